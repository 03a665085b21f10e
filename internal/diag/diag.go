// Package diag is a finding about the configuration, in the shape of Terraform's JSON
// diagnostics (severity, summary, detail, range, snippet), so that the tools that read
// `terraform validate -json` (pull-request annotators, editors) read ghcrsync's the same way.
// It decides nothing: it converts HCL's diagnostics and renders them.
package diag

import (
	"cmp"
	"slices"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hcled"
)

// Severities.
const (
	Error   = "error"
	Warning = "warning"
)

// Diagnostic is one finding. Range and Snippet are set when the finding has a place in a file.
type Diagnostic struct {
	Severity string   `json:"severity"`
	Summary  string   `json:"summary"`
	Detail   string   `json:"detail"`
	Range    *Range   `json:"range,omitempty"`
	Snippet  *Snippet `json:"snippet,omitempty"`
}

// Range is where in a file a finding is: Terraform's diagnostic range.
type Range struct {
	Filename string `json:"filename"`
	Start    Pos    `json:"start"`
	End      Pos    `json:"end"`
}

// Pos is a position in a file: line and column from 1, byte from 0.
type Pos struct {
	Line   int `json:"line"`
	Column int `json:"column"`
	Byte   int `json:"byte"`
}

// Snippet is the source the range covers: the whole lines, the offsets (in bytes, within
// Code) of the part to highlight, and the block the range lies in (Context).
type Snippet struct {
	Context              *string `json:"context"`
	Code                 string  `json:"code"`
	StartLine            int     `json:"start_line"`
	HighlightStartOffset int     `json:"highlight_start_offset"`
	HighlightEndOffset   int     `json:"highlight_end_offset"`
	Values               []any   `json:"values"`
}

// New is a finding without a place.
func New(severity, summary, detail string) Diagnostic {
	return Diagnostic{Severity: severity, Summary: summary, Detail: detail}
}

// FromHCL converts HCL's diagnostics, one for one, in the order of the file (HCL's decoder
// reports a block's arguments in no fixed order). files holds the sources the diagnostics'
// subjects point into (the parser's Files); filename names the file in the range (the path the
// user gave, where HCL knows only its base name); scrub cleans each summary and detail (the
// configuration's env() values are never repeated).
func FromHCL(diags hcl.Diagnostics, files map[string]*hcl.File, filename string, scrub func(string) string) []Diagnostic {
	out := make([]Diagnostic, 0, len(diags))

	for _, d := range diags {
		severity := Error
		if d.Severity == hcl.DiagWarning {
			severity = Warning
		}

		out = append(out, Diagnostic{
			Severity: severity,
			Summary:  scrub(d.Summary),
			Detail:   scrub(d.Detail),
			Range:    rangeOf(d.Subject, filename),
			Snippet:  snippetOf(d.Subject, files),
		})
	}

	slices.SortStableFunc(out, func(a, b Diagnostic) int {
		if a.Range == nil || b.Range == nil {
			return 0
		}

		return cmp.Or(strings.Compare(a.Range.Filename, b.Range.Filename), a.Range.Start.Byte-b.Range.Start.Byte)
	})

	return out
}

func rangeOf(r *hcl.Range, filename string) *Range {
	if r == nil {
		return nil
	}

	name := r.Filename
	if filename != "" {
		name = filename
	}

	return &Range{
		Filename: name,
		Start:    Pos{Line: r.Start.Line, Column: r.Start.Column, Byte: r.Start.Byte},
		End:      Pos{Line: r.End.Line, Column: r.End.Column, Byte: r.End.Byte},
	}
}

// snippetOf is the source of the lines r covers, as Terraform's snippet.
func snippetOf(r *hcl.Range, files map[string]*hcl.File) *Snippet {
	if r == nil {
		return nil
	}

	f := files[r.Filename]
	if f == nil || r.Start.Byte > len(f.Bytes) {
		return nil
	}

	src := f.Bytes
	first := strings.LastIndexByte(string(src[:r.Start.Byte]), '\n') + 1

	end := min(max(r.End.Byte, r.Start.Byte), len(src))
	last := len(src)

	if i := strings.IndexByte(string(src[end:]), '\n'); i >= 0 {
		last = end + i
	}

	// A range that ends at a line's start (after its newline) shows the line before only.
	code := strings.TrimRight(string(src[first:last]), "\r\n")
	s := &Snippet{
		Code:                 code,
		StartLine:            r.Start.Line,
		HighlightStartOffset: r.Start.Byte - first,
		HighlightEndOffset:   min(end-first, len(code)),
		Values:               []any{},
	}

	if c := hcled.ContextString(f, r.Start.Byte); c != "" {
		s.Context = &c
	}

	return s
}

// Errors counts the errors among ds.
func Errors(ds []Diagnostic) int {
	n := 0

	for _, d := range ds {
		if d.Severity == Error {
			n++
		}
	}

	return n
}
