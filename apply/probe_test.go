package apply_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/taints"
	"github.com/ghcrsync/ghcrsync/state"
)

// A probe the node's kubelet refuses to run (the real LimitRanger defaults its memory request
// past the node's capacity; the kubelet's admission rejects it OutOfmemory) fails at once, as a
// rejection — not as a pull failure, not after the probe's timeout — and the node keeps its
// fence. The negative control: a default request that fits, and the node is rotated.
func TestRuntimeProbeKubeletRejectionFailsFastAndDistinctly(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()
	const name = "prod-worker-3"

	for _, tc := range []struct {
		name, request string
		rejected      bool
	}{
		{"request past the node's memory", "9Gi", true},
		{"request that fits", "64Mi", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			limits := kube.CoreV1().LimitRanges(sandbox.ProbeNamespace)
			t.Cleanup(func() { _ = limits.Delete(context.Background(), "probe-defaults", metav1.DeleteOptions{}) })

			r := newRotation(t, sb, func(s string) string {
				return strings.Replace(s, `ready_timeout         = "60s"`, `ready_timeout         = "5m"`, 1)
			}, name)
			path := r.plan()

			res, err := r.apply(path, apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
				if phase != state.PhaseProved {
					return
				}

				_, err := limits.Create(ctx, &corev1.LimitRange{
					ObjectMeta: metav1.ObjectMeta{Name: "probe-defaults"},
					Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{
						Type: corev1.LimitTypeContainer, DefaultRequest: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(tc.request)},
					}}},
				}, metav1.CreateOptions{})
				if err != nil {
					t.Error(err)
				}
			}})
			if err != nil {
				t.Fatal(err)
			}

			x := r.result(res, name)

			if !tc.rejected {
				if x.Outcome != state.OutcomeDone {
					t.Fatalf("the control: %+v", x)
				}

				return
			}

			// The 5-minute probe timeout would have said "did not complete … timed out".
			if x.Outcome != state.OutcomeFailed || !x.Fenced || !strings.Contains(x.Message, "rejected runtime probe") ||
				!strings.Contains(x.Message, "OutOfmemory") || strings.Contains(x.Message, "timed out") || strings.Contains(x.Message, "cannot pull") {
				t.Fatalf("a probe the kubelet rejects: %+v", x)
			}

			if rel := releaseHolder(t, r.cfg, res.Holder); rel.Held() != 0 {
				t.Fatalf("release: %+v", rel.Outcomes)
			}
		})
	}
}

// A probe that stalls (the node's container runtime hangs creating containers) fails at the
// probe's timeout with what was last observed of the pod: its phase, the conditions not True,
// the container waiting in ContainerCreating. The node keeps its fence.
func TestRuntimeProbeTimeoutReportsObservedPodState(t *testing.T) {
	sb := sandboxtest.Get(t)
	ctx := context.Background()
	const name = "prod-worker-3"

	t.Cleanup(func() { _, _ = sb.Do(context.Background(), "unstall-pods", sandbox.Request{Node: name}) })

	r := newRotation(t, sb, func(s string) string {
		return strings.Replace(s, `ready_timeout         = "60s"`, `ready_timeout         = "10s"`, 1)
	}, name)
	path := r.plan()

	res, err := r.apply(path, apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
		if phase == state.PhaseProved {
			if _, err := sb.Do(ctx, "stall-pods", sandbox.Request{Node: name}); err != nil {
				t.Error(err)
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}

	x := r.result(res, name)
	for _, want := range []string{"did not complete", "timed out after 10s", "last seen: phase Pending", "Ready=False", "container probe waiting: ContainerCreating"} {
		if !strings.Contains(x.Message, want) {
			t.Fatalf("a stalled probe, want %q: %+v", want, x)
		}
	}

	if x.Outcome != state.OutcomeFailed || !x.Fenced {
		t.Fatalf("a stalled probe: %+v", x)
	}

	if _, err := sb.Do(ctx, "unstall-pods", sandbox.Request{Node: name}); err != nil {
		t.Fatal(err)
	}

	if rel := releaseHolder(t, r.cfg, res.Holder); rel.Held() != 0 {
		t.Fatalf("release: %+v", rel.Outcomes)
	}
}

// A node that does not come back usable from its reboot — its kubelet reports NotReady (a CNI
// that never comes up; the real node lifecycle controller then taints it), or it is Ready but a
// lifecycle taint stays (Cilium's agent-not-ready) — fails at ready_timeout: its fence and cordon
// stay, and the roll stops there (the next node is not started). A cordon an operator put on it
// before the run is kept by the release that follows. The negative control: the fault cleared,
// the same rotation completes.
func TestUnreadyNodeAfterRebootStopsTheRoll(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()
	nodes := []string{"prod-worker-1", "prod-worker-2"}

	for _, tc := range []struct {
		name     string
		fault    string // "not-ready", "taint", "" (the control)
		cordoned bool   // by an operator, before the plan
		want     string
	}{
		{"Ready=False after the reboot", "not-ready", false, "Ready false"},
		{"Ready=False, cordoned before the run", "not-ready", true, "Ready false"},
		{"a lifecycle taint that stays", "taint", false, "lifecycle taints true"},
		{"no fault", "", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var first string

			clear := func() {
				if first == "" {
					return
				}

				if _, err := sb.Do(context.Background(), "kubelet-ready", sandbox.Request{Node: first}); err != nil {
					t.Error(err)
				}

				// Read and update again when a kubelet heartbeat lands in between.
				if err := sandboxtest.EditNode(context.Background(), kube, first, func(n *corev1.Node) {
					n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.Key == taints.CiliumAgentNotReady })
				}); err != nil {
					t.Error(err)
				}
			}
			t.Cleanup(clear)

			r := newRotation(t, sb, func(s string) string {
				return strings.Replace(s, `ready_timeout         = "60s"`, `ready_timeout         = "8s"`, 1)
			}, nodes...)

			if tc.cordoned {
				for _, n := range nodes {
					sandboxtest.Cordon(t, kube, n)
					t.Cleanup(func() {
						sandboxtest.PatchNode(t, kube, n, map[string]any{"spec": map[string]any{"unschedulable": false}})
					})
				}
			}

			path := r.plan()
			writes := sb.Fleet().Stats().TalosWrites

			res, err := r.apply(path, apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
				if phase != state.PhaseRebooting || first != "" {
					return
				}

				first = node

				switch tc.fault {
				case "not-ready":
					if _, err := sb.Do(ctx, "kubelet-not-ready", sandbox.Request{Node: node}); err != nil {
						t.Error(err)
					}
				case "taint":
					sandboxtest.PatchNode(t, kube, node, map[string]any{"spec": map[string]any{"taints": []map[string]any{
						{"key": taints.CiliumAgentNotReady, "effect": "NoSchedule"}}}})
				}
			}})
			if err != nil {
				t.Fatal(err)
			}

			if tc.fault == "" {
				for _, n := range nodes {
					if x := r.result(res, n); x.Outcome != state.OutcomeDone {
						t.Fatalf("the control: %+v", x)
					}
				}

				return
			}

			x := r.result(res, first)
			if x.Outcome != state.OutcomeFailed || !x.Fenced || !strings.Contains(x.Message, "did not come back Ready") || !strings.Contains(x.Message, tc.want) {
				t.Fatalf("%s: %+v", tc.name, x)
			}

			if n := node(t, sb, first); !n.Spec.Unschedulable || n.Annotations[object.OwnerAnnotation] != res.Holder {
				t.Fatalf("the failed node's fence is gone: %+v %v", n.Spec, n.Annotations)
			}

			for _, other := range nodes {
				if other == first {
					continue
				}

				if y := r.result(res, other); y.Outcome != state.OutcomeSkipped || sb.Fleet().Stats().TalosWrites[other] != writes[other] {
					t.Fatalf("the roll went on after %s: %+v", first, y)
				}
			}

			clear()

			if rel := releaseHolder(t, r.cfg, res.Holder); rel.Held() != 0 {
				t.Fatalf("release: %+v", rel.Outcomes)
			}

			// Rebooted with its new config, never proved: on an unproven hold, unless an
			// operator's cordon from before the run is what keeps it out of service.
			if !tc.cordoned {
				liftUnproven(t, sb, r.cfg, first)
			}

			assertReleased(t, sb, first, tc.cordoned)
		})
	}
}
