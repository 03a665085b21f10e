package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"testing"
)

// exitLiterals are the places among files that build an exitError: where a result becomes an
// exit status.
func exitLiterals(t *testing.T, fset *token.FileSet, files map[string]string) []string {
	t.Helper()

	var out []string

	for name, src := range files {
		f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}

		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.CompositeLit); ok {
				if id, ok := lit.Type.(*ast.Ident); ok && id.Name == "exitError" {
					out = append(out, fset.Position(lit.Pos()).String())
				}
			}

			return true
		})
	}

	return out
}

// Only exitcode.go turns a result into an exit status: every command returns its result's status
// from there (one table, docs/ci.md), never a code of its own.
func TestExitStatusIsMappedInOnePlace(t *testing.T) {
	files := commandSources(t)
	delete(files, "exitcode.go")

	if bad := exitLiterals(t, token.NewFileSet(), files); len(bad) > 0 {
		t.Errorf("an exit status is set outside exitcode.go at %v: return the result's status from exitcode.go", bad)
	}

	// The negative control: a command setting its own code is seen.
	own := map[string]string{"x.go": "package main\n\nfunc f() error { return exitError{code: 3} }\n"}
	if got := exitLiterals(t, token.NewFileSet(), own); len(got) != 1 {
		t.Fatalf("a command's own exitError was not seen: %v", got)
	}
}
