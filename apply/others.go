package apply

import (
	"context"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/maintenance"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/state"
)

// others: before a node is claimed, the other maintenance tools are asked whether one holds it
// (kured's lock or mark, a system-upgrade-controller Plan applying to it, its Talos machine
// upgrading or rebooting, a drain hold that needs an action). A hold defers the node — the next
// run rotates it — and is no failure; a question that cannot be answered fails the node with
// nothing done to it (ghcrsync does not disrupt a node it cannot tell is free).
func (t *txn) others(ctx context.Context) *NodeResult {
	holds, err := t.otherHolds(ctx)
	if err != nil {
		if r := t.interrupted(); r != nil {
			return r
		}

		return t.fail("not started: the other maintenance tools could not be asked about it (" + t.answer(err) + "); nothing was done to it")
	}

	if len(holds) == 0 {
		return nil
	}

	r := t.finish(state.OutcomeDeferred, "", "not started: held by other maintenance — "+maintenance.Sentence(holds)+": the next run rotates it")

	return &r
}

func (t *txn) otherHolds(ctx context.Context) ([]maintenance.Hold, error) {
	var holds []maintenance.Hold

	if t.e.others != nil {
		h, err := t.e.others.Holds(ctx, t.np.Name)
		if err != nil {
			return nil, err
		}

		holds = h
	}

	if h := t.stage(ctx); h != nil {
		holds = append(holds, *h)
	}

	return holds, nil
}

// stage is the hold of the node's Talos machine in someone else's maintenance stage. A node gone,
// or a machine whose stage cannot be read, is the claim's guard's to judge: it reads the node
// and asks the machine at its address who it is and what it holds next, and fails closed there.
func (t *txn) stage(ctx context.Context) *maintenance.Hold {
	if t.e.stages == nil {
		return nil
	}

	n, err := t.e.nodes.Get(ctx, t.np.Name)
	if err != nil {
		return nil
	}

	stage, err := t.e.stages.Stage(ctx, object.InternalIP(n))
	if err != nil {
		t.log.Warn("its Talos machine's stage could not be read; the claim's guard asks its Talos API next", "error", t.answer(err))

		return nil
	}

	return maintenance.Staged(stage)
}

// kuredLock takes kured's lock for the reboot, once the claim landed: recorded first (a run
// killed after the write leaves the record for `ghcrsync release`), then written. Kured,
// installed, then waits for ghcrsync's reboot as ghcrsync waited for its. Taken by kured since
// the check, the claim is undone and the node deferred.
func (t *txn) kuredLock(ctx context.Context) *NodeResult {
	if t.e.others == nil {
		return nil
	}

	t.rec.KuredLock = true
	if r := t.saved(); r != nil {
		return r
	}

	hold, err := t.e.others.TakeKuredLock(ctx, t.np.Name, t.e.o.Holder, t.rec.WasCordoned)

	switch {
	case err != nil:
		if t.e.sig.Err() != nil || t.e.stopped() {
			return t.failOrInterrupted(t.answer(err))
		}

		return t.restore(ctx, "kured's lock could not be taken: "+t.answer(err))
	case hold != nil:
		t.rec.KuredLock = false

		return t.deselectDeferred(ctx, "held by other maintenance — "+hold.Reason+" (taken since the check)")
	}

	return nil
}

// deselectDeferred undoes the claim and defers the node to the next run.
func (t *txn) deselectDeferred(ctx context.Context, msg string) *NodeResult {
	if err := t.unclaim(ctx); err != nil {
		return t.fail(msg + "; undoing its claim failed: " + t.answer(err))
	}

	r := t.finish(state.OutcomeDeferred, "", msg+"; its claim was undone: the next run rotates it")

	return &r
}

// dropKuredLock gives kured's lock back once the node holds no fence (done, restored, deselected,
// cancelled before its Talos write); a fence kept keeps the lock with it, for `ghcrsync release`.
// A lock that cannot be given back stays recorded and is logged: release gives it back.
func (t *txn) dropKuredLock() {
	if !t.rec.KuredLock || t.rec.Holds() || t.e.others == nil {
		return
	}

	ctx, cancel := t.e.clock.WithTimeout(context.Background(), 30*time.Second) // a cancelled run gives it back too
	defer cancel()

	if err := t.e.others.DropKuredLock(ctx, t.np.Name); err != nil {
		t.log.Warn("kured's lock was not given back: `ghcrsync release` gives it back", "error", t.answer(err))

		return
	}

	t.rec.KuredLock = false
}
