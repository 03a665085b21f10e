// Package apply executes a saved plan. Each node's rotation is a transaction whose phases are
// exactly the state file's phases (state.Phase): every phase is written to the state before its
// mutation, re-validated against the plan's invariants and the live node, and mirrored on the
// node. Workers run concurrently (bounded), control planes one at a time behind an etcd quorum
// check, the API endpoint's node last.
package apply

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/taints"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// Nodes is what the executor needs from Kubernetes.
type Nodes interface {
	Get(ctx context.Context, name string) (*corev1.Node, error)
	// ControlPlanes lists every control-plane Node of the cluster (not only the plan's).
	ControlPlanes(ctx context.Context) ([]corev1.Node, error)
	CASPatch(ctx context.Context, name string, attempts int, check func(*corev1.Node) error,
		build func(*corev1.Node) map[string]any, between func(attempt int)) (*corev1.Node, error)
	Drain(ctx context.Context, node string, timeout time.Duration, out io.Writer) error
	ProveRuntime(ctx context.Context, node, namespace, image string, timeout time.Duration) error
}

// Talos is what the executor needs from the Talos API.
type Talos interface {
	Configure(ctx context.Context, node, registry, username, password string, live bool) error
	Reboot(ctx context.Context, node string) error
	EtcdHealthy(ctx context.Context, node string) error
}

// Lease is the run's Lease, as the executor uses it.
type Lease interface {
	Assert() error
	WaitLive(ctx context.Context) error
}

// Store persists the state.
type Store interface {
	Write(*state.State) error
}

// Hooks let tests act at exact points. Production leaves them nil.
type Hooks struct {
	// BeforeMutation runs after a phase is written to the state and before its mutation.
	BeforeMutation func(node string, phase state.Phase)
	// BetweenReadAndClaim runs after the claim read the node and before it patches it.
	BetweenReadAndClaim func(node string, attempt int)
}

// Options configure a run.
type Options struct {
	Holder             string
	Registry           string
	Username, Password string // the credential; only handed to Talos
	DrainTimeout       time.Duration
	ReadyTimeout       time.Duration
	WorkerParallelism  int
	ProbeImage         string
	ProbeNamespace     string
	Logger             hclog.Logger
	Progress           io.Writer // drain progress
	Hooks              Hooks
}

// Executor runs a plan's node transactions.
type Executor struct {
	nodes Nodes
	talos Talos
	lease Lease
	store Store
	o     Options
	now   func() time.Time

	mu sync.Mutex
	st *state.State

	stop     chan struct{} // closed when the Lease is lost: no new mutation starts
	stopOnce sync.Once
}

// New makes an executor writing into st through store.
func New(nodes Nodes, talos Talos, lease Lease, store Store, st *state.State, o Options) *Executor {
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}

	if o.Progress == nil {
		o.Progress = io.Discard
	}

	return &Executor{nodes: nodes, talos: talos, lease: lease, store: store, st: st, o: o, now: time.Now, stop: make(chan struct{})}
}

// Result is one node's outcome.
type Result struct {
	Node    string
	Action  plan.Action
	Outcome string // state.Outcome*
	Reason  plan.Reason
	Message string
}

// Failed reports whether the outcome makes the run fail.
func (r Result) Failed() bool { return r.Outcome == state.OutcomeFailed }

// save records rec in the state and writes it: always before the mutation it announces.
func (e *Executor) save(rec *state.Record) error {
	e.mu.Lock()
	defer e.mu.Unlock()

	rec.Updated = e.now().UTC()
	e.st.Put(*rec)

	if err := e.store.Write(e.st); err != nil {
		return fmt.Errorf("write state before %s of %s: %w", rec.Phase, rec.Node, err)
	}

	return nil
}

func (e *Executor) stopped() bool {
	select {
	case <-e.stop:
		return true
	default:
		return false
	}
}

func (e *Executor) halt(err error) {
	e.stopOnce.Do(func() {
		e.o.Logger.Error("stopping all mutation", "error", err)
		close(e.stop)
	})
}

// Run executes the plan's fence and apply-live nodes in order and returns every node's result.
func (e *Executor) Run(ctx context.Context, p *plan.Plan) []Result {
	var workers, controlPlanes []plan.NodePlan

	for _, n := range p.Nodes {
		if n.Order == 0 {
			continue
		}

		if n.Role == plan.RoleControlPlane {
			controlPlanes = append(controlPlanes, n)
		} else {
			workers = append(workers, n)
		}
	}

	results := make([]Result, 0, len(workers)+len(controlPlanes))

	var rmu sync.Mutex

	add := func(r Result) {
		rmu.Lock()
		results = append(results, r)
		rmu.Unlock()
	}

	sem := make(chan struct{}, max(e.o.WorkerParallelism, 1))

	var wg sync.WaitGroup

	for _, n := range workers {
		wg.Add(1)

		go func() {
			defer wg.Done()

			sem <- struct{}{}
			defer func() { <-sem }()

			add(e.node(ctx, p, n))
		}()
	}

	wg.Wait()

	cpFailed := false

	for _, n := range controlPlanes {
		if cpFailed {
			add(Result{Node: n.Name, Action: n.Action, Outcome: state.OutcomeFailed,
				Message: "not started: an earlier control plane failed, and the next one depends on its etcd member"})

			continue
		}

		r := e.node(ctx, p, n)
		add(r)
		cpFailed = r.Failed()
	}

	return results
}

// node runs one node's transaction.
func (e *Executor) node(ctx context.Context, p *plan.Plan, np plan.NodePlan) Result {
	if e.stopped() {
		return Result{Node: np.Name, Action: np.Action, Outcome: state.OutcomeFailed, Message: "not started: the Lease was lost"}
	}

	t := &txn{e: e, p: p, np: np, log: e.o.Logger.With("node", np.Name)}

	return t.run(ctx)
}

// txn is one node's transaction.
type txn struct {
	e   *Executor
	p   *plan.Plan
	np  plan.NodePlan
	log hclog.Logger
	rec state.Record
	ip  string
}

func (t *txn) result(outcome string, reason plan.Reason, msg string) Result {
	return Result{Node: t.np.Name, Action: t.np.Action, Outcome: outcome, Reason: reason, Message: msg}
}

// finish records the outcome. phase is where the node was left.
func (t *txn) finish(outcome string, reason plan.Reason, msg string) Result {
	now := t.e.now().UTC()
	t.rec.Outcome, t.rec.Reason, t.rec.Finished = outcome, string(reason), &now

	if outcome == state.OutcomeFailed {
		t.rec.LastError = msg
	}

	if err := t.e.save(&t.rec); err != nil {
		msg += "; and the state could not be written: " + err.Error()
	}

	switch outcome {
	case state.OutcomeFailed:
		t.log.Error("failed", "phase", t.rec.Phase, "error", msg)
	case state.OutcomeDeselected, state.OutcomeGoneAfterMutation:
		t.log.Warn(msg)
	default:
		t.log.Info(msg)
	}

	return t.result(outcome, reason, msg)
}

// enter writes the phase to the state, then runs the test hook; the mutation follows.
func (t *txn) enter(phase state.Phase) error {
	t.rec.Phase = phase
	if err := t.e.save(&t.rec); err != nil {
		return err
	}

	t.log.Info(string(phase))

	if h := t.e.o.Hooks.BeforeMutation; h != nil {
		h(t.np.Name, phase)
	}

	return nil
}

func (t *txn) run(ctx context.Context) Result {
	now := t.e.now().UTC()
	t.rec = state.Record{
		Node: t.np.Name, UID: t.np.UID, Owner: t.e.o.Holder, Action: string(t.np.Action),
		Phase: state.PhaseSelected, WasCordoned: t.np.Invariants.Unschedulable,
		InitialTaints: t.np.Invariants.SchedulingTaints, DesiredRevision: t.p.CredentialRevision,
		Started: now,
	}

	if t.np.Role == plan.RoleControlPlane {
		if err := t.e.quorum(ctx, t.np.Name); err != nil {
			return t.finish(state.OutcomeFailed, "", "etcd quorum not confirmed before claiming a control plane: "+err.Error())
		}
	}

	n, err := t.e.nodes.Get(ctx, t.np.Name)
	if apierrors.IsNotFound(err) {
		return t.finish(state.OutcomeDeselected, plan.ReasonNotFound, plan.ReasonNotFound.Sentence(t.np.Name, "deleted after the plan was made"))
	}

	if err != nil {
		return t.finish(state.OutcomeFailed, "", "read node: "+err.Error())
	}

	if v := Validate(t.np, n, t.e.o.Holder); v != nil {
		return t.finish(v.outcome(), v.Reason, v.Message)
	}

	t.ip = internalIP(n)
	t.rec.BootBefore = n.Status.NodeInfo.BootID

	if err := t.e.save(&t.rec); err != nil {
		return t.finish(state.OutcomeFailed, "", err.Error())
	}

	if t.np.Action == plan.ActionApplyLive {
		return t.live(ctx)
	}

	return t.fence(ctx)
}

// Violation is why a node may not be (or no longer be) acted on.
type Violation struct {
	Reason  plan.Reason // set for a deselection; empty for a genuine safety violation
	Message string
}

func (v *Violation) outcome() string {
	switch v.Reason {
	case plan.ReasonNotFound, plan.ReasonDeleting, plan.ReasonAutoscalerDeleting:
		return state.OutcomeDeselected
	}

	return state.OutcomeFailed
}

func (v *Violation) Error() string { return v.Message }

// Validate compares the live node with the plan's invariants before anything is done to it.
// Routine autoscaler and deletion events deselect; anything else that changed is refused.
func Validate(np plan.NodePlan, n *corev1.Node, holder string) *Violation {
	if string(n.UID) != np.Invariants.UID {
		return &Violation{plan.ReasonNotFound, plan.ReasonNotFound.Sentence(np.Name, "it was replaced by a new Node of the same name (uid "+string(n.UID)+")")}
	}

	if n.DeletionTimestamp != nil {
		return &Violation{plan.ReasonDeleting, fmt.Sprintf("deselected %s: it is being deleted (deletionTimestamp %s)", np.Name, n.DeletionTimestamp.UTC().Format(time.RFC3339))}
	}

	ts := cluster.Taints(n.Spec.Taints)
	if tbd, ok := taints.Find(ts, taints.ToBeDeleted); ok {
		return &Violation{plan.ReasonAutoscalerDeleting, fmt.Sprintf("deselected %s: the cluster autoscaler is deleting it (%s since %s)", np.Name, taints.ToBeDeleted, unixTime(tbd.Value))}
	}

	if owner := n.Annotations[plan.OwnerAnnotation]; owner != "" && owner != holder {
		return &Violation{plan.ReasonFencedByOther, fmt.Sprintf("refusing %s: it is fenced by another run (%s=%s); see `ghcrsync fences`", np.Name, plan.OwnerAnnotation, owner)}
	}

	if !cluster.Ready(n) {
		return &Violation{plan.ReasonNotReady, plan.ReasonNotReady.Sentence(np.Name, "since the plan was made")}
	}

	if n.Spec.Unschedulable != np.Invariants.Unschedulable {
		return &Violation{"", fmt.Sprintf("refusing %s: it was %s outside ghcrsync since the plan", np.Name, map[bool]string{true: "cordoned", false: "uncordoned"}[n.Spec.Unschedulable])}
	}

	if now := taints.Scheduling(ts); !slices.Equal(now, np.Invariants.SchedulingTaints) {
		added, removed := taints.Diff(np.Invariants.SchedulingTaints, now)

		return &Violation{"", fmt.Sprintf("refusing %s: its taints changed outside ghcrsync: %s", np.Name, taints.DescribeDiff(added, removed))}
	}

	return nil
}

func internalIP(n *corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}

	return ""
}

func unixTime(v string) string {
	var sec int64
	if _, err := fmt.Sscanf(v, "%d", &sec); err != nil {
		return fmt.Sprintf("%q", v)
	}

	return time.Unix(sec, 0).UTC().Format(time.RFC3339)
}

// errLeaseLost marks a guard failure caused by the Lease.
var errLeaseLost = errors.New("lease lost")

// guard runs before every mutation: the Lease is held and live, and the node is still ours with
// the scheduling state the claim left, and Ready unless notReadyExpected (while it reboots). It returns the live node, or a Result that ends the
// transaction.
func (t *txn) guard(ctx context.Context, notReadyExpected bool, next string) (*corev1.Node, *Result) {
	if err := t.e.lease.Assert(); err != nil {
		// An API outage (the endpoint node rebooting) is ridden out while the Lease could still be ours.
		wctx, cancel := context.WithTimeout(ctx, t.e.o.ReadyTimeout)
		err = t.e.lease.WaitLive(wctx)
		cancel()

		if err != nil {
			t.e.halt(err)
			r := t.finish(state.OutcomeFailed, "", fmt.Sprintf("refusing to %s %s: %v: %v", next, t.np.Name, errLeaseLost, err))

			return nil, &r
		}

		t.log.Warn("the Lease is live again after an API outage; continuing")
	}

	var (
		n      *corev1.Node
		warned bool
	)

	err := cluster.WaitFor(ctx, t.e.o.ReadyTimeout, 500*time.Millisecond, func() (bool, error) {
		var err error

		n, err = t.e.nodes.Get(ctx, t.np.Name)
		if err == nil || apierrors.IsNotFound(err) {
			return true, err
		}

		if !warned {
			t.log.Warn("the Kubernetes API is unreachable; retrying until ready_timeout", "error", err)
			warned = true
		}

		return false, err
	})

	mutated := t.rec.Phase.AtOrAfter(state.PhaseConfigured)

	switch {
	case apierrors.IsNotFound(err) || (err == nil && string(n.UID) != t.rec.UID):
		if mutated {
			r := t.finish(state.OutcomeGoneAfterMutation, plan.ReasonNotFound, t.np.Name+" disappeared after its Talos config was written; nothing left to release")

			return nil, &r
		}

		r := t.finish(state.OutcomeDeselected, plan.ReasonNotFound, "deselected "+t.np.Name+": it was deleted during the run; nothing left to release")

		return nil, &r
	case err != nil:
		r := t.finish(state.OutcomeFailed, "", "read node: "+err.Error())

		return nil, &r
	}

	if owner := n.Annotations[plan.OwnerAnnotation]; t.rec.Phase.AtOrAfter(state.PhaseClaimed) && t.np.Action == plan.ActionFence && owner != t.e.o.Holder {
		r := t.finish(state.OutcomeFailed, "", fmt.Sprintf("refusing to %s %s: its owner changed outside ghcrsync (%s=%q)", next, t.np.Name, plan.OwnerAnnotation, owner))

		return nil, &r
	}

	deleting := n.DeletionTimestamp != nil
	_, tbd := taints.Find(cluster.Taints(n.Spec.Taints), taints.ToBeDeleted)

	if (deleting || tbd) && !mutated {
		msg := "deselected " + t.np.Name + ": it is being deleted"
		reason := plan.ReasonDeleting

		if tbd {
			msg, reason = "deselected "+t.np.Name+": the cluster autoscaler is deleting it ("+taints.ToBeDeleted+")", plan.ReasonAutoscalerDeleting
		}

		r := t.releaseAndDeselect(ctx, reason, msg)

		return nil, &r
	}

	if t.np.Action == plan.ActionFence && t.rec.Phase.AtOrAfter(state.PhaseClaimed) {
		if !n.Spec.Unschedulable {
			r := t.finish(state.OutcomeFailed, "", fmt.Sprintf("refusing to %s %s: it was uncordoned outside ghcrsync", next, t.np.Name))

			return nil, &r
		}

		if now := taints.Scheduling(cluster.Taints(n.Spec.Taints)); !slices.Equal(now, t.rec.InitialTaints) {
			added, removed := taints.Diff(t.rec.InitialTaints, now)
			r := t.finish(state.OutcomeFailed, "", fmt.Sprintf("refusing to %s %s: its taints changed outside ghcrsync: %s", next, t.np.Name, taints.DescribeDiff(added, removed)))

			return nil, &r
		}
	}

	if deleting || tbd {
		r := t.finish(state.OutcomeFailed, "", t.np.Name+" is being deleted after its Talos config was written; its fence stays recorded")

		return nil, &r
	}

	if !notReadyExpected && !cluster.Ready(n) {
		r := t.finish(state.OutcomeFailed, "", fmt.Sprintf("refusing to %s %s: it is not Ready, and ghcrsync only acts on a node it can prove afterwards", next, t.np.Name))

		return nil, &r
	}

	return n, nil
}

// claim is the compare-and-swap claim: re-read, re-validated and retried on conflict.
func (t *txn) claim(ctx context.Context) (*corev1.Node, *Result) {
	if _, r := t.guard(ctx, false, "claim"); r != nil {
		return nil, r
	}

	if err := t.enter(state.PhaseClaimed); err != nil {
		r := t.finish(state.OutcomeFailed, "", err.Error())

		return nil, &r
	}

	var violation *Violation

	n, err := t.e.nodes.CASPatch(ctx, t.np.Name, 5,
		func(n *corev1.Node) error {
			if v := Validate(t.np, n, t.e.o.Holder); v != nil {
				violation = v

				return v
			}

			return nil
		},
		func(n *corev1.Node) map[string]any {
			t.rec.ScaleDownGuardOurs = n.Annotations[cluster.ScaleDownDisabledAnnotation] != "true"

			return cluster.ClaimPatch(n, t.e.o.Holder, t.fenceRecord())
		},
		func(attempt int) {
			if h := t.e.o.Hooks.BetweenReadAndClaim; h != nil {
				h(t.np.Name, attempt)
			}
		})

	switch {
	case violation != nil:
		t.rec.Phase = state.PhaseSelected // the claim did not land

		r := t.finish(violation.outcome(), violation.Reason, violation.Message)

		return nil, &r
	case apierrors.IsNotFound(err):
		t.rec.Phase = state.PhaseSelected

		r := t.finish(state.OutcomeDeselected, plan.ReasonNotFound, "deselected "+t.np.Name+": it was deleted before the claim")

		return nil, &r
	case err != nil:
		t.rec.Phase = state.PhaseSelected

		r := t.finish(state.OutcomeFailed, "", "claim: "+err.Error())

		return nil, &r
	}

	if err := t.e.save(&t.rec); err != nil { // records scale_down_guard_ours
		r := t.finish(state.OutcomeFailed, "", err.Error())

		return nil, &r
	}

	return n, nil
}

func (t *txn) fenceRecord() cluster.FenceRecord {
	return cluster.FenceRecord{
		UID: t.rec.UID, WasCordoned: t.rec.WasCordoned, InitialTaints: t.rec.InitialTaints,
		DesiredRevision: t.rec.DesiredRevision, ScaleDownGuardOurs: t.rec.ScaleDownGuardOurs,
	}
}

// mirror writes the phase onto the node (a CAS that only requires the node to still be ours).
func (t *txn) mirror(ctx context.Context, phase state.Phase) error {
	_, err := t.e.nodes.CASPatch(ctx, t.np.Name, 10, t.ours, func(*corev1.Node) map[string]any { return cluster.PhasePatch(string(phase)) }, nil)

	return err
}

func (t *txn) ours(n *corev1.Node) error {
	if string(n.UID) != t.rec.UID {
		return fmt.Errorf("%s was replaced (uid %s)", t.np.Name, n.UID)
	}

	if owner := n.Annotations[plan.OwnerAnnotation]; owner != t.e.o.Holder {
		return fmt.Errorf("%s is not ours (%s=%q)", t.np.Name, plan.OwnerAnnotation, owner)
	}

	return nil
}

// release removes the fence with a CAS requiring it to still be ours. A deleted node is released.
func (t *txn) release(ctx context.Context) error {
	_, err := t.e.nodes.CASPatch(ctx, t.np.Name, 10,
		func(n *corev1.Node) error {
			if string(n.UID) != t.rec.UID {
				return errReplaced // nothing of ours is on the new object
			}

			if owner := n.Annotations[plan.OwnerAnnotation]; owner != "" && owner != t.e.o.Holder {
				return fmt.Errorf("%s is fenced by another run (%s), not releasing it", t.np.Name, owner)
			}

			return nil
		},
		func(*corev1.Node) map[string]any { return cluster.ReleasePatch(t.fenceRecord()) }, nil)
	if apierrors.IsNotFound(err) || errors.Is(err, errReplaced) {
		return nil // a deleted Node carries no cordon
	}

	return err
}

var errReplaced = errors.New("replaced by a new Node of the same name")

// releaseAndDeselect undoes a fence that did not reach Talos and deselects the node.
func (t *txn) releaseAndDeselect(ctx context.Context, reason plan.Reason, msg string) Result {
	if t.rec.Phase.AtOrAfter(state.PhaseClaimed) {
		t.rec.Phase = state.PhaseReleased
		if err := t.e.save(&t.rec); err != nil {
			return t.finish(state.OutcomeFailed, reason, msg+"; and "+err.Error())
		}

		if err := t.release(ctx); err != nil {
			return t.finish(state.OutcomeFailed, reason, msg+"; releasing its fence failed: "+err.Error())
		}

		msg += "; its fence was released"
	}

	return t.finish(state.OutcomeDeselected, reason, msg)
}

// fence runs claim → guarded → drained → configured → rebooting → ready → proved → released.
func (t *txn) fence(ctx context.Context) Result {
	if _, r := t.claim(ctx); r != nil {
		return *r
	}

	// Guarded: after the claim, the autoscaler may already have started deleting the node.
	if _, r := t.guard(ctx, false, "guard"); r != nil {
		return *r
	}

	if err := t.enter(state.PhaseGuarded); err != nil {
		return t.finish(state.OutcomeFailed, "", err.Error())
	}

	if err := t.mirror(ctx, state.PhaseGuarded); err != nil {
		return t.failKeepingFence("mirror phase: " + err.Error())
	}

	if _, r := t.guard(ctx, false, "drain"); r != nil {
		return *r
	}

	if err := t.enter(state.PhaseDrained); err != nil {
		return t.finish(state.OutcomeFailed, "", err.Error())
	}

	if err := t.e.nodes.Drain(ctx, t.np.Name, t.e.o.DrainTimeout, t.e.o.Progress); err != nil {
		// Nothing reached Talos: restore the node.
		t.rec.Phase = state.PhaseReleased
		_ = t.e.save(&t.rec)

		if rerr := t.release(ctx); rerr != nil {
			return t.finish(state.OutcomeFailed, "", err.Error()+"; restoring the node failed too: "+rerr.Error())
		}

		return t.finish(state.OutcomeFailed, "", err.Error()+"; the node was restored (fence released)")
	}

	_ = t.mirror(ctx, state.PhaseDrained)

	if r := t.configure(ctx, false); r != nil {
		return *r
	}

	_ = t.mirror(ctx, state.PhaseConfigured)

	n, r := t.guard(ctx, false, "reboot")
	if r != nil {
		return *r
	}

	t.rec.BootBefore = n.Status.NodeInfo.BootID

	if err := t.enter(state.PhaseRebooting); err != nil {
		return t.finish(state.OutcomeFailed, "", err.Error())
	}

	_ = t.mirror(ctx, state.PhaseRebooting)

	if err := t.e.talos.Reboot(ctx, t.ip); err != nil {
		return t.talosFailed(ctx, "reboot", err)
	}

	if r := t.waitReady(ctx); r != nil {
		return *r
	}

	return t.proveAndRelease(ctx, true)
}

// waitReady waits for a new boot ID, Ready, and no lifecycle taints, re-checking the guard.
func (t *txn) waitReady(ctx context.Context) *Result {
	deadline := t.e.now().Add(t.e.o.ReadyTimeout)

	for {
		n, r := t.guard(ctx, true, "keep waiting for")
		if r != nil {
			return r
		}

		boot := n.Status.NodeInfo.BootID
		lifecycle := slices.ContainsFunc(n.Spec.Taints, func(x corev1.Taint) bool { return taints.Lifecycle(x.Key) })

		if boot != "" && boot != t.rec.BootBefore && cluster.Ready(n) && !lifecycle {
			t.rec.BootAfter = boot

			if err := t.enter(state.PhaseReady); err != nil {
				r := t.finish(state.OutcomeFailed, "", err.Error())

				return &r
			}

			_ = t.mirror(ctx, state.PhaseReady)

			return nil
		}

		if t.e.now().After(deadline) {
			r := t.failKeepingFence(fmt.Sprintf("%s did not come back Ready with a new boot within %s (boot %s, Ready %t, lifecycle taints %t)",
				t.np.Name, t.e.o.ReadyTimeout, boot, cluster.Ready(n), lifecycle))

			return &r
		}

		select {
		case <-ctx.Done():
			r := t.failKeepingFence(ctx.Err().Error())

			return &r
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// proveAndRelease proves the runtime, marks the node, and (for a fence) releases it.
func (t *txn) proveAndRelease(ctx context.Context, fenced bool) Result {
	n, r := t.guard(ctx, false, "prove")
	if r != nil {
		return *r
	}

	if err := t.enter(state.PhaseProved); err != nil {
		return t.finish(state.OutcomeFailed, "", err.Error())
	}

	if err := t.e.nodes.ProveRuntime(ctx, t.np.Name, t.e.o.ProbeNamespace, t.e.o.ProbeImage, t.e.o.ReadyTimeout); err != nil {
		return t.failKeepingFence("not proved: " + err.Error())
	}

	boot := n.Status.NodeInfo.BootID
	if _, err := t.e.nodes.CASPatch(ctx, t.np.Name, 10, func(n *corev1.Node) error {
		if string(n.UID) != t.rec.UID {
			return fmt.Errorf("%s was replaced", t.np.Name)
		}

		return nil
	}, func(*corev1.Node) map[string]any { return cluster.MarkPatch(t.rec.DesiredRevision, boot) }, nil); err != nil {
		return t.failKeepingFence("write verified marker: " + err.Error())
	}

	if fenced {
		if _, r := t.guard(ctx, false, "release"); r != nil {
			return *r
		}

		if err := t.enter(state.PhaseReleased); err != nil {
			return t.finish(state.OutcomeFailed, "", err.Error())
		}

		if err := t.release(ctx); err != nil {
			return t.failKeepingFence("release: " + err.Error())
		}

		return t.finish(state.OutcomeDone, "", fmt.Sprintf("rotated: boot %s → %s, runtime proved, fence released", short(t.rec.BootBefore), short(t.rec.BootAfter)))
	}

	t.rec.Phase = state.PhaseReleased

	return t.finish(state.OutcomeDone, "", "rotated live: runtime proved, no cordon, no reboot")
}

// live runs selected → configured → proved → released for a node whose Talos reloads live.
func (t *txn) live(ctx context.Context) Result {
	if r := t.configure(ctx, true); r != nil {
		return *r
	}

	return t.proveAndRelease(ctx, false)
}

// configure is the configured phase: guard, record, write the credential into the machine
// config (live, or staged for the next boot).
func (t *txn) configure(ctx context.Context, live bool) *Result {
	if _, r := t.guard(ctx, false, "configure"); r != nil {
		return r
	}

	if err := t.enter(state.PhaseConfigured); err != nil {
		r := t.finish(state.OutcomeFailed, "", err.Error())

		return &r
	}

	if err := t.e.talos.Configure(ctx, t.ip, t.e.o.Registry, t.e.o.Username, t.e.o.Password, live); err != nil {
		r := t.talosFailed(ctx, "configure", err)

		return &r
	}

	return nil
}

// talosFailed classifies a failed Talos call: a node that vanished meanwhile is recorded as
// such; anything else fails closed.
func (t *txn) talosFailed(ctx context.Context, step string, err error) Result {
	if _, r := t.guard(ctx, true, step); r != nil {
		return *r
	}

	return t.failKeepingFence(step + ": " + err.Error())
}

// failKeepingFence fails closed: the fence stays, recorded, for `ghcrsync release`.
func (t *txn) failKeepingFence(msg string) Result {
	return t.finish(state.OutcomeFailed, "", msg+"; the fence stays in place (see `ghcrsync fences`)")
}

// quorum waits until every other control plane of the cluster is Ready and its etcd member
// healthy.
func (e *Executor) quorum(ctx context.Context, node string) error {
	return cluster.WaitFor(ctx, e.o.ReadyTimeout, time.Second, func() (bool, error) {
		cps, err := e.nodes.ControlPlanes(ctx)
		if err != nil {
			return false, err
		}

		for i := range cps {
			cp := &cps[i]
			if cp.Name == node {
				continue
			}

			if !cluster.Ready(cp) {
				return false, fmt.Errorf("control plane %s is not Ready", cp.Name)
			}

			if err := e.talos.EtcdHealthy(ctx, internalIP(cp)); err != nil {
				return false, fmt.Errorf("control plane %s: %w", cp.Name, err)
			}
		}

		return true, nil
	})
}

func short(s string) string {
	if len(s) > 8 {
		return s[:8]
	}

	return strings.TrimSpace(s)
}
