// Package budget tests that a rotation fits the pipeline it runs in, on the sandbox: a run with
// a time budget smaller than the rotation does what fits, stops at a safe point within its
// budget (plus one node's overrun at most) and exits 6 (progressed), leaving nothing that blocks;
// the next run continues the rotation and finishes it; and a run with nothing to do writes
// nothing at all.
package budget

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ghcrsync/ghcrsync/internal/authdigest"
	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/state"
)

func TestMain(m *testing.M) {
	// Six workers and a control plane, each reboot 3 to 5 s: a fenced node takes several seconds.
	sandboxtest.Main(m, sandbox.Options{ControlPlanes: 1, Workers: 6, Autoscaled: 0, AutoscalerPaused: true, NoWorkloads: true,
		Reboot: 3 * time.Second, RebootMax: 5 * time.Second, Heartbeat: time.Second, Seed: 41})
}

// config is the sandbox's configuration, with the estimate's default at the sandbox's scale
// (a fenced node takes seconds here, not minutes) and a small reserve, in dir.
func config(t *testing.T, sb *sandbox.Sandbox, dir string) string {
	t.Helper()

	return sandboxtest.CopyConfig(t, sb, dir, func(s string) string {
		s = strings.Replace(s, "nodes {\n", "nodes {\n  expected_node_time = \"10s\"\n", 1)

		return s + "\nrun {\n  reserve = \"5s\"\n}\n"
	})
}

type result struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

func ghcrsync(t *testing.T, sb *sandbox.Sandbox, args ...string) result {
	t.Helper()

	start := time.Now()

	var r result
	r.code, r.stdout, r.stderr = sandboxtest.Run(t, sb, args...)
	r.took = time.Since(start)

	return r
}

// summary is the last line of `apply --json`.
type summary struct {
	Outcome   string   `json:"outcome"`
	Remaining int      `json:"remaining"`
	Deferred  []string `json:"deferred"`
	Next      string   `json:"next"`
	Held      []string `json:"held"`
	Nodes     []struct {
		Name    string `json:"name"`
		Outcome string `json:"outcome"`
	} `json:"nodes"`
	Secrets []struct {
		Namespace, Secret, Role, Outcome string
	} `json:"secrets"`
	Verdict struct {
		SafeToRevoke bool `json:"safe_to_revoke"`
		Still        []struct {
			Kind, Name string
		} `json:"still_used_by"`
	} `json:"verdict"`
	LeaseReleased bool `json:"lease_released"`
}

func lastSummary(t *testing.T, stdout string) summary {
	t.Helper()

	lines := strings.Split(strings.TrimSpace(stdout), "\n")

	var s summary
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &s); err != nil {
		t.Fatalf("apply --json's last line: %v\n%s", err, stdout)
	}

	return s
}

// A budget that fits about half the rotation: the first run rotates what fits, stops within its
// budget (plus one node's overrun at most) with exit 6, and leaves nothing that blocks: no fence,
// no steering taint, Flux resumed, the Lease free, the root Flux secret untouched, a verdict that
// says do not revoke yet, naming the nodes left. The next run says it continues the rotation,
// finishes it, and ends safe (exit 0). The negative control: the same fleet without a budget is
// rotated in one run.
func TestABudgetSmallerThanTheRotation(t *testing.T) {
	sb := sandboxtest.Get(t)
	ctx := context.Background()
	kube := sb.Kube()

	if _, err := sb.RotateSecret("budget"); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	cfg := config(t, sb, dir)
	rootBefore := rootDigest(t, sb)

	const within = 35 * time.Second

	first := ghcrsync(t, sb, "apply", "--auto-approve", "--within", within.String(), "--json", "--config", cfg)
	s := lastSummary(t, first.stdout)

	if first.code != 6 || s.Outcome != "progressed" || s.Remaining == 0 || len(s.Deferred) != s.Remaining || !strings.Contains(s.Next, "ghcrsync apply") {
		t.Fatalf("the first run under a %s budget: exit %d, want 6 (progressed)\n%s\n%s", within, first.code, first.stdout, first.stderr)
	}

	rotated := 0

	for _, n := range s.Nodes {
		if n.Outcome == string(state.OutcomeDone) {
			rotated++
		}
	}

	if rotated == 0 {
		t.Fatalf("the first run rotated nothing: %+v", s.Nodes)
	}

	// Within its budget, plus one node's overrun at most (a node takes under 15 s here; the
	// budget counts from the run's start, after its planning, which this measure includes).
	if limit := within + 15*time.Second + 10*time.Second; first.took > limit {
		t.Fatalf("the first run took %s, over its budget %s plus one node's overrun", first.took.Round(time.Second), within)
	}

	// Nothing blocks the next run or the cluster.
	if len(s.Held) != 0 || !s.LeaseReleased {
		t.Fatalf("the progressed run left fences %v, lease released %v", s.Held, s.LeaseReleased)
	}

	if r := ghcrsync(t, sb, "fences", "--config", cfg, "--exit-code"); r.code != 0 || !strings.Contains(r.stdout, "No fence is held") {
		t.Fatalf("fences after a progressed run: exit %d\n%s", r.code, r.stdout)
	}

	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}

	for _, n := range nodes.Items {
		if n.Spec.Unschedulable || slices.ContainsFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.Key == "ghcrsync.dev/rotation-pending" }) {
			t.Fatalf("%s is left cordoned or steered: unschedulable %v, taints %v", n.Name, n.Spec.Unschedulable, n.Spec.Taints)
		}
	}

	if suspended(t, sb) {
		t.Fatal("the Flux Kustomization is left suspended")
	}

	if got := rootDigest(t, sb); got != rootBefore {
		t.Fatal("the root Flux secret was switched by a run that did not finish the rotation")
	}

	if s.Verdict.SafeToRevoke {
		t.Fatal("the progressed run says it is safe to revoke")
	}

	for _, d := range s.Deferred {
		if !slices.ContainsFunc(s.Verdict.Still, func(u struct{ Kind, Name string }) bool { return u.Name == d }) {
			t.Fatalf("the verdict does not name the deferred node %s: %+v", d, s.Verdict.Still)
		}
	}

	// The next run continues the rotation and finishes it.
	plan := ghcrsync(t, sb, "plan", "--config", cfg)
	if plan.code != 0 || !strings.Contains(plan.stdout, "Continuing: continuing the rotation to revision") ||
		!strings.Contains(plan.stdout, fmt.Sprintf("%d of %d nodes done", rotated, rotated+s.Remaining)) {
		t.Fatalf("plan after a progressed run: exit %d\n%s", plan.code, plan.stdout)
	}

	second := ghcrsync(t, sb, "apply", "--auto-approve", "--within", "3m", "--config", cfg)
	if second.code != 0 || !strings.Contains(second.stdout, "It is safe to revoke") {
		t.Fatalf("the continuing run: exit %d, want 0\n%s\n%s", second.code, second.stdout, second.stderr)
	}

	st := readState(t, filepath.Join(dir, "ghcrsync.state.json"))
	if r := st.Rotation; r == nil || r.Runs != 2 || r.Finished == nil || len(r.Done) != rotated+s.Remaining {
		t.Fatalf("the state's rotation after two runs: %+v", st.Rotation)
	}

	if len(st.Samples) < rotated+s.Remaining {
		t.Fatalf("the state recorded %d samples for %d rotated nodes", len(st.Samples), rotated+s.Remaining)
	}

	t.Logf("first run: %d rotated, %d deferred in %s (budget %s); second run: %s", rotated, s.Remaining, first.took.Round(time.Second), within,
		second.took.Round(time.Second))

	// The negative control: without a budget, one run rotates the whole fleet.
	if _, err := sb.RotateSecret("no-budget"); err != nil {
		t.Fatal(err)
	}

	whole := ghcrsync(t, sb, "apply", "--auto-approve", "--json", "--config", config(t, sb, t.TempDir()))
	if w := lastSummary(t, whole.stdout); whole.code != 0 || w.Outcome != "done" || w.Remaining != 0 {
		t.Fatalf("a run without a budget: exit %d, outcome %s, %d remaining\n%s", whole.code, w.Outcome, w.Remaining, whole.stderr)
	}
}

func rootDigest(t *testing.T, sb *sandbox.Sandbox) string {
	t.Helper()

	s, err := sb.Kube().CoreV1().Secrets(sandbox.RootNamespace).Get(context.Background(), sandbox.RootSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	return authdigest.DockerConfig(s.Data[".dockerconfigjson"])
}

func suspended(t *testing.T, sb *sandbox.Sandbox) bool {
	t.Helper()

	k, err := sandboxtest.DynamicFrom(t, sb.Path(sandbox.KubeconfigFile)).Resource(cluster.Kustomizations).Namespace(sandbox.RootNamespace).
		Get(context.Background(), sandbox.Kustomization, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	s, _, _ := unstructured.NestedBool(k.Object, "spec", "suspend")

	return s || k.GetAnnotations()[object.SuspendedByAnnotation] != ""
}

func readState(t *testing.T, path string) *state.State {
	t.Helper()

	st, err := (&state.Local{Path: path}).Read()
	if err != nil {
		t.Fatal(err)
	}

	return st
}

// The case that runs on almost every deploy: nothing to rotate. A converged plan and apply make
// no mutating Kubernetes request (the API server's audit log, as this identity), no Talos write,
// no Lease; and the requests they make are reads and permission checks only. The control: the
// same count after a rotation is far from zero (the count sees writes).
func TestNothingToDoWritesNothing(t *testing.T) {
	sb := sandboxtest.Get(t)

	const user = "ghcrsync-budget-test"

	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")

	if err := sb.WriteKubeconfig(kc, user, "system:masters"); err != nil {
		t.Fatal(err)
	}

	cfg := sandboxtest.CopyConfig(t, sb, dir, func(s string) string {
		return strings.Replace(s, `"`+sb.Path(sandbox.KubeconfigFile)+`"`, `"`+kc+`"`, 1)
	})

	mutating := func() []string {
		t.Helper()

		return sandboxtest.Mutations(t, sb, user)
	}

	talosWrites := func() int {
		n := 0
		for _, w := range sb.Fleet().Stats().TalosWrites {
			n += w
		}

		return n
	}

	// Converge first: a rotation of a fresh credential (the control: its writes are counted).
	if _, err := sb.RotateSecret("converge"); err != nil {
		t.Fatal(err)
	}

	if r := ghcrsync(t, sb, "apply", "--auto-approve", "--config", cfg); r.code != 0 {
		t.Fatalf("converging: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	rotationWrites := len(mutating())
	if rotationWrites == 0 {
		t.Fatal("control: the audit log shows no write of this identity after a rotation")
	}

	time.Sleep(2 * time.Second) // the audit log is written as requests end
	before, talosBefore := len(mutating()), talosWrites()

	planFile := filepath.Join(dir, "converged.plan")

	if r := ghcrsync(t, sb, "plan", "--config", cfg, "--out", planFile, "--detailed-exitcode"); r.code != 0 {
		t.Fatalf("plan of a converged cluster: exit %d, want 0\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	r := ghcrsync(t, sb, "apply", "--config", cfg, "--verbose", planFile)
	if r.code != 0 || !strings.Contains(r.stdout, "No changes") {
		t.Fatalf("apply of a converged cluster: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	time.Sleep(2 * time.Second)

	if w := mutating()[before:]; len(w) != 0 {
		t.Fatalf("a converged plan and apply wrote: %v", w)
	}

	if n := talosWrites() - talosBefore; n != 0 {
		t.Fatalf("a converged plan and apply made %d Talos writes", n)
	}

	t.Logf("a converged plan and apply: 0 writes (a rotation before: %d); apply's requests: %s", rotationWrites, requestsLine(r.stderr))
}

func requestsLine(stderr string) string {
	for _, l := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(l, "Requests:") {
			return l
		}
	}

	return "(not reported)"
}
