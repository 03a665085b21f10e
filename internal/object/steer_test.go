package object

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/taints"
)

// WithoutSteering merges the removal of the run's steering into a patch: other spec fields and
// annotations stay, another run's steering is not touched.
func TestWithoutSteering(t *testing.T) {
	const holder = "run-a"

	steered := func(by string) *corev1.Node {
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{SteeredByAnnotation: by}},
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{
				{Key: taints.Steering, Value: taints.RunToken(by), Effect: corev1.TaintEffectPreferNoSchedule},
				{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule},
			}},
		}
	}

	release := func() map[string]any {
		return map[string]any{
			"metadata": map[string]any{"annotations": map[string]any{OwnerAnnotation: nil}},
			"spec":     map[string]any{"unschedulable": false},
		}
	}

	for _, tc := range []struct {
		name string
		node *corev1.Node
		want string
	}{
		{"not steered", &corev1.Node{}, `{"metadata":{"annotations":{"ghcrsync.dev/owner":null}},"spec":{"unschedulable":false}}`},
		{"steered by this run", steered(holder), `{"metadata":{"annotations":{"ghcrsync.dev/owner":null,"ghcrsync.dev/steered-by":null}},` +
			`"spec":{"taints":[{"key":"dedicated","value":"gpu","effect":"NoSchedule"}],"unschedulable":false}}`},
		{"steered by another run", steered("run-b"), `{"metadata":{"annotations":{"ghcrsync.dev/owner":null}},"spec":{"unschedulable":false}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := json.Marshal(WithoutSteering(tc.node, holder, release()))
			if err != nil {
				t.Fatal(err)
			}

			if string(got) != tc.want {
				t.Fatalf("patch\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}
