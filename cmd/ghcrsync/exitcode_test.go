package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/state"
)

// The exit codes of the table in docs/ci.md that other tests do not produce: 4 (the Lease
// held by another run), 5 (a node failed; its fence is recorded) and fences --exit-code (2
// while a fence is held, 0 once released). 0 and 2 (plan --detailed-exitcode) are in
// plan_test.go, 3 (refused plans) in inputs_test.go, 130 and 143 in cancel_test.go.
func TestExitCodes(t *testing.T) {
	sb := sandboxtest.Start(t, sandbox.Options{
		ControlPlanes: 1, Workers: 1, NoWorkloads: true, AutoscalerPaused: true,
		Heartbeat: time.Second, Reboot: time.Second, AutoscalerInterval: time.Second,
	})
	cfg := sandboxEnv(t, sb)
	kube := sb.Kube()
	ctx := context.Background()

	// 4: another run holds the Lease.
	now := metav1.NewMicroTime(time.Now())
	_, err := kube.CoordinationV1().Leases(sandbox.LeaseNamespace).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: sandbox.LeaseName, Namespace: sandbox.LeaseNamespace},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("0123456789abcdef-gh42.1-runner-7-abc123"),
			LeaseDurationSeconds: ptr.To(int32(3600)), RenewTime: &now, AcquireTime: &now},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	if r := ghcrsync(t, "apply", "--config", cfg, "--auto-approve"); r.code != exitLeaseHeld || !strings.Contains(r.stderr, "held-by-another") {
		t.Fatalf("apply while another run holds the Lease: exit %d, want %d\n%s", r.code, exitLeaseHeld, r.stderr)
	}

	if err := kube.CoordinationV1().Leases(sandbox.LeaseNamespace).Delete(ctx, sandbox.LeaseName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// 5: the worker's runtime cannot pull once the registry revokes the credential (between its
	// reboot and its proof): it fails, its fence stays and the budget stops the run.
	cred := sb.NewCredential()
	testHooks = apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
		if phase == state.PhaseProved {
			sb.Registry().RevokeCredential(cred.Username)
		}
	}}

	t.Cleanup(func() { testHooks = apply.Hooks{} })

	r := ghcrsync(t, "apply", "--config", cfg, "--auto-approve")
	if r.code != exitPartial || !strings.Contains(r.stdout, "1 failed") {
		t.Fatalf("apply with a failing node: exit %d, want %d\n%s\n%s", r.code, exitPartial, r.stdout, r.stderr)
	}

	testHooks = apply.Hooks{}
	sb.Registry().AddCredential(cred.Username, cred.Password)

	if r := ghcrsync(t, "fences", "--config", cfg, "--exit-code"); r.code != exitChanges || !strings.Contains(r.stdout, "prod-worker-1") {
		t.Fatalf("fences --exit-code with a fence held: exit %d, want %d\n%s", r.code, exitChanges, r.stdout)
	}

	// Shell completion offers the recorded node and holder.
	if r := ghcrsync(t, "__complete", "release", "--config", cfg, "--node", "prod-w"); !strings.Contains(r.stdout, "prod-worker-1\n") {
		t.Errorf("completion of --node: %q", r.stdout)
	}

	// The failed run ran in this test's process, which is alive: name its holder and force.
	var fences struct {
		Fences []struct{ Holder string } `json:"fences"`
	}

	if r := ghcrsync(t, "fences", "--config", cfg, "--json"); json.Unmarshal([]byte(r.stdout), &fences) != nil || len(fences.Fences) == 0 {
		t.Fatalf("fences --json: %s", r.stdout)
	}

	if r := ghcrsync(t, "__complete", "release", "--config", cfg, "--holder", ""); !strings.Contains(r.stdout, fences.Fences[0].Holder+"\n") {
		t.Errorf("completion of --holder: %q, want %s", r.stdout, fences.Fences[0].Holder)
	}

	if r := ghcrsync(t, "release", "--config", cfg, "--holder", fences.Fences[0].Holder, "--force"); r.code != exitOK {
		t.Fatalf("release: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	// Its Talos config was written and its runtime never proved: release keeps it on the
	// unproven hold (still 2), lifted here without a proof.
	if r := ghcrsync(t, "fences", "--config", cfg, "--exit-code"); r.code != exitChanges || !strings.Contains(r.stdout, "unproven prod-worker-1") {
		t.Fatalf("fences --exit-code with the unproven hold: exit %d\n%s", r.code, r.stdout)
	}

	if r := ghcrsync(t, "release", "--config", cfg, "--node", "prod-worker-1", "--uncordon-unproven"); r.code != exitOK {
		t.Fatalf("release --uncordon-unproven: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	if r := ghcrsync(t, "fences", "--config", cfg, "--exit-code"); r.code != exitOK {
		t.Fatalf("fences --exit-code with nothing held: exit %d\n%s", r.code, r.stdout)
	}
}
