package cluster

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/ghcrsync/ghcrsync/internal/answer"
	"github.com/ghcrsync/ghcrsync/internal/redact"
	"github.com/ghcrsync/ghcrsync/plan"
)

// Kustomizations is Flux's Kustomization resource: what kustomize-controller applies from Git.
var Kustomizations = schema.GroupVersionResource{Group: "kustomize.toolkit.fluxcd.io", Version: "v1", Resource: "kustomizations"}

// SuspendedByAnnotation names the run that suspended a Kustomization: only that run (or a
// release of it) resumes it; one suspended by a person carries none and is never resumed.
const SuspendedByAnnotation = "ghcrsync.dev/suspended-by"

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
	obs.SuspendedBy = k.GetAnnotations()[SuspendedByAnnotation]

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
// status meanwhile). ours is false when it was suspended already by someone else: it is left as
// it is, and the run never resumes it. A lost answer is looked for at the next read: the
// annotation tells whether the write landed.
func (c *Connection) Suspend(ctx context.Context, ns, name, holder string) (ours bool, err error) {
	return c.casKustomization(ctx, ns, name, func(k *unstructured.Unstructured) (bool, bool) {
		if k.GetAnnotations()[SuspendedByAnnotation] == holder {
			return true, false // landed already
		}

		if s, _, _ := unstructured.NestedBool(k.Object, "spec", "suspend"); s {
			return false, false // someone else's suspension
		}

		_ = unstructured.SetNestedField(k.Object, true, "spec", "suspend")
		setAnnotation(k, SuspendedByAnnotation, holder)

		return true, true
	})
}

// Resume lifts holder's suspension of the Kustomization ns/name. gone is true when there is none
// to lift: it no longer exists, or carries no suspension of this run (resumed already, by this
// run or a person, or never suspended by it).
func (c *Connection) Resume(ctx context.Context, ns, name, holder string) (gone bool, err error) {
	resumed, err := c.casKustomization(ctx, ns, name, func(k *unstructured.Unstructured) (bool, bool) {
		if k.GetAnnotations()[SuspendedByAnnotation] != holder {
			return false, false
		}

		_ = unstructured.SetNestedField(k.Object, false, "spec", "suspend")
		setAnnotation(k, SuspendedByAnnotation, "")

		return true, true
	})

	if errors.Is(err, ErrGone) {
		return true, nil
	}

	return !resumed, err
}

// casKustomization reads the Kustomization and applies edit, which says whether the outcome is
// the caller's (ok) and whether it changed the object (write); a write that conflicts, or whose
// answer is lost, is decided again from a fresh read.
func (c *Connection) casKustomization(ctx context.Context, ns, name string, edit func(*unstructured.Unstructured) (ok, write bool)) (bool, error) {
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
		if !write {
			return ok, nil
		}

		_, err = res.Update(ctx, k, metav1.UpdateOptions{FieldManager: FieldManager})

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

// setAnnotation sets (or, with "", removes) one annotation.
func setAnnotation(k *unstructured.Unstructured, key, value string) {
	a := k.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}

	if value == "" {
		delete(a, key)
	} else {
		a[key] = value
	}

	k.SetAnnotations(a)
}
