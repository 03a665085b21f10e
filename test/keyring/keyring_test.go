// Package keyring rotates the credential through the kubelets' node keyrings (plan's
// kubelet-keyring action, nodes.kubelet_keyring) on a Talos 1.13 fleet, whose runtimes load
// registry auth only at boot: the rotation ends "safe to revoke" with no reboot, no drain, no
// eviction and no restart, every node proved by a pod with no pull secret after its kubelet was
// seen reading the keyring — and after the old credential is revoked, every node still pulls.
package keyring

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/keyring"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// fleet is a Talos 1.13 fleet whose kubelets keep their keyring 10 s (the real kubelet's 5
// minutes, scaled down), with ghcrsync's writer image published and configured.
func fleet(t *testing.T, o sandbox.Options) *sandbox.Sandbox {
	t.Helper()

	if os.Geteuid() != 0 {
		t.Skip("the sandbox runs the keyring writer's process only as root (chroot, bind mount)")
	}

	o.KeyringWriter = sandboxtest.Binary(t)
	o.KeyringCache = 10 * time.Second
	o.TalosVersion = "1.13"
	o.AutoscalerPaused = true
	o.Heartbeat = time.Second

	return sandboxtest.Start(t, o)
}

// configFile is the sandbox's configuration with the keyring's window at its shortest (1 minute).
func configFile(t *testing.T, sb *sandbox.Sandbox) string {
	t.Helper()

	return sandboxtest.CopyConfig(t, sb, t.TempDir(), func(s string) string {
		return strings.Replace(s, "kubelet_keyring {", "kubelet_keyring {\n    window = \"1m\"", 1)
	})
}

// pulls runs a pod with no pull secret and imagePullPolicy Always on every node and reports the
// nodes where it could not pull.
func pulls(t *testing.T, sb *sandbox.Sandbox, attempt string) []string {
	t.Helper()

	kube, ctx := sb.Kube(), context.Background()

	var failed []string

	for _, m := range sb.Fleet().Machines() {
		name := "pull-" + attempt + "-" + m.Name
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "apps"}, Spec: corev1.PodSpec{
			NodeName: m.Name, RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: new(bool),
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers:  []corev1.Container{{Name: "app", Image: registry.RegistryHost + "/" + registry.PrivateOrg + "/app:v1", ImagePullPolicy: corev1.PullAlways}},
		}}

		if _, err := kube.CoreV1().Pods("apps").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}

		if state, _ := sandboxtest.PullOutcome(t, sb, "apps", name); state != "ok" {
			failed = append(failed, m.Name)
		}

		_ = kube.CoreV1().Pods("apps").Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	}

	return failed
}

// evictions are the Eviction API calls in the audit log.
func evictions(t *testing.T, sb *sandbox.Sandbox) int {
	t.Helper()

	n := 0

	for _, w := range sandboxtest.Mutations(t, sb, "sandbox-admin") {
		if strings.Contains(w, "/eviction ") {
			n++
		}
	}

	return n
}

// An ordinary rotation of a Talos 1.13 fleet through the kubelet keyring: exit 0, safe to
// revoke, no reboot, no eviction, no cordon; each node's keyring holds the new credential and
// its Node records it; once the old credential is revoked, every node pulls with no pull secret.
// The plan says why per node.
func TestRotationThroughTheKubeletKeyring(t *testing.T) {
	sb := fleet(t, sandbox.Options{ControlPlanes: 1, Workers: 2, Seed: 61})
	cfg := configFile(t, sb)

	code, stdout, stderr := sandboxtest.Run(t, sb, "plan", "--config", cfg, "--detailed-exitcode")
	if code != 2 || !strings.Contains(stdout, "will take the credential through its kubelet keyring") ||
		!strings.Contains(stdout, "3 through the kubelet keyring") || strings.Contains(stdout, "will be fenced") {
		t.Fatalf("plan: exit %d\n%s\n%s", code, stdout, stderr)
	}

	before := sb.Fleet().Stats()
	evictedBefore := evictions(t, sb)

	code, stdout, stderr = sandboxtest.Run(t, sb, "apply", "--auto-approve", "--config", cfg, "--log-level", "debug")
	if code != 0 || !strings.Contains(stdout, "It is safe to revoke") || !strings.Contains(stdout, "rotated through its kubelet keyring") {
		t.Fatalf("apply: exit %d\n%s\n%s", code, stdout, stderr)
	}

	// The credential is never in the run's output, an Event, the API server's audit log or a
	// writer's log (the writer pods' specs carry a reference to the Secret only: keyring.Pod is
	// never given the credential).
	secret := sb.NewCredential().Password
	noCredential(t, "apply's output", stdout+stderr, secret)

	events, err := sb.Kube().CoreV1().Events("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}

	for _, e := range events.Items {
		noCredential(t, "Event "+e.Namespace+"/"+e.Name, e.Message, secret)
	}

	for _, glob := range []string{filepath.Join("logs", "*"), filepath.Join("containers", "*.log")} {
		files, _ := filepath.Glob(sb.Path(glob))
		for _, f := range files {
			if b, err := os.ReadFile(f); err == nil {
				noCredential(t, f, string(b), secret)
			}
		}
	}

	after := sb.Fleet().Stats()
	for _, m := range sb.Fleet().Machines() {
		if after.Reboots[m.Name] != before.Reboots[m.Name] {
			t.Errorf("%s was rebooted", m.Name)
		}

		b, err := os.ReadFile(filepath.Join(m.KubeletRootDir(), keyring.File))
		if err != nil || !strings.Contains(string(b), registry.RegistryHost) {
			t.Errorf("%s's kubelet keyring: %v %s", m.Name, err, b)
		}
	}

	if n := evictions(t, sb) - evictedBefore; n != 0 {
		t.Errorf("the rotation evicted %d pods", n)
	}

	nodes, err := sb.Kube().CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}

	for _, n := range nodes.Items {
		if n.Spec.Unschedulable || n.Annotations["ghcrsync.dev/keyring"] == "" {
			t.Errorf("node %s: cordoned %t, keyring annotation %q", n.Name, n.Spec.Unschedulable, n.Annotations["ghcrsync.dev/keyring"])
		}
	}

	sb.Registry().RevokeCredential(sb.OldCredential().Username)

	if failed := pulls(t, sb, "revoked"); len(failed) > 0 {
		t.Fatalf("with the old credential revoked after exit 0, these nodes cannot pull: %v", failed)
	}

	// The next plan: every node in sync, nothing to do.
	if code, stdout, stderr := sandboxtest.Run(t, sb, "plan", "--config", cfg, "--detailed-exitcode"); code != 0 || !strings.Contains(stdout, "its kubelet keyring holds it") {
		t.Fatalf("plan after the rotation: exit %d\n%s\n%s", code, stdout, stderr)
	}
}

// The negative control: a node whose kubelet does not read the keyring ghcrsync writes (its
// writer's folder is not the kubelet's: as a root-dir ghcrsync got wrong) is not proved — the
// proof waits for the kubelet's read, not merely for a pull that passes with containerd's old
// credential — and the run exits 5 naming it; the next plan reboots it instead.
func TestKeyringNotReadIsNotProved(t *testing.T) {
	sb := fleet(t, sandbox.Options{ControlPlanes: 1, Workers: 1, Seed: 62, NoWorkloads: true})
	cfg := configFile(t, sb)

	m, _ := sb.Fleet().Machine("prod-worker-1")
	m.MisplaceKeyring(true)

	code, stdout, stderr := sandboxtest.Run(t, sb, "apply", "--auto-approve", "--config", cfg)
	if code != 5 || !strings.Contains(stdout, "prod-worker-1") || !strings.Contains(stdout, "did not read its keyring") || strings.Contains(stdout, "It is safe to revoke") {
		t.Fatalf("apply with prod-worker-1's keyring misplaced: exit %d, want 5 naming it\n%s\n%s", code, stdout, stderr)
	}

	if code, stdout, stderr := sandboxtest.Run(t, sb, "plan", "--config", cfg); !strings.Contains(stdout, "prod-worker-1 (worker, Talos v1.13") ||
		!strings.Contains(stdout, "will be fenced") || !strings.Contains(stdout, "its kubelet keyring is not used again") {
		t.Fatalf("the next plan does not fence prod-worker-1: exit %d\n%s\n%s", code, stdout, stderr)
	}
}

// noCredential fails the test if text holds the credential's secret.
func noCredential(t *testing.T, where, text, secret string) {
	t.Helper()

	if secret != "" && strings.Contains(text, secret) {
		t.Errorf("%s holds the credential", where)
	}
}

// startApply starts apply with cfg: the command, and its stderr as it comes.
func startApply(t *testing.T, sb *sandbox.Sandbox, cfg string) (*exec.Cmd, *sandboxtest.SyncBuffer) {
	t.Helper()

	cmd := exec.Command(sandboxtest.Binary(t), "apply", "--auto-approve", "--config", cfg)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "SOPS_AGE_KEY_FILE=" + sb.Path(sandbox.AgeKeyFile)}

	var out, errb sandboxtest.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errb

	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})

	return cmd, &errb
}

func awaitOutput(t *testing.T, errb *sandboxtest.SyncBuffer, marker string) {
	t.Helper()

	sandboxtest.Eventually(t, 3*time.Minute, "apply's output "+marker, func() error {
		if strings.Contains(errb.String(), marker) {
			return nil
		}

		return fmt.Errorf("not yet")
	})
}

// writers are the keyring writer pods now.
func writers(t *testing.T, sb *sandbox.Sandbox) []corev1.Pod {
	t.Helper()

	list, err := sb.Kube().CoreV1().Pods(config.DefaultKeyringNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: keyring.Label})
	if err != nil {
		t.Fatal(err)
	}

	return list.Items
}

// A run killed outright (SIGKILL: no chance to wind down) while a keyring writer pod runs leaves
// that pod and the writer's Secret, and no cordon: `ghcrsync fences` lists the pod, `release`
// removes both (the run's process has exited: no --holder), and the next apply finishes the
// rotation: exit 0, every node pulling once the old credential is revoked.
func TestKilledWhileAKeyringWriterRunsIsRecovered(t *testing.T) {
	sb := fleet(t, sandbox.Options{ControlPlanes: 1, Workers: 2, Seed: 63, NoWorkloads: true})
	cfg := configFile(t, sb)
	ctx := context.Background()

	cmd, errb := startApply(t, sb, cfg)
	awaitOutput(t, errb, "keyring-written: node=")

	sandboxtest.Eventually(t, 2*time.Minute, "a keyring writer pod", func() error {
		if len(writers(t, sb)) == 0 {
			return fmt.Errorf("none yet")
		}

		return nil
	})

	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()

	if _, err := sb.Kube().CoreV1().Secrets(config.DefaultKeyringNamespace).Get(ctx, config.DefaultKeyringSecret, metav1.GetOptions{}); err != nil {
		t.Fatalf("the killed run's writer Secret: %v", err)
	}

	if code, stdout, stderr := sandboxtest.Run(t, sb, "fences", "--config", cfg); !strings.Contains(stdout, "keyring writer pod "+config.DefaultKeyringNamespace+"/") {
		t.Fatalf("fences after the kill: exit %d, want the writer pod listed\n%s\n%s", code, stdout, stderr)
	}

	if code, stdout, stderr := sandboxtest.Run(t, sb, "release", "--config", cfg); code != 0 || !strings.Contains(stdout, "keyring writer pod(s) left by a killed run were removed") {
		t.Fatalf("release after the kill: exit %d\n%s\n%s", code, stdout, stderr)
	}

	if w := writers(t, sb); len(w) != 0 {
		t.Fatalf("release left %d writer pods", len(w))
	}

	if _, err := sb.Kube().CoreV1().Secrets(config.DefaultKeyringNamespace).Get(ctx, config.DefaultKeyringSecret, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("release left the writer's Secret: %v", err)
	}

	nodes, _ := sb.Kube().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	for _, n := range nodes.Items {
		if n.Spec.Unschedulable {
			t.Errorf("%s is cordoned after the kill", n.Name)
		}
	}

	code, stdout, stderr := sandboxtest.Run(t, sb, "apply", "--auto-approve", "--config", cfg)
	if code != 0 || !strings.Contains(stdout, "It is safe to revoke") {
		t.Fatalf("apply after the release: exit %d\n%s\n%s", code, stdout, stderr)
	}

	sb.Registry().RevokeCredential(sb.OldCredential().Username)

	if failed := pulls(t, sb, "after-kill"); len(failed) > 0 {
		for _, n := range failed {
			m, _ := sb.Fleet().Machine(n)
			b, err := os.ReadFile(filepath.Join(m.KubeletRootDir(), keyring.File))
			t.Logf("%s's keyring: %v %d bytes", n, err, len(b))
		}

		t.Fatalf("these nodes cannot pull after the revocation: %v\n%s", failed, stdout)
	}
}

// A node rebooted by someone else between its keyring's write and its proof: the run does not
// prove what it cannot (the node is not Ready while it reboots), and whatever it ends with, the
// next apply ends exit 0 — the reboot loaded the new credential into containerd as well — and
// every node pulls once the old credential is revoked. ghcrsync itself rebooted nothing.
func TestANodeRebootedBetweenTheKeyringAndItsProof(t *testing.T) {
	sb := fleet(t, sandbox.Options{ControlPlanes: 1, Workers: 2, Seed: 64, NoWorkloads: true})
	cfg := configFile(t, sb)
	node := "prod-worker-1"

	cmd, errb := startApply(t, sb, cfg)
	awaitOutput(t, errb, "ghcrsync.apply: keyring-written: node="+node)

	if _, err := sb.Do(context.Background(), "reboot", sandbox.Request{Node: node}); err != nil {
		t.Fatal(err)
	}

	_ = cmd.Wait()
	t.Logf("the run with %s rebooted under it: exit %d", node, cmd.ProcessState.ExitCode())

	sandboxtest.Eventually(t, 2*time.Minute, node+" Ready again", func() error {
		n, err := sb.Kube().CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return err
		}

		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return nil
			}
		}

		return fmt.Errorf("not Ready")
	})

	if code, stdout, stderr := sandboxtest.Run(t, sb, "apply", "--auto-approve", "--config", cfg); code != 0 || !strings.Contains(stdout, "It is safe to revoke") {
		t.Fatalf("the next apply: exit %d\n%s\n%s", code, stdout, stderr)
	}

	if st := sb.Fleet().Stats(); st.Reboots[node] != 1 || st.ThirdPartyReboots != 1 {
		t.Fatalf("%s rebooted %d time(s), by a third party %d: ghcrsync rebooted it too", node, st.Reboots[node], st.ThirdPartyReboots)
	}

	sb.Registry().RevokeCredential(sb.OldCredential().Username)

	if failed := pulls(t, sb, "after-reboot"); len(failed) > 0 {
		t.Fatalf("these nodes cannot pull after the revocation: %v", failed)
	}
}
