package fence

import (
	"context"
	"slices"
	"strings"

	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// KindFlux is a Flux Kustomization a run suspended (the flux block): the delivery pipeline stops
// while it is on, so it is recorded, listed and released like a fence.
const KindFlux = "flux-suspend"

// FluxObs is a state record of a run's suspension, with the Kustomization as it is now.
type FluxObs struct {
	Record state.Suspension
	Now    plan.KustomizationObs
}

// observeFlux reads the Kustomization of every suspension record in the state (the record is
// written before the suspension, so a run killed at any point has one), and every configured
// Kustomization carrying a run's suspension annotation with no record (the state was lost):
// its run is the annotation's, judged like any other holder.
func observeFlux(ctx context.Context, flux Flux, st *state.State, configured []config.NamespacedName) ([]FluxObs, error) {
	read := map[string]plan.KustomizationObs{} // each Kustomization is read once
	get := func(ns, name string) (plan.KustomizationObs, error) {
		if k, ok := read[ns+"/"+name]; ok {
			return k, nil
		}

		k, err := flux.Kustomization(ctx, ns, name)
		if err == nil {
			read[ns+"/"+name] = k
		}

		return k, err
	}

	var out []FluxObs

	seen := map[string]bool{}

	for _, x := range st.Suspended {
		k, err := get(x.Namespace, x.Name)
		if err != nil {
			return nil, err
		}

		out = append(out, FluxObs{Record: x, Now: k})
		seen[x.Namespace+"/"+x.Name+"\x00"+x.Owner] = true
	}

	for _, n := range configured {
		k, err := get(n.Namespace, n.Name)
		if err != nil {
			return nil, err
		}

		if k.SuspendedBy == "" || !k.Suspended || seen[n.String()+"\x00"+k.SuspendedBy] {
			continue
		}

		out = append(out, FluxObs{Record: state.Suspension{Namespace: n.Namespace, Name: n.Name, UID: k.UID, Owner: k.SuspendedBy}, Now: k})
	}

	return out, nil
}

// ours reports whether the Kustomization carries the record's run's suspension.
func (x FluxObs) ours() bool {
	return x.Now.Exists && x.Now.Suspended && x.Now.SuspendedBy == x.Record.Owner &&
		(x.Record.UID == "" || x.Record.UID == x.Now.UID)
}

// classifyFlux is the report's entry for one suspension record.
func classifyFlux(x FluxObs, o Observation) Fence {
	ref := x.Record.Namespace + "/" + x.Record.Name
	f := Fence{Kind: KindFlux, Name: ref, Holder: x.Record.Owner, Exists: x.Now.Exists, UID: x.Now.UID,
		Evidence: "spec.suspend=true, " + object.SuspendedByAnnotation + "=" + x.Now.SuspendedBy}

	if !x.ours() {
		f.Releasable = true
		f.Evidence = "state record only"
		f.Reason = "the Kustomization carries no suspension of this run (resumed already, by someone else, or gone): only the state record remains"

		return f
	}

	assessLiveness(&f, o)
	f.Reason = "Flux reconcile suspended (the delivery pipeline is stopped): " + f.Reason

	return f
}

// releaseFlux resumes the run's suspension of a Kustomization (never a person's: Resume lifts
// only one carrying this run's annotation) and drops its state record.
func releaseFlux(ctx context.Context, in Inputs, f Fence) Outcome {
	ns, name, _ := strings.Cut(f.Name, "/")

	var gone bool

	err := riding(ctx, in.Clock, undoBound, func() (err error) {
		gone, err = in.Flux.Resume(ctx, ns, name, f.Holder)

		return err
	})
	if err != nil {
		return Outcome{Fence: f, Message: "not resumed: " + redact.Error(err)}
	}

	in.State.DropSuspension(ns, name, f.Holder)

	if werr := in.Store.Write(in.State); werr != nil {
		return Outcome{Fence: f, Released: true, Message: "resumed, but the state could not be written: " + redact.Error(werr)}
	}

	if gone {
		return Outcome{Fence: f, Released: true, Message: "no suspension of this run on it (state record closed)"}
	}

	return Outcome{Fence: f, Released: true, Message: "Flux Kustomization resumed"}
}

// fluxHolders are the runs the suspension records name (for the liveness check).
func fluxHolders(xs []FluxObs) []string {
	var out []string

	for _, x := range xs {
		if !slices.Contains(out, x.Record.Owner) {
			out = append(out, x.Record.Owner)
		}
	}

	return out
}
