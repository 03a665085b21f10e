package workspace

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// maxFunctionLines and maxApplyFileLines bound the rooms a reader walks through.
const (
	maxFunctionLines  = 60
	maxApplyFileLines = 400
)

// oversized are the functions still over maxFunctionLines, at their length when this test came
// (issue 60): each may shrink, and leaves the list once it fits; none may grow, and no other
// function may pass the bound.
var oversized = map[string]int{
	"cmd/ghcrsync-release.run":             103,
	"internal/permission.secretShapeRules": 84,
	"cmd/ghcrsync.newFmt":                  76,
	"internal/permission.Escapes":          74,
	"plan.estimate":                        73,
	"cmd/ghcrsync.run":                     73,
	"internal/release.platformImage":       72,
	"internal/metrics.Render":              72,
	"cmd/ghcrsync.newValidate":             62,
}

// longFunctions are the functions of files longer than limit lines, as "pkg.Name" → lines.
func longFunctions(fset *token.FileSet, pkg string, files []*ast.File, limit int) map[string]int {
	out := map[string]int{}

	for _, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}

			if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > limit {
				out[pkg+"."+fd.Name.Name] = max(out[pkg+"."+fd.Name.Name], n)
			}
		}
	}

	return out
}

// Functions stay within maxFunctionLines outside the sandbox and the tests (the ones still over
// it may only shrink), and no file of apply passes maxApplyFileLines.
func TestRoomsStaySmall(t *testing.T) {
	pkgs := parseModule(t)
	long := map[string]int{}

	for pkg, src := range pkgs {
		if waitExempt(pkg) {
			continue
		}

		for name, n := range longFunctions(src.fset, pkg, src.files, maxFunctionLines) {
			long[name] = n

			switch was, ok := oversized[name]; {
			case !ok:
				t.Errorf("%s has %d lines: more than %d; split it into named steps", name, n, maxFunctionLines)
			case n > was:
				t.Errorf("%s grew to %d lines (it had %d, already more than %d): shrink it", name, n, was, maxFunctionLines)
			}
		}
	}

	for name := range oversized {
		if _, ok := long[name]; !ok {
			t.Errorf("%s fits in %d lines now: take it off the oversized list", name, maxFunctionLines)
		}
	}

	apply := pkgs["apply"]
	for _, f := range apply.files {
		if n := apply.fset.Position(f.End()).Line; n > maxApplyFileLines {
			t.Errorf("%s has %d lines: more than %d; give what it does a file of its own", apply.fset.Position(f.Pos()).Filename, n, maxApplyFileLines)
		}
	}

	fset := token.NewFileSet()

	// The negative control: a 61-line function is seen, a 60-line one is not.
	body := func(lines int) string { return "func f" + "() {\n" + strings.Repeat("\t_ = 0\n", lines-2) + "}\n" }
	files := []*ast.File{parseSource(t, fset, "p.go", "package p\n\n"+body(61)), parseSource(t, fset, "q.go", "package q\n\n"+strings.Replace(body(60), "func f", "func g", 1))}

	if got := longFunctions(fset, "p", files, maxFunctionLines); len(got) != 1 || got["p.f"] != 61 {
		t.Fatalf("the rule sees %v, want p.f of 61 lines only", got)
	}
}

func parseSource(t *testing.T, fset *token.FileSet, name, src string) *ast.File {
	t.Helper()

	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}

	return f
}
