package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/view"
)

// The apply command end to end on a small sandbox of its own: a saved plan applies (exit 0),
// a second apply of the same plan is refused as stale (exit 3) before any write,
// --auto-approve with nothing to do says so, and apply --json streams each step as a JSON line
// and ends with the summary.
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

	if _, err := sb.RotateSecret("json"); err != nil {
		t.Fatal(err)
	}

	r = ghcrsync(t, "apply", "--config", cfg, "--auto-approve", "--json")
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")

	if r.code != 0 || len(lines) < 8 {
		t.Fatalf("apply --json: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	var steps []string

	for i, line := range lines {
		var ev view.ApplyEventJSON
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("line %d is not JSON: %v\n%s", i, err, line)
		}

		if i == len(lines)-1 {
			var sum view.ApplyJSON
			if ev.Type != "summary" || json.Unmarshal([]byte(line), &sum) != nil || sum.Failed != 0 || len(sum.Nodes) != 2 {
				t.Fatalf("the last line is not the summary: %s", line)
			}

			continue
		}

		if ev.Type != "event" || ev.FormatVersion != view.ApplyJSONFormatVersion || ev.Time.IsZero() {
			t.Fatalf("line %d: %s", i, line)
		}

		if ev.Kind == "Node" && ev.Name == "prod-worker-1" {
			steps = append(steps, ev.Reason)
		}
	}

	want := "GhcrsyncClaim GhcrsyncDrain GhcrsyncConfigure GhcrsyncReboot GhcrsyncProve GhcrsyncRelease GhcrsyncRotated"
	if got := strings.Join(steps, " "); got != want {
		t.Fatalf("prod-worker-1's steps: %s, want %s", got, want)
	}
}
