package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

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

		return strings.Replace(s, `drain_timeout         = "2m"`, `drain_timeout         = "5s"`, 1) + waitHeldDrains
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

// The case reported on the sandbox: one control plane with its NoSchedule taint, one worker
// carrying both pods of a Deployment (not pinned: it is the only node that takes them), and a
// budget of minAvailable 1, which allows 1 disruption now. The drain evicts one pod; its
// replacement has nowhere to go, so the budget holds the second for the whole drain_timeout.
// plan predicts exactly that (the pod, the budget, the way out) and prices the hold into the
// estimate; apply meets it. The control: with a second worker to take the replacement, no hold.
func TestPlanPredictsAHoldNoReplacementCanEnd(t *testing.T) {
	sb := sandboxtest.Start(t, sandbox.Options{
		Dir: t.TempDir(), ControlPlanes: 1, Workers: 1, NoWorkloads: true,
		AutoscalerPaused: true, Heartbeat: time.Second, Reboot: 2 * time.Second, AutoscalerInterval: time.Second,
	})
	sandboxEnv(t, sb)

	const worker = "prod-worker-1"

	kube, ctx := sb.Kube(), context.Background()

	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps2"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	d := sandboxtest.PinnedDeploymentObject("apps2", "web", worker)
	d.Spec.Replicas, d.Spec.Template.Spec.NodeSelector = ptr.To(int32(2)), nil

	if _, err := kube.AppsV1().Deployments("apps2").Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	sandboxtest.Eventually(t, time.Minute, "both pods of apps2/web run on "+worker, func() error {
		pods, err := kube.CoreV1().Pods("apps2").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return err
		}

		running := 0
		for _, p := range pods.Items {
			if p.Spec.NodeName == worker && p.Status.Phase == corev1.PodRunning {
				running++
			}
		}

		if running != 2 {
			return fmt.Errorf("%d running on %s", running, worker)
		}

		return nil
	})

	if got := sandboxtest.Budget(t, kube, "apps2", "web", map[string]string{"app": "web"}, sandboxtest.MinAvailable(1), 2); got.DisruptionsAllowed != 1 {
		t.Fatalf("the disruption controller allows %d, want 1", got.DisruptionsAllowed)
	}

	cfg := copyConfig(t, sb, t.TempDir(), func(s string) string {
		s = strings.Replace(s, "nodes {\n", "nodes {\n  selector = \"kubernetes.io/hostname="+worker+"\"\n  verdict  = \"selected\"\n", 1)

		return strings.Replace(s, `drain_timeout         = "2m"`, `drain_timeout         = "5s"`, 1)
	})

	p := planJSON(t, ghcrsync(t, "plan", "--config", cfg, "--json"))
	warnings := strings.Join(p.Warnings, "\n")

	if !strings.Contains(warnings, worker+"'s drain will be held: it carries 2 pods of PodDisruptionBudget apps2/web, which allows 1 disruption(s) now") ||
		!strings.Contains(warnings, "Make room for one more replica elsewhere") {
		t.Fatalf("no prediction of the hold a replacement cannot end: %v", p.Warnings)
	}

	if strings.Contains(p.Steering.Sentence, "move onto nodes rotated later") {
		t.Fatalf("the steering line sends the pods to nodes rotated later, and there are none: %q", p.Steering.Sentence)
	}

	if p.Estimate == nil || p.Estimate.HeldDrains != 1 {
		t.Fatalf("the estimate does not price the predicted hold: %+v", p.Estimate)
	}

	// The real event: apply's drain evicts one pod, then the budget holds the other.
	if r := ghcrsync(t, "apply", "--config", cfg, "--auto-approve"); r.code == 0 || !strings.Contains(r.stdout+r.stderr, "PodDisruptionBudget apps2/web") {
		t.Fatalf("apply after the prediction: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	// The control: the control plane takes pods too (its NoSchedule taint removed), so the
	// replacement has somewhere to go, the budget allows the second eviction once it is ready,
	// and nothing is predicted to hold.
	sandboxtest.PatchNode(t, kube, "prod-control-plane-1", map[string]any{"spec": map[string]any{"taints": nil}})

	p = planJSON(t, ghcrsync(t, "plan", "--config", cfg, "--json"))
	if strings.Contains(strings.Join(p.Warnings, "\n"), "drain will be held") {
		t.Fatalf("a hold was predicted with room for the replacement: %v", p.Warnings)
	}
}
