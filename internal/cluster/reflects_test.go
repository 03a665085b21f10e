package cluster

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/state"
)

func TestReflects(t *testing.T) {
	claimed := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "w1", Annotations: map[string]string{}}}
	claim := object.ClaimPatch("run-a", state.Fence{UID: "u1", WasCordoned: false, DesiredRevision: "rev"})

	// What the claim makes of a node: its annotations and the cordon.
	meta := claim["metadata"].(map[string]any)
	for k, v := range meta["annotations"].(map[string]any) {
		if s, ok := v.(string); ok {
			claimed.Annotations[k] = s
		}
	}

	claimed.Spec.Unschedulable = true

	other := claimed.DeepCopy()
	other.Annotations[object.OwnerAnnotation] = "run-b"

	released := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "w1"}}

	for _, tc := range []struct {
		name  string
		obj   any
		patch map[string]any
		want  bool
	}{
		{"the claim landed", claimed, claim, true},
		{"another run's claim is not ours", other, claim, false},
		{"nothing landed", released, claim, false},
		{"a release landed: keys gone, cordon lifted (false omitted)", released,
			map[string]any{"metadata": map[string]any{"annotations": map[string]any{object.OwnerAnnotation: nil}}, "spec": map[string]any{"unschedulable": false}}, true},
		{"a release that did not land", claimed,
			map[string]any{"metadata": map[string]any{"annotations": map[string]any{object.OwnerAnnotation: nil}}}, false},
		{"the resourceVersion a CAS patch carries is not asked", claimed,
			map[string]any{"metadata": map[string]any{"annotations": map[string]any{object.OwnerAnnotation: "run-a"}}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Reflects(tc.obj, tc.patch); got != tc.want {
				t.Fatalf("Reflects = %t, want %t", got, tc.want)
			}
		})
	}
}
