package apply

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/ghcrsync/ghcrsync/internal/drain"
	"github.com/ghcrsync/ghcrsync/internal/human"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/progress"
	"github.com/ghcrsync/ghcrsync/internal/taints"
	"github.com/ghcrsync/ghcrsync/internal/talos"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// claim is the compare-and-swap claim: judged on every read, retried on conflict.
func (t *txn) claim(ctx context.Context) *NodeResult {
	if _, r := t.advance(ctx, plan.StepClaim, state.PhaseClaimed); r != nil {
		return r
	}

	claim := func(n *corev1.Node) map[string]any {
		// The guard is ours when we set it: also when our own claim landed already and only
		// its answer was lost (the retry then reads our guard back).
		t.rec.ScaleDownGuardOurs = n.Annotations[object.ScaleDownDisabledAnnotation] != "true" ||
			n.Annotations[object.ScaleDownGuardByAnnotation] == t.e.o.Holder

		return object.ClaimPatch(t.e.o.Holder, t.rec.Fence)
	}

	between := func(attempt int) {
		if h := t.e.o.Hooks.BetweenReadAndClaim; h != nil {
			h(t.np.Name, attempt)
		}
	}

	if r := t.patch(ctx, plan.StepClaim, "claim", claim, between); r != nil {
		return r
	}

	return t.saved() // records scale_down_guard_ours
}

// guarded: after the claim, the autoscaler may already have started deleting the node.
func (t *txn) guarded(ctx context.Context) *NodeResult {
	if _, r := t.advance(ctx, plan.StepGuard, state.PhaseGuarded); r != nil {
		return r
	}

	return t.mirror(ctx, state.PhaseGuarded)
}

// drain evicts the node's pods; a drain that fails restores the node (nothing reached Talos).
func (t *txn) drain(ctx context.Context) *NodeResult {
	if _, r := t.advance(ctx, plan.StepDrain, state.PhaseDrained); r != nil {
		return r
	}

	if err := t.e.workloads.Drain(ctx, t.np.Name, t.e.o.DrainTimeout, t.e.o.Progress, t.destinations(ctx)); err != nil {
		if t.e.sig.Err() != nil || t.e.stopped() {
			return t.failOrInterrupted(t.answer(err))
		}

		return t.restore(ctx, t.answer(err))
	}

	return t.mirror(ctx, state.PhaseDrained)
}

// configureStaged writes the credential into the next-boot machine config.
func (t *txn) configureStaged(ctx context.Context) *NodeResult {
	if r := t.configure(ctx, false); r != nil {
		return r
	}

	return t.mirror(ctx, state.PhaseConfigured)
}

// configureLive writes the credential into the active machine config (Talos 1.14+ reloads it).
func (t *txn) configureLive(ctx context.Context) *NodeResult { return t.configure(ctx, true) }

func (t *txn) configure(ctx context.Context, live bool) *NodeResult {
	if t.np.Action == plan.ActionApplyLive && t.np.Role == plan.RoleControlPlane {
		if r := t.quorum(ctx); r != nil { // the gate again, right before the live write
			return r
		}
	}

	// The guard asks the machine at the pinned address who it is, and reads its Talos facts,
	// before the phase is recorded (judged).
	n, r := t.advance(ctx, plan.StepConfigure, state.PhaseConfigured)
	if r != nil {
		return r
	}

	t.wroteOnBoot = n.Status.NodeInfo.BootID

	changed, err := t.e.talos.Configure(ctx, t.ip, t.e.o.Registry, t.e.o.Username, t.e.o.Password, live)
	if err != nil {
		return t.callFailed(ctx, "configure", err)
	}

	t.configChanged = changed

	return nil
}

// sameMachine checks, before a reboot, that the machine at the address the claim pinned is this
// Node (isPinned). The Talos config write's guard checks the same (judged).
func (t *txn) sameMachine(ctx context.Context, step plan.Step) *NodeResult {
	n, r := t.guard(ctx, step)
	if r != nil {
		return r
	}

	return t.isPinned(ctx, n, step)
}

// isPinned checks, before a Talos write, that the machine at the address the claim pinned is
// this Node: the Node still reports that address, and the machine there says it is this node
// (Talos's own node name). A moved or reused address would have ghcrsync configure or reboot
// another, undrained machine. A live update, which no claim pinned, is pinned here.
func (t *txn) isPinned(ctx context.Context, n *corev1.Node, step plan.Step) *NodeResult {
	if t.ip == "" {
		t.ip = object.InternalIP(n)
	}

	if ip := object.InternalIP(n); ip != t.ip {
		return t.refuseBeforeTalos(ctx, plan.Verdict{Decision: plan.Refuse, Reason: plan.ReasonUnclassifiable,
			Detail: fmt.Sprintf("its InternalIP changed from %s to %s since the claim; nothing was written to it", t.ip, ip)}, step)
	}

	return t.machineIsTheNode(ctx, step)
}

// machineIsTheNode asks the machine at the pinned address for its name (Talos's own node name):
// another machine there is refused, nothing written to it.
func (t *txn) machineIsTheNode(ctx context.Context, step plan.Step) *NodeResult {
	name, err := t.e.talos.Nodename(ctx, t.ip)

	switch {
	case err != nil && step == plan.StepClaim:
		if r := t.interrupted(); r != nil {
			return r
		}

		return t.refuseBeforeTalos(ctx, plan.Verdict{Decision: plan.Refuse, Reason: plan.ReasonTalosUnreachable, Detail: t.answer(err)}, step)
	case err != nil:
		return t.callFailed(ctx, string(step), err)
	case name != t.np.Name:
		return t.refuseBeforeTalos(ctx, plan.Verdict{Decision: plan.Refuse, Reason: plan.ReasonUnclassifiable,
			Detail: fmt.Sprintf("the machine at %s says it is node %q, not %q; nothing was written to it", t.ip, name, t.np.Name)}, step)
	}

	return nil
}

// reboot asks Talos to reboot (advance recorded the boot it leaves). A control plane passes the
// etcd gate again first: the drain took time, and another member may have failed meanwhile.
func (t *txn) reboot(ctx context.Context) *NodeResult {
	if t.np.Role == plan.RoleControlPlane {
		if r := t.quorum(ctx); r != nil {
			return r
		}
	}

	if r := t.sameMachine(ctx, plan.StepReboot); r != nil {
		return r
	}

	if _, r := t.advance(ctx, plan.StepReboot, state.PhaseRebooting); r != nil {
		return r
	}

	if r := t.mirror(ctx, state.PhaseRebooting); r != nil {
		return r
	}

	if err := t.e.talos.Reboot(ctx, t.ip); err != nil {
		if !errors.Is(err, talos.ErrAnswerLost) {
			return t.callFailed(ctx, "reboot", err)
		}

		// The machine may be rebooting: the Ready wait tells (a new boot, or the fence stays).
		t.log.Warn("the reboot's answer was lost; waiting for a new boot to tell", "error", t.answer(err))
	}

	return nil
}

// waitReady waits for a new boot ID, Ready, and no lifecycle taints, judging every read.
func (t *txn) waitReady(ctx context.Context) *NodeResult {
	start := t.e.clock.Now()
	deadline := start.Add(t.e.o.ReadyTimeout)
	lastSaid := start

	// The node's changes wake the wait (its kubelet reporting the new boot, Ready): each wake
	// is still a guard read, judged like every poll.
	wctx, stop := context.WithCancel(ctx)
	defer stop()

	changed := t.e.nodes.Changes(wctx, t.np.Name)

	for {
		n, r := t.guard(ctx, plan.StepWait)
		if r != nil {
			return r
		}

		boot, ready := n.Status.NodeInfo.BootID, drain.NodeReady(n)
		lifecycle := taints.HasLifecycle(object.Taints(n.Spec.Taints))

		if boot != "" && boot != t.rec.BootBefore && ready && !lifecycle {
			t.rec.BootAfter = boot

			if r := t.enter(state.PhaseReady); r != nil {
				return r
			}

			return t.mirror(ctx, state.PhaseReady)
		}

		if t.e.clock.Now().After(deadline) {
			return t.failKeepingFence(fmt.Sprintf("%s did not come back Ready with a new boot within %s (boot %s, Ready %t, lifecycle taints %t)",
				t.np.Name, t.e.o.ReadyTimeout, boot, ready, lifecycle))
		}

		if now := t.e.clock.Now(); now.Sub(lastSaid) >= progressEvery {
			lastSaid = now
			t.e.o.Progress.Emit(progress.WaitingReady{Node: t.np.Name, Elapsed: now.Sub(start), Timeout: t.e.o.ReadyTimeout,
				Awaited: awaited(boot != "" && boot != t.rec.BootBefore, ready, lifecycle)})
		}

		if err := t.e.sleepOr(ctx, changed); err != nil {
			return t.failOrInterrupted(t.answer(err))
		}
	}
}

// awaited says what a node coming back from its reboot still lacks.
func awaited(newBoot, ready, lifecycle bool) string {
	var want []string

	if !newBoot {
		want = append(want, "a new boot id")
	}

	if !ready {
		want = append(want, "Ready")
	}

	if lifecycle {
		want = append(want, "its lifecycle taints to go")
	}

	if len(want) == 0 {
		return "the next read"
	}

	return strings.Join(want, ", ")
}

// awaitRuntime waits, after a live write, until the node's container runtime has restarted on
// the config now active: Talos 1.14 restarts it when the rendered registry config changed, a
// moment after the write answered, and until then the runtime pulls with the credential it
// started with — a proof taken before would prove the old credential. A runtime that does not
// restart within the ready timeout fails the node: its config holds the new credential, its
// runtime may not, and the next plan fences it (a reboot loads it for sure). What the start
// must follow is the write's (talos.Configure: its read-back, or the runtime's start before it);
// each poll asks only for the runtime's last start.
func (t *txn) awaitRuntime(ctx context.Context) *NodeResult {
	deadline := t.e.clock.Now().Add(t.e.o.ReadyTimeout)

	changed := t.configChanged // the write's: no read of its own

	for {
		started, err := t.e.talos.RuntimeStarted(ctx, t.ip)
		if err != nil {
			return t.callFailed(ctx, "its container runtime's start could not be read after the live write", err)
		}

		if started.After(changed) {
			t.runtimeStarted = started

			return nil
		}

		if t.e.clock.Now().After(deadline) {
			last := "its last start is unknown"
			if !started.IsZero() {
				last = "it last started at " + human.Clock(started)
			}

			return t.fail(fmt.Sprintf("its container runtime did not restart within %s after its registry config changed at %s (%s): "+
				"until it does it pulls with the credential it started with, so nothing is proved; the next plan fences it (a reboot loads the credential)",
				t.e.o.ReadyTimeout, human.Clock(changed), last))
		}

		if err := t.e.sleepOr(ctx, nil); err != nil {
			return t.failOrInterrupted(t.answer(err))
		}
	}
}

// prove proves the runtime pulls with the node's credential, then marks the node verified.
func (t *txn) prove(ctx context.Context) *NodeResult {
	return t.proveWith(ctx, func(ctx context.Context) (*NodeResult, error) { return nil, t.e.proveRuntime(ctx, t.np.Name) })
}

// proveWith runs proof (which may end the transaction itself, as a judgement does), then checks
// the active config and marks the node verified.
func (t *txn) proveWith(ctx context.Context, proof func(context.Context) (*NodeResult, error)) *NodeResult {
	n, r := t.advance(ctx, plan.StepProve, state.PhaseProved)
	if r != nil {
		return r
	}

	for again := false; ; again = true {
		if r, err := proof(ctx); r != nil {
			return r
		} else if err != nil {
			return t.callFailed(ctx, "not proved", err)
		}

		// The proof is of this config: the active one must carry the new credential now. For a
		// live write this read is its read-back too (talos.Configure), and — the machine having
		// said it is this Node on this boot before the write — it stands for a whole read of it.
		facts, err := t.e.talos.ConfigFacts(ctx, t.vouched(n), t.e.o.Registry)
		switch {
		case err != nil:
			return t.callFailed(ctx, "not proved: its active Talos config could not be read again", err)
		case facts.ConfiguredDigest != t.p.AuthDigest:
			return t.failKeepingFence(fmt.Sprintf("not proved: its active Talos config carries %s, not the new credential %s, when the proof was taken",
				human.ShortOrNone(facts.ConfiguredDigest), human.Short(t.p.AuthDigest)))
		case t.runtimeStarted.IsZero() || t.runtimeStarted.After(facts.ConfigUpdated):
			// no runtime restart awaited (a reboot, a keyring), or the runtime proved ran on
			// this config
		case again:
			return t.failKeepingFence(fmt.Sprintf("not proved: its active Talos config changed at %s, after its container runtime's restart at %s, twice: "+
				"something else writes its config; the next plan reads it again", human.Clock(facts.ConfigUpdated), human.Clock(t.runtimeStarted)))
		default:
			// The restart the wait saw was before the write changed the config (the write
			// knew only the runtime's start before it): wait for this config's, prove again.
			t.configChanged = facts.ConfigUpdated
			if r := t.awaitRuntime(ctx); r != nil {
				return r
			}

			if n, r = t.guard(ctx, plan.StepProve); r != nil { // the probe is a write: judged again
				return r
			}

			continue
		}

		break
	}

	// Proved: the marker, and the steering taint off (pods may land here now), in one patch.
	mark := func(cur *corev1.Node) map[string]any {
		return t.e.withoutSteering(cur, object.MarkPatch(cur, t.rec.DesiredRevision, n.Status.NodeInfo.BootID))
	}

	return t.patch(ctx, plan.StepAnnotate, "write verified marker", mark, nil)
}

// vouched is the machine at the pinned address as this Node, after a write that did not reboot
// it: the write's guard had the machine say it is this Node, on the boot it is on now. A fenced
// node was rebooted after its guard, and a boot changed since the write vouches for nothing:
// only its address.
func (t *txn) vouched(n *corev1.Node) plan.Node {
	live := t.np.Action == plan.ActionApplyLive || t.np.Action == plan.ActionKeyring
	if boot := n.Status.NodeInfo.BootID; !live || boot == "" || boot != t.wroteOnBoot {
		return plan.Node{InternalIP: t.ip}
	}

	return plan.Node{Name: t.np.Name, UID: string(n.UID), BootID: n.Status.NodeInfo.BootID, InternalIP: t.ip,
		Talos: &plan.TalosFacts{Version: t.np.Talos, CRIStarted: t.runtimeStarted}}
}

// release takes the fence off: the rotation is done.
func (t *txn) release(ctx context.Context) *NodeResult {
	if _, r := t.advance(ctx, plan.StepRelease, state.PhaseReleased); r != nil {
		return r
	}

	if err := t.undo(ctx, false); err != nil { // proved: back to service
		return t.failOrInterrupted("release: " + t.answer(err))
	}

	return nil
}
