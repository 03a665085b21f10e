// Package apiload checks that ghcrsync's load on the API server stays flat while a drain waits:
// a pod a PodDisruptionBudget holds is asked for again with a backoff, and the check before each
// eviction (where may the pod land?) reads the run's one Node watch, never a new list of every
// Node. Counted by ghcrsync's own tally of its requests (`apply --verbose`).
package apiload

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	sandboxtest.Main(m, sandbox.Options{ControlPlanes: 1, Workers: 2, AutoscalerPaused: true, NoWorkloads: true, Heartbeat: time.Second, Seed: 44})
}

// requests reads apply --verbose's tally: how many requests of kind (LIST, WATCH, POST…).
func requests(t *testing.T, stderr, kind string) int {
	t.Helper()

	for _, l := range strings.Split(stderr, "\n") {
		if !strings.HasPrefix(l, "Requests: Kubernetes") {
			continue
		}

		if m := regexp.MustCompile(`\b` + kind + ` (\d+)`).FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[1])

			return n
		}

		return 0
	}

	t.Fatalf("apply --verbose reported no requests:\n%s", stderr)

	return 0
}

// rotate rotates the credential and applies it to prod-worker-1 only (its drain meets the held
// pod), while hold is how long the budget refuses the pod's eviction (0: it never does).
func rotate(t *testing.T, sb *sandbox.Sandbox, hold time.Duration) (lists, watches, evictions int) {
	t.Helper()

	kube := sb.Kube()
	ctx := context.Background()

	if _, err := sb.RotateSecret(fmt.Sprintf("apiload-held-%s", hold)); err != nil { // a user of its own
		t.Fatal(err)
	}

	labels := map[string]string{"app": "held"}

	// The pod runs on prod-worker-1 again (it waited Pending while the node rebooted).
	sandboxtest.Eventually(t, 60*time.Second, "the held pod runs on prod-worker-1", func() error {
		return podRunsOn(ctx, sb, "prod-worker-1")
	})

	if hold > 0 {
		sandboxtest.Budget(t, kube, "held", "held", labels, sandboxtest.MinAvailable(1), 1)

		relax := time.AfterFunc(hold, func() {
			_ = kube.PolicyV1().PodDisruptionBudgets("held").Delete(context.Background(), "held", metaDelete)
		})
		t.Cleanup(func() { relax.Stop() })
	} else {
		_ = kube.PolicyV1().PodDisruptionBudgets("held").Delete(ctx, "held", metaDelete)
	}

	cfg := sandboxtest.CopyConfig(t, sb, t.TempDir(), func(s string) string {
		return strings.Replace(s, "nodes {\n", "nodes {\n  selector = \"kubernetes.io/hostname=prod-worker-1\"\n  verdict  = \"selected\"\n", 1)
	})

	code, stdout, stderr := sandboxtest.Run(t, sb, "apply", "--auto-approve", "--verbose", "--config", cfg)
	if code != 0 || !strings.Contains(stdout, "prod-worker-1") {
		t.Fatalf("apply (budget held %s): exit %d\n%s\n%s", hold, code, stdout, stderr)
	}

	return requests(t, stderr, "LIST"), requests(t, stderr, "WATCH"), strings.Count(stderr, "pod held/")
}

// A drain whose pod a budget holds for 30 s makes as many Node lists as one that meets no
// budget: the destinations come from the run's watch (one LIST and its WATCH), and the pod's
// eviction is asked again with a backoff (1 s doubling to 8 s, jittered), not every 2 s. Before
// this, every attempt listed every Node: the same hold cost about 15 LISTs more.
func TestADrainHeldByABudgetAddsNoLists(t *testing.T) {
	sb := sandboxtest.Get(t)
	sandboxtest.PinnedDeployment(t, sb.Kube(), "held", "held", "prod-worker-1")

	freeLists, freeWatches, _ := rotate(t, sb, 0)
	heldLists, heldWatches, retries := rotate(t, sb, 30*time.Second)

	t.Logf("LISTs: %d with no budget, %d with the pod held 30 s (WATCH %d, %d; %d progress lines on the held pod)",
		freeLists, heldLists, freeWatches, heldWatches, retries)

	if heldLists-freeLists > 2 {
		t.Fatalf("a drain held 30 s by a budget made %d LISTs, %d more than one that met no budget: the destination check lists Nodes per attempt",
			heldLists, heldLists-freeLists)
	}
}

var metaDelete = metav1.DeleteOptions{}

// podRunsOn checks the held Deployment's pod runs on node.
func podRunsOn(ctx context.Context, sb *sandbox.Sandbox, node string) error {
	pods, err := sb.Kube().CoreV1().Pods("held").List(ctx, metav1.ListOptions{LabelSelector: "app=held"})
	if err != nil {
		return err
	}

	for _, p := range pods.Items {
		if p.Spec.NodeName == node && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			return nil
		}
	}

	return fmt.Errorf("%d pods, none running on %s", len(pods.Items), node)
}
