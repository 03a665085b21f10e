package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ghcrsync/ghcrsync/internal/answer"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/plan"
)

// Kustomizations is Flux's Kustomization resource: what kustomize-controller applies from Git.
var Kustomizations = schema.GroupVersionResource{Group: "kustomize.toolkit.fluxcd.io", Version: "v1", Resource: "kustomizations"}

// casTries bounds a compare-and-swap loop against a controller that keeps writing.
const casTries = 10

// Kustomization reads the Flux Kustomization ns/name (Exists false when it, or Flux's CRD, is not
// there).
func (c *Connection) Kustomization(ctx context.Context, ns, name string) (plan.KustomizationObs, error) {
	obs := plan.KustomizationObs{Namespace: ns, Name: name}

	k, err := c.getKustomization(ctx, ns, name)

	switch {
	case errors.Is(err, ErrGone):
		return obs, nil
	case err != nil:
		return obs, err
	}

	obs.Exists, obs.UID = true, string(k.GetUID())
	obs.Suspended, _, _ = unstructured.NestedBool(k.Object, "spec", "suspend")
	obs.SuspendedBy = k.GetAnnotations()[object.SuspendedByAnnotation]
	obs.Handled, _, _ = unstructured.NestedString(k.Object, "status", "lastHandledReconcileAt")

	return obs, nil
}

// getKustomization is the one read of a Kustomization: ErrGone when it, or Flux's CRD, is not
// there.
func (c *Connection) getKustomization(ctx context.Context, ns, name string) (*unstructured.Unstructured, error) {
	dyn, err := c.Dynamic()
	if err != nil {
		return nil, err
	}

	k, err := dyn.Resource(Kustomizations).Namespace(ns).Get(ctx, name, metav1.GetOptions{})

	switch {
	case apierrors.IsNotFound(err), meta.IsNoMatchError(err):
		return nil, fmt.Errorf("Kustomization %s/%s: %w", ns, name, ErrGone)
	case err != nil:
		return nil, c.Unreachable("read Kustomization "+ns+"/"+name, err)
	}

	return k, nil
}

// ErrGone is a Kustomization that no longer exists.
var ErrGone = errors.New("no such Kustomization")

// Suspend sets spec.suspend on the Kustomization ns/name for holder's run, with its
// annotation, by a compare-and-swap on its resourceVersion (kustomize-controller writes its
// status meanwhile). request, when not "", is written with it as a reconcile request, which
// kustomize-controller answers (status.lastHandledReconcileAt, read by Kustomization) at the end
// of a reconcile that saw the suspension: reconciles are serial, so every one begun before it has
// ended, and none begins while it holds. ours is false when it was suspended already by someone
// else: it is left as it is, and the run never resumes it. The run's own suspension lifted since
// (`flux resume` leaves its annotation) is written again. A lost answer is looked for at the
// next read: the annotation tells whether the write landed.
func (c *Connection) Suspend(ctx context.Context, ns, name, holder, request string) (ours bool, err error) {
	return c.casKustomization(ctx, ns, name, func(k *unstructured.Unstructured) (bool, *suspension) {
		s, _, _ := unstructured.NestedBool(k.Object, "spec", "suspend")

		switch {
		case s && k.GetAnnotations()[object.SuspendedByAnnotation] == holder:
			return true, nil // landed already
		case s:
			return false, nil // someone else's suspension
		}

		return true, &suspension{suspend: true, by: holder, request: request}
	})
}

// Resume lifts holder's suspension of the Kustomization ns/name. gone is true when there is none
// to lift: it no longer exists, or carries no suspension of this run (resumed already, by this
// run or a person, or never suspended by it).
func (c *Connection) Resume(ctx context.Context, ns, name, holder string) (gone bool, err error) {
	resumed, err := c.casKustomization(ctx, ns, name, func(k *unstructured.Unstructured) (bool, *suspension) {
		if k.GetAnnotations()[object.SuspendedByAnnotation] != holder {
			return false, nil
		}

		return true, &suspension{suspend: false}
	})

	if errors.Is(err, ErrGone) {
		return true, nil
	}

	return !resumed, err
}

// suspension is the one write ghcrsync makes on a Kustomization: spec.suspend, the annotation
// naming the run that set it ("" removes it), and with a suspension a reconcile request the
// controller answers once it has taken it. Nothing else of the object is sent.
type suspension struct {
	suspend bool
	by      string
	request string // a reconcile request written with it ("": none)
}

// patch is the suspension as a merge patch that holds only if the Kustomization is still at rv.
func (s suspension) patch(rv string) []byte {
	var by any
	if s.by != "" {
		by = s.by
	}

	ann := map[string]any{object.SuspendedByAnnotation: by}
	if s.request != "" {
		ann[ReconcileRequestAnnotation] = s.request
	}

	body, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": rv, "annotations": ann},
		"spec":     map[string]any{"suspend": s.suspend},
	})

	return body
}

// casKustomization reads the Kustomization and asks edit whether the outcome is the caller's (ok)
// and what to write (nil: nothing); a write that conflicts, or whose answer is lost, is decided
// again from a fresh read.
func (c *Connection) casKustomization(ctx context.Context, ns, name string, edit func(*unstructured.Unstructured) (ok bool, write *suspension)) (bool, error) {
	dyn, err := c.Dynamic()
	if err != nil {
		return false, err
	}

	res := dyn.Resource(Kustomizations).Namespace(ns)

	for range casTries {
		k, err := c.getKustomization(ctx, ns, name)
		if err != nil {
			return false, err
		}

		ok, write := edit(k)
		if write == nil {
			return ok, nil
		}

		_, err = res.Patch(ctx, name, types.MergePatchType, write.patch(k.GetResourceVersion()), metav1.PatchOptions{FieldManager: FieldManager})

		switch {
		case err == nil:
			return ok, nil
		case apierrors.IsConflict(err), answer.Lost(err):
			if ctx.Err() != nil {
				return false, ctx.Err()
			}

			continue
		case apierrors.IsNotFound(err):
			return false, fmt.Errorf("Kustomization %s/%s: %w", ns, name, ErrGone)
		default:
			return false, fmt.Errorf("write Kustomization %s/%s: %s", ns, name, redact.Error(err))
		}
	}

	return false, fmt.Errorf("Kustomization %s/%s kept changing under %d compare-and-swaps: try again", ns, name, casTries)
}
