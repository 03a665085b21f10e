package budget

import (
	"strings"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/window"
)

// A maintenance window closed now: plan says so, and apply does what restarts nothing — the node template, the
// consumer pull secrets — defers every node it would fence (nothing drained, nothing rebooted,
// nothing held), exits 6 (progressed), and its `next` names the window's opening; the root
// Flux secret waits. Then the credential the nodes hold is revoked: an emergency ignores the
// window, says so, and rotates every node (exit 0, safe to revoke) — which is also the negative
// control: the same fleet and window, and the fence goes ahead.
func TestAClosedWindowDefersTheNodesItWouldReboot(t *testing.T) {
	sb := sandboxtest.Get(t)

	if _, err := sb.RotateSecret("window"); err != nil {
		t.Fatal(err)
	}

	held := sb.Fleet().Machines()[0].Configured() // what the nodes hold (every node alike here)

	// A whole day, two days from now: closed today.
	text := time.Now().UTC().Add(48 * time.Hour).Weekday().String()[:3] + " 00:00-24:00 UTC"

	w, err := window.Parse(text)
	if err != nil {
		t.Fatal(err)
	}

	cfg := sandboxtest.CopyConfig(t, sb, t.TempDir(), func(s string) string {
		s = strings.Replace(s, "nodes {\n", "nodes {\n  expected_node_time = \"10s\"\n", 1)

		return s + "\nrun {\n  reserve = \"5s\"\n  window  = \"" + text + "\"\n}\n"
	})

	// The plan says it first.
	if p := ghcrsync(t, sb, "plan", "--config", cfg); p.code != 0 || !strings.Contains(p.stdout, "The maintenance window (run.window \""+text+"\") is closed now") {
		t.Fatalf("plan with the window closed: exit %d\n%s", p.code, p.stdout)
	}

	boots := map[string]string{}
	for _, m := range sb.Fleet().Machines() {
		boots[m.Name] = m.BootID()
	}

	r := ghcrsync(t, sb, "apply", "--auto-approve", "--json", "--config", cfg)
	s := lastSummary(t, r.stdout)

	if r.code != 6 || s.Outcome != "progressed" || len(s.Held) != 0 || !s.LeaseReleased {
		t.Fatalf("apply with the window closed: exit %d, outcome %s, held %v\n%s\n%s", r.code, s.Outcome, s.Held, r.stdout, r.stderr)
	}

	if want := w.Next(time.Now()).UTC().Format(time.RFC3339); !strings.Contains(s.Next, "in the maintenance window (it opens "+want) {
		t.Fatalf("next does not name the window's opening (%s): %q", want, s.Next)
	}

	for _, n := range s.Nodes {
		if n.Outcome != "deferred" {
			t.Fatalf("%s: %s with the window closed, want deferred", n.Name, n.Outcome)
		}
	}

	for _, m := range sb.Fleet().Machines() {
		if m.BootID() != boots[m.Name] {
			t.Fatalf("%s rebooted outside the window", m.Name)
		}
	}

	written := map[string]string{}
	for _, x := range s.Secrets {
		written[x.Role] = x.Outcome
	}

	if written["consumer"] != "written" || written["node-template"] != "written" || written["root"] == "written" {
		t.Fatalf("with the window closed, the pull secrets and the template are written and the root waits: %+v", s.Secrets)
	}

	if !strings.Contains(r.stdout, "outside the maintenance window (run.window \\\""+text+"\\\")") {
		t.Fatalf("apply does not say the window deferred the nodes:\n%s", r.stdout)
	}

	// The emergency: the nodes' credential is refused; the window no longer holds them.
	if !sb.Registry().RevokeCredential(held.Username) {
		t.Fatalf("revoke %s", held.Username)
	}

	e := ghcrsync(t, sb, "apply", "--auto-approve", "--json", "--config", cfg)
	es := lastSummary(t, e.stdout)

	if e.code != 0 || !es.Verdict.SafeToRevoke || !strings.Contains(e.stderr, "nodes are rebooted outside the maintenance window") {
		t.Fatalf("an emergency with the window closed: exit %d, safe %v\n%s\n%s", e.code, es.Verdict.SafeToRevoke, e.stdout, e.stderr)
	}
}
