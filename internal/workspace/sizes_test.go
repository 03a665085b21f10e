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

// Functions stay within maxFunctionLines outside the sandbox and the tests, and no file of apply
// passes maxApplyFileLines.
func TestRoomsStaySmall(t *testing.T) {
	pkgs := parseModule(t)
	for pkg, src := range pkgs {
		if waitExempt(pkg) {
			continue
		}

		for name, n := range longFunctions(src.fset, pkg, src.files, maxFunctionLines) {
			t.Errorf("%s has %d lines: more than %d; split it into named steps", name, n, maxFunctionLines)
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
