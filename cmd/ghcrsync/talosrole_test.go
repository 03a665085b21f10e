package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// plan with a Talos identity that may not read the machine configs (an os:reader certificate:
// Talos answers PermissionDenied) fails — exit 1, naming the role it needs and the nodes, and
// saving nothing — instead of leaving every node alone and exiting 2 as if it had planned. The
// control: the same plan with the os:admin talosconfig plans (and sees changes: exit 2).
func TestPlanFailsWhenItsTalosRoleCannotReadTheFleet(t *testing.T) {
	sb := sandboxtest.Start(t, sandbox.Options{
		Dir: t.TempDir(), ControlPlanes: 1, Workers: 1, NoWorkloads: true,
		AutoscalerPaused: true, Heartbeat: time.Second, Reboot: 2 * time.Second, AutoscalerInterval: time.Second,
	})
	cfg := sandboxEnv(t, sb)

	if _, err := sb.RotateSecret("role"); err != nil {
		t.Fatal(err)
	}

	out := t.TempDir() + "/plan.out"

	r := ghcrsync(t, "plan", "--config", cfg, "--talosconfig", sb.Path(sandbox.TalosconfigReaderFile), "--detailed-exitcode", "--out", out)
	if r.code != 1 || !strings.Contains(r.stderr, "os:admin") || !strings.Contains(r.stderr, "PermissionDenied") ||
		!strings.Contains(r.stderr, "prod-worker-1") || !strings.Contains(r.stderr, "nothing was planned") {
		t.Fatalf("plan with an os:reader talosconfig: exit %d, want 1 naming os:admin\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	if exists(out) {
		t.Fatal("a plan that could not read the fleet was saved")
	}

	if r := ghcrsync(t, "plan", "--config", cfg, "--detailed-exitcode", "--out", out); r.code != 2 || !exists(out) {
		t.Fatalf("the control, plan with the os:admin talosconfig: exit %d, want 2\n%s", r.code, r.stderr)
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)

	return err == nil
}
