package view

import (
	"bytes"
	"fmt"
	"io"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/atomicfile"
	"github.com/ghcrsync/ghcrsync/internal/progress"
	"github.com/ghcrsync/ghcrsync/plan"
)

// Streams are where a command's view writes: Out its result, Err its progress and --verbose
// lines; JSON when Out carries JSON; GitHub when GitHub Actions output (annotations and the step
// summary) is on; Verbose for where the seconds and the requests went.
type Streams struct {
	Out, Err io.Writer
	JSON     bool
	GitHub   bool
	Verbose  bool
}

// Annotations is where workflow commands go: Out, or Err when Out carries JSON (the runner reads
// workflow commands from both streams, and a JSON reader of Out must see JSON only).
func (s Streams) Annotations() io.Writer {
	if s.JSON {
		return s.Err
	}

	return s.Out
}

func (s Streams) format() Format { return formatFor(s.JSON) }

// gitHub writes a command's annotations and appends its Markdown to the step summary (when
// GitHub output is on); a summary that cannot be written is a warning annotation, never fatal.
func (s Streams) gitHub(command string, annotate, summary func(io.Writer)) {
	if !s.GitHub {
		return
	}

	annotate(s.Annotations())

	if err := appendSummary(summary); err != nil {
		Annotate(s.Annotations(), AnnotateWarning, command, err.Error())
	}
}

// Counted are the calls a command made so far: to Kubernetes (by verb) and Talos (by method),
// and both by the step that made them (one line per step, or "").
type Counted func() (kube, talos, steps string)

// requests is the --verbose line of the calls made, then the calls by step.
func (s Streams) requests(counted Counted) {
	if s.Verbose && counted != nil {
		kube, talos, steps := counted()
		requestsLine(s.Err, kube, talos)

		if steps != "" {
			fmt.Fprint(s.Err, "Requests by step:\n"+steps)
		}
	}
}

// PlanView is `ghcrsync plan`'s view.
type PlanView struct{ s Streams }

// NewPlan is the plan command's view on s.
func NewPlan(s Streams) *PlanView { return &PlanView{s: s} }

// planTo renders the plan (human or JSON).
func (v *PlanView) Plan(p *plan.Plan) error { return planTo(v.s.Out, v.s.format(), p) }

// Saved says where the plan was saved (human only: JSON readers have the plan).
func (v *PlanView) Saved(path string) {
	if !v.s.JSON {
		planSaved(v.s.Out, path)
	}
}

// Markdown writes the plan as Markdown to path for a pull-request comment (0644, atomically: a
// PR-comment step may read it while a retry rewrites it), cut to what a comment holds.
func (v *PlanView) Markdown(path string, p *plan.Plan) error {
	var b bytes.Buffer

	planMarkdown(&b, p)

	if err := atomicfile.Write(path, []byte(truncated(b.String())), 0o644); err != nil {
		return fmt.Errorf("write Markdown plan %s: %w", path, err)
	}

	return nil
}

// Published writes the plan's GitHub output and the requests it made (--verbose).
func (v *PlanView) Published(p *plan.Plan, counted Counted) {
	v.s.gitHub("ghcrsync plan", func(w io.Writer) { planAnnotations(w, p) }, func(w io.Writer) { planMarkdown(w, p) })
	v.s.requests(counted)
}

// ApplyView is `ghcrsync apply`'s view.
type ApplyView struct{ s Streams }

// NewApply is the apply command's view on s.
func NewApply(s Streams) *ApplyView { return &ApplyView{s: s} }

// Planned renders the plan --auto-approve made, before it is applied (human only).
func (v *ApplyView) Planned(p *plan.Plan) {
	if !v.s.JSON {
		planHuman(v.s.Out, p)
	}
}

// Progress words the run's progress events on Err.
func (v *ApplyView) Progress() progress.Func { return Progress(v.s.Err) }

// Events streams each step of the run as a JSON line (--json), else nil.
func (v *ApplyView) Events() func(apply.Event) {
	if !v.s.JSON {
		return nil
	}

	return func(ev apply.Event) { _ = applyEventLine(v.s.Out, ev) }
}

// Result renders the run's outcome (human, or the JSON summary line), where each node's seconds
// went and the requests made (--verbose), and its GitHub output.
func (v *ApplyView) Result(res *apply.Result, counted Counted) error {
	var err error

	if v.s.JSON {
		err = applySummaryLine(v.s.Out, res)
	} else {
		err = applyTo(v.s.Out, Human, res)
	}

	if err != nil {
		return err
	}

	if v.s.Verbose {
		applyTimings(v.s.Err, res)
	}

	v.s.requests(counted)
	v.s.gitHub("ghcrsync apply", func(w io.Writer) {
		planAnnotations(w, res.Plan)
		applyAnnotations(w, res)
	}, func(w io.Writer) { applyMarkdown(w, res) })

	if v.s.GitHub {
		if err := appendOutputs(applyOutputs(res)); err != nil {
			Annotate(v.s.Annotations(), AnnotateWarning, "ghcrsync apply", err.Error())
		}
	}

	return nil
}
