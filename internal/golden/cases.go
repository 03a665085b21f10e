package golden

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"testing"
)

// Case is one block of a case file (plan/testdata/judge, apply/testdata/txn): the comment lines
// before it (Notes), "case NAME", its input lines (comments among them kept), and after "=>"
// what is expected — "=> LINE" for one line (Inline), or "=>" alone and then lines up to a blank
// line. A blank line ends a block; the comment lines before the first case are the file's header.
type Case struct {
	Name   string
	File   string
	Line   int // of "case NAME"
	Notes  []string
	Input  []string
	Want   []string
	Inline bool
}

// At is where the case is, for messages: FILE:LINE.
func (c Case) At() string { return fmt.Sprintf("%s:%d", c.File, c.Line) }

// ReadCases reads a case file: its header and its cases. A line outside a case that is not a
// comment is an error naming its place.
func ReadCases(t testing.TB, file string) (header []string, cases []Case) {
	t.Helper()

	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	var (
		in, out bool     // inside a case; reading its expected lines
		notes   []string // the comment lines of the next case
	)

	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		c := func() *Case { return &cases[len(cases)-1] }

		switch {
		case text == "":
			in, out = false, false
		case strings.HasPrefix(text, "case "):
			cases = append(cases, Case{Name: strings.TrimPrefix(text, "case "), File: file, Line: line, Notes: notes})
			in, out, notes = true, false, nil
		case !in && strings.HasPrefix(text, "#") && len(cases) == 0:
			header = append(header, text)
		case !in && strings.HasPrefix(text, "#"):
			notes = append(notes, text)
		case !in:
			t.Fatalf("%s:%d: %q outside a case (a case starts with \"case NAME\"; a blank line ends it)", file, line, text)
		case out:
			c().Want = append(c().Want, text)
		case text == "=>":
			out = true
		case strings.HasPrefix(text, "=> "):
			c().Want, c().Inline = append(c().Want, strings.TrimPrefix(text, "=> ")), true
		default:
			c().Input = append(c().Input, text)
		}
	}

	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}

	return header, cases
}

// WriteCases rewrites a case file (-update) with got as each case's expected lines, in the
// case's own style (one line stays inline).
func WriteCases(t testing.TB, file string, header []string, cases []Case, got [][]string) {
	t.Helper()

	var b strings.Builder

	for i, l := range header {
		if i > 0 {
			b.WriteString("\n")
		}

		b.WriteString(l)
	}

	for i, c := range cases {
		if i > 0 || len(header) > 0 {
			b.WriteString("\n\n")
		}

		for _, l := range append(append(append([]string{}, c.Notes...), "case "+c.Name), c.Input...) {
			b.WriteString(l + "\n")
		}

		if c.Inline && len(got[i]) == 1 {
			b.WriteString("=> " + got[i][0])

			continue
		}

		b.WriteString("=>")

		for _, l := range got[i] {
			b.WriteString("\n" + l)
		}
	}

	if err := os.WriteFile(file, []byte(b.String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}
