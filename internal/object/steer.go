package object

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/ghcrsync/ghcrsync/internal/taints"
)

// ErrNotTheNode is a steering patch's refusal: the Node of that name is another machine now.
var ErrNotTheNode = errors.New("the Node is another object now (its uid changed)")

// SteerPatch puts holder's steering taint (taints.Steering, valued with its token) on n with
// effect, and names holder in SteeredByAnnotation, leaving every other taint as it is. A merge
// patch replaces the whole taint list, so it is only ever sent as a compare-and-swap (CASPatch)
// on the n it was built from.
func SteerPatch(n *corev1.Node, holder, effect string) map[string]any {
	token := taints.RunToken(holder)
	list := make([]corev1.Taint, 0, len(n.Spec.Taints)+1)

	for _, t := range n.Spec.Taints {
		if t.Key != taints.Steering {
			list = append(list, t)
		}
	}

	list = append(list, corev1.Taint{Key: taints.Steering, Value: token, Effect: corev1.TaintEffect(effect)})

	return map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{SteeredByAnnotation: holder}},
		"spec":     map[string]any{"taints": list},
	}
}

// withoutSteering is n's taint list without the steering taint of token, and whether it had one.
// A steering taint of another run, and an operator's taint of the same effect, stay.
func withoutSteering(n *corev1.Node, token string) ([]corev1.Taint, bool) {
	list := make([]corev1.Taint, 0, len(n.Spec.Taints))
	found := false

	for _, t := range n.Spec.Taints {
		if t.Key == taints.Steering && t.Value == token {
			found = true

			continue
		}

		list = append(list, t)
	}

	return list, found
}

// Steered reports whether n carries holder's steering taint or the annotation naming it.
func Steered(n *corev1.Node, holder string) bool { return UnsteerPatch(n, holder) != nil }

// UnsteerPatch removes holder's steering taint, and the annotation naming it, from n; nil when
// n carries neither.
func UnsteerPatch(n *corev1.Node, holder string) map[string]any {
	list, found := withoutSteering(n, taints.RunToken(holder))
	named := n.Annotations[SteeredByAnnotation] == holder

	p := map[string]any{}
	if found {
		p["spec"] = map[string]any{"taints": list}
	}

	if named {
		p["metadata"] = map[string]any{"annotations": map[string]any{SteeredByAnnotation: nil}}
	}

	if len(p) == 0 {
		return nil
	}

	return p
}

// WithoutSteering adds UnsteerPatch(n, holder) to patch (a merge patch of n: its spec and
// annotations are merged into, not replaced) and returns it.
func WithoutSteering(n *corev1.Node, holder string, patch map[string]any) map[string]any {
	un := UnsteerPatch(n, holder)
	if un == nil {
		return patch
	}

	if s, ok := un["spec"].(map[string]any); ok {
		submap(patch, "spec")["taints"] = s["taints"]
	}

	if _, ok := un["metadata"]; ok {
		submap(submap(patch, "metadata"), "annotations")[SteeredByAnnotation] = nil
	}

	return patch
}

// submap is m[key] as a map, made when absent.
func submap(m map[string]any, key string) map[string]any {
	sub, _ := m[key].(map[string]any)
	if sub == nil {
		sub = map[string]any{}
		m[key] = sub
	}

	return sub
}

// Steer puts holder's steering taint on the node named, if it is still the machine of uid (a
// compare-and-swap, so a concurrent taint change is never lost).
func Steer(ctx context.Context, p Patcher, name, uid, holder, effect string) error {
	_, err := p.CASPatch(ctx, name, 10, sameUID(uid), func(n *corev1.Node) map[string]any { return SteerPatch(n, holder, effect) }, nil)

	return err
}

// Unsteer takes holder's steering taint off the node named. gone is true when there is nothing
// to take off: the node is deleted, another machine has its name, or it carries no such taint
// (removed already, by this run or a person).
func Unsteer(ctx context.Context, p Patcher, name, uid, holder string) (gone bool, err error) {
	check := func(n *corev1.Node) error {
		if err := sameUID(uid)(n); err != nil {
			return err
		}

		if !Steered(n, holder) {
			return ErrNoFence
		}

		return nil
	}

	_, err = p.CASPatch(ctx, name, 10, check, func(n *corev1.Node) map[string]any { return UnsteerPatch(n, holder) }, nil)

	switch {
	case apierrors.IsNotFound(err), errors.Is(err, ErrNoFence), errors.Is(err, ErrNotTheNode):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("remove the steering taint %s from %s: %w", taints.Steering, name, err)
	}

	return false, nil
}

func sameUID(uid string) func(*corev1.Node) error {
	return func(n *corev1.Node) error {
		if uid != "" && string(n.UID) != uid {
			return ErrNotTheNode
		}

		return nil
	}
}
