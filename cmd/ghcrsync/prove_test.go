package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// A classic PAT expires, and GitHub says when (GitHub-Authentication-Token-Expiration, which
// the sandbox registry sends with its token as GitHub does): plan shows it and, under 14 days,
// warns and labels the pull request; the control, 30 days out, only shows it. Once it has
// passed the registry refuses the credential and nothing is planned.
func TestPlanReportsCredentialExpiry(t *testing.T) {
	sb := sandboxtest.Get(t)
	sandboxEnv(t, sb)

	dir := t.TempDir()
	cfg := copyConfig(t, sb, dir, nil)
	user := sb.NewCredential().Username

	t.Cleanup(func() { sb.Registry().SetExpiry(user, time.Time{}) })

	for _, tc := range []struct {
		name     string
		in       time.Duration
		expiring bool
	}{
		{"in 5 days", 5 * 24 * time.Hour, true},
		{"in 30 days", 30 * 24 * time.Hour, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at := time.Now().Add(tc.in).UTC().Truncate(time.Second)
			sb.Registry().SetExpiry(user, at)

			p := planJSON(t, ghcrsync(t, "plan", "--config", cfg, "--json"))
			warned := strings.Contains(strings.Join(p.Warnings, "\n"), "The new credential expires at "+at.Format(time.RFC3339))

			if p.CredentialExpiresAt != at.Format("2006-01-02T15:04:05Z") || p.CredentialExpiring != tc.expiring || warned != tc.expiring {
				t.Fatalf("expires_at %q expiring %t warned %t; want %s, %t", p.CredentialExpiresAt, p.CredentialExpiring, warned, at, tc.expiring)
			}

			mdPath := filepath.Join(t.TempDir(), "plan.md")
			ghcrsync(t, "plan", "--config", cfg, "--markdown", mdPath)

			md, _ := os.ReadFile(mdPath)
			if strings.Contains(string(md), "`ghcrsync:credential-expiring`") != tc.expiring {
				t.Fatalf("markdown labels (want expiring %t):\n%s", tc.expiring, md)
			}
		})
	}

	sb.Registry().SetExpiry(user, time.Now().Add(-time.Minute))

	out := filepath.Join(dir, "expired.plan")
	if r := ghcrsync(t, "plan", "--config", cfg, "--out", out); r.code != 1 || !strings.Contains(r.stderr, "nothing was planned") {
		t.Fatalf("an expired credential: exit %d, want 1\n%s", r.code, r.stderr)
	}

	if _, err := os.Stat(out); err == nil {
		t.Fatal("a plan with an expired credential was saved")
	}
}
