package apply_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/state"
)

// On a Talos 1.14 fleet every node is applied live: zero cordons, zero reboots, runtime proved.
func TestApplyLiveOnTalos114(t *testing.T) {
	ctx := context.Background()

	sb := sandboxtest.Start(t, sandbox.Options{
		ControlPlanes: 1, Workers: 2, TalosVersion: "1.14", NoWorkloads: true, AutoscalerPaused: true,
		Heartbeat: time.Second, Reboot: 2 * time.Second, AutoscalerInterval: time.Second,
	})

	r := newRotation(t, sb, nil, allNodes(sb)...)
	path := r.plan()

	if r.planned.Summary.ApplyLive != 3 || r.planned.Summary.Fence != 0 {
		t.Fatalf("plan: %+v", r.planned.Summary)
	}

	cordoned := 0
	res, err := r.apply(path, apply.Hooks{BeforeMutation: func(node string, _ state.Phase) {
		if n0 := nodeOf(t, sb, node); n0.Spec.Unschedulable || n0.Annotations[object.OwnerAnnotation] != "" {
			cordoned++
		}
	}})
	if err != nil {
		t.Fatal(err)
	}

	if res.Failed() != 0 || cordoned != 0 {
		t.Fatalf("failed %d, cordoned %d: %+v", res.Failed(), cordoned, res.Nodes)
	}

	stats := sb.Fleet().Stats()
	for _, n := range allNodes(sb) {
		if stats.Reboots[n] != 0 {
			t.Errorf("%s rebooted", n)
		}

		if m, _ := sb.Fleet().Machine(n); m.Effective() != r.cred {
			t.Errorf("%s's runtime did not load the credential live", n)
		}

		assertReleased(t, sb, n, false)
	}

	again, err := planCfg(ctx, r.cfg)
	if err != nil || again.Plan.Changes() {
		t.Fatalf("second plan: %v %+v", err, again.Plan.Summary)
	}

	_ = os.Remove(filepath.Join(r.dir, "x"))
	_ = strings.TrimSpace

	liveNeverHoldsAFence(t, sb)
}

// A live rotation claims nothing, so it never holds a fence: when an operator cordons the node
// after its Talos write and the proof refuses it, neither the state, `fences` nor `release`
// call the cordon ghcrsync's (the chaos campaign found release uncordoning it). Negative
// control: the refusal itself still happens.
func liveNeverHoldsAFence(t *testing.T, sb *sandbox.Sandbox) {
	const name = "prod-worker-1"

	kube := sb.Kube()
	r := newRotation(t, sb, nil, name)
	path := r.plan()

	res, err := r.apply(path, apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
		if node == name && phase == state.PhaseConfigured {
			sandboxtest.Cordon(t, kube, name)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		sandboxtest.PatchNode(t, kube, name, map[string]any{"spec": map[string]any{"unschedulable": false}})
	})

	if x := r.result(res, name); x.Outcome != state.OutcomeFailed || x.Fenced {
		t.Fatalf("operator cordon after the live write: %+v", x)
	}

	if rec := r.readState().Record(name); rec.Holds() {
		t.Fatalf("a live record holds a fence: %+v", rec)
	}

	rel := release(t, r.cfg)
	if len(rel.Outcomes) != 0 || !nodeOf(t, sb, name).Spec.Unschedulable {
		t.Fatalf("release touched the operator's cordon: %+v", rel.Outcomes)
	}
}
