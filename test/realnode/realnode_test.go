// Package realnode rotates the credential on a fleet whose workers are real nodes — a real
// kubelet and a real containerd configured from the machine's Talos config — and checks the
// verdict where it matters: after ghcrsync's exit 0 the old credential is revoked in the
// registry, and every real node still pulls a private image with imagePullPolicy Always. One
// real node runs Talos 1.13 (the new credential loads at a reboot: fenced), the other 1.14
// (containerd restarted live on the new config: no reboot).
package realnode

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	// prod-control-plane-1 runs Talos 1.13, prod-worker-1 1.14, prod-worker-2 1.13: the
	// versions are taken machine by machine. Both workers are real nodes.
	sandboxtest.Main(m, sandbox.Options{ControlPlanes: 1, Workers: 2, RealNodes: 2, TalosVersion: "1.13,1.14",
		AutoscalerPaused: true, Seed: 43})
}

const (
	live   = "prod-worker-1" // Talos 1.14
	fenced = "prod-worker-2" // Talos 1.13
)

// fleet is the package's sandbox, or a skip saying why a real node cannot run here (make test
// requires one: GHCRSYNC_REAL_RUNTIME=required).
func fleet(t *testing.T) *sandbox.Sandbox {
	t.Helper()

	realNodesHere(t)

	return sandboxtest.Get(t)
}

// realNodesHere skips the test, saying why, where no real node can run (make test requires one:
// GHCRSYNC_REAL_RUNTIME=required, then it fails instead).
func realNodesHere(t *testing.T) {
	t.Helper()

	if _, _, err := sandbox.RealNodeBinaries(); err != nil {
		if os.Getenv("GHCRSYNC_REAL_RUNTIME") == "required" {
			t.Fatal(err)
		}

		t.Skipf("SKIPPED, no real node on this machine: %v", err)
	}
}

func apply(t *testing.T, sb *sandbox.Sandbox) (code int, stdout, stderr string) {
	t.Helper()

	return run(t, sb, "apply", "--auto-approve")
}

// run runs ghcrsync with the sandbox's configuration (ready_timeout 30s: a node that does not
// come back fails the test sooner).
func run(t *testing.T, sb *sandbox.Sandbox, args ...string) (code int, stdout, stderr string) {
	t.Helper()

	cfg := sandboxtest.CopyConfig(t, sb, t.TempDir(), func(s string) string {
		return strings.Replace(s, `ready_timeout         = "2m"`, `ready_timeout         = "30s"`, 1)
	})

	return sandboxtest.Run(t, sb, append(args, "--config", cfg)...)
}

// pulls runs a pod pulling the private app image with imagePullPolicy Always and no pull
// secret on each real node, and reports each node's outcome: "ok" (its containerd pulled with
// the credential its Talos config gave it, and the container runs) or the kubelet's reason.
func pulls(t *testing.T, sb *sandbox.Sandbox, attempt string) map[string]string {
	t.Helper()

	kube, ctx := sb.Kube(), context.Background()
	out := map[string]string{}

	for _, node := range []string{live, fenced} {
		name := fmt.Sprintf("pull-%s-%s", attempt, node)
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "apps"}, Spec: corev1.PodSpec{
			NodeName: node, RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: new(bool),
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{Name: "app", Image: registry.RegistryHost + "/" + registry.PrivateOrg + "/app:v1",
				ImagePullPolicy: corev1.PullAlways}},
		}}

		if _, err := kube.CoreV1().Pods("apps").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}

		out[node], _ = sandboxtest.PullOutcome(t, sb, "apps", name)

		_ = kube.CoreV1().Pods("apps").Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	}

	return out
}

func bootIDs(sb *sandbox.Sandbox) map[string]string {
	ids := map[string]string{}

	for _, node := range []string{live, fenced} {
		m, _ := sb.Fleet().Machine(node)
		ids[node] = m.BootID()
	}

	return ids
}

// The ordinary rotation, then the emergency one, on real nodes:
//   - ordinary: the fleet's credential still works; apply exits 0, the Talos 1.13 node was
//     rebooted (a new boot id), the 1.14 node was not; the old credential revoked, both real
//     nodes still pull (their containerd holds the new one), and the registry answered
//     containerd as the new user;
//   - emergency: the credential the nodes hold is revoked before the run — the negative
//     control: both real nodes now fail to pull, for real — apply exits 0 and both pull again.
func TestRotationOnRealNodes(t *testing.T) {
	sb := fleet(t)
	reg := sb.Registry()

	for _, node := range []string{live, fenced} {
		if m, ok := sb.Fleet().Machine(node); !ok || !m.Real() {
			t.Fatalf("%s is not a real node", node)
		}
	}

	t.Run("ordinary", func(t *testing.T) {
		old, next := sb.OldCredential(), sb.NewCredential()
		before := bootIDs(sb)

		if code, stdout, stderr := apply(t, sb); code != 0 || !strings.Contains(stdout, "It is safe to revoke") {
			t.Fatalf("apply: exit %d, want 0 and the verdict\n%s\n%s", code, stdout, stderr)
		}

		after := bootIDs(sb)
		if after[fenced] == before[fenced] || after[live] != before[live] {
			t.Fatalf("boots before %v, after %v: want %s (Talos 1.13) rebooted and %s (1.14) not", before, after, fenced, live)
		}

		reg.RevokeCredential(old.Username)

		if got := pulls(t, sb, "after-ordinary"); got[live] != "ok" || got[fenced] != "ok" {
			t.Fatalf("with the old credential revoked after exit 0, the real nodes pull: %v, want ok on both", got)
		}

		if !reg.ServedManifest(next.Username, "containerd") {
			t.Fatalf("the registry never answered a real node's containerd as %s", next.Username)
		}
	})

	t.Run("emergency", func(t *testing.T) {
		held := sb.NewCredential() // what the nodes hold now
		if _, err := sb.RotateSecret("emergency"); err != nil {
			t.Fatal(err)
		}

		reg.RevokeCredential(held.Username)

		if got := pulls(t, sb, "revoked"); got[live] != "ErrImagePull" || got[fenced] != "ErrImagePull" {
			t.Fatalf("with the nodes' credential revoked, the real nodes pull: %v, want ErrImagePull on both", got)
		}

		if code, stdout, stderr := apply(t, sb); code != 0 || !strings.Contains(stdout, "It is safe to revoke") {
			t.Fatalf("apply in an emergency: exit %d, want 0 and the verdict\n%s\n%s", code, stdout, stderr)
		}

		if got := pulls(t, sb, "after-emergency"); got[live] != "ok" || got[fenced] != "ok" {
			t.Fatalf("after the emergency rotation, the real nodes pull: %v, want ok on both", got)
		}
	})

	// Talos 1.14 loads the credential by restarting containerd a moment after the write; until
	// then a proof pulls with the old credential, which still works. With the restart held back
	// (Talos's CRI controller stuck) apply proves nothing on that node and refuses the verdict,
	// exit 5; the next plan fences it (a live write would change nothing), and that apply ends
	// with both real nodes pulling after the revocation.
	t.Run("live_proof_waits_for_the_runtime_restart", func(t *testing.T) {
		old := sb.NewCredential()
		if _, err := sb.RotateSecret("live"); err != nil {
			t.Fatal(err)
		}

		m, _ := sb.Fleet().Machine(live)
		m.HoldRuntime(true)

		code, stdout, stderr := apply(t, sb)
		m.HoldRuntime(false)

		if code != 5 || !strings.Contains(stdout, live+" (apply-live): its container runtime did not restart") || strings.Contains(stdout, "It is safe to revoke") {
			t.Fatalf("apply with %s's runtime not restarted: exit %d, want 5 naming it\n%s\n%s", live, code, stdout, stderr)
		}

		if _, stdout, stderr := run(t, sb, "plan"); !strings.Contains(stdout, live+" (worker, Talos v1.14.0) will be fenced") {
			t.Fatalf("the next plan does not fence %s:\n%s\n%s", live, stdout, stderr)
		}

		if code, stdout, stderr := apply(t, sb); code != 0 || !strings.Contains(stdout, "It is safe to revoke") {
			t.Fatalf("apply after the held restart: exit %d, want 0\n%s\n%s", code, stdout, stderr)
		}

		reg.RevokeCredential(old.Username)

		if got := pulls(t, sb, "after-held-restart"); got[live] != "ok" || got[fenced] != "ok" {
			t.Fatalf("with the old credential revoked, the real nodes pull: %v, want ok on both", got)
		}
	})
}
