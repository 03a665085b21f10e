package apply

import (
	"context"
	"fmt"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/fence"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// The endings of a node's transaction, in one place: each writes the record's outcome (finish)
// and says what is left on the cluster. Before the Talos write an ending undoes the claim
// (unclaim: the state first, then the undo); after it, the fence stays for `ghcrsync release`.

// leaseLost stops all mutation of the run and ends the transaction, saying why.
func (t *txn) leaseLost(step plan.Step, err error) *NodeResult {
	t.e.halt(err)

	return t.failKeepingFence(fmt.Sprintf("refusing to %s %s: %v: %v; no further mutation starts", step, t.np.Name, errLeaseLost, err))
}

// refuseBeforeTalos fails the node on a refusal. Before its Talos write, nothing was changed on
// the machine, so a claim that landed is undone (cordon restored as recorded, ghcrsync's
// annotations and scale-down guard removed, other taints untouched); after it, the fence stays.
func (t *txn) refuseBeforeTalos(ctx context.Context, v plan.Verdict, step plan.Step) *NodeResult {
	msg := v.Message(t.np.Name, step)

	switch {
	case t.claimLanded() && t.rec.Phase.TalosWritten():
		msg += "; its Talos config was already written, so the fence stays (see `ghcrsync fences`)"
	case t.claimLanded():
		if err := t.unclaim(ctx); err != nil {
			msg += "; nothing reached Talos, but " + t.answer(err)
		} else {
			msg += "; nothing reached Talos, so its claim was undone (cordon restored as recorded, ghcrsync's annotations removed, other taints untouched)"
		}
	}

	r := t.finish(state.OutcomeFailed, v.Reason, msg)

	return &r
}

// claimLanded reports whether this transaction's claim is on the node.
func (t *txn) claimLanded() bool {
	return t.np.Action == plan.ActionFence && t.rec.Phase.AtOrAfter(state.PhaseClaimed)
}

// unclaim undoes a claim that did not reach Talos: the record says released first (a kill -9
// between the two leaves `release` to finish it), then the fence comes off. A cancelled run
// still gets a few seconds to do it. The error says which half failed.
func (t *txn) unclaim(ctx context.Context) error {
	t.rec.Phase = state.PhaseReleased
	if err := t.e.save(&t.rec); err != nil {
		return fmt.Errorf("the state could not be written, so the fence stays: %w", err)
	}

	if ctx.Err() != nil {
		cctx, cancel := t.e.clock.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()

		ctx = cctx
	}

	// Before the Talos write: the node keeps an unproven hold it had before the claim.
	if err := t.undo(ctx, t.rec.HeldUnproven); err != nil {
		return fmt.Errorf("undoing its claim failed: %w", err)
	}

	return nil
}

// interrupted ends the transaction when the run was cancelled (SIGINT, SIGTERM). Before the
// node's Talos write, a claim that landed is undone and the node recorded cancelled; after it,
// the fence stays, recorded at its phase, for `ghcrsync release`.
func (t *txn) interrupted() *NodeResult {
	if t.e.sig.Err() == nil {
		return nil
	}

	phase := t.rec.Phase

	var msg string

	switch {
	case phase.TalosWritten() && t.claimLanded():
		msg = "cancelled after its Talos config was written: the fence stays, recorded at phase " + string(phase) + " (release it with `ghcrsync release`)"
	case phase.TalosWritten():
		msg = "cancelled after its Talos config was written; nothing is fenced"
	case t.claimLanded():
		if err := t.unclaim(t.e.sig); err != nil {
			msg = "cancelled before its Talos write, but " + t.answer(err)
		} else {
			msg = "cancelled before its Talos write: its claim was undone (cordon restored as recorded)"
		}
	default:
		msg = "cancelled before anything was done to it"
	}

	r := t.finish(state.OutcomeCancelled, "", msg)

	return &r
}

// deselect leaves the node to a later run, undoing a claim that landed.
func (t *txn) deselect(ctx context.Context, reason plan.Reason, msg string) *NodeResult {
	if t.claimLanded() {
		if err := t.unclaim(ctx); err != nil {
			r := t.finish(state.OutcomeFailed, reason, msg+"; "+t.answer(err))

			return &r
		}

		msg += "; its fence was released"
	}

	r := t.finish(state.OutcomeDeselected, reason, msg)

	return &r
}

// failOrInterrupted is failKeepingFence, unless the failure came from a cancelled run or a lost
// Lease (which stops mutations in flight): then it says that.
func (t *txn) failOrInterrupted(msg string) *NodeResult {
	if r := t.interrupted(); r != nil {
		return r
	}

	if t.e.stopped() {
		return t.failKeepingFence(fmt.Sprintf("%s: stopped: %v: %v; no further mutation starts", msg, errLeaseLost, t.e.stopErr))
	}

	return t.failKeepingFence(msg)
}

// finish records the outcome.
func (t *txn) finish(outcome state.Outcome, reason plan.Reason, msg string) NodeResult {
	now := t.e.clock.Now().UTC()
	t.rec.Outcome, t.rec.Reason, t.rec.Finished = outcome, string(reason), &now
	t.dropKuredLock()

	if outcome == state.OutcomeFailed {
		t.rec.LastError = msg
	}

	if err := t.e.save(&t.rec); err != nil {
		msg += "; and the state could not be written: " + t.answer(err)
	}

	if reason, ok := outcomeEvents[outcome]; ok && !(t.live() && outcome == state.OutcomeDone) {
		t.event(reason, msg, outcome == state.OutcomeFailed || outcome == state.OutcomeCancelled)
	}

	switch outcome {
	case state.OutcomeFailed:
		t.log.Error("failed", "phase", t.rec.Phase, "error", msg)
	case state.OutcomeDeselected, state.OutcomeGoneAfterMutation:
		t.log.Warn(msg)
	default:
		t.log.Info(msg)
	}

	return NodeResult{Node: t.np.Name, Action: t.np.Action, Outcome: outcome, Reason: reason, Message: msg,
		Fenced: t.np.Action == plan.ActionFence && t.rec.Holds()}
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

// restore undoes a fence that did not reach Talos, after a failure.
func (t *txn) restore(ctx context.Context, why string) *NodeResult {
	if err := t.unclaim(ctx); err != nil {
		return t.fail(why + "; restoring the node failed: " + t.answer(err))
	}

	return t.fail(why + "; the node was restored (fence released)")
}

// undo takes our fence off the node: the one undo, shared with `ghcrsync release`. It judges the
// claim as recorded before this undo began (the record's phase says how far the claim got);
// hold keeps the cordon as an unproven hold.
func (t *txn) undo(ctx context.Context, hold bool) error {
	_, err := fence.Undo(ctx, t.e.clock, t.e.nodes, t.np.Name, t.e.o.Holder, state.PhaseGuarded, t.rec.Fence, hold, t.e.o.ReadyTimeout)

	return err
}

// callFailed classifies a failed call (to Talos, or the runtime proof): a node that vanished
// meanwhile — or that is being deleted, waited for until it goes — is recorded as such; anything
// else fails closed.
func (t *txn) callFailed(ctx context.Context, step string, err error) *NodeResult {
	if r := t.interrupted(); r != nil {
		return r
	}

	if _, r := t.guard(ctx, plan.StepCheck); r != nil {
		return r
	}

	return t.failKeepingFence(step + ": " + t.answer(err))
}
