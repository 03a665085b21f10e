// Package coexist tests, on the sandbox, that ghcrsync shares the fleet with the other tools that
// drain and reboot nodes: kured's lock (held by another: every node deferred; free: taken for
// each reboot and given back; a killed run's given back by release), a system-upgrade-controller
// Plan applying to a node, a Talos machine upgrading, and a budget that never frees by itself
// (Longhorn-shaped) — each with the real objects, each beside a negative control.
package coexist

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/maintenance"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	sandboxtest.Main(m, sandbox.Options{ControlPlanes: 1, Workers: 5, Autoscaled: 0, AutoscalerPaused: true, NoWorkloads: true,
		Reboot: time.Second, RebootMax: 2 * time.Second, Heartbeat: time.Second, Seed: 62})
}

const kuredNS, kuredName = "kube-system", "kured"

// kured installs kured's DaemonSet (its pods select no node: only its lock matters here) and
// returns a function that reads its lock annotation.
func kured(t *testing.T, sb *sandbox.Sandbox) func() string {
	t.Helper()

	ctx := context.Background()
	labels := map[string]string{"name": "kured"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: kuredName, Namespace: kuredNS},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{NodeSelector: map[string]string{"coexist.test/kured": "nowhere"},
					Containers: []corev1.Container{{Name: "kured", Image: "registry.k8s.io/pause:3.10"}}},
			},
		},
	}

	if _, err := sb.Kube().AppsV1().DaemonSets(kuredNS).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		_ = sb.Kube().AppsV1().DaemonSets(kuredNS).Delete(context.Background(), kuredName, metav1.DeleteOptions{})
	})

	return func() string {
		d, err := sb.Kube().AppsV1().DaemonSets(kuredNS).Get(ctx, kuredName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}

		return d.Annotations[maintenance.KuredLockAnnotation]
	}
}

// setKuredLock writes kured's lock annotation as kured would ("" removes it).
func setKuredLock(t *testing.T, sb *sandbox.Sandbox, value string) {
	t.Helper()

	var v any = value
	if value == "" {
		v = nil
	}

	body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{maintenance.KuredLockAnnotation: v}}})
	if _, err := sb.Kube().AppsV1().DaemonSets(kuredNS).Patch(context.Background(), kuredName, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// kuredHolds is kured's single-form lock held by its pod on node, as kured writes it.
func kuredHolds(node string) string {
	return `{"nodeID":"` + node + `","metadata":{"unschedulable":false},"created":"` + time.Now().UTC().Format(time.RFC3339) + `","TTL":0}`
}

// watchKuredLock records every value kured's lock annotation takes until stop.
func watchKuredLock(t *testing.T, read func() string) (stop func() []string) {
	var (
		mu   sync.Mutex
		seen []string
		done = make(chan struct{})
		wg   sync.WaitGroup
	)

	wg.Add(1)

	go func() {
		defer wg.Done()

		for {
			v := read()

			mu.Lock()
			if len(seen) == 0 || seen[len(seen)-1] != v {
				seen = append(seen, v)
			}
			mu.Unlock()

			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()

	return func() []string {
		close(done)
		wg.Wait()

		return seen
	}
}

type summary struct {
	Outcome string `json:"outcome"`
	Nodes   []struct {
		Name    string `json:"name"`
		Outcome string `json:"outcome"`
		Message string `json:"message"`
		Timings []struct {
			Step string `json:"step"`
		} `json:"timings"`
	} `json:"nodes"`
	Held          []string `json:"held"`
	LeaseReleased bool     `json:"lease_released"`
}

func apply(t *testing.T, sb *sandbox.Sandbox, cfg string) (int, summary, string) {
	t.Helper()

	code, stdout, stderr := sandboxtest.Run(t, sb, "apply", "--auto-approve", "--json", "--verbose", "--config", cfg)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")

	var s summary
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &s); err != nil {
		t.Fatalf("apply --json's last line: %v\n%s\n%s", err, stdout, stderr)
	}

	return code, s, stdout + stderr
}

// steps are the steps node ran, in order.
func (s summary) steps(name string) []string {
	var out []string

	for _, n := range s.Nodes {
		if n.Name == name {
			for _, t := range n.Timings {
				out = append(out, t.Step)
			}
		}
	}

	return out
}

func (s summary) node(name string) (outcome, message string) {
	for _, n := range s.Nodes {
		if n.Name == name {
			return n.Outcome, n.Message
		}
	}

	return "", ""
}

func configFor(t *testing.T, sb *sandbox.Sandbox) string {
	return sandboxtest.CopyConfig(t, sb, t.TempDir(), func(s string) string {
		return strings.Replace(s, "nodes {\n", "nodes {\n  expected_node_time = \"10s\"\n", 1) + "\nmaintenance {\n  upgrade_plans = \"system-upgrade\"\n}\n"
	})
}

func workers(sb *sandbox.Sandbox) []*sandbox.Machine {
	var out []*sandbox.Machine

	for _, m := range sb.Fleet().Machines() {
		if m.Role == sandbox.RoleWorker {
			out = append(out, m)
		}
	}

	return out
}

func boots(sb *sandbox.Sandbox) map[string]string {
	out := map[string]string{}
	for _, m := range sb.Fleet().Machines() {
		out[m.Name] = m.BootID()
	}

	return out
}

// Kured's lock held by another node defers every node apply would fence (exit 6, naming kured,
// nothing rebooted). Then, with the lock free: a system-upgrade-controller Plan applying to one
// worker, another worker's Talos machine upgrading and a Longhorn-shaped budget at 0 on a third
// each defer their node, naming the tool (and the action), while the rest rotate — kured's lock
// taken for each reboot and given back; the Longhorn pod is never evicted (its drain never
// started). The negative control: the same fleet with every hold lifted rotates them all.
func TestOtherMaintenanceDefersTheNodesItHolds(t *testing.T) {
	sb := sandboxtest.Get(t)
	ctx := context.Background()
	lock := kured(t, sb)
	ws := workers(sb)
	planned, upgrading, longhorn, cnpg, free := ws[0].Name, ws[1].Name, ws[2].Name, ws[3].Name, ws[4].Name

	if _, err := sb.RotateSecret("coexist"); err != nil {
		t.Fatal(err)
	}

	cfg := configFor(t, sb)

	// 1. kured is rebooting another node.
	setKuredLock(t, sb, kuredHolds(planned))

	if _, out, _ := sandboxtest.Run(t, sb, "plan", "--config", cfg); !strings.Contains(out, "Kured's reboot lock ("+maintenance.KuredLockAnnotation+") is held by "+planned) {
		t.Fatalf("plan does not show kured's lock:\n%s", out)
	}

	before := boots(sb)

	code, s, out := apply(t, sb, cfg)
	if code != 6 || s.Outcome != "progressed" || len(s.Held) != 0 || !s.LeaseReleased {
		t.Fatalf("kured's lock held: exit %d, outcome %s, held %v\n%s", code, s.Outcome, s.Held, out)
	}

	for _, w := range ws {
		if o, msg := s.node(w.Name); o != "deferred" || !strings.Contains(msg, "kured's reboot lock") || !strings.Contains(msg, planned) {
			t.Fatalf("%s with kured's lock held by %s: %s %q", w.Name, planned, o, msg)
		}
	}

	if after := boots(sb); !mapsEqual(before, after) {
		t.Fatalf("a node rebooted while kured held its lock: %v → %v", before, after)
	}

	if v := lock(); !strings.Contains(v, `"nodeID":"`+planned+`"`) || strings.Contains(v, "ghcrsync/") {
		t.Fatalf("ghcrsync changed kured's lock it did not hold: %s", v)
	}

	// 2. kured is done; three other holds, one on each of three workers.
	setKuredLock(t, sb, "")

	plans := upgradePlan(t, sb, planned)

	ws[1].SetStage(runtime.MachineStageUpgrading)
	t.Cleanup(func() { ws[1].SetStage(runtime.MachineStageRunning) })

	lhLabels := heldWorkload(t, sb, "longhorn-system", "instance-manager", longhorn,
		map[string]string{"longhorn.io/component": "instance-manager", "longhorn.io/node": longhorn})
	lhPod := podUID(t, sb, "longhorn-system", lhLabels)
	pgLabels := heldWorkload(t, sb, "db", "pg-1", cnpg, map[string]string{"cnpg.io/cluster": "pg", "cnpg.io/instanceRole": "primary", "role": "primary"})
	pgPod := podUID(t, sb, "db", pgLabels)

	if _, out, _ := sandboxtest.Run(t, sb, "plan", "--config", cfg); !strings.Contains(out, planned+": system-upgrade-controller Plan system-upgrade/talos-upgrade") ||
		!strings.Contains(out, longhorn+"'s drain is held by a budget that needs an action") {
		t.Fatalf("plan does not show the Plan and the held drain:\n%s", out)
	}

	before = boots(sb)
	stop := watchKuredLock(t, lock)

	code, s, out = apply(t, sb, cfg)
	seen := stop()

	if code != 6 || s.Outcome != "progressed" || len(s.Held) != 0 {
		t.Fatalf("three holds: exit %d, outcome %s, held %v\n%s", code, s.Outcome, s.Held, out)
	}

	for node, want := range map[string]string{
		planned:   "system-upgrade-controller Plan system-upgrade/talos-upgrade is applying to the node",
		upgrading: "its Talos machine is upgrading",
		longhorn:  "Longhorn keeps PodDisruptionBudget longhorn-system/instance-manager",
		cnpg:      "CloudNativePG's primary db/pg-1-",
	} {
		if o, msg := s.node(node); o != "deferred" || !strings.Contains(msg, want) {
			t.Fatalf("%s: %s %q, want deferred with %q", node, o, msg, want)
		}

		if boots(sb)[node] != before[node] {
			t.Fatalf("%s rebooted while another tool held it", node)
		}
	}

	if o, msg := s.node(free); o != "done" {
		t.Fatalf("%s, held by nothing, was not rotated: %s %q\n%s", free, o, msg, out)
	}

	if !slices.ContainsFunc(seen, func(v string) bool { return strings.Contains(v, `"nodeID":"ghcrsync/`+free+`"`) }) || lock() != "" {
		t.Fatalf("kured's lock was not taken for %s's reboot and given back: seen %q, now %q", free, seen, lock())
	}

	if podUID(t, sb, "longhorn-system", lhLabels) != lhPod || podUID(t, sb, "db", pgLabels) != pgPod {
		t.Fatal("a held pod was evicted: the held drain started")
	}

	// Counted, not timed: each held node ran one step — the other tools were asked — and was
	// never claimed, so no drain waited for its budget.
	for _, node := range []string{planned, upgrading, longhorn, cnpg} {
		if steps := s.steps(node); !slices.Equal(steps, []string{"others"}) {
			t.Fatalf("%s, held, ran the steps %v: want only the other tools asked", node, steps)
		}
	}

	// 3. The negative control: every hold lifted, the same fleet rotates.
	setApplying(t, plans, nil)
	ws[1].SetStage(runtime.MachineStageRunning)

	for ns, name := range map[string]string{"longhorn-system": "instance-manager", "db": "pg-1"} {
		if err := sb.Kube().PolicyV1().PodDisruptionBudgets(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	stop = watchKuredLock(t, lock)
	code, s, out = apply(t, sb, cfg)
	seen = stop()

	if code != 0 {
		t.Fatalf("the holds lifted: exit %d\n%s", code, out)
	}

	for _, node := range []string{planned, upgrading, longhorn, cnpg} {
		if o, msg := s.node(node); o != "done" {
			t.Fatalf("%s with its hold lifted: %s %q", node, o, msg)
		}

		if !slices.ContainsFunc(seen, func(v string) bool { return strings.Contains(v, `"nodeID":"ghcrsync/`+node+`"`) }) {
			t.Fatalf("kured's lock was not taken for %s's reboot: %q", node, seen)
		}
	}

	if lock() != "" {
		t.Fatalf("kured's lock was not given back: %s", lock())
	}
}

// A run killed while it reboots a node leaves kured's lock held for it — kured must not reboot
// another node under it — and lists it as a fence; release gives it back after the node's fence.
// The race: kured takes its lock between ghcrsync's read and its write, and the write (a JSON
// patch testing the value read) fails and is judged again: the lock is kured's, nothing of
// ghcrsync's is in it. The negative control: the same write without kured's move takes it.
func TestKuredsLockAcrossAKillAndARace(t *testing.T) {
	sb := sandboxtest.Get(t)
	lock := kured(t, sb)

	if _, err := sb.RotateSecret("coexist-kill"); err != nil {
		t.Fatal(err)
	}

	cfg := configFor(t, sb)

	cmd := exec.Command(sandboxtest.Binary(t), "apply", "--auto-approve", "--config", cfg)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "SOPS_AGE_KEY_FILE=" + sb.Path(sandbox.AgeKeyFile)}
	sandboxtest.KillWhen(t, cmd, "rebooting: node=")

	held := lock()
	if !strings.Contains(held, `"nodeID":"ghcrsync/`) {
		t.Fatalf("the killed run's reboot does not hold kured's lock: %q", held)
	}

	if code, out, _ := sandboxtest.Run(t, sb, "fences", "--config", cfg); !strings.Contains(out, "kured-lock") {
		t.Fatalf("fences does not list kured's lock (exit %d):\n%s", code, out)
	}

	if code, out, errs := sandboxtest.Run(t, sb, "release", "--config", cfg); code != 0 || lock() != "" {
		t.Fatalf("release: exit %d, kured's lock now %q\n%s\n%s", code, lock(), out, errs)
	}

	// The race, on the real API server.
	conn, err := cluster.Connect(sb.Path("kubeconfig"), "", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}

	others := cluster.NewOthers(conn, config.Others{Kured: config.NamespacedName{Namespace: kuredNS, Name: kuredName}}, time.Now)
	ctx := context.Background()
	node := workers(sb)[0].Name

	cluster.BetweenReadAndLockPatch = func() { setKuredLock(t, sb, kuredHolds("w-kured")) }
	hold, err := others.TakeKuredLock(ctx, node, "run-race", false)
	cluster.BetweenReadAndLockPatch = nil

	if err != nil || hold == nil || !strings.Contains(hold.Reason, "w-kured") || strings.Contains(lock(), "ghcrsync/") {
		t.Fatalf("kured took its lock between the read and the write: hold %v, error %v, lock %q", hold, err, lock())
	}

	setKuredLock(t, sb, "")

	if hold, err := others.TakeKuredLock(ctx, node, "run-race", false); err != nil || hold != nil || !strings.Contains(lock(), `"nodeID":"ghcrsync/`+node+`"`) {
		t.Fatalf("the negative control: hold %v, error %v, lock %q", hold, err, lock())
	}

	if err := others.DropKuredLock(ctx, node); err != nil || lock() != "" {
		t.Fatalf("give it back: %v, lock %q", err, lock())
	}
}

// upgradePlan installs the system-upgrade-controller's Plan CRD and a Plan applying to node (its
// status.applying, as the controller writes it while its job runs).
func upgradePlan(t *testing.T, sb *sandbox.Sandbox, node string) dynamic.ResourceInterface {
	t.Helper()

	ctx := context.Background()

	dyn, err := dynamic.NewForConfig(sb.AdminRESTConfig())
	if err != nil {
		t.Fatal(err)
	}

	if _, err := sb.Kube().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "system-upgrade"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		_ = sb.Kube().CoreV1().Namespaces().Delete(context.Background(), "system-upgrade", metav1.DeleteOptions{})
	})

	if err := sandbox.InstallCRD(ctx, dyn, cluster.UpgradePlans, "Plan", true); err != nil {
		t.Fatal(err)
	}

	plans := dyn.Resource(cluster.UpgradePlans).Namespace("system-upgrade")
	p := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "upgrade.cattle.io/v1", "kind": "Plan",
		"metadata": map[string]any{"name": "talos-upgrade", "namespace": "system-upgrade"},
		"spec":     map[string]any{"concurrency": int64(1), "upgrade": map[string]any{"image": "ghcr.io/siderolabs/installer:v1.13.9"}},
	}}

	if _, err := plans.Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	setApplying(t, plans, []string{node})

	return plans
}

func setApplying(t *testing.T, plans dynamic.ResourceInterface, nodes []string) {
	t.Helper()

	applying := []any{}
	for _, n := range nodes {
		applying = append(applying, n)
	}

	body, _ := json.Marshal(map[string]any{"status": map[string]any{"applying": applying}})
	if _, err := plans.Patch(context.Background(), "talos-upgrade", types.MergePatchType, body, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
}

// heldWorkload runs a one-replica Deployment ns/name pinned to node, its pod labelled labels (as
// Longhorn labels its instance manager, or CloudNativePG its primary), under a budget at 0: every
// pod healthy at its floor, as Longhorn keeps it while a volume's only healthy replica is on the
// node, or CloudNativePG until a switchover.
func heldWorkload(t *testing.T, sb *sandbox.Sandbox, ns, name, node string, labels map[string]string) map[string]string {
	t.Helper()

	ctx := context.Background()
	kube := sb.Kube()

	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { _ = kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })

	d := sandboxtest.PinnedDeploymentObject(ns, name, node)
	d.Spec.Selector.MatchLabels, d.Spec.Template.Labels = labels, labels
	d.Spec.Replicas = ptr.To(int32(1))

	if _, err := kube.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	if st := sandboxtest.Budget(t, kube, ns, name, labels, sandboxtest.MinAvailable(1), 1); st.DisruptionsAllowed != 0 {
		t.Fatalf("the budget of %s/%s allows %d", ns, name, st.DisruptionsAllowed)
	}

	return labels
}

func podUID(t *testing.T, sb *sandbox.Sandbox, ns string, labels map[string]string) types.UID {
	t.Helper()

	pods, err := sb.Kube().CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: labels})})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("pods of %v: %v (%d)", labels, err, len(pods.Items))
	}

	return pods.Items[0].UID
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}

	for k, v := range a {
		if b[k] != v {
			return false
		}
	}

	return true
}
