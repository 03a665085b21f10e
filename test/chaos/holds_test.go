package chaos

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/plan"
)

// One seed in three, before its first plan, an operator's workload stands on a worker the plan
// will fence: one replica pinned to it behind a budget that allows no disruption (heldNS/
// planHoldPDB). The plan must predict the drain it holds.
const (
	heldNS      = "chaos-held"
	planHoldPDB = "chaos-plan-hold"
)

// holdNamespaces are where the campaign compares predicted and met holds.
var holdNamespaces = []string{"apps", heldNS}

// holds is what the campaign compares: the drains the first plan said a budget would hold,
// against the evictions the apiserver refused during the first apply.
type holds struct {
	// placed: the seed put planHoldPDB in place before the plan; lifted is when it went.
	placed bool
	lifted time.Time
	// pods are the pods of holdNamespaces when the plan was made; zero the budgets that
	// allowed no disruption then (read before the plan).
	pods map[string]bool
	zero []string
	// predicted are the pods the plan named as held by a budget.
	predicted map[string]bool
}

// beforePlan, on one seed in three, puts the held workload on a worker a read-only plan says
// the first plan will fence, waits for the disruption controller to have judged its budget
// (its status is what the plan reads), and reads the pods and budgets the plan will see.
func (r *seedRun) beforePlan(ctx context.Context) {
	if r.seed%3 == 2 {
		r.placeHeldWorkload(ctx)
	}

	r.holds.pods = map[string]bool{}

	for _, ns := range holdNamespaces {
		pods, err := r.kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			r.problem("list %s pods: %v", ns, err)

			continue
		}

		for _, p := range pods.Items {
			r.holds.pods[ns+"/"+p.Name] = true
		}
	}

	r.holds.zero = r.zeroBudgets(ctx)
}

// placeHeldWorkload is the operator's workload of this seed, on the first worker a read-only
// plan fences.
func (r *seedRun) placeHeldWorkload(ctx context.Context) {
	pj, ok := r.plan("")
	if !ok {
		return
	}

	var node string

	for _, n := range pj.Nodes {
		if n.Action == string(plan.ActionFence) && n.Role == string(plan.RoleWorker) {
			node = n.Name

			break
		}
	}

	if node == "" {
		r.note("plan-hold", "no worker to fence")

		return
	}

	r.onHeal(r.removeHeldWorkload)

	if err := r.placeHold(ctx, node); err != nil {
		r.problem("place the held workload on %s: %v", node, err)

		return
	}

	r.holds.placed = true
	r.note("plan-hold", "a pod pinned to "+node+" behind PodDisruptionBudget "+heldNS+"/"+planHoldPDB+", which allows no disruption")
}

// afterPlan records what the plan predicted.
func (r *seedRun) afterPlan(ctx context.Context, pj view.PlanJSON) {
	r.holds.predicted = map[string]bool{}

	for _, n := range pj.Nodes {
		for _, b := range n.DrainBlockers {
			if b.Kind == plan.BlockerBudget {
				r.holds.predicted[b.Pod] = true
			}
		}
	}

	r.note("plan-predicted-holds", fmt.Sprint(len(r.holds.predicted)))

	// A budget that allowed a disruption before and after the plan is not flagged (the
	// negative control: the demo's apps/web allows one).
	if zero := slices.Concat(r.holds.zero, r.zeroBudgets(ctx)); len(zero) == 0 && len(r.holds.predicted) > 0 {
		r.problem("the plan predicted budget holds on %v, but every PodDisruptionBudget allowed a disruption before and after it", keys(r.holds.predicted))
	}
}

// liftPlanHold deletes the held workload's budget after a drawn delay into the apply (or at once, when the
// apply ended), so the held drains go on or time out.
func (r *seedRun) liftPlanHold(ctx context.Context) {
	if !r.holds.placed {
		return
	}

	d := r.duration(5*time.Second, 25*time.Second)
	sleep(ctx, d)
	r.deletePlanHold()

	r.mu.Lock()
	r.holds.lifted = time.Now()
	r.injected = append(r.injected, fmt.Sprintf("lift-plan-hold(%s)", d))
	r.mu.Unlock()
}

// checkHolds compares: every eviction of ghcrsync's the apiserver refused during the first apply, of a pod
// that was there when the plan was made, while a budget that allowed no disruption then was
// still in place, must be one the plan predicted. The campaign adds them up.
func (r *seedRun) checkHolds(applyStart time.Time) {
	if len(r.holds.zero) == 0 {
		return // no budget allowed none at plan time: a refusal came from a later change
	}

	refused, err := r.sb.RefusedEvictions(applyStart, holdNamespaces)
	if err != nil {
		r.problem("audit log: %v", err)

		return
	}

	r.mu.Lock()
	lifted := r.holds.lifted
	r.mu.Unlock()

	held := map[string]bool{}

	for _, e := range refused {
		mine := strings.HasPrefix(e.UserAgent, cluster.FieldManager) // not the autoscaler's drain
		if mine && r.holds.pods[e.Pod] && (lifted.IsZero() || e.Time.Before(lifted)) {
			held[e.Pod] = true
		}
	}

	var missed []string

	for p := range held {
		if !r.holds.predicted[p] {
			missed = append(missed, p)
		}
	}

	r.c.held += len(held)
	r.c.predicted += len(held) - len(missed)

	if len(missed) > 0 {
		slices.Sort(missed)
		r.problem("the first apply's drain was held by a budget on %v (the apiserver refused the eviction), which the plan did not predict (it named %v)", missed, keys(r.holds.predicted))
	}
}

// placeHold creates heldNS with a one-replica Deployment pinned to node and the budget, and
// waits until the pod runs there and the disruption controller has judged the budget.
func (r *seedRun) placeHold(ctx context.Context, node string) error {
	if _, err := r.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: heldNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}

	if _, err := r.kube.AppsV1().Deployments(heldNS).Create(ctx, sandboxtest.PinnedDeploymentObject(heldNS, "held", node), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}

	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: planHoldPDB, Namespace: heldNS},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable: ptr.To(intstr.FromInt32(0)),
			Selector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "held"}},
		},
	}

	if _, err := r.kube.PolicyV1().PodDisruptionBudgets(heldNS).Create(ctx, pdb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}

	// The controller-manager's disruption controller counts the running pod.
	_, err := sandboxtest.JudgedBudget(ctx, r.kube, heldNS, planHoldPDB, 1)

	return err
}

// deletePlanHold lifts the hold: the budget goes (the workload stays until heal).
func (r *seedRun) deletePlanHold() {
	err := r.kube.PolicyV1().PodDisruptionBudgets(heldNS).Delete(context.Background(), planHoldPDB, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		r.problem("delete PDB %s/%s: %v", heldNS, planHoldPDB, err)
	}
}

// removeHeldWorkload deletes heldNS, and waits until it is gone, so the next stage (and seed)
// starts without it.
func (r *seedRun) removeHeldWorkload() {
	ctx := context.Background()

	err := r.kube.CoreV1().Namespaces().Delete(ctx, heldNS, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return
	}

	if err != nil {
		r.problem("delete namespace %s: %v", heldNS, err)

		return
	}

	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if _, err := r.kube.CoreV1().Namespaces().Get(ctx, heldNS, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return
		}
	}

	r.problem("namespace %s still there 2 minutes after its deletion", heldNS)
}

// zeroBudgets names the budgets that allow no disruption now.
func (r *seedRun) zeroBudgets(ctx context.Context) []string {
	pdbs, err := r.kube.PolicyV1().PodDisruptionBudgets("").List(ctx, metav1.ListOptions{})
	if err != nil {
		r.problem("list PodDisruptionBudgets: %v", err)

		return nil
	}

	var out []string

	for _, b := range pdbs.Items {
		if b.Status.DisruptionsAllowed == 0 {
			out = append(out, b.Namespace+"/"+b.Name)
		}
	}

	return out
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}

	slices.Sort(out)

	return out
}
