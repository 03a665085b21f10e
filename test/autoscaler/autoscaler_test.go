// Package autoscaler runs ghcrsync against the real Kubernetes cluster-autoscaler (1.33.0 with
// its Hetzner provider, built by `make cluster-autoscaler`) on the sandbox: it talks to the
// sandbox's fake Hetzner Cloud API, boots servers from HCLOUD_CLUSTER_CONFIG (read once, when
// it starts), soft-taints unneeded nodes, honours scale-down-disabled while it plans, and
// deletes servers whose Nodes the sandbox (as the cloud-controller-manager) then deletes. No
// seed decides what it does, so the tests wait on conditions and accept every outcome the
// real races allow — and check that each is safe.
package autoscaler

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/view"
)

func TestMain(m *testing.M) {
	sandboxtest.Main(m, sandbox.Options{
		ControlPlanes: 1, Workers: 1, Autoscaled: 2, Seed: 13, NoWorkloads: true, Autoscaler: sandbox.AutoscalerReal,
	})
}

type result struct {
	code           int
	stdout, stderr string
}

func ghcrsync(t *testing.T, sb *sandbox.Sandbox, args ...string) result {
	t.Helper()

	var r result
	r.code, r.stdout, r.stderr = sandboxtest.Run(t, sb, args...)

	return r
}

// config is the sandbox's configuration for the workers (the one control plane is left out:
// its etcd has no quorum to spare), with edit applied.
func config(t *testing.T, sb *sandbox.Sandbox, edit func(string) string) string {
	t.Helper()

	return sandboxtest.CopyConfig(t, sb, t.TempDir(), func(s string) string {
		s = strings.Replace(s, "nodes {\n", "nodes {\n  selector = \"!node-role.kubernetes.io/control-plane\"\n  verdict  = \"selected\"\n", 1)
		if edit != nil {
			s = edit(s)
		}

		return s
	})
}

func plan(t *testing.T, sb *sandbox.Sandbox, cfg string) view.PlanJSON {
	t.Helper()

	r := ghcrsync(t, sb, "plan", "--config", cfg, "--json")

	var p view.PlanJSON
	if err := json.Unmarshal([]byte(r.stdout), &p); err != nil {
		t.Fatalf("plan --json: exit %d, not JSON (%v)\n%s\n%s", r.code, err, r.stdout, r.stderr)
	}

	return p
}

func autoscaled(sb *sandbox.Sandbox) []string {
	var out []string

	for _, m := range sb.Fleet().Machines() {
		if m.Autoscaled {
			out = append(out, m.Name)
		}
	}

	return out
}

func configure(t *testing.T, sb *sandbox.Sandbox, minSize int, unneeded time.Duration) {
	t.Helper()

	configureMax(t, sb, minSize, 0, unneeded)
}

// configureMax also sets the pool's maximum size (0 keeps it).
func configureMax(t *testing.T, sb *sandbox.Sandbox, minSize, maxSize int, unneeded time.Duration) {
	t.Helper()

	if err := sb.ConfigureRealAutoscaler(sandbox.RealAutoscalerFlags{MinSize: minSize, MaxSize: maxSize, UnneededTime: unneeded}); err != nil {
		t.Fatal(err)
	}
}

// load is a Deployment of replicas pods that each need 3 of a node's 4 CPUs, one per autoscaled
// node (anti-affinity): with more replicas than nodes, the real scheduler marks the rest
// Unschedulable and the autoscaler adds servers for them.
func load(t *testing.T, sb *sandbox.Sandbox, name string, replicas int) {
	t.Helper()

	kube, ctx := sb.Kube(), context.Background()
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(replicas)), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{sandbox.NodeGroupLabel: sandbox.TemplatePool},
					TerminationGracePeriodSeconds: ptr.To(int64(0)),
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
							LabelSelector: &metav1.LabelSelector{MatchLabels: labels}, TopologyKey: "kubernetes.io/hostname",
						}},
					}},
					Containers: []corev1.Container{{
						Name: "c", Image: "registry.k8s.io/pause:3.10",
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3")}},
					}},
				},
			},
		},
	}

	if _, err := kube.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		_ = kube.AppsV1().Deployments("default").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// grow sets the load's replicas.
func grow(t *testing.T, sb *sandbox.Sandbox, name string, replicas int) {
	t.Helper()

	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
	if _, err := sb.Kube().AppsV1().Deployments("default").Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitJoined waits for a new autoscaled machine (not in before) to be Ready, and returns it.
func waitJoined(t *testing.T, sb *sandbox.Sandbox, before []string) string {
	t.Helper()

	var joined string

	sandboxtest.Eventually(t, 2*time.Minute, "the autoscaler's new server to join", func() error {
		for _, name := range autoscaled(sb) {
			if !contains(before, name) {
				n, err := sb.Kube().CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
				if err == nil && sandbox.NodeReady(n) {
					joined = name

					return nil
				}
			}
		}

		return fmt.Errorf("autoscaled machines %v; calls %v", autoscaled(sb), sb.HcloudCalls())
	})

	return joined
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}

	return false
}

// The template takes effect when the autoscaler restarts, and only then. With
// restart_deployment, apply rewrites the template and rolls the autoscaler: the server it adds
// next boots on the new credential. Negative control: without restart_deployment the plan
// warns, the template Secret holds the newest credential — and the server the autoscaler adds
// next still boots from the template it read at its start; the verdict names that machine.
func TestTemplateTakesEffectOnlyAfterTheAutoscalerRestarts(t *testing.T) {
	sb := sandboxtest.Get(t)
	// Nothing is scaled down during this test. Each step below asks for one server more, but the
	// real autoscaler may add more than the test asks for: ghcrsync's drain of an autoscaled node
	// leaves a load pod Pending (it scales up for it), and a restarted autoscaler forgets the
	// server it was already adding (it adds another). The maximum leaves room for both on every
	// step, so the last step's server is never refused for a full pool.
	n := len(autoscaled(sb))
	configureMax(t, sb, n, n+10, 10*time.Minute)

	cfg := config(t, sb, nil)
	starts := sb.AutoscalerStarts()

	if r := ghcrsync(t, sb, "apply", "--config", cfg, "--auto-approve"); r.code != 0 || !strings.Contains(r.stdout, "It is safe to revoke") {
		t.Fatalf("apply: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	if sb.AutoscalerStarts() == starts {
		t.Fatal("apply wrote the template but the autoscaler was not restarted")
	}

	rotated := sb.NewCredential()
	before := autoscaled(sb)
	load(t, sb, "load-a", len(before)+1)

	joined := waitJoined(t, sb, before)
	if m, _ := sb.Fleet().Machine(joined); m.Effective() != rotated {
		t.Fatalf("%s, added by the restarted autoscaler, joined with %s, not the new %s", joined, m.Effective().Username, rotated.Username)
	}

	if calls := sb.HcloudCalls(); calls["POST /v1/servers"] == 0 {
		t.Fatalf("no server was created through the Hetzner API: %v", calls)
	}

	// The negative control: a rotation to a fresher credential, with nothing restarting the reader.
	next, err := sb.RotateSecret("fleet-next")
	if err != nil {
		t.Fatal(err)
	}

	stale := config(t, sb, func(s string) string {
		return strings.Replace(s, "  restart_deployment = \"kube-system/cluster-autoscaler\"\n", "", 1)
	})

	if p := plan(t, sb, stale); !strings.Contains(strings.Join(p.Warnings, "\n"), "restart_deployment") {
		t.Fatalf("no plan warning for a template whose reader is never restarted: %v", p.Warnings)
	}

	// Every node rotates, but the template's reader still holds the one it read at its start: the
	// verdict cannot call the old credential unused, and the root Flux secret is held back.
	starts = sb.AutoscalerStarts()
	if r := ghcrsync(t, sb, "apply", "--config", stale, "--auto-approve"); r.code != 5 ||
		!strings.Contains(r.stdout, "no restart_deployment restarts it") || strings.Contains(r.stdout, "It is safe to revoke") {
		t.Fatalf("apply with a reader nothing restarts: exit %d, want 5 naming the template\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	if sb.AutoscalerStarts() != starts {
		t.Fatal("the autoscaler restarted without a restart_deployment")
	}

	before = autoscaled(sb)
	grow(t, sb, "load-a", len(before)+1) // one pod more than nodes: one more server

	late := waitJoined(t, sb, before)

	m, _ := sb.Fleet().Machine(late)
	if m.Effective() != rotated {
		t.Fatalf("%s joined with %s: want %s, the credential of the template the autoscaler read at its start", late, m.Effective().Username, rotated.Username)
	}

	p := plan(t, sb, stale)
	if p.Verdict == nil || p.Verdict.SafeToRevoke || !strings.Contains(p.Verdict.Sentence, late) {
		t.Fatalf("a machine booted from the stale template, and the verdict is %+v", p.Verdict)
	}

	// With restart_deployment again, the template is in sync but its reader is not: the plan
	// restarts it without writing the template, and rotates the late machine.
	p = plan(t, sb, cfg)
	if len(p.Templates) != 1 || p.Templates[0].Action != "restart" {
		t.Fatalf("the template whose reader has not restarted since it changed: %+v", p.Templates)
	}

	starts = sb.AutoscalerStarts()
	if r := ghcrsync(t, sb, "apply", "--config", cfg, "--auto-approve"); r.code != 0 || !strings.Contains(r.stdout, "It is safe to revoke") {
		t.Fatalf("apply with the reader restarted: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	if sb.AutoscalerStarts() == starts {
		t.Fatal("apply said it restarted the reader, and the autoscaler did not restart")
	}

	before = autoscaled(sb)
	grow(t, sb, "load-a", len(before)+1)

	if m, _ := sb.Fleet().Machine(waitJoined(t, sb, before)); m.Effective() != next {
		t.Fatalf("%s joined after the reader's restart with %s, not %s", m.Name, m.Effective().Username, next.Username)
	}
}

// nodeLog records, from a watch, every change of the autoscaled Nodes' autoscaler taints and of
// ghcrsync's claim: what the real autoscaler wrote while ghcrsync held a node.
type nodeLog struct {
	mu sync.Mutex
	// candidateWhileClaimed counts the candidate taint being removed from a claimed node (the
	// autoscaler cleaning it for scale-down-disabled: a write in the middle of ghcrsync's claim).
	cleanedWhileClaimed  int
	candidateAdds        int
	deletingWhileClaimed map[string]bool
	deleted              map[string]bool
}

func watchNodes(t *testing.T, sb *sandbox.Sandbox) *nodeLog {
	t.Helper()

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	w, err := sb.Kube().CoreV1().Nodes().Watch(ctx, metav1.ListOptions{LabelSelector: sandbox.NodeGroupLabel})
	if err != nil {
		t.Fatal(err)
	}

	l := &nodeLog{deletingWhileClaimed: map[string]bool{}, deleted: map[string]bool{}}
	candidate := map[string]bool{}

	go func() {
		defer w.Stop()

		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}

			claimed := n.Annotations[object.OwnerAnnotation] != ""
			has := func(key string) bool {
				for _, x := range n.Spec.Taints {
					if x.Key == key {
						return true
					}
				}

				return false
			}

			l.mu.Lock()

			switch {
			case ev.Type == watch.Deleted:
				l.deleted[n.Name] = true
			case has(sandbox.DeletionCandidateTaint) && !candidate[n.Name]:
				l.candidateAdds++
			case !has(sandbox.DeletionCandidateTaint) && candidate[n.Name] && claimed:
				l.cleanedWhileClaimed++
			}

			if has(sandbox.ToBeDeletedTaint) && claimed {
				l.deletingWhileClaimed[n.Name] = true
			}

			candidate[n.Name] = has(sandbox.DeletionCandidateTaint)
			l.mu.Unlock()
		}
	}()

	return l
}

// The real autoscaler's scale-down loop runs through a rotation of its nodes: it soft-taints
// the unneeded ones, cleans the taint off a node once ghcrsync's claim marks it
// scale-down-disabled, and deletes the unprotected ones. apply deselects what the autoscaler
// takes, never fails for it, and leaves no fence; every node still there holds the new
// credential. The control: a node an operator protected (scale-down-disabled of their own) is
// never deleted and keeps the annotation; its unprotected sibling is.
func TestRotationRacesTheRealScaleDown(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube, ctx := sb.Kube(), context.Background()

	configure(t, sb, len(autoscaled(sb)), 10*time.Minute)

	nodes := autoscaled(sb)
	if len(nodes) < 2 {
		t.Fatalf("want 2 autoscaled nodes, have %v", nodes)
	}

	protected := nodes[0]
	sandboxtest.PatchNode(t, kube, protected, map[string]any{"metadata": map[string]any{"annotations": map[string]any{sandbox.ScaleDownDisabledAnnotation: "true"}}})

	if _, err := sb.RotateSecret("fleet-race"); err != nil {
		t.Fatal(err)
	}

	cfg := config(t, sb, nil)
	path := t.TempDir() + "/plan.out"

	if r := ghcrsync(t, sb, "plan", "--config", cfg, "--out", path); r.code != 0 {
		t.Fatalf("plan: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	log := watchNodes(t, sb)

	// From here every autoscaled node above the minimum of 0 that is not protected is unneeded:
	// the autoscaler soft-taints it, and deletes it 8 s later unless it is scale-down-disabled.
	configure(t, sb, 0, 8*time.Second)

	deletes := sb.HcloudCalls()["DELETE /v1/servers/{id}"]
	r := ghcrsync(t, sb, "apply", "--config", cfg, "--json", path)

	if r.code != 0 {
		t.Fatalf("apply with the real autoscaler scaling down: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	// The unprotected siblings are deleted (during the run, or once its fence is released).
	sandboxtest.Eventually(t, 2*time.Minute, "the unprotected autoscaled nodes deleted", func() error {
		if left := autoscaled(sb); len(left) != 1 || left[0] != protected {
			return fmt.Errorf("autoscaled machines %v", left)
		}

		return nil
	})

	if sb.HcloudCalls()["DELETE /v1/servers/{id}"] == deletes {
		t.Fatal("the autoscaler deleted no server: the race was not run")
	}

	n, err := kube.CoreV1().Nodes().Get(ctx, protected, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the protected node: %v", err)
	}

	if n.Annotations[sandbox.ScaleDownDisabledAnnotation] != "true" || n.Annotations[object.OwnerAnnotation] != "" || n.Spec.Unschedulable {
		t.Fatalf("the protected node after the run: annotations %v, cordoned %t", n.Annotations, n.Spec.Unschedulable)
	}

	if rep := ghcrsync(t, sb, "fences", "--config", cfg, "--exit-code"); rep.code != 0 {
		t.Fatalf("fences after the run: exit %d\n%s\n%s", rep.code, rep.stdout, rep.stderr)
	}

	if m, _ := sb.Fleet().Machine(protected); m.Effective() != sb.NewCredential() {
		t.Fatalf("%s after the run: %s", protected, m.Effective().Username)
	}

	log.mu.Lock()
	defer log.mu.Unlock()

	if log.candidateAdds == 0 {
		t.Fatal("the autoscaler never soft-tainted a node during the run")
	}

	// A node the autoscaler started deleting while ghcrsync held it is one apply deselected
	// (before its Talos write) or waited for until it was gone (after it), never a failure.
	outcomes := applyOutcomes(t, r.stdout)

	for name := range log.deletingWhileClaimed {
		switch o := outcomes[name]; {
		case o.Outcome == "deselected" && o.ReasonCode == "autoscaler-deleting":
		case o.Outcome == "gone-after-mutation":
		default:
			t.Errorf("%s got ToBeDeleted while claimed; apply reported %q %q: %s", name, o.Outcome, o.ReasonCode, o.Message)
		}
	}

	t.Logf("candidate taints added %d, cleaned off claimed nodes %d, deleted %v, ToBeDeleted while claimed %v",
		log.candidateAdds, log.cleanedWhileClaimed, log.deleted, log.deletingWhileClaimed)
}

// applyOutcomes are the node outcomes of `apply --json`'s summary, by node (the last one a node
// got: a late round may act on it again).
func applyOutcomes(t *testing.T, stdout string) map[string]view.ApplyNodeJSON {
	t.Helper()

	out := map[string]view.ApplyNodeJSON{}

	for _, line := range strings.Split(stdout, "\n") {
		var sum view.ApplyJSON
		if json.Unmarshal([]byte(line), &sum) != nil || sum.Type != "summary" {
			continue
		}

		for _, n := range sum.Nodes {
			out[n.Name] = n
		}

		return out
	}

	t.Fatalf("apply --json printed no summary:\n%s", stdout)

	return nil
}
