package main

import (
	"strings"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// A plan that could read no node's Talos API is not a plan: with every machine's Talos API hung
// (it accepts calls and never answers), plan exits 1, naming the nodes and where it asked, and
// saves nothing — it used to exit 2 (changes), a green check, with every node "left alone".
// --allow-unreachable plans all the same, exit 2, saying how many it could not read. The
// negative control: with one machine of three hung, plan goes on and leaves that one alone.
func TestPlanThatReadsNoNodesTalosFails(t *testing.T) {
	sb := sandboxtest.Start(t, sandbox.Options{
		Dir: t.TempDir(), ControlPlanes: 1, Workers: 2, NoWorkloads: true, AutoscalerPaused: true, Heartbeat: time.Second,
	})

	cfg := sandboxtest.CopyConfig(t, sb, t.TempDir(), func(s string) string {
		return strings.Replace(s, `talosconfig = "`, "timeout     = \"3s\"\n  talosconfig = \"", 1)
	})
	sandboxEnv(t, sb)

	machines := sb.Fleet().Machines()
	for _, m := range machines {
		m.SetHung(true)
		t.Cleanup(func() { m.SetHung(false) })
	}

	out := t.TempDir() + "/rotation.plan"

	r := ghcrsync(t, "plan", "--config", cfg, "--detailed-exitcode", "--out", out)
	if r.code != 1 || !strings.Contains(r.stderr, "the Talos API of 3 of the 3 selected nodes could not be read") ||
		!strings.Contains(r.stderr, "prod-worker-1") || !strings.Contains(r.stderr, "--allow-unreachable") {
		t.Fatalf("plan with every Talos API hung: exit %d, want 1 naming them\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	if r := ghcrsync(t, "show", out); r.code == 0 {
		t.Fatal("a plan was saved although nothing was planned")
	}

	r = ghcrsync(t, "plan", "--config", cfg, "--detailed-exitcode", "--allow-unreachable")
	if r.code != 2 || !strings.Contains(r.stdout, "The Talos API of 3 of the nodes could not be read") {
		t.Fatalf("plan --allow-unreachable: exit %d, want 2 saying how many\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	// The negative control: one machine of three.
	for _, m := range machines {
		m.SetHung(m.Name == "prod-worker-2")
	}

	r = ghcrsync(t, "plan", "--config", cfg, "--detailed-exitcode")
	if r.code != 2 || !strings.Contains(r.stdout, "prod-worker-2 (worker) will be left alone") {
		t.Fatalf("plan with one Talos API hung of three: exit %d, want 2\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}
