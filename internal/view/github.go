package view

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/readlimit"
	"github.com/ghcrsync/ghcrsync/internal/secretwrite"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// GitHub Actions output: errors and warnings as workflow annotations, and a Markdown summary
// of the step. Annotations are the only "::" lines ghcrsync writes; they bypass the guard's
// colon rule (Guard) because their title and message are escaped the way the runner reads
// them, so no value can end the command or start another.

// Annotation levels.
const (
	AnnotateError   = "error"
	AnnotateWarning = "warning"
	AnnotateNotice  = "notice"
)

// Annotation is one workflow command line, e.g. "::error title=T::message".
func annotationText(level, title, msg string) string { return annotationAt(level, title, msg, nil) }

// Place is where in a file an annotation points: the runner shows it on that line of a pull
// request's diff.
type Place struct {
	File                             string
	Line, Column, EndLine, EndColumn int
}

func annotationAt(level, title, msg string, at *Place) string {
	var props []string

	if at != nil {
		props = append(props, "file="+escapeProperty(withoutLegacyCommands(Clean(at.File))),
			"line="+strconv.Itoa(at.Line), "col="+strconv.Itoa(at.Column))

		if at.EndLine > 0 {
			props = append(props, "endLine="+strconv.Itoa(at.EndLine))
		}

		if at.EndLine == at.Line && at.EndColumn > 0 {
			props = append(props, "endColumn="+strconv.Itoa(at.EndColumn))
		}
	}

	if title != "" {
		props = append(props, "title="+escapeProperty(withoutLegacyCommands(Clean(title))))
	}

	line := "::" + level
	if len(props) > 0 {
		line += " " + strings.Join(props, ",")
	}

	return line + "::" + escapeData(withoutLegacyCommands(Clean(msg))) + "\n"
}

// escapeData escapes a workflow command's message as the runner unescapes it.
func escapeData(s string) string {
	return strings.NewReplacer("%", "%25", "\r", "%0D", "\n", "%0A").Replace(s)
}

// escapeProperty escapes a workflow command's property value (a title).
func escapeProperty(s string) string {
	return strings.NewReplacer("%", "%25", "\r", "%0D", "\n", "%0A", ":", "%3A", ",", "%2C").Replace(s)
}

// Annotate writes an annotation to w: through the guard's command channel when w is guarded
// (starting a new line if needed), else as is.
func Annotate(w io.Writer, level, title, msg string) { annotateAt(w, level, title, msg, nil) }

// AnnotateAt is Annotate on a place in a file (nil: none).
func annotateAt(w io.Writer, level, title, msg string, at *Place) {
	line := annotationAt(level, title, msg, at)

	if g, ok := w.(*guard); ok {
		g.command(line)

		return
	}

	_, _ = io.WriteString(w, line)
}

// command writes a workflow command line ghcrsync made (Annotation escaped its values).
func (g *guard) command(line string) {
	g.mu.Lock()
	defer g.mu.Unlock()

	if !g.lineStart {
		_, _ = io.WriteString(g.w, "\n")
	}

	_, _ = io.WriteString(g.w, line)
	g.lineStart, g.hashes = true, 0
}

// planAnnotations annotates a plan's warnings.
func planAnnotations(w io.Writer, p *plan.Plan) {
	for _, u := range p.Refused() {
		Annotate(w, AnnotateError, "ghcrsync plan: emergency rotation", u.Sentence())
	}

	for _, warning := range p.Warnings {
		Annotate(w, AnnotateWarning, "ghcrsync plan", warning)
	}
}

// ApplyAnnotations annotates a run's failed and cancelled nodes, a Lease left held and the
// pull secrets not written.
func applyAnnotations(w io.Writer, res *apply.Result) {
	for _, n := range res.Nodes {
		switch n.Outcome {
		case state.OutcomeFailed:
			Annotate(w, AnnotateError, "ghcrsync: "+n.Node+" failed", n.Message)
		case state.OutcomeCancelled:
			Annotate(w, AnnotateWarning, "ghcrsync: "+n.Node+" cancelled", n.Message)
		}
	}

	for _, s := range res.Secrets {
		if s.Outcome == secretwrite.Failed {
			Annotate(w, AnnotateError, "ghcrsync: pull secret "+s.Namespace+"/"+s.Secret, s.Message)
		}
	}

	if res.ReleaseErr != nil {
		Annotate(w, AnnotateError, "ghcrsync: Lease not released", res.ReleaseErr.Error()+" (release it with `ghcrsync release`)")
	}

	verdictAnnotation(w, res.Verdict, res.VerdictErr)
}

// ApplyMarkdown renders a run's outcome for the step summary.
func applyMarkdown(w io.Writer, res *apply.Result) {
	p := res.Plan
	c := res.Counts()
	nodes := c.Nodes[state.OutcomeFailed]

	head := "done, safe to revoke the old credential"

	switch {
	case res.Cancelled:
		head = "cancelled"
	case nodes > 0:
		head = plural(nodes, "node failed", "nodes failed")
	case c.Failed() > 0:
		head = plural(c.Failed(), "part failed", "parts failed") + " (pull secrets, node templates, Flux)"
	case !res.SafeToRevoke():
		head = "the old credential is still in use"
	case !p.Changes():
		head = "no changes, safe to revoke the old credential"
	}

	fmt.Fprintf(w, "### ghcrsync apply: %s\n\n", head)
	fmt.Fprintf(w, "Credential revision `%s` for %s · run `%s`.\n\n", shortRev(p.CredentialRevision), md(p.Registry), md(res.Holder))

	if len(res.Nodes) > 0 {
		fmt.Fprintln(w, "| Node | Action | Outcome | Fence held | Detail |")
		fmt.Fprintln(w, "|---|---|---|---|---|")

		for _, n := range res.Nodes {
			held := "no"
			if n.Fenced {
				held = "**yes**"
			}

			fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", md(n.Node), n.Action, n.Outcome, held, md(n.Message))
		}

		fmt.Fprintln(w)
	}

	if len(res.Secrets) > 0 {
		fmt.Fprintln(w, "| Pull secret | Role | Outcome | Detail |")
		fmt.Fprintln(w, "|---|---|---|---|")

		for _, s := range res.Secrets {
			fmt.Fprintf(w, "| %s | %s | %s | %s |\n", md(s.Namespace+"/"+s.Secret), md(s.Role), md(string(s.Outcome)), md(s.Message))
		}

		fmt.Fprintln(w)
	}

	if held := res.Held(); len(held) > 0 || res.ReleaseErr != nil {
		fmt.Fprintln(w, "Fences are still held: inspect them with `ghcrsync fences`, undo them with `ghcrsync release`.")
		fmt.Fprintln(w)
	}

	verdictMarkdown(w, res.Verdict, res.VerdictErr)
}

func shortRev(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}

	return rev
}

// appendSummary appends Markdown to the step summary file GitHub Actions names in
// $GITHUB_STEP_SUMMARY (nothing when it is unset); a file that cannot be written is reported,
// never fatal to the command.
func appendSummary(render func(io.Writer)) error {
	path := os.Getenv("GITHUB_STEP_SUMMARY")
	if path == "" {
		return nil
	}

	if fi, err := os.Stat(path); err == nil && fi.Size() > readlimit.StepSummary {
		return fmt.Errorf("step summary %s is already %d bytes: not appending", path, fi.Size())
	}

	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("step summary: %w", err)
	}

	var b strings.Builder

	render(&b)

	if _, err := f.WriteString(b.String() + "\n"); err != nil {
		f.Close()

		return fmt.Errorf("step summary %s: %w", path, err)
	}

	return f.Close()
}

// ApplyOutputs are the step outputs of `ghcrsync apply` under GitHub Actions: what a workflow's
// next step decides on without parsing the output — outcome (done, progressed, partial,
// cancelled), remaining (the nodes a budget deferred to the next run), safe_to_revoke.
func applyOutputs(res *apply.Result) [][2]string {
	return [][2]string{
		{"outcome", RunOutcome(res)},
		{"remaining", strconv.Itoa(len(res.Deferred()))},
		{"safe_to_revoke", strconv.FormatBool(res.SafeToRevoke())},
	}
}

// appendOutputs appends step outputs to the file GitHub Actions names in $GITHUB_OUTPUT
// (nothing when it is unset). Values are one line each: names and numbers only.
func appendOutputs(kv [][2]string) error {
	path := os.Getenv("GITHUB_OUTPUT")
	if path == "" {
		return nil
	}

	var b strings.Builder

	for _, p := range kv {
		if strings.ContainsAny(p[0]+p[1], "\r\n") {
			return fmt.Errorf("step output %s: not one line", p[0])
		}

		b.WriteString(p[0] + "=" + p[1] + "\n")
	}

	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("step outputs: %w", err)
	}

	if _, err := f.WriteString(b.String()); err != nil {
		f.Close()

		return fmt.Errorf("step outputs %s: %w", path, err)
	}

	return f.Close()
}
