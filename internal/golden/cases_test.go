package golden_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/golden"
)

// A case file reads into its header and cases, and is written back byte for byte.
func TestCasesRoundTrip(t *testing.T) {
	const text = `# header line 1
# header line 2

case inline
in a=1
# a comment among the inputs
=> one line

# notes of the next case
case block
in b=2
=>
line 1
line 2

case nothing_expected_yet
in c=3
=>
`

	file := filepath.Join(t.TempDir(), "cases.txt")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}

	header, cases := golden.ReadCases(t, file)

	if !slices.Equal(header, []string{"# header line 1", "# header line 2"}) || len(cases) != 3 {
		t.Fatalf("header %q, %d cases", header, len(cases))
	}

	inline, block := cases[0], cases[1]
	if !inline.Inline || !slices.Equal(inline.Want, []string{"one line"}) || !slices.Equal(inline.Input, []string{"in a=1", "# a comment among the inputs"}) {
		t.Fatalf("inline case: %+v", inline)
	}

	if block.Inline || !slices.Equal(block.Want, []string{"line 1", "line 2"}) || !slices.Equal(block.Notes, []string{"# notes of the next case"}) || block.Line != 10 {
		t.Fatalf("block case: %+v", block)
	}

	golden.WriteCases(t, file, header, cases, [][]string{inline.Want, block.Want, nil})

	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}

	if string(got) != text {
		t.Fatalf("written back:\n%s\nwant:\n%s", got, text)
	}
}
