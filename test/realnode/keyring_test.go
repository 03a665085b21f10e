package realnode

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	talosconfig "github.com/siderolabs/talos/pkg/machinery/resources/config"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// keyringFleet is a Talos 1.13 fleet whose two workers are real nodes (a real kubelet 1.35.4 and
// containerd 1.6, which load registry auth only at boot), with ghcrsync's writer image published
// and nodes.kubelet_keyring configured.
func keyringFleet(t *testing.T) *sandbox.Sandbox {
	t.Helper()

	realNodesHere(t)

	return sandboxtest.Start(t, sandbox.Options{ControlPlanes: 1, Workers: 2, RealNodes: 2, TalosVersion: "1.13", NoWorkloads: true,
		AutoscalerPaused: true, Heartbeat: time.Second, Seed: 44, KeyringWriter: sandboxtest.Binary(t)})
}

// applyJSON runs apply --json with cfg and returns its exit code, its result and its stderr.
func applyJSON(t *testing.T, sb *sandbox.Sandbox, cfg string) (int, applied, string) {
	t.Helper()

	code, stdout, stderr := sandboxtest.Run(t, sb, "apply", "--auto-approve", "--json", "--config", cfg)

	// --json prints the run's events, a line each, then its result.
	lines := strings.Split(strings.TrimSpace(stdout), "\n")

	var res applied
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("apply --json: exit %d: %v\n%s\n%s", code, err, stdout, stderr)
	}

	return code, res, stderr
}

type applied struct {
	Nodes []struct {
		Name, Action, Outcome, Message string
		Timings                        []struct {
			Step    string
			Seconds float64
		}
	}
	Verdict struct {
		SafeToRevoke bool `json:"safe_to_revoke"`
	}
}

// proofSeconds is how long each node's proof took after its keyring was written: the keyring
// step writes it and records it on the node, the prove step follows at once.
func (a applied) proofSeconds() map[string]float64 {
	out := map[string]float64{}

	for _, n := range a.Nodes {
		for _, tm := range n.Timings {
			if tm.Step == "prove" {
				out[n.Name] = tm.Seconds
			}
		}
	}

	return out
}

// The zero-reboot path on the real kubelet and containerd, twice: an ordinary rotation (the old
// credential still valid: the proof waits for each kubelet to read its keyring), then an
// emergency one (the credential the nodes hold revoked before the run: their containerd cannot
// pull; only the keyring can). Each ends exit 0, safe to revoke, with the same boot ids, the
// same containerd and kubelet processes, no eviction and no cordon; after each, the credential
// before it is revoked and both real nodes pull with no pull secret. The time from each
// keyring write to its proof is reported (GHCRSYNC_KEYRING_EVIDENCE), never asserted.
func TestRotationThroughTheKubeletKeyringOnRealNodes(t *testing.T) {
	sb := keyringFleet(t)
	reg := sb.Registry()
	cfg := sandboxtest.CopyConfig(t, sb, t.TempDir(), nil)
	real := []string{"prod-worker-1", "prod-worker-2"}

	boots, pids := map[string]string{}, map[string][]int{}

	for _, n := range real {
		m, _ := sb.Fleet().Machine(n)
		boots[n], pids[n] = m.BootID(), m.RuntimePIDs()
	}

	evidence := map[string]map[string]float64{}

	for _, round := range []string{"ordinary", "emergency"} {
		held := sb.NewCredential()
		if round == "emergency" {
			if _, err := sb.RotateSecret("keyring-emergency"); err != nil {
				t.Fatal(err)
			}

			reg.RevokeCredential(held.Username)
		}

		code, res, stderr := applyJSON(t, sb, cfg)
		if code != 0 || !res.Verdict.SafeToRevoke {
			t.Fatalf("%s rotation: exit %d, safe to revoke %t\n%+v\n%s", round, code, res.Verdict.SafeToRevoke, res.Nodes, stderr)
		}

		for _, n := range res.Nodes {
			if n.Action != "kubelet-keyring" || n.Outcome != "done" {
				t.Fatalf("%s rotation: %s %s %s: %s", round, n.Name, n.Action, n.Outcome, n.Message)
			}
		}

		evidence[round] = res.proofSeconds()
		t.Logf("%s rotation: from each keyring write to its proof (s): %v", round, evidence[round])

		if round == "ordinary" {
			reg.RevokeCredential(sb.OldCredential().Username)
		}

		if got := pulls(t, sb, "keyring-"+round); got[live] != "ok" || got[fenced] != "ok" {
			t.Fatalf("after the %s rotation, with the credential before it revoked, the real nodes pull: %v", round, got)
		}
	}

	for _, n := range real {
		m, _ := sb.Fleet().Machine(n)
		if m.BootID() != boots[n] || !slices.Equal(m.RuntimePIDs(), pids[n]) {
			t.Errorf("%s: boot %s → %s, containerd and kubelet %v → %v: something restarted", n, boots[n], m.BootID(), pids[n], m.RuntimePIDs())
		}
	}

	for _, w := range sandboxtest.Mutations(t, sb, "sandbox-admin") {
		if strings.Contains(w, "/eviction ") {
			t.Errorf("a rotation through the keyring evicted: %s", w)
		}
	}

	nodes, err := sb.Kube().CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}

	for _, n := range nodes.Items {
		if n.Spec.Unschedulable {
			t.Errorf("%s is cordoned", n.Name)
		}
	}

	if out := os.Getenv("GHCRSYNC_KEYRING_EVIDENCE"); out != "" {
		b, _ := json.MarshalIndent(evidence, "", "  ")
		_ = os.WriteFile(out, b, 0o600)
	}
}

// The negative control: a real node whose keyring ghcrsync cannot write where its kubelet reads
// it (its machine config names another root directory than the kubelet's, so the write lands
// in a folder nobody reads) is not proved in an emergency — its containerd's credential is
// revoked and the kubelet sends none — and the run exits 5 naming it.
func TestKeyringWriteThatDoesNotReachTheKubeletFailsTheProof(t *testing.T) {
	sb := keyringFleet(t)
	node := "prod-worker-1"
	decoy := t.TempDir()
	cfg := sandboxtest.CopyConfig(t, sb, t.TempDir(), func(s string) string {
		s = regexp.MustCompile(`root_dirs(\s*)= \[`).ReplaceAllString(s, `root_dirs$1= ["`+decoy+`", `)

		return strings.Replace(s, "kubelet_keyring {", "kubelet_keyring {\n    window = \"1m\"", 1)
	})

	m, _ := sb.Fleet().Machine(node)
	setKubeletRootDir(t, sb, m, decoy)

	// The credential the fleet booted with, revoked: their containerd cannot pull.
	sb.Registry().RevokeCredential(sb.OldCredential().Username)

	code, stdout, stderr := sandboxtest.Run(t, sb, "apply", "--auto-approve", "--config", cfg)
	if code != 5 || !strings.Contains(stdout, node+" (kubelet-keyring)") || !strings.Contains(stdout, "no probe passed within 1m0s of the keyring write") ||
		strings.Contains(stdout, "It is safe to revoke") {
		t.Fatalf("apply with %s's keyring written where its kubelet does not read: exit %d, want 5 naming it\n%s\n%s", node, code, stdout, stderr)
	}
}

// setKubeletRootDir changes the node's machine.kubelet.extraArgs root-dir to dir, through the
// Talos API (live: the sandbox's kubelet, unlike Talos's, is not restarted by it, so it keeps
// reading its own root directory).
func setKubeletRootDir(t *testing.T, sb *sandbox.Sandbox, m *sandbox.Machine, dir string) {
	t.Helper()

	ctx := client.WithNode(context.Background(), m.IP)
	tc := sandboxtest.TalosFor(t, sb, sandbox.TalosconfigOperatorFile)

	active, err := safe.StateGetByID[*talosconfig.MachineConfig](ctx, tc.COSI, talosconfig.ActiveID)
	if err != nil {
		t.Fatal(err)
	}

	b, err := active.Provider().Bytes()
	if err != nil {
		t.Fatal(err)
	}

	text := string(b)
	i := strings.Index(text, "root-dir: ")
	if i < 0 {
		t.Fatalf("%s's machine config sets no root-dir", m.Name)
	}

	end := i + strings.Index(text[i:], "\n")
	text = text[:i] + "root-dir: " + dir + text[end:]

	if _, err := tc.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: []byte(text), Mode: machine.ApplyConfigurationRequest_NO_REBOOT}); err != nil {
		t.Fatalf("%s: %v", m.Name, err)
	}
}
