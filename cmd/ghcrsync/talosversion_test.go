package main

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/talos"
	"github.com/ghcrsync/ghcrsync/plan"
)

// RegistryAuthConfig exists from Talos 1.12 (plan.TalosMinimum). A 1.11 node is deselected by
// plan with its reason and never claimed, cordoned or written by apply, and the verdict names
// it; the 1.12 node beside it (the edge) is rotated. The negative control: the 1.11 node's
// Talos really refuses the document ghcrsync would have written.
func TestTalosBelowTheMinimumIsNeverClaimed(t *testing.T) {
	sb := sandboxtest.Start(t, sandbox.Options{
		Dir: t.TempDir(), ControlPlanes: 1, Workers: 2, TalosVersion: "1.13,1.11,1.12", NoWorkloads: true,
		AutoscalerPaused: true, Heartbeat: time.Second, Reboot: 2 * time.Second, AutoscalerInterval: time.Second,
	})

	cfg := sandboxEnv(t, sb)

	const old, edge = "prod-worker-1", "prod-worker-2"

	p := planJSON(t, ghcrsync(t, "plan", "--config", cfg, "--json"))

	for name, want := range map[string]string{old: "deselect", edge: "fence"} {
		n, ok := nodeByName(p, name)
		if !ok || n.Action != want {
			t.Fatalf("%s: %+v, want %s", name, n, want)
		}

		if name == old && (n.ReasonCode != string(plan.ReasonTalosUnsupported) || !strings.Contains(n.Reason, "needs "+plan.TalosMinimum.String()+" or later")) {
			t.Fatalf("%s: reason %s (%s)", name, n.ReasonCode, n.Reason)
		}
	}

	// Each node plan acts on was asked, with a dry run of exactly the change, what its Talos would
	// do (1.12 and 1.13 stage it for the reboot); the plan wrote nothing to any Talos.
	if n, _ := nodeByName(p, edge); !strings.HasPrefix(n.TalosDryRun, "STAGED: ") {
		t.Fatalf("%s: talos_dry_run %q, want Talos's STAGED answer", edge, n.TalosDryRun)
	}

	if n, _ := nodeByName(p, old); n.TalosDryRun != "" {
		t.Fatalf("%s was deselected, and still dry-run: %q", old, n.TalosDryRun)
	}

	for name, w := range sb.Fleet().Stats().TalosWrites {
		if w != 0 {
			t.Fatalf("plan wrote to %s's Talos (%d write(s))", name, w)
		}
	}

	writes := sb.Fleet().Stats().TalosWrites[old]

	r := ghcrsync(t, "apply", "--config", cfg, "--auto-approve")
	if r.code != 5 || !strings.Contains(r.stdout, "Do not revoke") || !strings.Contains(r.stdout, "upgrade its Talos to "+plan.TalosMinimum.String()) {
		t.Fatalf("apply with a 1.11 node: exit %d, want 5 naming it\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	if got := sb.Fleet().Stats().TalosWrites[old]; got != writes {
		t.Fatalf("%d Talos write(s) to the 1.11 node", got-writes)
	}

	n, err := sb.Kube().CoreV1().Nodes().Get(context.Background(), old, metav1.GetOptions{})
	if err != nil || n.Spec.Unschedulable || n.Annotations[object.OwnerAnnotation] != "" {
		t.Fatalf("the 1.11 node after apply (%v): cordoned %t, annotations %v", err, n.Spec.Unschedulable, n.Annotations)
	}

	if m, _ := sb.Fleet().Machine(edge); m.Effective() != sb.NewCredential() {
		t.Fatalf("the 1.12 node was not rotated: %s", m.Effective().Username)
	}

	// The negative control: what ghcrsync did not send, the 1.11 node's Talos refuses.
	tc, err := talos.Connect(context.Background(), sb.Path(sandbox.TalosconfigFile), "", nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()

	m, _ := sb.Fleet().Machine(old)
	c := sb.NewCredential()

	if _, err := tc.Configure(context.Background(), m.IP, sandbox.RegistryHost, c.Username, c.Password, false); err == nil ||
		!strings.Contains(err.Error(), `unknown document kind "RegistryAuthConfig"`) {
		t.Fatalf("a RegistryAuthConfig apply to Talos 1.11: %v", err)
	}
}
