package apply

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// errRefused marks a compare-and-swap whose read the judgement refused.
var errRefused = errors.New("refused by the judgement")

// errLeaseLost marks a guard failure caused by the Lease.
var errLeaseLost = errors.New("lease lost")

// guard is the re-validation before a mutation: the Lease is live, the node is read (an API
// outage is ridden out up to ready_timeout), its Talos config is read before a Talos write, and
// the judgement decides. It returns the node, or the result that ends the transaction.
func (t *txn) guard(ctx context.Context, step plan.Step) (*corev1.Node, *NodeResult) {
	if err := t.leaseLive(ctx); err != nil {
		t.e.halt(err)

		return nil, t.fail(fmt.Sprintf("refusing to %s %s: %v: %v", step, t.np.Name, errLeaseLost, err))
	}

	n, err := t.read(ctx)
	if err != nil {
		return nil, t.fail("read node: " + err.Error())
	}

	if r := t.verdict(ctx, t.judge(n, nil, step), step); r != nil {
		return nil, r
	}

	if step == plan.StepClaim || step == plan.StepConfigure {
		// Before a claim or a Talos write, the node's Talos config too is as the plan saw it.
		facts, r := t.talosFacts(ctx, n, step)
		if r != nil {
			return nil, r
		}

		if r := t.verdict(ctx, t.judge(n, facts, step), step); r != nil {
			return nil, r
		}
	}

	return n, nil
}

// talosFacts reads the registry credential's digests in the node's active and staged configs.
func (t *txn) talosFacts(ctx context.Context, n *corev1.Node, step plan.Step) (*plan.TalosFacts, *NodeResult) {
	if t.ip == "" {
		t.ip = cluster.InternalIP(n)
	}

	active, staged, err := t.e.talos.Digests(ctx, t.ip, t.e.o.Registry)
	if err != nil {
		return nil, t.failKeepingFence(fmt.Sprintf("refusing to %s %s: its Talos config cannot be read: %v", step, t.np.Name, err))
	}

	return &plan.TalosFacts{ConfiguredDigest: active, StagedDigest: staged}, nil
}

// leaseLive returns nil while the Lease is held and live; an API outage (the endpoint node
// rebooting) is ridden out while the Lease could still be ours.
func (t *txn) leaseLive(ctx context.Context) error {
	if t.e.lease.Assert() == nil {
		return nil
	}

	wctx, cancel := context.WithTimeout(ctx, t.e.o.ReadyTimeout)
	defer cancel()

	if err := t.e.lease.WaitLive(wctx); err != nil {
		return err
	}

	t.log.Warn("the Lease is live again after an API outage; continuing")

	return nil
}

// read reads the node, retrying an unreachable API until ready_timeout; nil means NotFound.
func (t *txn) read(ctx context.Context) (*corev1.Node, error) {
	var (
		n      *corev1.Node
		warned bool
	)

	err := cluster.WaitFor(ctx, t.e.o.ReadyTimeout, t.e.o.Poll, func() (bool, error) {
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
	if apierrors.IsNotFound(err) {
		return nil, nil
	}

	return n, err
}

// judge asks the judgement about the node as read (nil: NotFound), with its Talos facts if read.
func (t *txn) judge(n *corev1.Node, facts *plan.TalosFacts, step plan.Step) plan.Verdict {
	s := plan.Subject{
		Planned: &t.np.Invariants, Phase: t.rec.Phase, Action: t.np.Action, Step: step,
		Holder: t.e.o.Holder, Desired: t.p.AuthDigest,
	}

	if n != nil {
		obs := cluster.FromNode(n)
		obs.Talos = facts
		s.Node = &obs
	}

	return t.e.judge(s)
}

// verdict acts on a verdict: nil to proceed, else the result that ends the transaction.
func (t *txn) verdict(ctx context.Context, v plan.Verdict, step plan.Step) *NodeResult {
	msg := v.Message(t.np.Name, step)

	switch v.Decision {
	case plan.Proceed:
		return nil
	case plan.Gone:
		r := t.finish(state.OutcomeGoneAfterMutation, v.Reason, msg)

		return &r
	case plan.Deselect:
		return t.deselect(ctx, v.Reason, msg)
	}

	r := t.finish(state.OutcomeFailed, v.Reason, msg)

	return &r
}

// deselect leaves the node to a later run, undoing a claim that landed.
func (t *txn) deselect(ctx context.Context, reason plan.Reason, msg string) *NodeResult {
	if t.np.Action == plan.ActionFence && t.rec.Phase.AtOrAfter(state.PhaseClaimed) {
		t.rec.Phase = state.PhaseReleased
		if err := t.e.save(&t.rec); err != nil {
			r := t.finish(state.OutcomeFailed, reason, msg+"; and "+err.Error())

			return &r
		}

		if err := t.undo(ctx); err != nil {
			r := t.finish(state.OutcomeFailed, reason, msg+"; releasing its fence failed: "+err.Error())

			return &r
		}

		msg += "; its fence was released"
	}

	r := t.finish(state.OutcomeDeselected, reason, msg)

	return &r
}

// advance judges the node, then records the phase: its mutation follows. Until the reboot, it
// also records the boot the node is on (the reboot must leave it).
func (t *txn) advance(ctx context.Context, step plan.Step, phase state.Phase) (*corev1.Node, *NodeResult) {
	n, r := t.guard(ctx, step)
	if r != nil {
		return nil, r
	}

	if !t.rec.Phase.AtOrAfter(state.PhaseRebooting) {
		t.rec.BootBefore = n.Status.NodeInfo.BootID
	}

	return n, t.enter(phase)
}

// enter writes the phase to the state, then runs the test hook; the mutation follows.
func (t *txn) enter(phase state.Phase) *NodeResult {
	t.rec.Phase = phase
	if r := t.saved(); r != nil {
		return r
	}

	t.log.Info(string(phase))

	if h := t.e.o.Hooks.BeforeMutation; h != nil {
		h(t.np.Name, phase)
	}

	return nil
}

// saved writes the record, or ends the transaction.
func (t *txn) saved() *NodeResult {
	if err := t.e.save(&t.rec); err != nil {
		return t.fail(err.Error())
	}

	return nil
}

// mirror writes the phase onto the node, judged as an annotation of what was done.
func (t *txn) mirror(ctx context.Context, phase state.Phase) *NodeResult {
	return t.patch(ctx, plan.StepAnnotate, "mirror phase "+string(phase), func(*corev1.Node) map[string]any { return cluster.PhasePatch(phase) }, nil)
}

// patch is a compare-and-swap patch of the node, judged on every read: a read the judgement does
// not let through ends the transaction as that verdict says.
func (t *txn) patch(ctx context.Context, step plan.Step, what string, build func(*corev1.Node) map[string]any, between func(int)) *NodeResult {
	var refused *plan.Verdict

	_, err := t.e.nodes.CASPatch(ctx, t.np.Name, 10, func(n *corev1.Node) error {
		if v := t.judge(n, nil, step); v.Decision != plan.Proceed {
			refused = &v

			return errRefused
		}

		return nil
	}, build, between)

	if step == plan.StepClaim && (refused != nil || err != nil) {
		t.rec.Phase = state.PhaseSelected // the claim did not land
	}

	switch {
	case refused != nil:
		return t.verdict(ctx, *refused, step)
	case apierrors.IsNotFound(err):
		return t.verdict(ctx, t.judge(nil, nil, step), step)
	case err != nil:
		return t.failKeepingFence(what + ": " + err.Error())
	}

	return nil
}

// finish records the outcome.
func (t *txn) finish(outcome state.Outcome, reason plan.Reason, msg string) NodeResult {
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

	return NodeResult{Node: t.np.Name, Action: t.np.Action, Outcome: outcome, Reason: reason, Message: msg}
}

// fail ends the transaction as failed.
func (t *txn) fail(msg string) *NodeResult {
	r := t.finish(state.OutcomeFailed, "", msg)

	return &r
}

// failKeepingFence fails closed: the fence stays, recorded, for `ghcrsync release`.
func (t *txn) failKeepingFence(msg string) *NodeResult {
	if t.np.Action == plan.ActionFence {
		return t.fail(msg + "; the fence stays in place (see `ghcrsync fences`)")
	}

	return t.fail(msg)
}

// sleep waits one poll interval, or returns ctx's error.
func (e *executor) sleep(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(e.o.Poll):
		return nil
	}
}
