// Loading and decoding: the file read and parsed, the decoder's primitives (strings, durations,
// paths, ranges) and its errors, each with file, line and column.

package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"

	"github.com/ghcrsync/ghcrsync/internal/diag"
	"github.com/ghcrsync/ghcrsync/internal/readlimit"
)

// Error carries the diagnostics of a configuration that did not decode. Its message lists each
// as FILE:LINE:COL: summary; detail.
type Error struct {
	Diagnostics hcl.Diagnostics
	Files       map[string]*hcl.File
	envs        []envValue // values env() returned: never repeated in the message
}

func (e *Error) Error() string {
	var b strings.Builder

	for i, d := range e.Diagnostics.Errs() {
		if i > 0 {
			b.WriteString("\n")
		}

		b.WriteString(formatDiag(d.(*hcl.Diagnostic)))
	}

	return withoutEnvValues(b.String(), e.envs)
}

// Findings are the diagnostics one by one, each with its place and source (validate --json),
// filename naming the file as the user gave it; no env() value is repeated.
func (e *Error) Findings(filename string) []diag.Diagnostic {
	return diag.FromHCL(e.Diagnostics, e.Files, filename, func(s string) string { return withoutEnvValues(s, e.envs) })
}

// Finding is a diagnostic about the configuration at where (a range in it), with its snippet;
// filename names the file as the user gave it.
func (c *Config) Finding(severity hcl.DiagnosticSeverity, summary, detail string, where hcl.Range, filename string) diag.Diagnostic {
	return diag.FromHCL(hcl.Diagnostics{{Severity: severity, Summary: summary, Detail: detail, Subject: &where}}, c.files, filename,
		func(s string) string { return withoutEnvValues(s, c.envs) })[0]
}

func formatDiag(d *hcl.Diagnostic) string {
	where := ""
	if d.Subject != nil {
		where = fmt.Sprintf("%s:%d:%d: ", d.Subject.Filename, d.Subject.Start.Line, d.Subject.Start.Column)
	}

	msg := where + d.Summary
	if d.Detail != "" {
		msg += "; " + d.Detail
	}

	return msg
}

// Load reads and validates the configuration at path.
func Load(path string) (*Config, error) { return load(path, false) }

// LoadNames is Load without checking that the files the configuration names exist: which files
// it reads (SopsFiles), for a workflow to fetch them before they do.
func LoadNames(path string) (*Config, error) { return load(path, true) }

func load(path string, namesOnly bool) (*Config, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}

	src, err := readlimit.File(abs, readlimit.Config)
	if err != nil {
		return nil, fmt.Errorf("read configuration %s: %w (pass --config FILE, or create ghcrsync.hcl; see docs/config.md)", path, err)
	}

	return parse(src, abs, namesOnly)
}

// Parse decodes src as if read from the absolute path filename.
func Parse(src []byte, filename string) (*Config, error) { return parse(src, filename, false) }

// parse decodes src; with namesOnly, the files it names need not exist.
func parse(src []byte, filename string, namesOnly bool) (*Config, error) {
	p := hclparse.NewParser()
	name := filepath.Base(filename)

	f, diags := p.ParseHCL(src, name)
	if diags.HasErrors() {
		return nil, newError(diags, p.Files())
	}

	d := &decoder{dir: filepath.Dir(filename), namesOnly: namesOnly}
	d.ctx = d.evalContext()

	var raw file
	diags = append(diags, gohcl.DecodeBody(f.Body, d.ctx, &raw)...)

	if diags.HasErrors() {
		return nil, d.newError(diags, p.Files())
	}

	sum := sha256.Sum256(src)
	cfg := d.build(&raw, f.Body)
	cfg.Path, cfg.Digest, cfg.files, cfg.envs = filename, hex.EncodeToString(sum[:]), p.Files(), d.envs

	if d.diags.HasErrors() {
		return nil, d.newError(d.diags, p.Files())
	}

	return cfg, nil
}

// newError keeps the first error reported at each place: a value that failed to evaluate (an
// unset env() variable) is reported once, not followed by what its absence caused there.
func (d *decoder) newError(diags hcl.Diagnostics, files map[string]*hcl.File) *Error {
	e := newError(diags, files)
	e.envs = d.envs

	return e
}

func newError(diags hcl.Diagnostics, files map[string]*hcl.File) *Error {
	seen := map[hcl.Pos]bool{}
	out := make(hcl.Diagnostics, 0, len(diags))

	for _, d := range diags {
		if d.Severity == hcl.DiagError && d.Subject != nil {
			if seen[d.Subject.Start] {
				continue
			}

			seen[d.Subject.Start] = true
		}

		out = append(out, d)
	}

	return &Error{Diagnostics: out, Files: files}
}

// evalContext gives expressions env(); every value it returns is remembered, so no error
// message repeats it (Error names the variable instead).
func (d *decoder) evalContext() *hcl.EvalContext {
	return &hcl.EvalContext{Functions: map[string]function.Function{
		"env": function.New(&function.Spec{
			Params: []function.Parameter{{Name: "name", Type: cty.String}},
			Type:   function.StaticReturnType(cty.String),
			Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
				name := args[0].AsString()

				v, ok := os.LookupEnv(name)
				if !ok {
					return cty.NilVal, fmt.Errorf("environment variable %s is not set", name)
				}

				d.envs = append(d.envs, envValue{name: name, value: v})

				return cty.StringVal(v), nil
			},
		}),
	}}
}

type decoder struct {
	dir   string
	ctx   *hcl.EvalContext
	diags hcl.Diagnostics
	envs  []envValue // what env() returned
	// namesOnly: a file the configuration names need not exist (LoadNames).
	namesOnly bool
}

func (d *decoder) errorf(rng hcl.Range, summary, detail string, args ...any) {
	r := rng
	d.diags = append(d.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: fmt.Sprintf(detail, args...), Subject: &r})
}

// expr evaluates an optional expression to a string; null or absent gives def.
func (d *decoder) str(e hcl.Expression, def string) (string, hcl.Range, bool) {
	if e == nil {
		return def, hcl.Range{}, true
	}

	v, diags := e.Value(d.ctx)
	if diags.HasErrors() {
		d.diags = append(d.diags, diags...)

		return def, e.Range(), false
	}

	if v.IsNull() {
		return def, e.Range(), true
	}

	if v.Type() != cty.String {
		d.errorf(e.Range(), "Incorrect attribute value type", "Expected a string, got %s.", v.Type().FriendlyName())

		return def, e.Range(), false
	}

	return v.AsString(), e.Range(), true
}

// atLeastOne decodes an optional whole number of at least 1.
func (d *decoder) atLeastOne(e hcl.Expression, def int, what string) int {
	if e == nil {
		return def
	}

	v, diags := e.Value(d.ctx)
	d.diags = append(d.diags, diags...)

	if diags.HasErrors() || v.IsNull() {
		return def
	}

	var n int
	if diags := gohcl.DecodeExpression(e, d.ctx, &n); diags.HasErrors() || n < 1 {
		d.errorf(e.Range(), "Invalid "+what, "%s must be a whole number of at least 1.", what)

		return def
	}

	return n
}

func (d *decoder) duration(e hcl.Expression, def time.Duration, what string) time.Duration {
	s, rng, ok := d.str(e, "")
	if !ok || s == "" {
		return def
	}

	v, err := time.ParseDuration(s)
	if err != nil || v <= 0 {
		d.errorf(rng, "Invalid duration", "%s must be a positive duration like \"90s\", \"10m\" or \"1h30m\"; %q is not.", what, s)

		return def
	}

	return v
}

func (d *decoder) path(p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}

	return filepath.Join(d.dir, p)
}

func (d *decoder) existingFile(p string, rng hcl.Range, what string) string {
	abs := d.path(p)
	if _, err := os.Stat(abs); err != nil && !d.namesOnly {
		d.errorf(rng, "File not found", "%s %q (resolved to %s) does not exist. Relative paths resolve against the configuration file's folder.", what, p, abs)
	}

	return abs
}

// attrRange finds where an attribute of a block was written, for diagnostics about values
// decoded as plain Go types.
func attrRange(body hcl.Body, block, attr string) hcl.Range {
	content, _, _ := body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: block, LabelNames: nil}}})
	for _, b := range content.Blocks {
		attrs, _ := b.Body.JustAttributes()
		if a, ok := attrs[attr]; ok {
			return a.Range
		}

		return b.DefRange
	}

	return body.MissingItemRange()
}

// blockRange is where attr of the labelled block (type, label) was written (attr "": the block's
// header), for diagnostics about values decoded as plain Go types.
func blockRange(body hcl.Body, block, label, attr string) hcl.Range {
	content, _, _ := body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: block, LabelNames: []string{"name"}}}})
	for _, b := range content.Blocks {
		if len(b.Labels) != 1 || b.Labels[0] != label {
			continue
		}

		if attr != "" {
			if attrs, _ := b.Body.JustAttributes(); attrs != nil {
				if a, ok := attrs[attr]; ok {
					return a.Range
				}
			}
		}

		return b.DefRange
	}

	return attrRange(body, block, attr)
}
