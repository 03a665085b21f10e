// Package drain is the drain's own rules, with no client: which pods a drain must evict, which
// PodDisruptionBudget selects a pod, what would hold a node's drain (a budget allowing no
// disruption, or fewer than the node carries while no other node takes a replacement; a pod
// no controller recreates; emptyDir data), and whether a node takes pods. internal/cluster lists
// the pods, evicts them and waits; plan reads what this package found.
package drain

import (
	"context"
	"fmt"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"

	"github.com/ghcrsync/ghcrsync/plan"
)

// Blockers is, per node, what a drain of it would meet among its evictable pods: a
// PodDisruptionBudget selecting the pod that allows no disruption now (the drain waits), or that
// allows fewer than the node carries of its pods while no other node takes their replacements
// (the first evictions pass; the rest wait for replicas that cannot become ready), no controller
// (the drain refuses: nothing would recreate it), emptyDir volumes (their data is lost). The
// same rules as the drain's own (drain.Helper without Force, DeleteEmptyDirData).
func Blockers(pods []corev1.Pod, pdbs []policyv1.PodDisruptionBudget, nodes []corev1.Node) map[string][]plan.DrainBlocker {
	out := budgetCapacityHolds(pods, pdbs, nodes)

	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName == "" || !Evictable(p) {
			continue
		}

		name := p.Namespace + "/" + p.Name
		add := func(b plan.DrainBlocker) { out[p.Spec.NodeName] = append(out[p.Spec.NodeName], b) }

		for j := range pdbs {
			if b := &pdbs[j]; b.Namespace == p.Namespace && b.Status.DisruptionsAllowed == 0 && Selects(b, p) {
				add(plan.DrainBlocker{Kind: plan.BlockerBudget, Pod: name, Budget: b.Namespace + "/" + b.Name, Action: Action(b, p)})
			}
		}

		if metav1.GetControllerOf(p) == nil {
			add(plan.DrainBlocker{Kind: plan.BlockerBare, Pod: name})
		}

		var dirs []string

		for _, v := range p.Spec.Volumes {
			if v.EmptyDir != nil {
				dirs = append(dirs, v.Name)
			}
		}

		if len(dirs) > 0 {
			add(plan.DrainBlocker{Kind: plan.BlockerEmptyDir, Pod: name, Volumes: dirs})
		}
	}

	return out
}

// Action is what frees a budget at 0 disruptions that never frees by itself, holding pod p ("":
// it frees as its workload's replacements become ready). Where the owner is known the action is
// its own: Longhorn keeps its instance manager's budget at 0 while a volume's only healthy
// replica is on the node; CloudNativePG's primary is held until a switchover. Otherwise a budget
// that allows nothing with every one of its pods healthy is at its floor by its own spec.
func Action(b *policyv1.PodDisruptionBudget, p *corev1.Pod) string {
	budget := b.Namespace + "/" + b.Name

	switch {
	case p.Labels["longhorn.io/component"] == "instance-manager":
		return fmt.Sprintf("Longhorn keeps PodDisruptionBudget %s of its instance manager %s at 0 while a volume's only healthy replica is on this node: "+
			"add a replica of the node's volumes on another node (or evict the node's replicas in Longhorn), then run again", budget, p.Namespace+"/"+p.Name)
	case p.Labels["cnpg.io/cluster"] != "" && (p.Labels["cnpg.io/instanceRole"] == "primary" || p.Labels["role"] == "primary"):
		c := p.Labels["cnpg.io/cluster"]

		return fmt.Sprintf("CloudNativePG's primary %s of cluster %s is held by PodDisruptionBudget %s until a switchover: "+
			"promote a replica on another node (kubectl cnpg promote %s <instance>), then run again", p.Namespace+"/"+p.Name, c, budget, c)
	case b.Status.ExpectedPods > 0 && b.Status.CurrentHealthy >= b.Status.ExpectedPods:
		return fmt.Sprintf("PodDisruptionBudget %s allows no disruption with all %d of its pods healthy, so no replacement frees it: "+
			"scale its workload up or relax the budget for the rotation (pod %s), then run again", budget, b.Status.ExpectedPods, p.Namespace+"/"+p.Name)
	}

	return ""
}

// Selects reports whether the budget's selector selects the pod (policy/v1: an empty selector
// selects every pod of its namespace, a nil one none).
func Selects(b *policyv1.PodDisruptionBudget, p *corev1.Pod) bool {
	if b.Spec.Selector == nil {
		return false
	}

	sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
	if err != nil {
		return false
	}

	return sel.Matches(labels.Set(p.Labels))
}

// Evictable reports whether a drain must evict the pod before its node may reboot: not
// finished, not owned by a DaemonSet, not a static (mirror) pod.
func Evictable(p *corev1.Pod) bool {
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return false
	}

	if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return false
	}

	for _, o := range p.OwnerReferences {
		if o.Kind == "DaemonSet" && o.Controller != nil && *o.Controller {
			return false
		}
	}

	return true
}

// budgetCapacityHolds are the pods a budget that allows some disruptions will still hold: on a
// node carrying more of its pods than it allows, when no other node would take a replacement
// (Ready, schedulable, every NoSchedule/NoExecute taint tolerated, the pod's node selector
// matched) — the evicted pods' replacements stay Pending, the budget never allows more, and the
// drain waits out nodes.drain_timeout. The pods past the first Allowed (by name) are held.
func budgetCapacityHolds(pods []corev1.Pod, pdbs []policyv1.PodDisruptionBudget, nodes []corev1.Node) map[string][]plan.DrainBlocker {
	out := map[string][]plan.DrainBlocker{}

	for j := range pdbs {
		b := &pdbs[j]
		allowed := int(b.Status.DisruptionsAllowed)

		if allowed == 0 { // every selected pod is a blocker already
			continue
		}

		byNode := map[string][]*corev1.Pod{}

		for i := range pods {
			if p := &pods[i]; p.Spec.NodeName != "" && Evictable(p) && b.Namespace == p.Namespace && Selects(b, p) {
				byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p)
			}
		}

		for node, on := range byNode {
			if len(on) <= allowed || replacementFits(on[0], node, nodes) {
				continue
			}

			sort.Slice(on, func(a, c int) bool { return on[a].Name < on[c].Name })

			for _, p := range on[allowed:] {
				out[node] = append(out[node], plan.DrainBlocker{Kind: plan.BlockerBudget, Pod: p.Namespace + "/" + p.Name,
					Budget: b.Namespace + "/" + b.Name, Allowed: allowed, OnNode: len(on)})
			}
		}
	}

	return out
}

// replacementFits reports whether a replacement of p could be scheduled on a node other than
// from: Ready, schedulable, its node selector matched, every hard taint tolerated.
func replacementFits(p *corev1.Pod, from string, nodes []corev1.Node) bool {
	for i := range nodes {
		n := &nodes[i]
		if n.Name == from || !NodeReady(n) || n.Spec.Unschedulable || !labels.SelectorFromSet(p.Spec.NodeSelector).Matches(labels.Set(n.Labels)) {
			continue
		}

		if !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return untolerated(p, t) }) {
			return true
		}
	}

	return false
}

// untolerated: a taint that keeps p off its node (NoSchedule or NoExecute, not tolerated).
func untolerated(p *corev1.Pod, t corev1.Taint) bool {
	if t.Effect != corev1.TaintEffectNoSchedule && t.Effect != corev1.TaintEffectNoExecute {
		return false
	}

	return !slices.ContainsFunc(p.Spec.Tolerations, func(tol corev1.Toleration) bool { return tol.ToleratesTaint(klog.Background(), &t, false) })
}

// NodeReady reports the Node's Ready condition.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}

	return false
}

// Check is asked (a nil Check allows every eviction) before each eviction request, with the number of pods the drain has to
// evict: a *Refused stops the drain; any other error (the check could not read what it
// judges) is asked again.
type Check func(ctx context.Context, pods int) error

func (d Check) Ask(ctx context.Context, pods int) error {
	if d == nil {
		return nil
	}

	return d(ctx, pods)
}

// Refused is a drain's check refusing an eviction: no pod of the node is evicted after it.
type Refused struct{ Why error }

func (e *Refused) Error() string { return "an eviction was refused: " + e.Why.Error() }
func (e *Refused) Unwrap() error { return e.Why }
