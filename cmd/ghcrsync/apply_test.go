package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// The apply command end to end on a small sandbox of its own: a saved plan applies (exit 0),
// a second apply of the same plan is refused as stale (exit 1) before any write, and
// --auto-approve with nothing to do says so.
func TestApplyCommand(t *testing.T) {
	sb := sandboxtest.Start(t, sandbox.Options{
		ControlPlanes: 1, Workers: 1, NoWorkloads: true, AutoscalerPaused: true,
		Heartbeat: time.Second, Reboot: 2 * time.Second, AutoscalerInterval: time.Second,
	})

	cfg := sandboxEnv(t, sb)
	planFile := filepath.Join(t.TempDir(), "rotation.plan")

	if r := ghcrsync(t, "apply", "--config", cfg); r.code != 1 || !strings.Contains(r.stderr, "needs a saved plan") {
		t.Fatalf("apply without a plan: %d %s", r.code, r.stderr)
	}

	if r := ghcrsync(t, "plan", "--config", cfg, "--out", planFile); r.code != 0 {
		t.Fatalf("plan: %s", r.stderr)
	}

	r := ghcrsync(t, "apply", "--config", cfg, "--log-level", "warn", planFile)
	if r.code != 0 || !strings.Contains(r.stdout, "Apply complete: 2 rotated, 0 deselected, 0 gone after mutation, 0 failed.") ||
		!strings.Contains(r.stdout, "Lease released") {
		t.Fatalf("apply: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	if got := sb.Fleet().Stats().UnsafeWrites; got != 0 {
		t.Fatalf("unsafe writes: %d", got)
	}

	r = ghcrsync(t, "apply", "--config", cfg, planFile)
	if r.code != 3 || !strings.Contains(r.stderr, "Saved plan is stale — the state was changed by another operation after the plan was created") {
		t.Fatalf("re-applying a used plan: %d %s", r.code, r.stderr)
	}

	r = ghcrsync(t, "apply", "--config", cfg, "--auto-approve")
	if r.code != 0 || !strings.Contains(r.stdout, "No changes. The fleet already uses credential revision") || !strings.Contains(r.stdout, "No changes. Nothing to apply.") {
		t.Fatalf("auto-approve with nothing to do: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}
