package apply_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

func TestMain(m *testing.M) {
	if killHelper() {
		return
	}

	sandboxtest.Main(m, sandbox.Options{ControlPlanes: 3, Workers: 3, Autoscaled: 2})
}

func allNodes(sb *sandbox.Sandbox) []string {
	var out []string
	for _, m := range sb.Fleet().Machines() {
		out = append(out, m.Name)
	}

	return out
}

// The whole fleet (3 control planes, 3 workers, 2 autoscaled) rotates: every node proved,
// nothing left cordoned or annotated, the Lease released, no unsafe write, the endpoint node
// rebooted last with the run surviving its API outage, and a second plan says "No changes".
func TestApplyFullRotation(t *testing.T) {
	sb := sandboxtest.Get(t)
	unsafeBefore := sb.Fleet().Stats().UnsafeWrites
	rebootsBefore := sb.Fleet().Stats().Reboots
	outagesBefore := sb.Fleet().Stats().EndpointOutages

	// The Lease is renewed every 500 ms: the endpoint node's reboot (≥ 2 s on the sandbox) then
	// always takes the API away from at least one renewal, so the run certainly meets the outage.
	r := newRotation(t, sb, func(s string) string {
		return regexp.MustCompile(`heartbeat\s*=\s*"5s"`).ReplaceAllString(s, `heartbeat = "500ms"`)
	}, allNodes(sb)...)
	path := r.plan()

	if cfg, err := os.ReadFile(r.cfg); err != nil || !strings.Contains(string(cfg), `heartbeat = "500ms"`) {
		t.Fatalf("the configuration's lease heartbeat was not shortened (%v)", err)
	}

	if r.planned.Summary.Fence != 8 || r.planned.EndpointNode != "prod-control-plane-1" {
		t.Fatalf("plan: %+v endpoint %q", r.planned.Summary, r.planned.EndpointNode)
	}

	res, err := r.apply(path, apply.Hooks{})
	if err != nil {
		t.Fatal(err)
	}

	if res.Failed() != 0 || res.ReleaseErr != nil {
		t.Fatalf("failed %d, release %v: %+v", res.Failed(), res.ReleaseErr, res.Nodes)
	}

	for _, x := range res.Nodes {
		if x.Outcome != state.OutcomeDone {
			t.Errorf("%s: %s %s", x.Node, x.Outcome, x.Message)
		}
	}

	if last := res.Nodes[len(res.Nodes)-1]; last.Node != "prod-control-plane-1" {
		t.Errorf("the endpoint node was not last: %s", last.Node)
	}

	stats := sb.Fleet().Stats()
	if stats.UnsafeWrites != unsafeBefore {
		t.Fatalf("unsafe writes: %+v", stats.Unsafe)
	}

	for _, n := range allNodes(sb) {
		assertReleased(t, sb, n, false)

		if stats.Reboots[n] != rebootsBefore[n]+1 {
			t.Errorf("%s rebooted %d times", n, stats.Reboots[n]-rebootsBefore[n])
		}

		if m, _ := sb.Fleet().Machine(n); m.Effective() != r.cred {
			t.Errorf("%s's runtime does not use the new credential", n)
		}

		if got := node(t, sb, n).Annotations[object.VerifiedRevisionAnnotation]; got != r.planned.CredentialRevision {
			t.Errorf("%s verified marker %q", n, got)
		}
	}

	lease, err := sb.Kube().CoordinationV1().Leases("flux-system").Get(context.Background(), "ghcr-auth-refresh", metav1.GetOptions{})
	if err != nil || ptr.Deref(lease.Spec.HolderIdentity, "") != "" {
		t.Fatalf("lease not released: %v %+v", err, lease)
	}

	// The endpoint node's reboot took the kubeconfig's API away, the run's own calls hit the
	// outage, and it carried on (prod-control-plane-1 is done, above).
	if stats.EndpointOutages != outagesBefore+1 {
		t.Errorf("endpoint outages %d -> %d", outagesBefore, stats.EndpointOutages)
	}

	// The run's own calls met the outage: a Lease renewal (every 500 ms) certainly did; a guard's
	// read does too when the outage outlasts the 2 s the run trusts a quiet Node watch.
	if log := r.log.String(); !strings.Contains(log, "renewal failed (api-unreachable)") {
		t.Errorf("the run never met the endpoint outage:\n%s", log)
	}

	st := r.readState()
	if st.Run == nil || st.Run.Outcome != "succeeded" || len(st.Records) != 8 {
		t.Fatalf("state: %+v", st.Run)
	}

	// The fan-out: team-a updated, team-b created, the root Flux secret last, its OCIRepository
	// asked to reconcile.
	checkFanOut(t, sb, res, r.cred)

	again, err := planCfg(context.Background(), r.cfg)
	if err != nil {
		t.Fatal(err)
	}

	if again.Plan.Changes() || again.Plan.Summary.Unchanged != 8 || again.Plan.Summary.SecretsUnchanged != 3 {
		t.Fatalf("second plan: %+v", again.Plan.Summary)
	}

	// The old credential is revoked at the registry: every workload still pulls.
	old := sb.OldCredential()
	sb.Registry().RevokeCredential(old.Username)
	t.Cleanup(func() { sb.Registry().AddCredential(old.Username, old.Password) }) // later tests rotate from it
	restartAllPods(t, sb)

	for _, ns := range sandbox.ConsumerNamespaces {
		pods, _ := sb.Kube().CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=puller"})
		for _, p := range pods.Items {
			if src := sb.Fleet().PullSource(ns, p.Name); src != "secret "+ns+"/"+sandbox.ConsumerSecret {
				t.Errorf("%s/%s pulled with %q, not through its pull secret", ns, p.Name, src)
			}
		}
	}
}

// A kubelet heartbeat that lands between the claim's read and its patch does not fail the
// claim: the conflict is re-read, re-validated and retried. Negative control: a foreign owner
// that lands in the same window is refused.
func TestClaimRacesHeartbeat(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	const name = "prod-worker-1"

	r := newRotation(t, sb, nil, name)
	path := r.plan()

	attempts := 0
	res, err := r.apply(path, apply.Hooks{BetweenReadAndClaim: func(node string, attempt int) {
		attempts = attempt + 1
		if attempt > 0 {
			return
		}

		// Wait for the real kubelet's next status heartbeat to land after the read.
		before := node0(t, sb, node)
		sandboxtest.Eventually(t, 10*time.Second, "a heartbeat lands", func() error {
			if node0(t, sb, node).ResourceVersion == before.ResourceVersion {
				return errors.New("no write yet")
			}

			return nil
		})
	}})
	if err != nil {
		t.Fatal(err)
	}

	if x := r.result(res, name); x.Outcome != state.OutcomeDone || attempts < 2 {
		t.Fatalf("claim with a heartbeat race: %s (%s) after %d attempts", x.Outcome, x.Message, attempts)
	}

	// Negative control: a foreign owner in the same window.
	r2 := newRotation(t, sb, nil, name)
	path2 := r2.plan()

	res, err = r2.apply(path2, apply.Hooks{BetweenReadAndClaim: func(node string, attempt int) {
		if attempt == 0 {
			sandboxtest.PatchNode(t, kube, node, map[string]any{"metadata": map[string]any{"annotations": map[string]any{object.OwnerAnnotation: "other-run"}}})
		}
	}})
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		sandboxtest.PatchNode(t, kube, name, map[string]any{"metadata": map[string]any{"annotations": map[string]any{object.OwnerAnnotation: nil}}})
	})

	x := r2.result(res, name)
	if x.Outcome != state.OutcomeFailed || x.Reason != plan.ReasonFencedByOther || !strings.Contains(x.Message, "other-run") {
		t.Fatalf("foreign owner: %s %s %s", x.Outcome, x.Reason, x.Message)
	}

	n := node(t, sb, name)
	if n.Spec.Unschedulable || n.Annotations[object.OwnerAnnotation] != "other-run" || n.Annotations[object.RecordAnnotation] != "" {
		t.Fatalf("a refused claim touched the node: %+v", n.Annotations)
	}

	_ = ctx
}

func node0(t *testing.T, sb *sandbox.Sandbox, name string) *corev1.Node { return node(t, sb, name) }

func nodeOf(t *testing.T, sb *sandbox.Sandbox, name string) *corev1.Node { return node(t, sb, name) }

// The autoscaler's candidate taint churning during the transaction does not stop it; a genuine
// scheduling change does, naming the taint. It came before the node's Talos write, so the refusal
// undoes ghcrsync's claim and keeps the operator's taint.
func TestTaintChurnVersusGenuineChange(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	kube := sb.Kube()

	up, err := sb.Do(ctx, "scale-up", sandbox.Request{})
	if err != nil {
		t.Fatal(err)
	}

	churned := up.(map[string]string)["added"]
	r := newRotation(t, sb, nil, churned)
	path := r.plan()

	setCandidate := func(name string) {
		n := node(t, sb, name)
		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.Key == sandbox.DeletionCandidateTaint })
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: sandbox.DeletionCandidateTaint, Value: fmt.Sprint(time.Now().UnixNano()), Effect: corev1.TaintEffectPreferNoSchedule})

		if _, err := kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
			t.Fatal(err)
		}
	}

	res, err := r.apply(path, apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
		switch phase {
		case state.PhaseDrained, state.PhaseConfigured, state.PhaseRebooting, state.PhaseProved:
			setCandidate(node)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}

	if x := r.result(res, churned); x.Outcome != state.OutcomeDone {
		t.Fatalf("candidate churn stopped the run: %s", x.Message)
	}

	// Negative control: a maintenance taint added by someone else before configure.
	const victim = "prod-worker-2"

	r2 := newRotation(t, sb, nil, victim)
	path2 := r2.plan()
	talosBefore := sb.Fleet().Stats().TalosWrites[victim]

	res, err = r2.apply(path2, apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
		if phase == state.PhaseDrained {
			updateNode(t, sb, node, func(n *corev1.Node) {
				n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "example.com/maintenance", Effect: corev1.TaintEffectNoSchedule})
			})
		}
	}})
	if err != nil {
		t.Fatal(err)
	}

	x := r2.result(res, victim)
	if x.Outcome != state.OutcomeFailed || !strings.Contains(x.Message, "refusing to configure "+victim+": its taints changed outside ghcrsync: + example.com/maintenance:NoSchedule") ||
		!strings.Contains(x.Message, "its claim was undone") {
		t.Fatalf("genuine change: %s %s", x.Outcome, x.Message)
	}

	// Nothing reached Talos: the claim is undone (cordon restored, annotations gone), the operator's
	// taint stays, and nothing is left for `ghcrsync fences` to report.
	n := node(t, sb, victim)
	if n.Annotations[object.OwnerAnnotation] != "" || n.Spec.Unschedulable ||
		!slices.ContainsFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.Key == "example.com/maintenance" }) {
		t.Fatalf("after a refusal before the Talos write: cordoned %t, annotations %+v, taints %+v", n.Spec.Unschedulable, n.Annotations, n.Spec.Taints)
	}

	if rec := r2.readState().Record(victim); rec.Phase != state.PhaseReleased || rec.Outcome != state.OutcomeFailed || rec.Holds() {
		t.Fatalf("state: %+v", rec)
	}

	if rep := fences(t, r2.cfg, ""); len(rep.Fences) != 0 {
		t.Fatalf("fences after a restored refusal: %+v", rep.Fences)
	}

	if sb.Fleet().Stats().TalosWrites[victim] != talosBefore {
		t.Fatal("a refused node reached Talos")
	}

	updateNode(t, sb, victim, func(n *corev1.Node) {
		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.Key == "example.com/maintenance" })
	})
}

// updateNode changes a Node as another writer would: read, change, update, retried on a
// conflict with the kubelet's heartbeat.
func updateNode(t *testing.T, sb *sandbox.Sandbox, name string, change func(*corev1.Node)) {
	t.Helper()

	if err := sandboxtest.EditNode(context.Background(), sb.Kube(), name, change); err != nil {
		t.Error(err)
	}
}

// Autoscaler events deselect instead of aborting: a node scaled down after the plan, a node
// that gets ToBeDeletedByClusterAutoscaler after the claim (its fence released), and one that
// gets it after its Talos write (waited for until gone: its machine is gone with it).
func TestAutoscalerTakesNodes(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)

	scaleUp := func() string {
		up, err := sb.Do(ctx, "scale-up", sandbox.Request{})
		if err != nil {
			t.Fatal(err)
		}

		return up.(map[string]string)["added"]
	}

	gone, later, afterWrite := scaleUp(), scaleUp(), scaleUp()
	r := newRotation(t, sb, nil, gone, later, afterWrite, "prod-worker-3")
	path := r.plan()

	if _, err := sb.Do(ctx, "scale-down", sandbox.Request{Node: gone}); err != nil {
		t.Fatal(err)
	}

	// The autoscaler acts on a decision it made before the claim's scale-down guard landed (the
	// real one does: test/autoscaler): it taints the node, and deletes it a moment later.
	deleting := func(node string) {
		updateNode(t, sb, node, func(n *corev1.Node) {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: sandbox.ToBeDeletedTaint, Value: fmt.Sprint(time.Now().Unix()), Effect: corev1.TaintEffectNoSchedule})
		})

		go func() {
			time.Sleep(3 * time.Second)

			if _, err := sb.Do(ctx, "delete-node", sandbox.Request{Node: node}); err != nil {
				t.Errorf("delete %s: %v", node, err)
			}
		}()
	}

	res, err := r.apply(path, apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
		switch {
		case node == later && phase == state.PhaseGuarded: // before its Talos write: deselected
			deleting(node)
		case node == afterWrite && phase == state.PhaseRebooting: // after it: waited for until gone
			deleting(node)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}

	if res.Failed() != 0 {
		t.Fatalf("an autoscaler event failed the run: %+v", res.Nodes)
	}

	if x := r.result(res, gone); x.Outcome != state.OutcomeDeselected || x.Reason != plan.ReasonNotFound {
		t.Errorf("scaled-down node: %s %s %s", x.Outcome, x.Reason, x.Message)
	}

	x := r.result(res, later)
	if x.Outcome != state.OutcomeDeselected || x.Reason != plan.ReasonAutoscalerDeleting ||
		!strings.Contains(x.Message, "the cluster autoscaler is deleting it") || !strings.Contains(x.Message, "fence was released") {
		t.Errorf("ToBeDeleted after claim: %s %s %s", x.Outcome, x.Reason, x.Message)
	}

	if x := r.result(res, afterWrite); x.Outcome != state.OutcomeGoneAfterMutation || x.Fenced ||
		!strings.Contains(x.Message, "vanished after its Talos config was written") {
		t.Errorf("ToBeDeleted after the Talos write: %s %s fenced=%t %s", x.Outcome, x.Reason, x.Fenced, x.Message)
	}

	for _, node := range []string{later, afterWrite} {
		if _, err := sb.Kube().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the run ended before %s, which the autoscaler deletes, was gone: %v", node, err)
		}
	}

	if x := r.result(res, "prod-worker-3"); x.Outcome != state.OutcomeDone {
		t.Errorf("the other node: %s", x.Message)
	}

	if !res.SafeToRevoke() {
		t.Errorf("gone nodes use nothing, yet: %s", res.Verdict.Sentence())
	}
}

// A node deleted after its Talos config was written is recorded as gone-after-mutation, and the
// run continues with the other nodes.
func TestNodeDeletedAfterConfigured(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)

	up, err := sb.Do(ctx, "scale-up", sandbox.Request{})
	if err != nil {
		t.Fatal(err)
	}

	doomed := up.(map[string]string)["added"]
	r := newRotation(t, sb, nil, doomed, "prod-worker-1")
	path := r.plan()

	res, err := r.apply(path, apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
		if node == doomed && phase == state.PhaseRebooting {
			if _, err := sb.Do(ctx, "delete-node", sandbox.Request{Node: node}); err != nil {
				t.Error(err)
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}

	if x := r.result(res, doomed); x.Outcome != state.OutcomeGoneAfterMutation {
		t.Fatalf("deleted after configured: %s %s", x.Outcome, x.Message)
	}

	if x := r.result(res, "prod-worker-1"); x.Outcome != state.OutcomeDone {
		t.Fatalf("the run did not continue: %s", x.Message)
	}

	if rec := r.readState().Record(doomed); rec.Outcome != state.OutcomeGoneAfterMutation || !rec.Phase.AtOrAfter(state.PhaseConfigured) {
		t.Fatalf("state: %+v", rec)
	}
}

// A PodDisruptionBudget that blocks the drain times out naming the budget, and the node is
// restored (no fence left) — with the cordon an operator put on it before the run kept
// (TestPDBBlockedDrainPreservesPreExistingCordon of the predecessor).
func TestDrainBlockedByPDB(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	const name, ns = "prod-worker-3", "pdb-block"

	labels := sandboxtest.PinnedDeployment(t, kube, ns, "pinned", name)
	sandboxtest.Budget(t, kube, ns, "pinned", labels, sandboxtest.MinAvailable(1), 1)

	// The same blocked drain on a node an operator cordoned before the run: the restore keeps
	// that cordon (F6).
	for _, cordoned := range []bool{false, true} {
		if cordoned {
			sandboxtest.Cordon(t, kube, name)
			t.Cleanup(func() {
				sandboxtest.PatchNode(t, kube, name, map[string]any{"spec": map[string]any{"unschedulable": false}})
			})
		}

		r := newRotation(t, sb, func(s string) string {
			return strings.Replace(s, `drain_timeout         = "2m"`, `drain_timeout         = "4s"`, 1) + waitHeldDrains
		}, name)
		path := r.plan()
		talosBefore := sb.Fleet().Stats().TalosWrites[name]

		res, err := r.apply(path, apply.Hooks{})
		if err != nil {
			t.Fatal(err)
		}

		x := r.result(res, name)
		if x.Outcome != state.OutcomeFailed || !strings.Contains(x.Message, "PodDisruptionBudget pdb-block/pinned") || !strings.Contains(x.Message, "restored") {
			t.Fatalf("blocked drain (cordoned before: %t): %s %s", cordoned, x.Outcome, x.Message)
		}

		assertReleased(t, sb, name, cordoned)

		if sb.Fleet().Stats().TalosWrites[name] != talosBefore {
			t.Fatal("a node whose drain failed reached Talos")
		}

		t.Logf("blocked drain reported: %s", x.Message)
	}
}

// A node an admin cordoned before the run stays cordoned after it.
func TestAdminCordonStays(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	const name = "prod-worker-2"

	sandboxtest.Cordon(t, kube, name)
	t.Cleanup(func() {
		sandboxtest.PatchNode(t, kube, name, map[string]any{"spec": map[string]any{"unschedulable": false}})
	})

	r := newRotation(t, sb, nil, name)
	path := r.plan()

	res, err := r.apply(path, apply.Hooks{})
	if err != nil {
		t.Fatal(err)
	}

	if x := r.result(res, name); x.Outcome != state.OutcomeDone {
		t.Fatalf("%s", x.Message)
	}

	assertReleased(t, sb, name, true)
}

// A control plane is claimed only while every other control plane is Ready and its etcd member
// healthy. Negative control for the ordering rule: with another control plane powered off, the
// next one is not touched and the run says why.
func TestQuorumGateHoldsControlPlanes(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	const down, target = "prod-control-plane-3", "prod-control-plane-2"

	// Fence the machine to power off, so the witness sees a safe reboot.
	sandboxtest.PatchNode(t, kube, down, map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{object.OwnerAnnotation: "quorum-test"}},
		"spec":     map[string]any{"unschedulable": true},
	})

	r := newRotation(t, sb, func(s string) string {
		return strings.Replace(s, `ready_timeout         = "60s"`, `ready_timeout         = "6s"`, 1)
	}, target)
	path := r.plan()

	m, _ := sb.Fleet().Machine(down)
	m.PowerOff()

	t.Cleanup(func() {
		m.PowerOn()
		sandboxtest.Eventually(t, 60*time.Second, down+" back", func() error {
			if !sandbox.NodeReady(node(t, sb, down)) {
				return errors.New("not Ready")
			}

			return nil
		})
		sandboxtest.PatchNode(t, kube, down, map[string]any{
			"metadata": map[string]any{"annotations": map[string]any{object.OwnerAnnotation: nil}},
			"spec":     map[string]any{"unschedulable": false},
		})
	})

	talosBefore := sb.Fleet().Stats().TalosWrites[target]

	res, err := r.apply(path, apply.Hooks{})
	if err != nil {
		t.Fatal(err)
	}

	x := r.result(res, target)
	if x.Outcome != state.OutcomeFailed || !strings.Contains(x.Message, "etcd quorum not confirmed") || !strings.Contains(x.Message, down) {
		t.Fatalf("quorum gate: %s %s", x.Outcome, x.Message)
	}

	if n := node(t, sb, target); n.Annotations[object.OwnerAnnotation] != "" || n.Spec.Unschedulable || sb.Fleet().Stats().TalosWrites[target] != talosBefore {
		t.Fatal("a control plane was touched without quorum")
	}

	if got := sb.Fleet().Stats().UnsafeWrites; got != 0 {
		t.Fatalf("unsafe writes: %+v", sb.Fleet().Stats().Unsafe)
	}
}

// A claim that loses its compare-and-swap to a concurrent writer on every attempt (another
// controller writing the Node between each read and patch) gives up after its budget — rounds
// of 10 attempts until ready_timeout — and refuses the node: nothing of the claim landed, nothing is held. The negative control: the
// same writer on the first three attempts only, and the claim lands.
func TestRetriedClaimStillRefusesWhenTheRetryBudgetIsExhausted(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	const name = "prod-worker-1"

	for _, tc := range []struct {
		name      string
		conflicts int
	}{{"every attempt", 1 << 30}, {"the first three", 3}} {
		t.Run(tc.name, func(t *testing.T) {
			// Conflicts are retried, 10 at a time, until ready_timeout.
			r := newRotation(t, sb, func(s string) string {
				return strings.Replace(s, `ready_timeout         = "60s"`, `ready_timeout         = "8s"`, 1)
			}, name)
			path := r.plan()

			res, err := r.apply(path, apply.Hooks{BetweenReadAndClaim: func(node string, attempt int) {
				if attempt < tc.conflicts {
					sandboxtest.PatchNode(t, kube, node, map[string]any{"metadata": map[string]any{"annotations": map[string]any{
						"example.com/busy-controller": fmt.Sprint(attempt)}}})
				}
			}})
			if err != nil {
				t.Fatal(err)
			}

			x := r.result(res, name)

			if tc.conflicts == 3 {
				if x.Outcome != state.OutcomeDone {
					t.Fatalf("the control: %+v", x)
				}

				return
			}

			if x.Outcome != state.OutcomeFailed || x.Fenced || !strings.Contains(x.Message, "after 10 attempts") {
				t.Fatalf("a claim that never lands: %+v", x)
			}

			if rec := r.readState().Record(name); rec == nil || rec.Phase != state.PhaseSelected || rec.Holds() {
				t.Fatalf("the record of a claim that never landed: %+v", rec)
			}

			assertReleased(t, sb, name, false)
		})
	}
}

// waitHeldDrains makes a drain held by a budget that never frees by itself wait drain_timeout
// (maintenance.held_drain = "wait"), as these tests of the wait and its undo need: by default
// such a node is deferred (test/coexist).
const waitHeldDrains = "\nmaintenance {\n  held_drain = \"wait\"\n}\n"
