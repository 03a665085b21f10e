package diag_test

import (
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"

	"github.com/ghcrsync/ghcrsync/internal/diag"
)

func TestFromHCLSnippet(t *testing.T) {
	src := "nodes {\n  a = 1\n  b = [\n    2,\n  ]\n}\nlast = 3"

	p := hclparse.NewParser()
	if _, diags := p.ParseHCL([]byte(src), "x.hcl"); diags.HasErrors() {
		t.Fatal(diags)
	}

	at := func(startLine, startCol, startByte, endLine, endCol, endByte int) *hcl.Range {
		return &hcl.Range{Filename: "x.hcl",
			Start: hcl.Pos{Line: startLine, Column: startCol, Byte: startByte},
			End:   hcl.Pos{Line: endLine, Column: endCol, Byte: endByte}}
	}

	for _, tc := range []struct {
		name                string
		subject             *hcl.Range
		code                string
		context             string
		highlightFrom, hiTo int
	}{
		{name: "one_line", subject: at(2, 3, 10, 2, 4, 11), code: "  a = 1", context: "nodes", highlightFrom: 2, hiTo: 3},
		{name: "several_lines", subject: at(3, 7, 22, 5, 4, 34), code: "  b = [\n    2,\n  ]", context: "nodes", highlightFrom: 6, hiTo: 18},
		{name: "last_line_without_newline", subject: at(7, 1, 37, 7, 5, 41), code: "last = 3", highlightFrom: 0, hiTo: 4},
		{name: "no_place", subject: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds := diag.FromHCL(hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "S secret", Detail: "D secret", Subject: tc.subject}},
				p.Files(), "dir/x.hcl", func(s string) string { return s[:2] })

			d := ds[0]
			if d.Summary != "S " || d.Detail != "D " {
				t.Fatalf("not scrubbed: %q %q", d.Summary, d.Detail)
			}

			if tc.subject == nil {
				if d.Range != nil || d.Snippet != nil {
					t.Fatalf("a finding without a place got one: %+v", d)
				}

				return
			}

			if d.Range.Filename != "dir/x.hcl" || d.Snippet.Code != tc.code || d.Snippet.HighlightStartOffset != tc.highlightFrom ||
				d.Snippet.HighlightEndOffset != tc.hiTo || d.Snippet.StartLine != tc.subject.Start.Line {
				t.Fatalf("got %+v %+v", d.Range, d.Snippet)
			}

			got := ""
			if d.Snippet.Context != nil {
				got = *d.Snippet.Context
			}

			if got != tc.context {
				t.Fatalf("context %q, want %q", got, tc.context)
			}
		})
	}
}
