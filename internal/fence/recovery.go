package fence

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/keyring"
	"github.com/ghcrsync/ghcrsync/internal/liveness"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/progress"
	"github.com/ghcrsync/ghcrsync/state"
)

// Inputs are what the fence commands (fences, release, an apply's reclaim) read and write,
// opened once by the command (workspace.Fences): the configuration, the cluster's ports, the
// state and its store, where a holder's liveness is asked, and the clock.
type Inputs struct {
	Config *config.Config
	Nodes  Nodes
	Leases Leases
	Flux   Flux
	Events Recorder
	// Pods judges a holder that runs in a pod, as the API server sees it (nil: not asked).
	Pods     liveness.Source
	Store    state.Store
	State    *state.State
	Liveness liveness.Source
	Clock    clock.Clock
	// Writers are the keyring writer's pods and Secret (nil: not configured).
	Writers Writers
	// Kured is kured's reboot lock (nil: not configured).
	Kured Kured
}

// observe reads every fence and its holder's liveness.
func (in Inputs) observe(ctx context.Context) (Observation, error) {
	obs, err := Observe(ctx, in, TargetsOf(in.Config))
	obs.ConfigPath = in.Config.Path

	return obs, err
}

// InventoryOptions are `ghcrsync fences`' and `ghcrsync release`'s common inputs.
type InventoryOptions struct {
	Holder string // judge as if releasing this holder id
	Force  bool
	// UncordonUnproven returns unproven nodes to service (release --uncordon-unproven).
	UncordonUnproven bool
}

// Inventory reports every fence ghcrsync holds, with liveness evidence. It writes nothing.
func Inventory(ctx context.Context, in Inputs, o InventoryOptions) (Report, error) {
	obs, err := in.observe(ctx)
	if err != nil {
		return Report{}, err
	}

	obs.Holder, obs.Force, obs.UncordonUnproven = o.Holder, o.Force, o.UncordonUnproven
	rep := Classify(obs)

	rep.Notes = append(rep.Notes, in.keyringLeftovers(ctx)...)

	return rep, nil
}

// keyringLeftovers names the keyring writer pods in the writer's namespace: a run deletes its
// own as each ends, so one listed while no run is alive was left by a run that was killed.
func (in Inputs) keyringLeftovers(ctx context.Context) []string {
	k := in.Config.Nodes.Keyring
	if k == nil || in.Writers == nil {
		return nil
	}

	pods, err := in.Writers.KeyringWriters(ctx, k.Namespace)
	if err != nil {
		return []string{fmt.Sprintf("The keyring writer's pods in %s could not be listed: %v", k.Namespace, err)}
	}

	var out []string

	for _, p := range pods {
		out = append(out, fmt.Sprintf("keyring writer pod %s/%s on node %s (%s): a run makes and deletes these; `ghcrsync release` removes one a killed run left, "+
			"with the writer's Secret %s", p.Namespace, p.Name, p.Spec.NodeName, p.Status.Phase, k.Secret))
	}

	return out
}

// removeKeyringLeftovers deletes the writer pods and the writer's Secret, once no run is alive
// (a live run's writer is working): the Secret is a copy of the credential nothing reads then.
func (in Inputs) removeKeyringLeftovers(ctx context.Context, rep Report) string {
	k := in.Config.Nodes.Keyring
	if k == nil || in.Writers == nil {
		return ""
	}

	for _, f := range rep.Fences {
		if f.Live {
			return "the keyring writer's pods and Secret were left in place: a run is alive"
		}
	}

	n, err := in.Writers.DeleteKeyringWriters(ctx, k.Namespace)
	if err == nil {
		err = in.Writers.DeleteKeyringSecret(ctx, keyring.Writer{Namespace: k.Namespace, Secret: k.Secret})
	}

	if err != nil {
		return "the keyring writer's pods and Secret were not all removed: " + err.Error()
	}

	if n == 0 {
		return ""
	}

	return fmt.Sprintf("%d keyring writer pod(s) left by a killed run were removed, and the writer's Secret %s/%s", n, k.Namespace, k.Secret)
}

// RecoveryOptions are `ghcrsync release`'s inputs.
type RecoveryOptions struct {
	InventoryOptions
	Node     string
	DryRun   bool
	Progress progress.Func
}

// RecoveryResult is what release found and did.
type RecoveryResult struct {
	Report   Report
	Outcomes []Outcome
	DryRun   bool
}

// Held counts fences left held. A node left on an unproven hold is not a run's fence: it is
// listed, and counted by `fences`, but does not make a release partial.
func (r *RecoveryResult) Held() int {
	n := 0

	for _, o := range r.Outcomes {
		if !o.Released && o.Fence.Kind != KindUnproven {
			n++
		}
	}

	return n
}

// Unproven counts the nodes left on an unproven hold.
func (r *RecoveryResult) Unproven() int {
	n := 0

	for _, o := range r.Outcomes {
		if !o.Released && o.Fence.Kind == KindUnproven {
			n++
		}
	}

	return n
}

// ErrForceNeedsHolder refuses --force without the holder it would force.
var ErrForceNeedsHolder = errors.New("--force needs the holder id to release (--holder ID), as terraform force-unlock needs the lock id: see `ghcrsync fences`")

// Recover undoes the fences held by a run that is provably over (or named with --holder), in a
// workspace whose state is locked (unless DryRun).
func Recover(ctx context.Context, in Inputs, o RecoveryOptions) (*RecoveryResult, error) {
	if o.Force && o.Holder == "" {
		return nil, ErrForceNeedsHolder
	}

	rep, err := Inventory(ctx, in, o.InventoryOptions)
	if err != nil {
		return nil, err
	}

	if o.Node != "" {
		kept := rep.Fences[:0]
		for _, f := range rep.Fences {
			if (f.Kind == KindNode || f.Kind == KindSteering || f.Kind == KindUnproven) && f.Name == o.Node {
				kept = append(kept, f)
			}
		}

		rep.Fences = kept

		if len(kept) == 0 {
			return nil, fmt.Errorf("no ghcrsync fence is held on node %q: nothing to release (see `ghcrsync fences` for what is held)", o.Node)
		}
	}

	res := &RecoveryResult{Report: rep, DryRun: o.DryRun}
	if o.DryRun {
		return res, nil
	}

	// All or nothing: one record that cannot be trusted casts doubt on the rest.
	if len(rep.Malformed) > 0 {
		return res, fmt.Errorf("release refuses to release any fence: the recovery record on node(s) %s is malformed (see `ghcrsync fences`); "+
			"check their cordon and taints, fix or remove the %s annotation, then run release again", strings.Join(rep.Malformed, ", "), object.RecordAnnotation)
	}

	res.Outcomes = Release(ctx, in, rep, ReleaseOptions{
		Node: o.Node, ReadyTimeout: in.Config.Nodes.ReadyTimeout, Progress: o.Progress, UncordonUnproven: o.UncordonUnproven,
	})
	in.recordReleases(ctx, res.Outcomes, "ghcrsync release")

	if note := in.removeKeyringLeftovers(ctx, rep); note != "" {
		res.Report.Notes = append(res.Report.Notes, note)
	}

	if run := in.State.Run; run != nil && run.Finished == nil && res.Held() == 0 && o.Node == "" {
		now := in.Clock.Now().UTC()
		run.Finished, run.Outcome = &now, "terminated; its fences were released by ghcrsync release"

		if err := in.Store.Write(in.State); err != nil {
			return res, err
		}
	}

	return res, nil
}

// Reclaim releases, before an apply, the fences whose holder's run is provably over (its process
// on this host has exited, or a liveness source says so; mere expiry is never enough). The
// steering of such a run on the nodes in handover is left where it is: the apply steers those
// nodes itself, and its taint replaces the dead run's in one compare-and-swap — lifting it first
// would let the pods the dead run left Pending land, in between, on nodes the apply then drains
// (evicted twice).
func Reclaim(ctx context.Context, in Inputs, report progress.Func, handover []string) ([]Outcome, error) {
	obs, err := in.observe(ctx)
	if err != nil {
		return nil, err
	}

	rep := Classify(obs)

	if len(rep.Malformed) > 0 { // all or nothing, as release: nothing is reclaimed, and the run says why
		var out []Outcome

		for _, f := range rep.Fences {
			if slices.Contains(rep.Malformed, f.Name) && f.Kind == KindNode {
				out = append(out, Outcome{Fence: f, Message: "not released, nor any other fence: " + f.Reason})
			}
		}

		return out, nil
	}

	var proven Report

	for _, f := range rep.Fences {
		if f.Kind == KindSteering && f.Exists && slices.Contains(handover, f.Name) {
			continue
		}

		if v, ok := obs.Verdicts[f.Holder]; ok && v.Checked && v.Terminal {
			proven.Fences = append(proven.Fences, f)
		}
	}

	if len(proven.Fences) == 0 {
		return nil, nil
	}

	out := Release(ctx, in, proven, ReleaseOptions{ReadyTimeout: in.Config.Nodes.ReadyTimeout, Progress: report})
	in.recordReleases(ctx, out, "ghcrsync apply (reclaim of a run that is over)")

	return out, nil
}

// recordReleases writes an Event on every node and Lease whose fence was released (best
// effort: the cluster's audit trail of who undid what).
func (in Inputs) recordReleases(ctx context.Context, outcomes []Outcome, by string) {
	for _, o := range outcomes {
		if !o.Released {
			continue
		}

		ref := object.LeaseRef(in.Config.Lease.Namespace, in.Config.Lease.Name)
		if o.Fence.Kind == KindNode || o.Fence.Kind == KindSteering || o.Fence.Kind == KindUnproven {
			ref = object.NodeRef(o.Fence.Name, types.UID(o.Fence.UID))
		}

		_ = in.Events.Record(ctx, ref, "GhcrsyncFenceReleased", by+" released the fence of run "+o.Fence.Holder+": "+o.Message, false)
	}
}
