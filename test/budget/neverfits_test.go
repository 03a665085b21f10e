package budget

import (
	"strings"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

// A budget shorter than one node: deferring the node would defer it for ever (every continuation
// run would exit 6, the rotation never done, the old credential never safe to revoke). plan warns,
// and apply does not start it but fails naming it and the way out (exit 5), holding nothing. The
// negative control is TestABudgetSmallerThanTheRotation: a budget that fits some nodes exits 6.
func TestABudgetShorterThanANodeFailsLoudly(t *testing.T) {
	sb := sandboxtest.Get(t)

	if _, err := sb.RotateSecret("never-fits"); err != nil {
		t.Fatal(err)
	}

	cfg := config(t, sb, t.TempDir()) // a node is expected to take 10 s, 5 s are kept for the end

	p := ghcrsync(t, sb, "plan", "--within", "12s", "--config", cfg)
	if p.code != 0 || !strings.Contains(p.stdout, "No run within the budget") || !strings.Contains(p.stdout, "none fits in this run") {
		t.Fatalf("plan with a budget shorter than a node: exit %d\n%s", p.code, p.stdout)
	}

	r := ghcrsync(t, sb, "apply", "--auto-approve", "--within", "12s", "--json", "--config", cfg)
	s := lastSummary(t, r.stdout)

	if r.code != 5 || s.Outcome != "partial" || len(s.Held) != 0 || !s.LeaseReleased {
		t.Fatalf("apply with a budget shorter than a node: exit %d, outcome %s, held %v\n%s", r.code, s.Outcome, s.Held, r.stderr)
	}

	if !strings.Contains(r.stdout, "longer than the run's whole time budget") {
		t.Fatalf("apply does not say why it did not start the nodes:\n%s", r.stdout)
	}

	for _, n := range s.Nodes {
		if n.Outcome == "done" {
			t.Fatalf("%s was fenced and rotated under a budget shorter than a node", n.Name)
		}
	}

	if f := ghcrsync(t, sb, "fences", "--config", cfg, "--exit-code"); f.code != 0 {
		t.Fatalf("fences after the run: exit %d\n%s", f.code, f.stdout)
	}
}
