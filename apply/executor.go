package apply

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/pool"
	"github.com/ghcrsync/ghcrsync/internal/probe"
	"github.com/ghcrsync/ghcrsync/internal/progress"
	"github.com/ghcrsync/ghcrsync/internal/window"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// Hooks let tests act at exact points. Production leaves them nil.
type Hooks struct {
	// BeforeMutation runs after a phase is written to the state and before its mutation.
	BeforeMutation func(node string, phase state.Phase)
	// BetweenReadAndClaim runs after the claim read the node and before it patches it.
	BetweenReadAndClaim func(node string, attempt int)
	// BeforeRoot runs after the consumers were written, before the cluster is read again to
	// decide the root Flux secret.
	BeforeRoot func()
	// BeforeRelist runs before each re-listing of the fleet for late nodes (round 1, 2, …).
	BeforeRelist func(round int)
	// BeforeFlux runs after a Flux Kustomization's suspension is recorded and before it is
	// suspended ("suspending"), and before it is resumed ("resuming").
	BeforeFlux func(kustomization string, phase state.Phase)
}

// execOptions configure the executor.
type execOptions struct {
	Holder             string
	Registry           string
	Username, Password string // the credential; only handed to Talos
	DrainTimeout       time.Duration
	ReadyTimeout       time.Duration
	WorkerParallelism  int
	LiveParallelism    int // live updates and keyring writes at a time (they cordon nothing)
	// KeyringWindow is how long after a keyring write its kubelet may take to read it
	// (nodes.kubelet_keyring.window).
	KeyringWindow   time.Duration
	MaxFailures     int  // the failure budget: after that many failed nodes no new node starts
	AllowQuorumLoss bool // control planes may be taken down with fewer than plan.MinOtherVoters others
	Probe           plan.Probe
	Logger          hclog.Logger
	Progress        progress.Func // what long steps report as they go
	Hooks           Hooks
	// Poll is how often waits re-read (default 500 ms).
	Poll time.Duration
	// Events writes the cluster's audit trail; nil writes none.
	Events Recorder
	// Recheck, if set, asks the registry again, before each drain, about the credentials the
	// nodes held when the run started: one revoked since the plan is refused, and a node still
	// holding it takes no evicted pod (plan.CheckDestinations).
	Recheck func(ctx context.Context) []plan.CredentialInUse
	// Deadline is when the run's time budget ends (zero: none); Reserve what it keeps for its
	// closing steps. A node starts only if its estimate ends before Deadline less Reserve.
	Deadline time.Time
	Budget   time.Duration
	Reserve  time.Duration
	// Window is the maintenance window a fenced node's estimate must fit in (nil: none, or an
	// emergency, which ignores it).
	Window *window.Window
	// Retry waits out the registry's passing trouble in a runtime proof, Control telling a
	// node's refused credential from a registry refusing everyone (zero: no retry).
	Retry   credential.Retry
	Control func(ctx context.Context) error
	// Clock is the run's clock (nil: clock.System).
	Clock clock.Clock
}

// proveRuntime is the node's runtime proof, asked again while the registry is in passing
// trouble: a pull the runtime could not make because the registry was busy (429, 5xx), or
// denied while the registry denied the new credential too (the control), is proved again with
// a new probe pod; a denial the control shows is this node's — the registry accepts the new
// credential at that moment — fails at once, "refused (stable)".
func (e *executor) proveRuntime(ctx context.Context, node string) error {
	try := func(ctx context.Context) credential.Attempt {
		return credential.Attempt{Err: e.workloads.ProveRuntime(ctx, node, e.o.Probe, e.o.ReadyTimeout)}
	}

	tried, err := e.o.Retry.Do(ctx, try, pullClass, e.o.Control)
	if s := tried.String(); err == nil && s != "" {
		e.o.Logger.Warn("the registry's passing trouble was waited out: the runtime proof pulled", "node", node, "retries", s)
	}

	return err
}

// pullClass is what a runtime proof's failure says about trying again: the runtime's own words
// where it could not pull, else final (a probe that did not run is not the registry's doing).
func pullClass(err error) credential.Class {
	var pe *probe.PullError
	if errors.As(err, &pe) {
		return credential.ClassOfPullMessage(pe.Message)
	}

	return credential.Final
}

// executor runs a plan's node transactions.
type executor struct {
	ports
	o     execOptions
	clock clock.Clock
	judge func(plan.Subject) plan.Verdict // plan.Judge; tests record it

	mu       sync.Mutex
	st       *state.State
	failures int

	stop     chan struct{} // closed when the Lease is lost: no new mutation starts
	stopOnce sync.Once
	stopErr  error

	// sig is the run's context as the signals see it: done when the run is cancelled (SIGINT,
	// SIGTERM). Mutations run under a context that also ends when the Lease is lost.
	sig context.Context
}

func newExecutor(p ports, st *state.State, o execOptions) *executor {
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}

	if o.Progress == nil {
		o.Progress = func(progress.Event) {}
	}

	if o.Poll == 0 {
		o.Poll = 500 * time.Millisecond
	}

	if o.MaxFailures == 0 {
		o.MaxFailures = 1
	}

	return &executor{ports: p, st: st, o: o, clock: clock.Or(o.Clock), judge: plan.Judge, stop: make(chan struct{})}
}

// save records rec in the state and writes it: always before the mutation it announces.
func (e *executor) save(rec *state.Record) error {
	e.mu.Lock()
	defer e.mu.Unlock()

	rec.Updated = e.clock.Now().UTC()
	e.st.Put(*rec)

	if err := e.store.Write(e.st); err != nil {
		return fmt.Errorf("write state before %s of %s: %w", rec.Phase, rec.Node, err)
	}

	return nil
}

func (e *executor) stopped() bool {
	select {
	case <-e.stop:
		return true
	default:
		return false
	}
}

func (e *executor) halt(err error) {
	e.stopOnce.Do(func() {
		e.o.Logger.Error("stopping all mutation", "error", err)
		e.stopErr = err
		close(e.stop)
	})
}

// run executes the plan's fence and apply-live nodes in order: workers concurrently (bounded),
// then control planes one at a time (a failed one stops the rest), in the plan's order. ctx ends
// when the run is cancelled; mutations also stop when the Lease is lost.
func (e *executor) run(ctx context.Context, p *plan.Plan) []NodeResult {
	e.sig = ctx

	mctx, cancel := context.WithCancel(ctx)
	defer cancel()

	go func() {
		select {
		case <-e.lease.Done():
			e.halt(e.lease.Assert())
			cancel()
		case <-mctx.Done():
		}
	}()

	var live, workers, controlPlanes []plan.NodePlan

	for _, n := range p.Nodes {
		switch {
		case n.Order == 0:
		case n.Action == plan.ActionKeyring, n.Action == plan.ActionApplyLive && n.Role != plan.RoleControlPlane:
			live = append(live, n) // no cordon, no reboot (a keyring write restarts nothing, control planes included): in parallel
		case n.Role == plan.RoleControlPlane: // live or fenced: one at a time, behind the etcd gate
			controlPlanes = append(controlPlanes, n)
		default:
			workers = append(workers, n)
		}
	}

	e.steer(mctx, p)
	defer e.unsteerAll(ctx)

	results := e.parallel(mctx, p, live, max(e.o.LiveParallelism, 1))

	// Where pods never land on a node not yet rotated, the seed (the emptiest worker) rolls
	// alone: the other workers' pods go to it.
	if len(workers) > 0 && p.Steering.Hard() && workers[0].Name == p.Steering.Seed {
		results = append(results, e.parallel(mctx, p, workers[:1], 1)...)
		workers = workers[1:]
	}

	results = append(results, e.parallel(mctx, p, workers, max(e.o.WorkerParallelism, 1))...)

	for i, n := range controlPlanes {
		r := e.node(mctx, p, n)
		results = append(results, r)

		if r.Failed() {
			for _, rest := range controlPlanes[i+1:] {
				results = append(results, NodeResult{Node: rest.Name, Action: rest.Action, Outcome: state.OutcomeSkipped,
					Message: "not started: an earlier control plane failed, and the next one depends on its etcd member"})
			}

			break
		}
	}

	return results
}

// parallel runs nodes with at most k transactions at a time.
func (e *executor) parallel(ctx context.Context, p *plan.Plan, nodes []plan.NodePlan, k int) []NodeResult {
	results := make([]NodeResult, len(nodes))

	pool.Each(len(nodes), k, func(i int) { results[i] = e.node(ctx, p, nodes[i]) })

	return results
}

// node runs one node's transaction, unless the run is cancelled, the Lease lost, or the failure
// budget spent.
func (e *executor) node(ctx context.Context, p *plan.Plan, np plan.NodePlan) NodeResult {
	skip := func(outcome state.Outcome, msg string) NodeResult {
		return NodeResult{Node: np.Name, Action: np.Action, Outcome: outcome, Message: "not started: " + msg}
	}

	switch {
	case e.sig.Err() != nil:
		return skip(state.OutcomeSkipped, "the run was cancelled")
	case e.stopped():
		return skip(state.OutcomeFailed, "the Lease was lost")
	case e.budgetSpent():
		return skip(state.OutcomeSkipped, fmt.Sprintf("the failure budget is spent (nodes.max_failures = %d)", e.o.MaxFailures))
	case plan.NeverFits(np, e.o.Budget, e.o.Reserve):
		return skip(state.OutcomeFailed, fmt.Sprintf("its estimate (%s) is longer than the run's whole time budget (%s, less %s kept for the run's end): "+
			"no run within this budget can rotate it, so it is not left to the next one — raise --within or run.budget, or rotate it in a run without a budget",
			np.Estimate.Round(time.Second), e.o.Budget, e.o.Reserve))
	case e.outsideWindow(np):
		now := e.clock.Now()
		if _, closes, open := e.o.Window.Span(now); open {
			return skip(state.OutcomeDeferred, fmt.Sprintf("it reboots the node, and its estimate (%s) ends after the maintenance window (run.window %q) "+
				"closes at %s: a run in the next window rotates it (it opens %s)", np.Estimate.Round(time.Second), e.o.Window, closes.UTC().Format(time.RFC3339),
				e.o.Window.Next(closes).UTC().Format(time.RFC3339)))
		}

		return skip(state.OutcomeDeferred, fmt.Sprintf("it reboots the node, outside the maintenance window (run.window %q): a run in the window rotates it "+
			"(it opens %s)", e.o.Window, e.o.Window.Next(now).UTC().Format(time.RFC3339)))
	case e.outOfTime(np):
		left := e.o.Deadline.Sub(e.clock.Now()).Round(time.Second)

		return skip(state.OutcomeDeferred, fmt.Sprintf("its estimate (%s) does not fit in what is left of the run's time budget (%s, of which %s is kept "+
			"for the run's end): the next run rotates it", np.Estimate.Round(time.Second), max(left, 0), e.o.Reserve))
	}

	t := &txn{e: e, p: p, np: np, log: e.o.Logger.With("node", np.Name)}

	r := t.run(ctx)
	if r.Failed() {
		e.mu.Lock()
		e.failures++
		e.mu.Unlock()
	}

	if r.Outcome == state.OutcomeDone {
		e.record(np, r)
	}

	return r
}

// outsideWindow reports whether np would reboot its node outside the maintenance window: it is
// fenced, and its estimate does not end before the window closes. Live updates and keyring
// writes restart nothing and run at any hour.
func (e *executor) outsideWindow(np plan.NodePlan) bool {
	return e.o.Window != nil && np.Action == plan.ActionFence && !e.o.Window.Fits(e.clock.Now(), np.Estimate)
}

// outOfTime reports whether np's estimate would end past the run's deadline less its reserve:
// then it is not started (a node already started is always finished).
func (e *executor) outOfTime(np plan.NodePlan) bool {
	return !e.o.Deadline.IsZero() && e.clock.Now().Add(np.Estimate+e.o.Reserve).After(e.o.Deadline)
}

// record keeps what a rotated node took in the state (the estimate's samples) and marks it
// done in the rotation in progress. A state that cannot be written loses the sample only.
func (e *executor) record(np plan.NodePlan, r NodeResult) {
	x := state.Sample{Node: np.Name, Class: plan.ClassOf(np), Run: e.o.Holder, Finished: e.clock.Now().UTC(), Steps: map[string]float64{}}

	for _, t := range r.Timings {
		x.Seconds += t.Duration.Seconds()
		x.Steps[t.Step] += t.Duration.Seconds()
	}

	e.mu.Lock()
	defer e.mu.Unlock()

	e.st.AddSample(x)
	e.st.Rotated(np.Name)

	if err := e.store.Write(e.st); err != nil {
		e.o.Logger.Warn("the node's timings could not be recorded in the state", "node", np.Name, "error", err)
	}
}

// budgetSpent reports whether max_failures nodes have failed.
func (e *executor) budgetSpent() bool {
	e.mu.Lock()
	defer e.mu.Unlock()

	return e.failures >= e.o.MaxFailures
}

// quorum waits (up to ready_timeout) until the etcd gate lets node be taken down: every other
// control plane Ready, not cordoned, fenced by no one, its etcd member healthy and a voter, no
// alarm, enough voters left (plan.Quorum). Too few voters, every one healthy, is refused at
// once: no wait adds a member.
func (e *executor) quorum(ctx context.Context, node string) error {
	var tooFew error

	err := clock.Until(ctx, e.clock, e.o.ReadyTimeout, time.Second, func() (bool, error) {
		view, err := controlPlanes(ctx, e.nodes, e.etcd, node)
		if err != nil {
			return false, err
		}

		err = plan.Quorum(node, view, e.o.AllowQuorumLoss)
		if errors.Is(err, plan.ErrTooFewVoters) {
			tooFew = err

			return true, nil
		}

		return err == nil, err
	})

	return cmp.Or(tooFew, err)
}
