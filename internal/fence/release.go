package fence

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ghcrsync/ghcrsync/internal/answer"
	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/drain"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/progress"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/internal/taints"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// Outcome is what release did with one fence.
type Outcome struct {
	Fence    Fence
	Released bool
	Message  string
}

// ReleaseOptions bound a release.
type ReleaseOptions struct {
	Node         string // only this node's fence ("" = all, and the Lease)
	ReadyTimeout time.Duration
	Progress     progress.Func
	// UncordonUnproven returns nodes to service whose runtime was never proved to pull with the
	// credential their Talos config holds (unproven holds, and fences undone unproven).
	UncordonUnproven bool
}

// UnprovenHoldSentence is what release says of a node it leaves on an unproven hold.
const UnprovenHoldSentence = "released, but LEFT CORDONED (an unproven hold): its Talos config holds the new credential and its runtime " +
	"was never proved to pull with it; run `ghcrsync apply` again to prove it (the hold is lifted then), or `ghcrsync release " +
	"--uncordon-unproven` to return it to service unproven"

// Undo takes holder's fence off the named node: a compare-and-swap judged (plan.Judge, StepUndo)
// on every read, so only what ghcrsync did is undone — never a node fenced by someone else, or
// replaced, or one the claim never reached. phase is how far the fence's transaction got. nothing
// is non-empty (and says why) when nothing of the fence was there to undo. The one undo of a
// fence: the executor and `ghcrsync release` both call it.
//
// A transient error (the API unreachable, overloaded) is ridden out, up to bound: one blip at a
// rotated node's last step must not leave its fence (a lost answer is adopted below it, by the
// compare-and-swap that finds the node already released).
//
// With hold, the node's Talos config holds a credential its runtime was never proved to pull
// with (state.Fence.Unproven): it keeps its cordon, as an unproven hold.
func Undo(ctx context.Context, clk clock.Clock, p object.Patcher, name, holder string, phase state.Phase, rec state.Fence, hold bool, bound time.Duration) (nothing string, err error) {
	err = riding(ctx, clk, bound, func() error {
		nothing, err = undoOnce(ctx, p, name, holder, phase, rec, hold)

		return err
	})

	return nothing, err
}

// riding calls do until it succeeds or fails for good: a transient error (answer.Transient) is
// tried again each second until bound has passed or ctx is done; the last error is returned.
func riding(ctx context.Context, clk clock.Clock, bound time.Duration, do func() error) error {
	return clock.Ride(ctx, clk, bound, clock.Every(time.Second), answer.Transient, do)
}

func undoOnce(ctx context.Context, p object.Patcher, name, holder string, phase state.Phase, rec state.Fence, hold bool) (nothing string, err error) {
	gone, err := object.ReleaseFence(ctx, p, name, holder, rec, hold, func(n *corev1.Node) error {
		obs := object.FromNode(n)

		uid := rec.UID
		if uid == "" {
			uid = obs.UID // no record of its identity: the node as it is
		}

		v := plan.Judge(plan.Subject{Node: &obs, Planned: &plan.Invariants{UID: uid}, Phase: phase,
			Action: plan.ActionFence, Step: plan.StepUndo, Holder: holder})

		switch v.Decision {
		case plan.Proceed:
			return nil
		case plan.Refuse:
			return errors.New(v.Message(name, plan.StepUndo))
		}

		nothing = v.Reason.Sentence(v.Detail)

		return object.ErrNoFence
	})

	if gone && nothing == "" {
		nothing = plan.ReasonNotFound.Sentence("deleted meanwhile")
	}

	return nothing, err
}

// undoBound is how long `release` rides out an unreachable API per node.
const undoBound = 2 * time.Minute

// Release undoes every releasable fence of the report: node fences first, then kured's lock
// (after its node's fence: kured waits until the node is back), the steering taints, the unproven
// holds and the Flux suspensions, the Lease last. A fence whose phase crossed into Talos mutation
// is released only once its node is Ready with lifecycle taints cleared. The state is written
// before each undo.
func Release(ctx context.Context, in Inputs, rep Report, o ReleaseOptions) []Outcome {
	var out []Outcome

	nodeKept := map[string]bool{}
	held := false // a fence kept that holds the Lease back

	for _, k := range releaseOrder(ctx, in, o, nodeKept) {
		for _, f := range rep.Fences {
			if f.Kind != k.kind || (o.Node != "" && (f.Name != o.Node || k.wholeRun)) {
				continue
			}

			r := Outcome{Fence: f, Message: k.kept + f.Reason}
			if f.Releasable {
				r = k.release(f)
			}

			if f.Kind == KindNode {
				nodeKept[f.Name] = !r.Released
			}

			held = held || k.holdsLease && !r.Released
			out = append(out, r)
		}
	}

	for _, f := range rep.Fences {
		if f.Kind == KindLease && o.Node == "" {
			out = append(out, releaseLease(ctx, in.Leases, f, held))
		}
	}

	return out
}

// releaseKind is how one kind of fence is released, in the order of releaseOrder.
type releaseKind struct {
	kind    string
	release func(Fence) Outcome
	kept    string // what an outcome of a fence not releasable says first
	// holdsLease: one kept keeps the Lease (a steering taint or an unproven hold is no run's
	// fence); wholeRun: released only by a release of the whole run (not --node).
	holdsLease, wholeRun bool
}

func releaseOrder(ctx context.Context, in Inputs, o ReleaseOptions, nodeKept map[string]bool) []releaseKind {
	return []releaseKind{
		{kind: KindNode, release: func(f Fence) Outcome { return releaseNode(ctx, in, f, o) }, kept: "not released: ", holdsLease: true},
		{kind: KindKured, release: func(f Fence) Outcome { return releaseKured(ctx, in, f, nodeKept) }, kept: "not released: ", holdsLease: true},
		{kind: KindSteering, release: func(f Fence) Outcome { return releaseSteering(ctx, in, f) }, kept: "not released: "},
		{kind: KindUnproven, release: func(f Fence) Outcome { return liftHold(ctx, in, f) }, kept: "left cordoned: "},
		// A suspension left on stops the delivery pipeline: the Lease stays until it is lifted.
		{kind: KindFlux, release: func(f Fence) Outcome { return releaseFlux(ctx, in, f) }, kept: "not resumed: ", holdsLease: true, wholeRun: true},
	}
}

func releaseLease(ctx context.Context, leases Leases, f Fence, nodeFailed bool) Outcome {
	switch {
	case !f.Releasable:
		return Outcome{Fence: f, Message: "not released: " + f.Reason}
	case nodeFailed:
		return Outcome{Fence: f, Message: "not released: a node fence or Flux suspension of this run is still held, and the Lease goes last"}
	}

	ns, name, _ := strings.Cut(f.Name, "/")
	gone, err := leases.ReleaseLease(ctx, ns, name, f.Holder)

	switch {
	case gone:
		return Outcome{Fence: f, Released: true, Message: "the Lease no longer exists: nothing to release"}
	case err != nil:
		return Outcome{Fence: f, Message: "not released: " + redact.Error(err)}
	}

	return Outcome{Fence: f, Released: true, Message: "Lease released"}
}

func releaseNode(ctx context.Context, in Inputs, f Fence, o ReleaseOptions) Outcome {
	st, store := in.State, in.Store

	if !f.Exists {
		markReleased(st, f, in.Clock.Now())

		if err := store.Write(st); err != nil {
			return Outcome{Fence: f, Message: "node gone, but the state could not be written: " + redact.Error(err)}
		}

		return Outcome{Fence: f, Released: true, Message: "the node no longer exists: released (state record closed)"}
	}

	if phaseMutated(f.Phase) {
		if err := waitSettled(ctx, in, f.Name, o); err != nil {
			return Outcome{Fence: f, Message: "stays fenced: " + redact.Error(err)}
		}
	}

	markReleased(st, f, in.Clock.Now())

	if err := store.Write(st); err != nil {
		return Outcome{Fence: f, Message: "not released: writing the state first failed: " + redact.Error(err)}
	}

	// Without a recovery record nobody knows whether the node was cordoned before the claim:
	// the cordon stays.
	rec := state.Fence{UID: f.UID, WasCordoned: true}
	if f.Record != nil {
		rec = *f.Record
	}

	nothing, err := Undo(ctx, in.Clock, in.Nodes, f.Name, f.Holder, state.Phase(f.Phase), rec, rec.Unproven(f.Phase) && !o.UncordonUnproven, undoBound)

	switch {
	case nothing != "":
		return Outcome{Fence: f, Released: true, Message: "nothing to undo on the node: " + nothing + " (state record closed)"}
	case err != nil:
		return Outcome{Fence: f, Message: "not released: " + redact.Error(err)}
	case f.Record == nil:
		return Outcome{Fence: f, Released: true, Message: "annotations removed; the cordon was kept: no recovery record says whether it was cordoned before the claim (uncordon it yourself if it was not)"}
	case rec.WasCordoned:
		return Outcome{Fence: f, Released: true, Message: "released (left cordoned: it was cordoned before the claim)"}
	case rec.Unproven(f.Phase) && !o.UncordonUnproven && heldNow(ctx, in.Nodes, f.Name):
		return Outcome{Fence: f, Released: true, Message: UnprovenHoldSentence}
	case rec.Unproven(f.Phase) && o.UncordonUnproven:
		return Outcome{Fence: f, Released: true, Message: "released and uncordoned WITHOUT a proof (--uncordon-unproven): its runtime may not pull with the credential its Talos config holds"}
	}

	return Outcome{Fence: f, Released: true, Message: "released and uncordoned"}
}

// heldNow reports whether the node carries an unproven hold now (the undo set one: its Talos
// config was written and its verified marker does not prove it on its current boot).
func heldNow(ctx context.Context, nodes Nodes, name string) bool {
	n, err := nodes.ReadNode(ctx, name)

	return err == nil && object.HeldUnproven(n)
}

// liftHold returns a node on an unproven hold to service (release --uncordon-unproven): a
// compare-and-swap that holds only while the node is still the one held.
func liftHold(ctx context.Context, in Inputs, f Fence) Outcome {
	err := riding(ctx, in.Clock, undoBound, func() error {
		_, err := in.Nodes.CASPatch(ctx, f.Name, 10, func(n *corev1.Node) error {
			if string(n.UID) != f.UID || !object.HeldUnproven(n) {
				return object.ErrNoFence
			}

			return nil
		}, func(*corev1.Node) map[string]any { return object.LiftHoldPatch() }, nil)

		return err
	})

	switch {
	case errors.Is(err, object.ErrNoFence):
		return Outcome{Fence: f, Released: true, Message: "no unproven hold on it any more (lifted, or another Node now)"}
	case err != nil:
		return Outcome{Fence: f, Message: "left cordoned: " + redact.Error(err)}
	}

	return Outcome{Fence: f, Released: true, Message: "uncordoned WITHOUT a proof (--uncordon-unproven): its runtime may not pull with the credential its Talos config holds"}
}

func markReleased(st *state.State, f Fence, now time.Time) {
	r := st.Record(f.Name)
	if r == nil {
		return
	}

	now = now.UTC()
	r.Phase, r.Outcome, r.Finished, r.Updated = state.PhaseReleased, state.OutcomeReleased, &now, now
}

// waitSettled waits until the node is Ready with no lifecycle taints, reporting each change of
// what it waits for.
func waitSettled(ctx context.Context, in Inputs, name string, o ReleaseOptions) error {
	var last *progress.WaitingSettled

	return clock.Until(ctx, in.Clock, o.ReadyTimeout, time.Second, func() (bool, error) {
		n, err := in.Nodes.ReadNode(ctx, name)
		if err != nil {
			return false, err
		}

		lifecycle, ready := taints.HasLifecycle(object.Taints(n.Spec.Taints)), drain.NodeReady(n)
		if ready && !lifecycle {
			return true, nil
		}

		if e := (progress.WaitingSettled{Node: name, Ready: ready, Lifecycle: lifecycle}); last == nil || e != *last {
			o.Progress.Emit(e)
			last = &e
		}

		return false, fmt.Errorf("%s is not Ready with its lifecycle taints cleared (Ready=%t, lifecycle taints=%t)", name, ready, lifecycle)
	})
}
