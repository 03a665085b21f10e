// Package quorum tests the etcd gate on a fleet of two control planes (PARITY E5): etcd keeps its
// quorum through a member's reboot only with two other healthy voters, so without
// nodes.allow_quorum_loss apply takes neither down.
package quorum

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	// Talos 1.13: a rotation reboots each control plane (the gate's case).
	sandboxtest.Main(m, sandbox.Options{ControlPlanes: 2, Workers: 0, Autoscaled: 0, AutoscalerPaused: true, NoWorkloads: true,
		Heartbeat: time.Second, Seed: 55, TalosVersion: "1.13"})
}

// configured counts the machines whose Talos config holds user's credential.
func configured(sb *sandbox.Sandbox, user string) int {
	n := 0

	for _, m := range sb.Fleet().Machines() {
		if m.Configured().Username == user {
			n++
		}
	}

	return n
}

// E5: two control planes. The sandbox renders nodes.allow_quorum_loss = true for a fleet this
// small, as a user must; without it, apply refuses each control plane before its claim — no
// cordon, no ghcrsync annotation, no Talos write — and says why (exit 5). The control: with it,
// both are rotated.
func TestTwoControlPlanesAreNotTakenDownWithoutAllowQuorumLoss(t *testing.T) {
	sb := sandboxtest.Get(t)

	rendered, err := os.ReadFile(sb.Path(sandbox.ConfigFile))
	if err != nil {
		t.Fatal(err)
	}

	if !strings.Contains(string(rendered), "allow_quorum_loss") {
		t.Fatalf("the two-control-plane sandbox's configuration does not carry allow_quorum_loss: the control would prove nothing\n%s", rendered)
	}

	t.Run("without allow_quorum_loss: each refused before its claim", func(t *testing.T) {
		cred, err := sb.RotateSecret("quorum-held")
		if err != nil {
			t.Fatal(err)
		}

		cfg := sandboxtest.CopyConfig(t, sb, t.TempDir(), func(s string) string {
			var keep []string

			for _, l := range strings.Split(s, "\n") {
				if !strings.Contains(l, "allow_quorum_loss") {
					keep = append(keep, l)
				}
			}

			return strings.Join(keep, "\n")
		})

		code, stdout, stderr := sandboxtest.Run(t, sb, "apply", "--auto-approve", "--config", cfg)
		if code != 5 || !strings.Contains(stdout+stderr, "allow_quorum_loss") {
			t.Fatalf("apply exited %d, want 5 naming nodes.allow_quorum_loss:\n%s\n%s", code, stdout, stderr)
		}

		if n := configured(sb, cred.Username); n != 0 {
			t.Errorf("%d control plane(s) were written the new credential without allow_quorum_loss", n)
		}

		nodes, err := sb.Kube().CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}

		for _, n := range nodes.Items {
			if n.Spec.Unschedulable || n.Annotations[object.OwnerAnnotation] != "" {
				t.Errorf("%s was claimed or cordoned (unschedulable %v, owner %q)", n.Name, n.Spec.Unschedulable, n.Annotations[object.OwnerAnnotation])
			}
		}
	})

	t.Run("control: with it both are rotated", func(t *testing.T) {
		cred, err := sb.RotateSecret("quorum-lost")
		if err != nil {
			t.Fatal(err)
		}

		cfg := sandboxtest.CopyConfig(t, sb, t.TempDir(), func(s string) string { return s })

		code, stdout, stderr := sandboxtest.Run(t, sb, "apply", "--auto-approve", "--config", cfg)
		if code != 0 || configured(sb, cred.Username) != 2 {
			t.Fatalf("apply exited %d with %d control plane(s) on the new credential, want 0 and 2:\n%s\n%s", code, configured(sb, cred.Username), stdout, stderr)
		}
	})
}
