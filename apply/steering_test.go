package apply_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/planning"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/taints"
	"github.com/ghcrsync/ghcrsync/internal/workspace"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// fleet3 is the fleet: one control plane, three Talos 1.13 workers (every rotation a
// reboot), the demo workloads (apps/web: two replicas under a budget; one puller in each of
// team-a and team-b), no autoscaler churn. The configuration rotates the workers, one at a time.
func fleet3(t *testing.T) (*sandbox.Sandbox, string) {
	t.Helper()

	sb := sandboxtest.Start(t, sandbox.Options{ControlPlanes: 1, Workers: 3, AutoscalerPaused: true, Reboot: 2 * time.Second, Heartbeat: 2 * time.Second})
	cfg := sandboxtest.CopyConfig(t, sb, t.TempDir(), func(s string) string {
		return strings.Replace(s, "nodes {", "nodes {\n  selector = \"!"+object.ControlPlaneLabel+"\"\n  verdict  = \"selected\"", 1)
	})

	t.Setenv("SOPS_AGE_KEY_FILE", sb.Path(sandbox.AgeKeyFile))
	sandboxtest.Eventually(t, time.Minute, "the demo workloads run", func() error { return demoRunning(sb) })
	spreadDemo(t, sb)

	return sb, cfg
}

// spreadDemo makes sure every worker runs a demo pod, as the tests on fleet3 assume: the
// scheduler spreads the four pods over three workers, but a worker that registered late may get
// none. A pod of the busiest worker is then deleted: its replacement goes to the emptiest.
func spreadDemo(t *testing.T, sb *sandbox.Sandbox) {
	t.Helper()

	ctx := context.Background()

	for try := 0; ; try++ {
		perNode := map[string][]corev1.Pod{}

		for _, n := range []string{"prod-worker-1", "prod-worker-2", "prod-worker-3"} {
			perNode[n] = nil
		}

		for _, ns := range sandbox.DemoNamespaces {
			pods, err := sb.Kube().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}

			for _, p := range pods.Items {
				if _, ok := perNode[p.Spec.NodeName]; ok {
					perNode[p.Spec.NodeName] = append(perNode[p.Spec.NodeName], p)
				}
			}
		}

		busiest, empty := "", false

		for n, pods := range perNode {
			empty = empty || len(pods) == 0
			if busiest == "" || len(pods) > len(perNode[busiest]) {
				busiest = n
			}
		}

		if !empty {
			return
		}

		if try == 5 {
			t.Fatalf("the demo pods do not spread over the workers: %v", perNode)
		}

		p := perNode[busiest][0]
		if err := sb.Kube().CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}

		sandboxtest.Eventually(t, time.Minute, "the demo workloads run again", func() error { return demoRunning(sb) })
	}
}

// demoRunning: apps/web's two replicas and one puller in each consumer namespace run, and
// nothing else of theirs is pending.
func demoRunning(sb *sandbox.Sandbox) error {
	for _, ns := range sandbox.DemoNamespaces {
		pods, err := sb.Kube().CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}

		want := 1
		if ns == "apps" {
			want = 2
		}

		running := 0

		for _, p := range pods.Items {
			if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
				return &notYet{ns + "/" + p.Name + " is " + string(p.Status.Phase)}
			}

			running++
		}

		if running != want {
			return &notYet{fmt.Sprintf("%s runs %d pods, not %d", ns, running, want)}
		}
	}

	return nil
}

type notYet struct{ what string }

func (e *notYet) Error() string { return e.what }

// planWith plans as `ghcrsync plan [--allow-pending]` and saves the plan.
func planWith(t *testing.T, cfg string, allowPending bool) (*plan.Plan, string) {
	t.Helper()

	ws, err := workspace.Open(workspace.Options{ConfigPath: cfg})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()

	p, err := ws.Planner().Plan(context.Background(), planning.Options{AllowPending: allowPending})
	if err != nil {
		t.Fatal(err)
	}

	cred, err := ws.Credential()
	if err != nil {
		t.Fatal(err)
	}

	key, err := cred.PlanKey()
	if err != nil {
		t.Fatal(err)
	}

	path := t.TempDir() + "/plan.out"
	if err := plan.Save(path, p, key); err != nil {
		t.Fatal(err)
	}

	return p, path
}

// noSteeringTaint fails unless no node carries a steering taint.
func noSteeringTaint(t *testing.T, sb *sandbox.Sandbox) {
	t.Helper()

	nodes, err := sb.Kube().CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}

	for _, n := range nodes.Items {
		if _, ok := taints.Find(object.Taints(n.Spec.Taints), taints.Steering); ok {
			t.Fatalf("%s still carries the steering taint: %v", n.Name, n.Spec.Taints)
		}
	}
}

// The leak: the credential the fleet and team-a's pull secret hold is revoked before plan.
// plan says emergency; with no empty worker and nowhere that can pull, it refuses to apply
// unless --allow-pending (PARITY I2: fail before any drain, nothing changed). With it, apply
// writes the consumers first, taints every worker NoSchedule, rolls the seed alone, and no demo
// pod spends a second unable to pull; the verdict is clean and each pod is evicted once. The
// negative control: a pod put on a worker still on the revoked credential is seen failing to
// pull by the same witness.
func TestEmergencyRotationKeepsEveryPodPulling(t *testing.T) {
	sb, cfg := fleet3(t)
	kube := sb.Kube()

	m, _ := sb.Fleet().Machine("prod-worker-1")
	old := m.Effective()
	sb.Registry().RevokeCredential(old.Username)

	// The witness sees a pull failure where there is one (the negative control).
	start := time.Now()
	bare := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "stale-pull", Namespace: "apps"}, Spec: corev1.PodSpec{
		NodeName: "prod-worker-3", TerminationGracePeriodSeconds: new(int64),
		// Always: a copy of the image on the node would start without the registry (IfNotPresent).
		Containers: []corev1.Container{{Name: "app", Image: registry.RegistryHost + "/" + registry.PrivateOrg + "/app:v1", ImagePullPolicy: corev1.PullAlways}},
	}}
	if _, err := kube.CoreV1().Pods("apps").Create(context.Background(), bare, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	sandboxtest.Eventually(t, 30*time.Second, "the witness sees the stale pull", func() error {
		d, err := sb.Disruption(start, sandbox.DemoNamespaces)
		if err != nil || d.PullFailurePodSecs == 0 {
			return &notYet{"no pull failure seen"}
		}

		return nil
	})

	if err := kube.CoreV1().Pods("apps").Delete(context.Background(), bare.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}

	p, path := planWith(t, cfg, false)
	if !p.Emergency() || p.Steering.Effect != taints.NoSchedule || p.Steering.Blocked == "" {
		t.Fatalf("the plan after the leak: emergency %t, steering %+v", p.Emergency(), p.Steering)
	}

	before := sb.Fleet().Stats()

	if _, err := applyCfg(context.Background(), applyOptions{ConfigPath: cfg, PlanPath: path}); err == nil ||
		!strings.Contains(err.Error(), "--allow-pending") || !strings.Contains(err.Error(), "nothing was changed") {
		t.Fatalf("a blocked emergency plan was applied: %v", err)
	}

	if after := sb.Fleet().Stats(); !maps.Equal(after.TalosWrites, before.TalosWrites) {
		t.Fatalf("a refused plan wrote to Talos: %v -> %v", before.TalosWrites, after.TalosWrites)
	}

	noSteeringTaint(t, sb)

	p, path = planWith(t, cfg, true)
	if !p.Emergency() || p.Steering.Blocked != "" || !p.Steering.AllowPending {
		t.Fatalf("the plan with --allow-pending: %+v", p.Steering)
	}

	start = time.Now()

	res, err := applyCfg(context.Background(), applyOptions{ConfigPath: cfg, PlanPath: path})
	if err != nil {
		t.Fatal(err)
	}

	if res.Failed() > 0 || !res.SafeToRevoke() {
		t.Fatalf("the emergency rotation: %d failed, verdict %+v, nodes %+v", res.Failed(), res.Verdict, res.Nodes)
	}

	sandboxtest.Eventually(t, time.Minute, "the demo workloads run again", func() error { return demoRunning(sb) })

	d, err := sb.Disruption(start, sandbox.DemoNamespaces)
	if err != nil {
		t.Fatal(err)
	}

	t.Logf("emergency: %d evictions, max %d per pod (mean %.2f), %.1f pod-seconds unable to pull",
		len(d.Evictions), d.MaxEvictionsPerPod, d.MeanEvictionsPerPod, d.PullFailurePodSecs)

	for _, ev := range d.Evictions {
		t.Logf("evicted %s (%s, first run %s) at %s", ev.Pod, ev.Owner, ev.Started.Format(time.StampMilli), ev.Time.Format(time.StampMilli))
	}

	if d.PullFailurePodSecs != 0 || d.MaxEvictionsPerPod > 1 {
		t.Fatalf("an emergency rotation disrupted the workloads: %+v", d)
	}

	noSteeringTaint(t, sb)
}

// An ordinary rotation of three non-empty workers, one at a time: with --allow-pending no pod
// lands on a worker drained later, so each demo pod is evicted at most once. The negative
// control is the same fleet without it: the first worker's pods move onto workers rotated later
// and are evicted again (the plan says so).
func TestOrdinaryRotationEvictsEachPodOnce(t *testing.T) {
	for _, allowPending := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow_pending=%t", allowPending), func(t *testing.T) {
			sb, cfg := fleet3(t) // a fresh fleet each: the demo pods on every worker

			p, path := planWith(t, cfg, allowPending)
			if p.Emergency() || p.Steering.Seed == "" || p.Steering.SeedPods == 0 {
				t.Fatalf("steering %+v (every worker should run a demo pod)", p.Steering)
			}

			if !allowPending && (p.Steering.Effect != taints.PreferNoSchedule || !strings.Contains(p.Steering.Sentence, "evicted again")) {
				t.Fatalf("the plan hides the double eviction: %+v", p.Steering)
			}

			start := time.Now()

			res, err := applyCfg(context.Background(), applyOptions{ConfigPath: cfg, PlanPath: path})
			if err != nil {
				t.Fatal(err)
			}

			if res.Failed() > 0 || !res.SafeToRevoke() {
				t.Fatalf("%d failed, verdict %+v", res.Failed(), res.Verdict)
			}

			sandboxtest.Eventually(t, time.Minute, "the demo workloads run again", func() error { return demoRunning(sb) })

			d, err := sb.Disruption(start, sandbox.DemoNamespaces)
			if err != nil {
				t.Fatal(err)
			}

			t.Logf("%d evictions, max %d per pod (mean %.2f), %.1f pod-seconds unable to pull",
				len(d.Evictions), d.MaxEvictionsPerPod, d.MeanEvictionsPerPod, d.PullFailurePodSecs)

			switch {
			case allowPending && d.MaxEvictionsPerPod > 1:
				t.Fatalf("with --allow-pending a pod was evicted %d times: %+v", d.MaxEvictionsPerPod, d.Evictions)
			case !allowPending && d.MaxEvictionsPerPod < 2:
				t.Fatalf("the negative control: no pod evicted twice without --allow-pending (the witness cannot see it?): %+v", d.Evictions)
			case d.PullFailurePodSecs != 0:
				t.Fatalf("pods failed to pull in an ordinary rotation: %+v", d.PullFailures)
			}

			noSteeringTaint(t, sb)
		})
	}
}

// The old credential is revoked while an ordinary rotation runs, right before its first drain:
// the drain asks the registry again, finds the credential the other workers hold refused, and
// evicts nothing (a pod would land on a worker that cannot pull); the node's claim is undone and
// no demo pod spends a second unable to pull. The next plan is an emergency one, and with
// --allow-pending it completes with a clean verdict. (TestOrdinaryRotationEvictsEachPodOnce is
// the negative control: nothing revoked, the same drains evict.)
func TestRevokedMidRunEvictsNothingOntoNodesThatCannotPull(t *testing.T) {
	sb, cfg := fleet3(t)

	m, _ := sb.Fleet().Machine("prod-worker-1")
	old := m.Effective()

	p, path := planWith(t, cfg, false)
	if p.Emergency() {
		t.Fatalf("nothing is revoked yet: %+v", p.CredentialsInUse)
	}

	start := time.Now()
	revoked := false

	res, err := applyCfg(context.Background(), applyOptions{ConfigPath: cfg, PlanPath: path, Hooks: apply.Hooks{
		BeforeMutation: func(_ string, phase state.Phase) {
			if phase == state.PhaseDrained && !revoked {
				revoked = sb.Registry().RevokeCredential(old.Username)
			}
		},
	}})
	if err != nil {
		t.Fatal(err)
	}

	seed := res.Nodes[0]
	if !revoked || seed.Outcome != state.OutcomeFailed || !strings.Contains(seed.Message, "cannot pull") || seed.Fenced || res.SafeToRevoke() {
		t.Fatalf("the drain after the revocation: %+v (verdict %+v)", seed, res.Verdict)
	}

	d, err := sb.Disruption(start, sandbox.DemoNamespaces)
	if err != nil {
		t.Fatal(err)
	}

	if d.PullFailurePodSecs != 0 || len(d.Evictions) != 0 {
		t.Fatalf("pods were evicted onto workers that cannot pull: %+v", d)
	}

	noSteeringTaint(t, sb)

	p, path = planWith(t, cfg, true)
	if !p.Emergency() {
		t.Fatalf("the plan after the revocation is no emergency: %+v", p.CredentialsInUse)
	}

	start = time.Now()

	if res, err = applyCfg(context.Background(), applyOptions{ConfigPath: cfg, PlanPath: path}); err != nil {
		t.Fatal(err)
	}

	if res.Failed() > 0 || !res.SafeToRevoke() {
		t.Fatalf("the emergency rotation after it: %d failed, verdict %+v", res.Failed(), res.Verdict)
	}

	sandboxtest.Eventually(t, time.Minute, "the demo workloads run again", func() error { return demoRunning(sb) })

	if d, err = sb.Disruption(start, sandbox.DemoNamespaces); err != nil || d.PullFailurePodSecs != 0 || d.MaxEvictionsPerPod > 1 {
		t.Fatalf("the emergency rotation disrupted the workloads: %v %+v", err, d)
	}
}

// PARITY H7 and H8, by a race that happens: in an emergency rotation an operator takes
// ghcrsync's steering taint off a worker still on the revoked credential between the taints and
// the seed's drain. The drain's check before its first eviction sees a Ready, schedulable
// worker that cannot pull, evicts nothing and undoes the claim. The negative control: the same
// worker cordoned as well takes no pod, so it does not count, and the drain goes on.
func TestStaleSchedulableWorkerStopsTheDrain(t *testing.T) {
	sb, cfg := fleet3(t)
	kube := sb.Kube()

	m, _ := sb.Fleet().Machine("prod-worker-1")
	sb.Registry().RevokeCredential(m.Effective().Username)

	for _, cordoned := range []bool{false, true} {
		p, path := planWith(t, cfg, true)

		var other string

		for _, n := range p.Nodes {
			if n.Order > 0 && n.Name != p.Steering.Seed && other == "" {
				other = n.Name
			}
		}

		start := time.Now()
		done := false

		res, err := applyCfg(context.Background(), applyOptions{ConfigPath: cfg, PlanPath: path, Hooks: apply.Hooks{
			BeforeMutation: func(name string, phase state.Phase) {
				if name != p.Steering.Seed || phase != state.PhaseDrained || done {
					return
				}

				done = true
				n := node(t, sb, other)
				patch := map[string]any{"spec": map[string]any{"taints": withoutTaint(n.Spec.Taints, taints.Steering)}}

				if cordoned {
					patch["spec"].(map[string]any)["unschedulable"] = true
				}

				sandboxtest.PatchNode(t, kube, other, patch)
			},
		}})
		if err != nil {
			t.Fatal(err)
		}

		var seed apply.NodeResult

		for _, x := range res.Nodes {
			if x.Node == p.Steering.Seed {
				seed = x
			}
		}

		t.Logf("%s cordoned %t: the seed %s: %s: %s", other, cordoned, seed.Node, seed.Outcome, seed.Message)

		switch {
		case !cordoned && (seed.Outcome != state.OutcomeFailed || !strings.Contains(seed.Message, "onto "+other) || seed.Fenced):
			t.Fatalf("the drain with %s schedulable and unable to pull: %+v", other, seed)
		case cordoned && seed.Outcome != state.OutcomeDone:
			t.Fatalf("the negative control (%s cordoned): %+v", other, seed)
		}

		if d, err := sb.Disruption(start, sandbox.DemoNamespaces); err != nil || d.PullFailurePodSecs != 0 {
			t.Fatalf("cordoned %t: pods failed to pull: %v %+v", cordoned, err, d)
		}

		sandboxtest.PatchNode(t, kube, other, map[string]any{"spec": map[string]any{"unschedulable": false}})
	}
}
