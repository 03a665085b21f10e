package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// commandWide are the view functions a command may call besides its own view's constructor: the
// lines any command prints the same way (an error, a warning, a signal, an annotation), the
// output guards, and the JSON log.
var commandWide = map[string]bool{
	"Error": true, "Warning": true, "Annotate": true, "Signalled": true, "SecondSignal": true,
	"Guard": true, "GuardCompletion": true, "JSONLog": true, "RunOutcome": true,
}

// renderedOutside are the places in src that render without a view: a fmt.Fprint*, or a view
// function that is neither a view's constructor (New…) nor command-wide.
func renderedOutside(t *testing.T, fset *token.FileSet, name, src string) []string {
	t.Helper()

	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}

	var out []string

	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}

		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}

		pkg, ok := sel.X.(*ast.Ident)
		if !ok {
			return true
		}

		switch fn := sel.Sel.Name; {
		case pkg.Name == "fmt" && strings.HasPrefix(fn, "Fprint"),
			pkg.Name == "view" && !strings.HasPrefix(fn, "New") && !commandWide[fn]:
			out = append(out, fset.Position(call.Pos()).String()+" "+pkg.Name+"."+fn)
		}

		return true
	})

	return out
}

// Every command renders through its view (internal/view: New…), never with a renderer or a
// fmt.Fprint of its own.
func TestEveryCommandRendersThroughAView(t *testing.T) {
	fset := token.NewFileSet()

	for n, src := range commandSources(t) {
		for _, at := range renderedOutside(t, fset, n, src) {
			t.Errorf("%s: render it through the command's view (internal/view)", at)
		}
	}

	// The negative control: a renderer called, and a line printed, by a command are both seen.
	own := "package main\n\nfunc f() {\n\tview.Fences(nil, 0, r)\n\tfmt.Fprintln(w, x)\n\tview.NewFences(s)\n}\n"
	if got := renderedOutside(t, token.NewFileSet(), "x.go", own); len(got) != 2 {
		t.Fatalf("a command's own rendering was not seen: %v", got)
	}
}

// commandSources are the command's own files (not its tests), by name: what the AST guards of
// this folder read.
func commandSources(t *testing.T) map[string]string {
	t.Helper()

	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}

	files := map[string]string{}

	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}

		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}

		files[n] = string(b)
	}

	if len(files) < 10 {
		t.Fatalf("read %d command files: not the command's folder", len(files))
	}

	return files
}
