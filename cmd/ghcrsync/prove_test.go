package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// GHCR grants each package on its own: a credential that logs in can still be denied one private
// repository. plan proves every image of credential.prove and names the one denied; the control,
// the same two images with both granted, plans.
func TestPlanProvesEveryImage(t *testing.T) {
	sb := sandboxtest.Get(t)
	sandboxEnv(t, sb)

	dir := t.TempDir()
	cfg := copyConfig(t, sb, dir, func(s string) string {
		return strings.Replace(s, `prove     = ["ghcrsync/private-probe:v1"]`, `prove     = ["ghcrsync/private-probe:v1", "ghcrsync/app:v1"]`, 1)
	})
	out := filepath.Join(dir, "plan.out")

	if r := ghcrsync(t, "plan", "--config", cfg, "--out", out, "--detailed-exitcode"); r.code != 2 {
		t.Fatalf("both images granted: exit %d, want 2\n%s", r.code, r.stderr)
	}

	user := sb.NewCredential().Username
	sb.Registry().DenyRepository(user, "ghcrsync/app")
	t.Cleanup(func() { sb.Registry().AllowRepository(user, "ghcrsync/app") })

	_ = os.Remove(out)

	r := ghcrsync(t, "plan", "--config", cfg, "--out", out)
	if r.code != 1 || !strings.Contains(r.stderr, "registry proof of ghcrsync/app:v1 failed") || !strings.Contains(r.stderr, "403") ||
		!strings.Contains(r.stderr, "without access to the image") || strings.Contains(r.stderr, "private-probe") {
		t.Fatalf("one image denied: exit %d, want 1 naming ghcrsync/app:v1 alone\n%s", r.code, r.stderr)
	}

	if _, err := os.Stat(out); err == nil {
		t.Fatal("a plan refused by the registry proof was saved")
	}

	// apply refuses before any write: no Talos write, no node patched (parity A5).
	talosBefore := totalTalosWrites(sb)

	if r := ghcrsync(t, "apply", "--config", cfg, "--auto-approve"); r.code != 1 || !strings.Contains(r.stderr, "registry proof of ghcrsync/app:v1 failed") {
		t.Fatalf("apply with one image denied: exit %d\n%s", r.code, r.stderr)
	}

	if got := totalTalosWrites(sb); got != talosBefore {
		t.Fatalf("apply refused by the registry proof made %d Talos write(s)", got-talosBefore)
	}
}
