package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/talos"
)

// Talos 1.13 accepts a no-reboot apply of a registry-auth change and its container runtime keeps
// the credential it booted with. An operator (or Omni, or another tool) doing that out of band
// leaves every config on the new credential and every runtime on the old one: plan fences each
// node ("runtime-unproven"), never counts it in sync, and the verdict is "do not revoke". The
// negative control: a node rebooted since (its runtime started after its config changed) is in
// sync. apply then rotates the rest, and revoking the old credential breaks no node.
func TestOutOfBandNoRebootApplyIsNotLoaded(t *testing.T) {
	dir := t.TempDir()

	sb := sandboxtest.Start(t, sandbox.Options{
		Dir: dir, ControlPlanes: 1, Workers: 2, InSync: true, NoWorkloads: true,
		AutoscalerPaused: true, Heartbeat: time.Second, Reboot: 2 * time.Second, AutoscalerInterval: time.Second,
	})

	cfg := sandboxEnv(t, sb)
	old := sb.NewCredential() // the fleet starts on the secret file's credential

	rotated := sandbox.Credential{Username: "fleet-oob", Password: "ghp_oob_" + fmt.Sprint(time.Now().UnixNano())}
	sb.Registry().AddCredential(rotated.Username, rotated.Password)
	writeSecretFile(t, sb, rotated)

	ctx := context.Background()

	tc, err := talos.Connect(ctx, sb.Path(sandbox.TalosconfigFile), "", nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()

	// The operator's out-of-band no-reboot apply of the new credential, on every node.
	for _, m := range sb.FleetInfo() {
		if _, err := tc.Configure(ctx, m.IP, sandbox.RegistryHost, rotated.Username, rotated.Password, true); err != nil {
			t.Fatalf("no-reboot apply to %s: %v", m.Name, err)
		}

		if m, _ := sb.Fleet().Machine(m.Name); m.Configured() != rotated || m.Effective() != old {
			t.Fatalf("%s: configured %s, loaded %s: want the new configured, the old loaded", m.Name, m.Configured().Username, m.Effective().Username)
		}
	}

	p := planJSON(t, ghcrsync(t, "plan", "--config", cfg, "--json"))
	if p.Verdict == nil || p.Verdict.SafeToRevoke {
		t.Fatalf("every runtime still on the old credential, and the verdict is %+v", p.Verdict)
	}

	for _, n := range p.Nodes {
		if n.Action != "fence" || n.ReasonCode != "runtime-unproven" || !strings.Contains(n.Reason, "the runtime started before the config changed") {
			t.Fatalf("%s: %s/%s (%s): want a fence, its runtime not loaded", n.Name, n.Action, n.ReasonCode, n.Reason)
		}
	}

	// The negative control: a worker rebooted since loaded it, and is in sync.
	const rebooted = "prod-worker-1"

	m, _ := sb.Fleet().Machine(rebooted)
	boot := m.BootID()

	if err := tc.Reboot(ctx, m.IP); err != nil {
		t.Fatal(err)
	}

	sandboxtest.Eventually(t, time.Minute, rebooted+" back with a new boot", func() error {
		n, err := sb.Kube().CoreV1().Nodes().Get(ctx, rebooted, metav1.GetOptions{})
		if err != nil {
			return err
		}

		if m.BootID() == boot || m.Effective() != rotated || !sandbox.NodeReady(n) {
			return fmt.Errorf("boot %s, loaded %s", m.BootID(), m.Effective().Username)
		}

		return nil
	})

	p = planJSON(t, ghcrsync(t, "plan", "--config", cfg, "--json"))

	for _, n := range p.Nodes {
		if want := map[bool]string{true: "no-op", false: "fence"}[n.Name == rebooted]; n.Action != want {
			t.Fatalf("%s after %s's reboot: %s (%s), want %s", n.Name, rebooted, n.Action, n.Reason, want)
		}
	}

	if r := ghcrsync(t, "apply", "--config", cfg, "--auto-approve"); r.code != 0 || !strings.Contains(r.stdout, "It is safe to revoke") {
		t.Fatalf("apply: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	sb.Registry().RevokeCredential(old.Username)

	for _, m := range sb.FleetInfo() {
		if m.Effective != rotated.Username {
			t.Errorf("%s still pulls with %s after apply said it was safe to revoke it", m.Name, m.Effective)
		}
	}
}
