package cluster

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/plan"
)

// What a drain of a node would meet, from its pods and the budgets: the drain's own rules.
func TestDrainBlockers(t *testing.T) {
	owned := []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "web-1", Controller: ptr.To(true)}}
	pod := func(name string, labels map[string]string, owners []metav1.OwnerReference, vols ...corev1.Volume) corev1.Pod {
		return corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "apps", Labels: labels, OwnerReferences: owners},
			Spec:       corev1.PodSpec{NodeName: "n1", Volumes: vols},
		}
	}
	budget := func(name string, sel *metav1.LabelSelector, allowed int32) policyv1.PodDisruptionBudget {
		return policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "apps"}, Spec: policyv1.PodDisruptionBudgetSpec{Selector: sel},
			Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: allowed},
		}
	}
	web := map[string]string{"app": "web"}
	cache := corev1.Volume{Name: "cache", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	daemon := []metav1.OwnerReference{{Kind: "DaemonSet", Name: "agent", Controller: ptr.To(true)}}

	for _, tc := range []struct {
		name string
		pods []corev1.Pod
		pdbs []policyv1.PodDisruptionBudget
		want []plan.DrainBlocker
	}{
		{"a budget allowing none holds", []corev1.Pod{pod("web-a", web, owned)}, []policyv1.PodDisruptionBudget{budget("web", &metav1.LabelSelector{MatchLabels: web}, 0)},
			[]plan.DrainBlocker{{Kind: plan.BlockerBudget, Pod: "apps/web-a", Budget: "apps/web"}}},
		{"a budget allowing one does not", []corev1.Pod{pod("web-a", web, owned)}, []policyv1.PodDisruptionBudget{budget("web", &metav1.LabelSelector{MatchLabels: web}, 1)}, nil},
		{"a budget selecting other pods does not", []corev1.Pod{pod("web-a", web, owned)},
			[]policyv1.PodDisruptionBudget{budget("db", &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}, 0)}, nil},
		{"an empty selector selects all", []corev1.Pod{pod("web-a", web, owned)}, []policyv1.PodDisruptionBudget{budget("all", &metav1.LabelSelector{}, 0)},
			[]plan.DrainBlocker{{Kind: plan.BlockerBudget, Pod: "apps/web-a", Budget: "apps/all"}}},
		{"a nil selector selects none", []corev1.Pod{pod("web-a", web, owned)}, []policyv1.PodDisruptionBudget{budget("none", nil, 0)}, nil},
		{"a bare pod", []corev1.Pod{pod("solo", nil, nil)}, nil, []plan.DrainBlocker{{Kind: plan.BlockerBare, Pod: "apps/solo"}}},
		{"emptyDir data", []corev1.Pod{pod("web-a", web, owned, cache)}, nil, []plan.DrainBlocker{{Kind: plan.BlockerEmptyDir, Pod: "apps/web-a", Volumes: []string{"cache"}}}},
		{"a DaemonSet pod is not evicted", []corev1.Pod{pod("agent", web, daemon, cache)}, []policyv1.PodDisruptionBudget{budget("all", &metav1.LabelSelector{}, 0)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := DrainBlockers(tc.pods, tc.pdbs)["n1"]; !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
