package apply

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/ghcrsync/ghcrsync/internal/answer"
	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/progress"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// errRefused marks a compare-and-swap whose read the judgement refused.
var errRefused = errors.New("refused by the judgement")

// errLeaseLost marks a guard failure caused by the Lease.
var errLeaseLost = errors.New("lease lost")

// guard is the re-validation before a mutation: the run is not cancelled, the Lease is live, the
// node is read (an API outage is ridden out up to ready_timeout), its Talos config is read before
// a claim or a Talos write, the judgement decides, and the Lease is asserted once more,
// immediately before the mutation (a wait for the Lease to come back starts over). It returns the
// node, or the result that ends the transaction.
func (t *txn) guard(ctx context.Context, step plan.Step) (*corev1.Node, *NodeResult) {
	deadline := t.e.clock.Now().Add(t.e.o.ReadyTimeout)

	for {
		if r := t.interrupted(); r != nil {
			return nil, r
		}

		if t.e.stopped() {
			return nil, t.leaseLost(step, t.e.stopErr)
		}

		if r := t.waitLease(ctx, step); r != nil {
			return nil, r
		}

		n, r := t.judged(ctx, step)
		if r != nil {
			return nil, r
		}

		err := t.e.lease.Assert()
		if err == nil {
			return n, nil
		}

		if t.e.clock.Now().After(deadline) {
			return nil, t.leaseLost(step, err)
		}
	}
}

// judged reads the node and asks the judgement, with the node's Talos facts before a claim or a
// Talos write.
func (t *txn) judged(ctx context.Context, step plan.Step) (*corev1.Node, *NodeResult) {
	n, v, r := t.current(ctx, step)
	if r != nil {
		return nil, r
	}

	if r := t.verdict(ctx, v, step); r != nil {
		return nil, r
	}

	if step != plan.StepClaim && step != plan.StepConfigure {
		return n, nil
	}

	// The facts it is judged on must be this node's: before the claim, the machine at the
	// address is asked who it is; before the Talos write, the address must still be the one the
	// claim pinned, and the machine there is asked again (isPinned).
	if r := t.isPinned(ctx, n, step); r != nil {
		return nil, r
	}

	facts, err := t.e.talos.ConfigFacts(ctx, plan.Node{InternalIP: t.ip}, t.e.o.Registry)
	if err != nil {
		if r := t.interrupted(); r != nil {
			return nil, r
		}

		return nil, t.refuseBeforeTalos(ctx, plan.Verdict{Decision: plan.Refuse, Reason: plan.ReasonTalosUnreachable, Detail: t.answer(err)}, step)
	}

	return n, t.verdict(ctx, t.judge(n, facts, step), step)
}

// current reads the node and judges it. While the judgement awaits the node's deletion (begun
// after its Talos write: nothing more is done to it), it reads again each poll for up to
// ready_timeout: a node gone is judged Gone, a deletion given up is judged afresh, and one still
// going on after that is refused (the fence stays).
func (t *txn) current(ctx context.Context, step plan.Step) (*corev1.Node, plan.Verdict, *NodeResult) {
	start := t.e.clock.Now()

	var lastSaid time.Time

	for {
		n, err := t.read(ctx)
		if err != nil {
			if r := t.interrupted(); r != nil {
				return nil, plan.Verdict{}, r
			}

			return nil, plan.Verdict{}, t.fail("read node: " + t.answer(err))
		}

		v := t.judge(n, nil, step)
		if v.Decision != plan.Await {
			return n, v, nil
		}

		elapsed := t.e.clock.Now().Sub(start)
		if elapsed >= t.e.o.ReadyTimeout {
			v.Decision, v.Detail = plan.Refuse, v.Detail+fmt.Sprintf("; still there after ready_timeout %s", t.e.o.ReadyTimeout)

			return n, v, nil
		}

		if lastSaid.IsZero() {
			t.log.Warn(v.Message(t.np.Name, step))
		}

		if now := t.e.clock.Now(); now.Sub(lastSaid) >= progressEvery {
			lastSaid = now
			t.e.o.Progress.Emit(progress.WaitingGone{Node: t.np.Name, Elapsed: elapsed, Timeout: t.e.o.ReadyTimeout, Why: v.Reason.Sentence(v.Detail)})
		}

		if t.e.stopped() {
			return nil, plan.Verdict{}, t.leaseLost(step, t.e.stopErr)
		}

		if err := t.e.sleep(ctx); err != nil {
			return nil, plan.Verdict{}, t.failOrInterrupted(t.answer(err))
		}
	}
}

// waitLease returns nil while the Lease is live, riding out an outage while it could still be
// ours; a Lost lease stops all mutation.
func (t *txn) waitLease(ctx context.Context, step plan.Step) *NodeResult {
	if err := t.leaseLive(ctx); err != nil {
		if r := t.interrupted(); r != nil {
			return r
		}

		return t.leaseLost(step, err)
	}

	return nil
}

// leaseLive returns nil while the Lease is held and live; an API outage (the endpoint node
// rebooting) is ridden out while the Lease could still be ours.
func (t *txn) leaseLive(ctx context.Context) error {
	if t.e.lease.Assert() == nil {
		return nil
	}

	wctx, cancel := t.e.clock.WithTimeout(ctx, t.e.o.ReadyTimeout)
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

	err := clock.Until(ctx, t.e.clock, t.e.o.ReadyTimeout, t.e.o.Poll, func() (bool, error) {
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
		obs := object.FromNode(n)
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

	return t.refuseBeforeTalos(ctx, v, step)
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
	t.phaseEvent(phase)

	if h := t.e.o.Hooks.BeforeMutation; h != nil {
		h(t.np.Name, phase)
	}

	return nil
}

// saved writes the record, or ends the transaction.
func (t *txn) saved() *NodeResult {
	if err := t.e.save(&t.rec); err != nil {
		return t.fail(t.answer(err))
	}

	return nil
}

// mirror writes the phase onto the node, judged as an annotation of what was done.
func (t *txn) mirror(ctx context.Context, phase state.Phase) *NodeResult {
	return t.patch(ctx, plan.StepAnnotate, "mirror phase "+string(phase), func(*corev1.Node) map[string]any { return object.PhasePatch(phase) }, nil)
}

// patch is a compare-and-swap patch of the node, judged on every read with the Lease asserted
// immediately before it: a read the judgement does not let through ends the transaction as that
// verdict says. An unreachable API is ridden out up to ready_timeout.
func (t *txn) patch(ctx context.Context, step plan.Step, what string, build func(*corev1.Node) map[string]any, between func(int)) *NodeResult {
	deadline := t.e.clock.Now().Add(t.e.o.ReadyTimeout)

	for {
		var (
			refused  *plan.Verdict
			leaseErr error
		)

		_, err := t.e.nodes.CASPatch(ctx, t.np.Name, 10, func(n *corev1.Node) error {
			if v := t.judge(n, nil, step); v.Decision != plan.Proceed {
				refused = &v

				return errRefused
			}

			if leaseErr = t.e.lease.Assert(); leaseErr != nil {
				return errLeaseLost
			}

			return nil
		}, build, between)

		if step == plan.StepClaim && err != nil {
			t.rec.Phase = state.PhaseSelected // the claim did not land
		}

		switch {
		case err == nil:
			return nil
		case refused != nil:
			return t.verdict(ctx, *refused, step)
		case apierrors.IsNotFound(err):
			return t.verdict(ctx, t.judge(nil, nil, step), step)
		case leaseErr != nil && t.e.clock.Now().Before(deadline):
			if r := t.waitLease(ctx, step); r != nil {
				return r
			}
		case leaseErr != nil:
			return t.leaseLost(step, leaseErr)
		case answer.Transient(err) && t.e.clock.Now().Before(deadline) && ctx.Err() == nil:
			t.log.Warn("the Kubernetes API is unreachable; retrying until ready_timeout", "write", what, "error", err)

			if err := t.e.sleep(ctx); err != nil {
				return t.failOrInterrupted(what + ": " + t.answer(err))
			}
		default:
			return t.failOrInterrupted(what + ": " + t.answer(err))
		}

		if step == plan.StepClaim {
			t.rec.Phase = state.PhaseClaimed // retrying the claim
		}
	}
}

// sleep waits one poll interval, or returns ctx's error.
func (e *executor) sleep(ctx context.Context) error { return e.sleepOr(ctx, nil) }

// sleepOr waits the poll interval, or less when changed signals first.
func (e *executor) sleepOr(ctx context.Context, changed <-chan struct{}) error {
	return clock.SleepOr(ctx, e.clock, e.o.Poll, changed)
}
