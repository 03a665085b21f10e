package drain

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/plan"
)

// What a drain of a node would meet, from its pods and the budgets: the drain's own rules.
func TestBlockers(t *testing.T) {
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

	// The fleet: a control plane with its NoSchedule taint and the one worker, n1.
	ready := corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}
	cpTaint := corev1.Taint{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}
	node := func(name string, taints ...corev1.Taint) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Taints: taints}, Status: ready}
	}
	alone := []corev1.Node{node("cp", cpTaint), node("n1")}
	room := append([]corev1.Node{node("n2")}, alone...)
	tolerant := func(p corev1.Pod) corev1.Pod {
		p.Spec.Tolerations = []corev1.Toleration{{Key: cpTaint.Key, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}

		return p
	}
	two := []corev1.Pod{pod("web-a", web, owned), pod("web-b", web, owned)}
	minOne := []policyv1.PodDisruptionBudget{budget("web", &metav1.LabelSelector{MatchLabels: web}, 1)}

	for _, tc := range []struct {
		name  string
		pods  []corev1.Pod
		pdbs  []policyv1.PodDisruptionBudget
		want  []plan.DrainBlocker
		nodes []corev1.Node
	}{
		{name: "allows 1, the node carries 2, nowhere else to go: the second is held", pods: two, pdbs: minOne, nodes: alone,
			want: []plan.DrainBlocker{{Kind: plan.BlockerBudget, Pod: "apps/web-b", Budget: "apps/web", Allowed: 1, OnNode: 2}}},
		{name: "allows 1, the node carries 2, another worker takes the replacement: not held", pods: two, pdbs: minOne, nodes: room},
		{name: "the replacement tolerates the control plane's taint: not held", pods: []corev1.Pod{tolerant(two[0]), tolerant(two[1])}, pdbs: minOne, nodes: alone},
		{name: "the other worker is cordoned: held", pods: two, pdbs: minOne, nodes: func() []corev1.Node {
			n := node("n2")
			n.Spec.Unschedulable = true

			return append([]corev1.Node{n}, alone...)
		}(), want: []plan.DrainBlocker{{Kind: plan.BlockerBudget, Pod: "apps/web-b", Budget: "apps/web", Allowed: 1, OnNode: 2}}},
		{name: "the other worker does not match the pods' node selector: held", pods: func() []corev1.Pod {
			out := []corev1.Pod{pod("web-a", web, owned), pod("web-b", web, owned)}
			for i := range out {
				out[i].Spec.NodeSelector = map[string]string{"disk": "ssd"}
			}

			return out
		}(), pdbs: minOne, nodes: room,
			want: []plan.DrainBlocker{{Kind: plan.BlockerBudget, Pod: "apps/web-b", Budget: "apps/web", Allowed: 1, OnNode: 2}}},
		{name: "allows 2, the node carries 2: not held", pods: two,
			pdbs: []policyv1.PodDisruptionBudget{budget("web", &metav1.LabelSelector{MatchLabels: web}, 2)}, nodes: alone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Blockers(tc.pods, tc.pdbs, tc.nodes)["n1"]; !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}

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
			if got := Blockers(tc.pods, tc.pdbs, nil)["n1"]; !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// Which pods a drain must evict, and which budget selects a pod (policy/v1: an empty selector
// selects every pod of its namespace, a nil one none) — the rule the planner's blockers and the
// drain's own "still running" description share.
func TestEvictableAndSelects(t *testing.T) {
	daemon := []metav1.OwnerReference{{Kind: "DaemonSet", Name: "agent", Controller: ptr.To(true)}}

	for _, tc := range []struct {
		name string
		pod  corev1.Pod
		want bool
	}{
		{"running", corev1.Pod{}, true},
		{"succeeded", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodSucceeded}}, false},
		{"failed", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed}}, false},
		{"a DaemonSet's", corev1.Pod{ObjectMeta: metav1.ObjectMeta{OwnerReferences: daemon}}, false},
		{"a DaemonSet's, not its controller", corev1.Pod{ObjectMeta: metav1.ObjectMeta{OwnerReferences: []metav1.OwnerReference{{Kind: "DaemonSet", Name: "agent"}}}}, true},
		{"static (mirror)", corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "x"}}}, false},
	} {
		t.Run("evictable/"+tc.name, func(t *testing.T) {
			if got := Evictable(&tc.pod); got != tc.want {
				t.Fatalf("Evictable = %v, want %v", got, tc.want)
			}
		})
	}

	web := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Labels: map[string]string{"app": "web"}}}

	for _, tc := range []struct {
		name string
		sel  *metav1.LabelSelector
		want bool
	}{
		{"matching labels", &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, true},
		{"other labels", &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}, false},
		{"empty: every pod of the namespace", &metav1.LabelSelector{}, true},
		{"nil: none", nil, false},
		{"invalid: none", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Bogus"}}}, false},
	} {
		t.Run("selects/"+tc.name, func(t *testing.T) {
			b := &policyv1.PodDisruptionBudget{Spec: policyv1.PodDisruptionBudgetSpec{Selector: tc.sel}}
			if got := Selects(b, web); got != tc.want {
				t.Fatalf("Selects = %v, want %v", got, tc.want)
			}
		})
	}
}

// A budget at 0 that never frees by itself needs an action, named for the owner when it is
// known; one short of healthy pods frees as replacements become ready.
func TestAction(t *testing.T) {
	budget := func(expected, healthy int32) *policyv1.PodDisruptionBudget {
		return &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b"},
			Status: policyv1.PodDisruptionBudgetStatus{ExpectedPods: expected, CurrentHealthy: healthy}}
	}
	pod := func(labels map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Labels: labels}}
	}

	for _, tc := range []struct {
		name   string
		b      *policyv1.PodDisruptionBudget
		p      *corev1.Pod
		action string // a word the action must carry; "" none
	}{
		{"a rolling workload one short", budget(3, 2), pod(nil), ""},
		{"at its floor, every pod healthy", budget(1, 1), pod(nil), "scale its workload up or relax the budget"},
		{"Longhorn's instance manager", budget(1, 1), pod(map[string]string{"longhorn.io/component": "instance-manager"}), "add a replica"},
		{"Longhorn even while one is unready", budget(2, 1), pod(map[string]string{"longhorn.io/component": "instance-manager"}), "Longhorn"},
		{"CloudNativePG's primary", budget(1, 1), pod(map[string]string{"cnpg.io/cluster": "pg", "cnpg.io/instanceRole": "primary"}), "kubectl cnpg promote pg"},
		{"CloudNativePG's replica one short", budget(2, 1), pod(map[string]string{"cnpg.io/cluster": "pg", "cnpg.io/instanceRole": "replica"}), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Action(tc.b, tc.p)
			if tc.action == "" && got != "" || tc.action != "" && !strings.Contains(got, tc.action) {
				t.Fatalf("action %q, want one with %q", got, tc.action)
			}
		})
	}
}
