package fence

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/internal/taints"
	"github.com/ghcrsync/ghcrsync/state"
)

// KindSteering is a node's steering taint (taints.Steering): not a fence that blocks the next
// run, but ghcrsync's mutation, recorded, listed and released like one.
const KindSteering = "steering"

// SteerObs is a node carrying a steering taint, or a state record that says it may.
type SteerObs struct {
	Name   string
	Exists bool
	UID    string
	Token  string // the taint's value ("" when only the state record remains)
	Effect string
	// Holder is the run whose token the taint carries, as far as the state or the Lease tell.
	Holder      string
	StateRecord *state.Steer
}

// observeSteering finds the steering taints on the listed nodes and the state's steering records
// whose node carries none (only the record remains). A taint's run is known by its token: the
// node's steered-by annotation, the owner of a state record or the Lease's holder with that
// token (the annotation is anyone's to write, so only a holder whose token matches counts).
func observeSteering(nodes []corev1.Node, st *state.State, leaseHolder string) []SteerObs {
	candidates := []string{leaseHolder}
	if st.Run != nil {
		candidates = append(candidates, st.Run.Holder)
	}

	for _, x := range st.Steered {
		candidates = append(candidates, x.Owner)
	}

	var out []SteerObs

	seen := map[string]bool{}

	for i := range nodes {
		n := &nodes[i]

		t, ok := taints.Find(object.Taints(n.Spec.Taints), taints.Steering)
		if !ok {
			continue
		}

		obs := SteerObs{Name: n.Name, Exists: true, UID: string(n.UID), Token: t.Value, Effect: t.Effect}

		for _, h := range append(candidates, n.Annotations[object.SteeredByAnnotation]) {
			if h != "" && taints.RunToken(h) == t.Value {
				obs.Holder = h
			}
		}

		for j := range st.Steered {
			if x := &st.Steered[j]; x.Node == n.Name && x.Owner == obs.Holder {
				obs.StateRecord = x
			}
		}

		out = append(out, obs)
		seen[n.Name+"\x00"+obs.Holder] = true
	}

	for j := range st.Steered {
		x := &st.Steered[j]
		if !seen[x.Node+"\x00"+x.Owner] {
			out = append(out, SteerObs{Name: x.Node, UID: x.UID, Holder: x.Owner, Effect: x.Effect, StateRecord: x})
		}
	}

	return out
}

// classifySteering is the report's entry for one steering taint.
func classifySteering(s SteerObs, o Observation) Fence {
	f := Fence{Kind: KindSteering, Name: s.Name, Holder: s.Holder, Exists: s.Exists, UID: s.UID,
		Evidence: taints.Steering + "=" + s.Token + ":" + s.Effect}

	if f.Holder == "" && o.Holder != "" && taints.RunToken(o.Holder) == s.Token {
		f.Holder = o.Holder // named explicitly (--holder)
	}

	switch {
	case s.Token == "":
		f.Releasable = true
		f.Evidence = "state record only"
		f.Reason = "the node carries no steering taint of this run: only the state record remains"
	case f.Holder == "":
		f.Reason = "NOT releasable: no state record or Lease names the run whose token the taint carries; " +
			"name the run (--holder), or, when no ghcrsync run is going on, remove it by hand: kubectl taint node " + Quote(s.Name) + " " + taints.Steering + "-"
	default:
		assessLiveness(&f, o)
		f.Reason = "steering taint: " + f.Reason
	}

	return f
}

// releaseSteering takes a steering taint off its node (only the run's own: an operator's taint
// of the same effect, or another run's, stays) and drops its state record.
func releaseSteering(ctx context.Context, in Inputs, f Fence) Outcome {
	var gone bool

	err := riding(ctx, in.Clock, undoBound, func() (err error) {
		gone, err = object.Unsteer(ctx, in.Nodes, f.Name, f.UID, f.Holder)

		return err
	})
	if err != nil {
		return Outcome{Fence: f, Message: "not released: " + redact.Error(err)}
	}

	in.State.DropSteer(f.Name, f.Holder)

	if werr := in.Store.Write(in.State); werr != nil {
		return Outcome{Fence: f, Released: true, Message: "steering taint removed, but the state could not be written: " + redact.Error(werr)}
	}

	if gone {
		return Outcome{Fence: f, Released: true, Message: "no steering taint of this run on the node (state record closed)"}
	}

	return Outcome{Fence: f, Released: true, Message: "steering taint removed"}
}

// steeringHolders are the runs the steering taints name (for the liveness check).
func steeringHolders(ss []SteerObs) []string {
	var out []string

	for _, s := range ss {
		if s.Holder != "" && !slices.Contains(out, s.Holder) {
			out = append(out, s.Holder)
		}
	}

	return out
}
