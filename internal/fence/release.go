package fence

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/lease"
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
	Progress     io.Writer
}

// Release undoes every releasable fence of the report: node fences first (each a CAS on the
// fields it read: the owner and uid), the Lease last. A fence whose phase crossed into Talos
// mutation is released only once its node is Ready with lifecycle taints cleared. The state is
// written before each undo.
func Release(ctx context.Context, kube *cluster.Connection, rep Report, store state.Store, st *state.State, o ReleaseOptions) []Outcome {
	var out []Outcome

	nodeFailed := false

	for _, f := range rep.Fences {
		if f.Kind != KindNode || (o.Node != "" && f.Name != o.Node) {
			continue
		}

		if !f.Releasable {
			out = append(out, Outcome{Fence: f, Message: "not released: " + f.Reason})
			nodeFailed = true

			continue
		}

		r := releaseNode(ctx, kube, f, store, st, o)
		if !r.Released {
			nodeFailed = true
		}

		out = append(out, r)
	}

	for _, f := range rep.Fences {
		if f.Kind != KindLease || o.Node != "" {
			continue
		}

		switch {
		case !f.Releasable:
			out = append(out, Outcome{Fence: f, Message: "not released: " + f.Reason})
		case nodeFailed:
			out = append(out, Outcome{Fence: f, Message: "not released: a node fence of this run is still held, and the Lease goes last"})
		default:
			ns, name, _ := cutSlash(f.Name)
			if err := lease.ReleaseHolder(ctx, kube.Client, ns, name, f.Holder); err != nil {
				out = append(out, Outcome{Fence: f, Message: "not released: " + err.Error()})
			} else {
				out = append(out, Outcome{Fence: f, Released: true, Message: "Lease released"})
			}
		}
	}

	return out
}

func cutSlash(s string) (string, string, bool) {
	for i := range s {
		if s[i] == '/' {
			return s[:i], s[i+1:], true
		}
	}

	return "", s, false
}

func releaseNode(ctx context.Context, kube *cluster.Connection, f Fence, store state.Store, st *state.State, o ReleaseOptions) Outcome {
	if !f.Exists {
		markReleased(st, f)

		if err := store.Write(st); err != nil {
			return Outcome{Fence: f, Message: "node gone, but the state could not be written: " + err.Error()}
		}

		return Outcome{Fence: f, Released: true, Message: "the node no longer exists: released (state record closed)"}
	}

	if phaseMutated(f.Phase) {
		if err := waitSettled(ctx, kube, f.Name, o); err != nil {
			return Outcome{Fence: f, Message: "stays fenced: " + err.Error()}
		}
	}

	markReleased(st, f)

	if err := store.Write(st); err != nil {
		return Outcome{Fence: f, Message: "not released: writing the state first failed: " + err.Error()}
	}

	rec := f.Record
	keepCordon := rec == nil
	patchRec := cluster.FenceRecord{WasCordoned: true}

	if rec != nil {
		patchRec = *rec
	}

	_, err := kube.CASPatch(ctx, f.Name, 10, func(n *corev1.Node) error {
		if f.UID != "" && string(n.UID) != f.UID {
			return errReplaced
		}

		if owner := n.Annotations[plan.OwnerAnnotation]; owner != "" && owner != f.Holder {
			return fmt.Errorf("%s is now fenced by %s, not by %s: not releasing it", f.Name, owner, f.Holder)
		}

		return nil
	}, func(n *corev1.Node) map[string]any {
		p := cluster.ReleasePatch(patchRec)
		if n.Annotations[cluster.ScaleDownGuardByAnnotation] == f.Holder {
			ann := p["metadata"].(map[string]any)["annotations"].(map[string]any)
			ann[cluster.ScaleDownDisabledAnnotation] = nil
			ann[cluster.ScaleDownGuardByAnnotation] = nil
		}

		return p
	}, nil)

	switch {
	case apierrors.IsNotFound(err), errors.Is(err, errReplaced):
		return Outcome{Fence: f, Released: true, Message: "the node was deleted meanwhile: released"}
	case err != nil:
		return Outcome{Fence: f, Message: "not released: " + err.Error()}
	case keepCordon:
		return Outcome{Fence: f, Released: true, Message: "annotations removed; the cordon was kept: no recovery record says whether it was cordoned before the claim (uncordon it yourself if it was not)"}
	case patchRec.WasCordoned:
		return Outcome{Fence: f, Released: true, Message: "released (left cordoned: it was cordoned before the claim)"}
	}

	msg := "released and uncordoned"
	if phaseMutated(f.Phase) {
		msg += "; its verified marker is unset, so the next plan re-fences it if its runtime has not loaded the credential"
	}

	return Outcome{Fence: f, Released: true, Message: msg}
}

var errReplaced = errors.New("replaced")

func markReleased(st *state.State, f Fence) {
	r := st.Record(f.Name)
	if r == nil {
		return
	}

	now := time.Now().UTC()
	r.Phase, r.Outcome, r.Finished, r.Updated = state.PhaseReleased, state.OutcomeReleased, &now, now
}

// waitSettled waits until the node is Ready with no lifecycle taints, printing progress.
func waitSettled(ctx context.Context, kube *cluster.Connection, name string, o ReleaseOptions) error {
	progress := o.Progress
	if progress == nil {
		progress = io.Discard
	}

	last := ""

	return cluster.WaitFor(ctx, o.ReadyTimeout, time.Second, func() (bool, error) {
		n, err := kube.Get(ctx, name)
		if err != nil {
			return false, err
		}

		lifecycle := slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return taints.Lifecycle(t.Key) })
		ready := cluster.Ready(n)

		if msg := fmt.Sprintf("%s: waiting before release: Ready=%t, lifecycle taints=%t", name, ready, lifecycle); msg != last && !(ready && !lifecycle) {
			fmt.Fprintln(progress, msg)
			last = msg
		}

		if ready && !lifecycle {
			return true, nil
		}

		return false, fmt.Errorf("%s is not Ready with its lifecycle taints cleared (Ready=%t, lifecycle taints=%t)", name, ready, lifecycle)
	})
}
