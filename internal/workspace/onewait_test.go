package workspace

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// handRolledWaits are the select statements of f with a case that receives from a call to an
// After method or function (time.After, a Clock's After): a wait written by hand instead of one of
// internal/clock's (Sleep, SleepOr, Until, Ride).
func handRolledWaits(f *ast.File) []ast.Node {
	var out []ast.Node

	ast.Inspect(f, func(n ast.Node) bool {
		s, ok := n.(*ast.SelectStmt)
		if !ok {
			return true
		}

		for _, c := range s.Body.List {
			if cc, ok := c.(*ast.CommClause); ok && cc.Comm != nil && callsAfter(cc.Comm) {
				out = append(out, s)

				break
			}
		}

		return true
	})

	return out
}

func callsAfter(n ast.Node) bool {
	found := false

	ast.Inspect(n, func(m ast.Node) bool {
		if call, ok := m.(*ast.CallExpr); ok {
			switch fun := call.Fun.(type) {
			case *ast.SelectorExpr:
				found = found || fun.Sel.Name == "After"
			case *ast.Ident:
				found = found || fun.Name == "After"
			}
		}

		return !found
	})

	return found
}

// waitExempt are the packages whose waits are not the product's: the clock itself, and the
// sandbox and the tests' own machinery.
func waitExempt(pkg string) bool {
	return pkg == "internal/clock" || strings.HasPrefix(pkg, "internal/sandbox") || strings.HasPrefix(pkg, "cmd/ghcrsync-sandbox") ||
		strings.HasPrefix(pkg, "test/") || strings.HasPrefix(pkg, "bench")
}

// One wait: outside internal/clock, no product code selects on After — every wait is Sleep,
// SleepOr, Until or Ride, so each ends with its context and runs on the run's clock.
func TestOneWait(t *testing.T) {
	pkgs := parseModule(t)
	fset := token.NewFileSet()
	found := 0

	for pkg, src := range pkgs {
		if waitExempt(pkg) {
			continue
		}

		for _, f := range src.files {
			for range handRolledWaits(f) {
				found++

				t.Errorf("%s (%s): a select on After; use internal/clock's Sleep or SleepOr", pkg, f.Name.Name)
			}
		}
	}

	// The negative control: the guard finds both hand-rolled forms it exists to refuse, and not a
	// select that waits on channels alone.
	const control = `package p

func a(ctx context.Context, c clock.Clock) {
	select {
	case <-ctx.Done():
	case <-c.After(time.Second):
	}
}

func b(ctx context.Context) {
	select {
	case <-ctx.Done():
	case t := <-time.After(time.Second):
		_ = t
	}
}

func quiet(ctx context.Context, ch chan int) {
	select {
	case <-ctx.Done():
	case <-ch:
	}
}
`

	f, err := parser.ParseFile(fset, "control.go", control, 0)
	if err != nil {
		t.Fatal(err)
	}

	if got := len(handRolledWaits(f)); got != 2 {
		t.Fatalf("the guard finds %d hand-rolled waits in its control, want 2", got)
	}

	t.Logf("%d packages checked, %d hand-rolled waits", len(pkgs), found)
}
