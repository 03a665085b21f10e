package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// On a one-worker fleet a PodDisruptionBudget that allows no disruption holds the worker's drain.
// plan predicts it, naming the pod and the budget (and --strict refuses, saving nothing), and
// apply then meets exactly that: its drain of the worker fails naming the same budget, and the
// node is restored. The control: a budget that allows the eviction is not flagged.
func TestPlanPredictsTheDrainHold(t *testing.T) {
	sb := sandboxtest.Start(t, sandbox.Options{
		Dir: t.TempDir(), ControlPlanes: 1, Workers: 1, NoWorkloads: true,
		AutoscalerPaused: true, Heartbeat: time.Second, Reboot: 2 * time.Second, AutoscalerInterval: time.Second,
	})
	sandboxEnv(t, sb)

	const worker = "prod-worker-1"

	kube, ctx := sb.Kube(), context.Background()
	labels := sandboxtest.PinnedDeployment(t, kube, "shop", "web", worker)

	cfg := copyConfig(t, sb, t.TempDir(), func(s string) string {
		s = strings.Replace(s, "nodes {\n", "nodes {\n  selector = \"kubernetes.io/hostname="+worker+"\"\n  verdict  = \"selected\"\n", 1)

		return strings.Replace(s, `drain_timeout         = "2m"`, `drain_timeout         = "5s"`, 1)
	})

	budget := func(maxUnavailable int32) {
		if got := sandboxtest.Budget(t, kube, "shop", "web", labels, sandboxtest.MaxUnavailable(maxUnavailable), 1); got.DisruptionsAllowed != maxUnavailable {
			t.Fatalf("the disruption controller allows %d, want %d", got.DisruptionsAllowed, maxUnavailable)
		}
	}

	predicted := "prod-worker-1's drain will wait: pod shop/"

	// The control: a budget that allows the eviction.
	budget(1)

	if p := planJSON(t, ghcrsync(t, "plan", "--config", cfg, "--json")); strings.Contains(strings.Join(p.Warnings, "\n"), predicted) {
		t.Fatalf("a budget allowing one disruption was predicted to hold: %v", p.Warnings)
	}

	budget(0)

	p := planJSON(t, ghcrsync(t, "plan", "--config", cfg, "--json"))
	if !strings.Contains(strings.Join(p.Warnings, "\n"), predicted) || !strings.Contains(strings.Join(p.Warnings, "\n"), "held by PodDisruptionBudget shop/web") {
		t.Fatalf("no prediction of the budget's hold: %v", p.Warnings)
	}

	out := t.TempDir() + "/plan.out"
	if r := ghcrsync(t, "plan", "--config", cfg, "--strict", "--out", out); r.code != 1 || !strings.Contains(r.stderr, "1 drain(s) would be held") {
		t.Fatalf("plan --strict: exit %d\n%s", r.code, r.stderr)
	}

	if _, err := os.Stat(out); err == nil {
		t.Fatal("plan --strict saved a plan with a predicted hold")
	}

	// The real event: apply's drain meets the same budget, and the node is restored.
	r := ghcrsync(t, "apply", "--config", cfg, "--auto-approve")
	if r.code == 0 || !strings.Contains(r.stdout+r.stderr, "PodDisruptionBudget shop/web") {
		t.Fatalf("apply after the prediction: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	if n, err := kube.CoreV1().Nodes().Get(ctx, worker, metav1.GetOptions{}); err != nil || n.Spec.Unschedulable {
		t.Fatalf("%s after the held drain (%v): cordoned %t", worker, err, n.Spec.Unschedulable)
	}
}
