package apply

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/fence"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/progress"
	"github.com/ghcrsync/ghcrsync/internal/secretwrite"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// Options are a run's choices besides its inputs and the plan.
type Options struct {
	// Within is the run's time budget (apply --within; 0: the configuration's run.budget).
	Within      time.Duration
	PlanPath    string // where the plan came from ("" when planned in this command), for messages
	RunRef      string
	Logger      hclog.Logger
	Progress    progress.Func // what long steps report as they go (view.Progress words it)
	Hooks       Hooks
	SecretHooks secretwrite.Hooks
	// Observe, if set, sees every Event the run records (apply --json streams them).
	Observe func(Event)
}

// Event is one step of the run as recorded on its object: the Kubernetes Event's content.
type Event struct {
	Time    time.Time
	Object  object.Ref
	Reason  string
	Message string
	Warning bool
}

// recorder records the run's Events in the cluster and shows each to Observe.
type recorder struct {
	kube    Recorder
	observe func(Event)
	clock   clock.Clock
}

func (r recorder) Record(ctx context.Context, ref object.Ref, reason, msg string, warning bool) error {
	if r.observe != nil {
		r.observe(Event{Time: r.clock.Now(), Object: ref, Reason: reason, Message: msg, Warning: warning})
	}

	return r.kube.Record(ctx, ref, reason, msg, warning)
}

// Result is what a run did.
type Result struct {
	Plan       *plan.Plan
	Holder     string
	Nodes      []NodeResult
	Secrets    []secretwrite.Result
	Reclaimed  []fence.Outcome // fences of terminated runs released before the run
	ReleaseErr error           // the Lease could not be released after the run
	// Cancelled is true when a signal stopped the run; MaxFailures is the failure budget it ran
	// with; ConfigPath names the configuration, for the release command a person is given.
	Cancelled   bool
	MaxFailures int
	ConfigPath  string
	// Verdict is who uses which credential at the end of the run, read from the cluster: exit 0
	// only when it is safe to revoke the old credential. VerdictErr is why it could not be had.
	Verdict    *plan.Revocation
	VerdictErr error
	// Flux is what the run did with each Kustomization of the flux block.
	Flux []FluxResult
	// Budget is the run's time budget (0: none) and Deadline when it ends.
	Budget   time.Duration
	Deadline time.Time
	// WindowOpens is the maintenance window's next opening when it deferred a node (zero: it
	// deferred none).
	WindowOpens time.Time
}

// Deferred lists the nodes the run did not start because they did not fit in its time budget
// or its maintenance window: the next run rotates them.
func (r *Result) Deferred() []string {
	var out []string

	for _, n := range r.Nodes {
		if n.Outcome == state.OutcomeDeferred {
			out = append(out, n.Node)
		}
	}

	return out
}

// Progressed reports whether the run stopped on its time budget with nothing failed: it did what
// fitted, released what it took, and the next run continues the rotation (exit 6). The root
// Flux secret held back is what a progressed run leaves by design, not a failure.
func (r *Result) Progressed() bool {
	c := r.Counts()

	return len(r.Deferred()) > 0 && !r.Cancelled && c.Failed()-c.Secrets[secretwrite.HeldBack] == 0
}

// SafeToRevoke reports whether the run ended with the old credential used by nothing.
func (r *Result) SafeToRevoke() bool { return r.Verdict != nil && r.Verdict.Clean() }

// Held lists the nodes the run left fenced (failed or cancelled after its claim landed).
func (r *Result) Held() []string {
	var out []string

	for _, n := range r.Nodes {
		if n.Fenced {
			out = append(out, n.Node)
		}
	}

	return out
}

// Counts are a run's outcomes counted once: the human view, the Markdown summary and the exit
// code all read them.
type Counts struct {
	Nodes     map[state.Outcome]int
	Secrets   map[secretwrite.Outcome]int // consumer and root pull secrets
	Templates map[secretwrite.Outcome]int // node templates
	FluxLeft  int                         // Flux Kustomizations left suspended
	FluxLost  int                         // Flux Kustomizations whose suspension the run could not keep
}

// Counts counts the run's outcomes.
func (r *Result) Counts() Counts {
	c := Counts{Nodes: map[state.Outcome]int{}, Secrets: map[secretwrite.Outcome]int{}, Templates: map[secretwrite.Outcome]int{}}

	for _, n := range r.Nodes {
		c.Nodes[n.Outcome]++
	}

	for _, s := range r.Secrets {
		if s.Role == plan.RoleTemplate {
			c.Templates[s.Outcome]++
		} else {
			c.Secrets[s.Outcome]++
		}
	}

	for _, f := range r.Flux {
		if f.Held() {
			c.FluxLeft++
		}

		if f.Lost {
			c.FluxLost++
		}
	}

	return c
}

// Failed counts the parts of the run that failed: nodes, pull secrets and node templates, a
// held-back root (the rotation is not done), Flux Kustomizations left suspended or not kept
// suspended.
func (c Counts) Failed() int {
	return c.Nodes[state.OutcomeFailed] + c.Secrets[secretwrite.Failed] + c.Secrets[secretwrite.HeldBack] +
		c.Templates[secretwrite.Failed] + c.Templates[secretwrite.HeldBack] + c.FluxLeft + c.FluxLost
}

// Failed counts the parts of the run that failed (Counts.Failed).
func (r *Result) Failed() int { return r.Counts().Failed() }

// NodeResult is one node's outcome.
type NodeResult struct {
	Node    string
	Action  plan.Action
	Outcome state.Outcome
	Reason  plan.Reason
	Message string
	// Fenced is true when the node was left fenced (its record holds a fence).
	Fenced bool
	// Timings are where the node's seconds went, one per step it ran, in order.
	Timings []Timing
	// Late is true for a node the plan did not act on, found by re-listing the fleet.
	Late bool
}

// Timing is how long one step of a node's transaction took.
type Timing struct {
	Step     string // quorum, claim, guard, drain, configure, reboot, ready, prove, release
	Duration time.Duration
}

// Failed reports whether the outcome makes the run fail.
func (r NodeResult) Failed() bool { return r.Outcome == state.OutcomeFailed }
