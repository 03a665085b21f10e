package budget

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/taints"
)

// A run under --allow-pending and a budget, killed outright (SIGKILL at its first reboot: no
// chance to wind down), leaves its NoSchedule steering on the nodes it expected to rotate in
// its budget — as docs/apply.md says, and on no other: the nodes left for the next run stay
// schedulable (the negative control: they exist and carry nothing). `fences` lists each as a
// steering fence of a run proved over, and `release` takes every one off without --holder.
func TestAKilledRunLeavesHardSteeringOnlyOnItsBudgetedNodes(t *testing.T) {
	sb := sandboxtest.Get(t)
	ctx := context.Background()

	if _, err := sb.RotateSecret("killed-steering"); err != nil {
		t.Fatal(err)
	}

	cfg := config(t, sb, t.TempDir())
	bin := sandboxtest.Binary(t)

	const within = "35s"

	// What this run expects to rotate in its budget.
	p := ghcrsync(t, sb, "plan", "--allow-pending", "--within", within, "--json", "--config", cfg)

	var pj struct {
		Nodes []struct {
			Name     string `json:"name"`
			Action   string `json:"action"`
			InBudget bool   `json:"in_budget"`
		} `json:"nodes"`
	}

	if err := json.Unmarshal([]byte(p.stdout), &pj); err != nil {
		t.Fatalf("plan --json: %v\n%s", err, p.stdout)
	}

	var budgeted, left []string

	for _, n := range pj.Nodes {
		switch {
		case n.Action != "fence":
		case n.InBudget:
			budgeted = append(budgeted, n.Name)
		default:
			left = append(left, n.Name)
		}
	}

	if len(budgeted) == 0 || len(left) == 0 {
		t.Fatalf("the budget should fit some nodes and leave others: fits %v, leaves %v", budgeted, left)
	}

	cmd := exec.Command(bin, "apply", "--auto-approve", "--allow-pending", "--within", within, "--config", cfg)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "SOPS_AGE_KEY_FILE=" + sb.Path(sandbox.AgeKeyFile)}
	sandboxtest.KillWhen(t, cmd, "rebooting: node=")

	steered := func() []string {
		nodes, err := sb.Kube().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}

		var out []string

		for _, n := range nodes.Items {
			if slices.ContainsFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.Key == taints.Steering && x.Effect == corev1.TaintEffectNoSchedule }) {
				out = append(out, n.Name)
			}
		}

		sort.Strings(out)

		return out
	}

	got := steered()
	if len(got) == 0 {
		t.Fatal("the killed run left no steering: the test proves nothing")
	}

	for _, n := range got {
		if !slices.Contains(budgeted, n) {
			t.Fatalf("the killed run left NoSchedule steering on %s, which its budget left for the next run (steered %v, budgeted %v)", n, got, budgeted)
		}
	}

	t.Logf("killed at its first reboot: NoSchedule steering on %d of %d fenced nodes (%v); %v left schedulable", len(got), len(budgeted)+len(left), got, left)

	f := ghcrsync(t, sb, "fences", "--config", cfg)
	if !strings.Contains(f.stdout, "steering") || !strings.Contains(f.stdout, "process has exited") {
		t.Fatalf("fences after the kill does not list the steering of a run proved over:\n%s", f.stdout)
	}

	if r := ghcrsync(t, sb, "release", "--config", cfg); r.code != 0 {
		t.Fatalf("release after the kill: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	if got := steered(); len(got) != 0 {
		t.Fatalf("release left NoSchedule steering on %v", got)
	}
}

// The same kill without a budget, with workloads: the run steers every node it will drain, so
// the killed run leaves NoSchedule on all of them (the whole unrotated fleet: what the design
// says, docs/apply.md) — and that is what keeps each pod evicted at most once across the killed
// run and the next one, which reclaims the dead run's fences and steering and finishes.
func TestAKilledRunUnderAllowPendingEvictsEachPodOnce(t *testing.T) {
	sb := sandboxtest.Get(t)
	ctx := context.Background()
	kube := sb.Kube()

	const ns = "kill-apps"

	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { _ = kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })

	d := sandboxtest.PinnedDeploymentObject(ns, "web", "")
	d.Spec.Replicas, d.Spec.Template.Spec.NodeSelector = ptr.To(int32(6)), nil

	if _, err := kube.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	running := func() error {
		pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}

		n := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				n++
			}
		}

		if n != 6 {
			return fmt.Errorf("%d of 6 running", n)
		}

		return nil
	}

	sandboxtest.Eventually(t, time.Minute, "the 6 pods run", running)

	if _, err := sb.RotateSecret("killed-whole"); err != nil {
		t.Fatal(err)
	}

	cfg := config(t, sb, t.TempDir())
	start := time.Now()

	cmd := exec.Command(sandboxtest.Binary(t), "apply", "--auto-approve", "--allow-pending", "--config", cfg)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "SOPS_AGE_KEY_FILE=" + sb.Path(sandbox.AgeKeyFile)}
	sandboxtest.KillWhen(t, cmd, "rebooting: node=")

	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}

	steered := 0
	for _, n := range nodes.Items {
		if slices.ContainsFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.Key == taints.Steering && x.Effect == corev1.TaintEffectNoSchedule }) {
			steered++
		}
	}

	// The next run: reclaims the dead run's fences and steering (its process has exited) and
	// finishes the rotation.
	if r := ghcrsync(t, sb, "apply", "--auto-approve", "--allow-pending", "--config", cfg); r.code != 0 {
		t.Fatalf("the run after the kill: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	sandboxtest.Eventually(t, time.Minute, "the 6 pods run again", running)

	dis, err := sb.Disruption(start, []string{ns})
	if err != nil {
		t.Fatal(err)
	}

	t.Logf("killed run left NoSchedule on %d nodes; across it and the next run: %d evictions, max %d per pod (mean %.2f), %.1f pod-seconds unable to pull",
		steered, len(dis.Evictions), dis.MaxEvictionsPerPod, dis.MeanEvictionsPerPod, dis.PullFailurePodSecs)

	if len(dis.Evictions) == 0 {
		t.Fatal("no pod was evicted: the test proves nothing")
	}

	if dis.MaxEvictionsPerPod > 1 {
		t.Fatalf("a pod was evicted %d times across the killed run and the next one: %+v", dis.MaxEvictionsPerPod, dis.Evictions)
	}
}
