package apply_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/workspace"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// The etcd gate, before a control plane is claimed: every other voting member healthy (its Node
// Ready, not cordoned, fenced by no one; its member answering, no errors, a voter), no alarm.
// Each case breaks one rule on prod-control-plane-3 and the rotation of prod-control-plane-2 is
// refused before its claim, naming it; the negative control (nothing broken) rotates it.
func TestEtcdGateBeforeTheClaim(t *testing.T) {
	sb := sandboxtest.Get(t)
	ctx := context.Background()
	const name, other = "prod-control-plane-2", "prod-control-plane-3"

	do := func(verb string, req sandbox.Request) {
		t.Helper()

		if _, err := sb.Do(ctx, verb, req); err != nil {
			t.Fatal(err)
		}
	}

	for _, tc := range []struct {
		name        string
		break_, fix func()
		want        string // "" = rotated
	}{
		{"an alarm (NOSPACE)", func() { do("etcd-alarm", sandbox.Request{Node: other, Alarm: "NOSPACE"}) },
			func() { do("etcd-alarm", sandbox.Request{Node: other}) }, "alarms raised (NOSPACE on " + other + ")"},
		{"an alarm (CORRUPT)", func() { do("etcd-alarm", sandbox.Request{Node: other, Alarm: "CORRUPT"}) },
			func() { do("etcd-alarm", sandbox.Request{Node: other}) }, "CORRUPT on " + other},
		{"a learner", func() { do("etcd-learner", sandbox.Request{Node: other}) },
			func() { do("etcd-voter", sandbox.Request{Node: other}) }, other + " are learners"},
		{"another control plane cordoned by an operator",
			func() {
				sandboxtest.Cordon(t, sb.Kube(), other)
			},
			func() {
				sandboxtest.PatchNode(t, sb.Kube(), other, map[string]any{"spec": map[string]any{"unschedulable": false}})
			},
			other + " is cordoned"},
		{"another control plane fenced by another run",
			func() {
				sandboxtest.PatchNode(t, sb.Kube(), other, map[string]any{"metadata": map[string]any{"annotations": map[string]any{object.OwnerAnnotation: "another-run"}}})
			},
			func() {
				sandboxtest.PatchNode(t, sb.Kube(), other, map[string]any{"metadata": map[string]any{"annotations": map[string]any{object.OwnerAnnotation: nil}}})
			},
			other + " is fenced by run another-run"},
		{"nothing broken", func() {}, func() {}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRotation(t, sb, func(s string) string {
				if tc.want == "" {
					return s
				}

				return strings.Replace(s, `ready_timeout         = "60s"`, `ready_timeout         = "3s"`, 1) // the gate waits no longer
			}, name)
			path := r.plan()

			tc.break_()
			t.Cleanup(tc.fix)

			writes := sb.Fleet().Stats().TalosWrites[name]

			res, err := r.apply(path, apply.Hooks{})
			if err != nil {
				t.Fatal(err)
			}

			x := r.result(res, name)

			if tc.want == "" {
				if x.Outcome != state.OutcomeDone {
					t.Fatalf("the control: %+v", x)
				}

				return
			}

			if x.Outcome != state.OutcomeFailed || x.Fenced || !strings.Contains(x.Message, "etcd quorum not confirmed before claiming it") ||
				!strings.Contains(x.Message, tc.want) {
				t.Fatalf("with %s: %+v", tc.name, x)
			}

			if n := node(t, sb, name); n.Spec.Unschedulable || n.Annotations[object.OwnerAnnotation] != "" || sb.Fleet().Stats().TalosWrites[name] != writes {
				t.Fatal("a control plane the gate refused was touched")
			}
		})
	}
}

// The gate again right before the reboot: an alarm raised while the control plane was drained
// and configured stops its reboot; the fence stays (its config is written), for `release`.
func TestEtcdGateBeforeTheReboot(t *testing.T) {
	sb := sandboxtest.Get(t)
	ctx := context.Background()
	const name, other = "prod-control-plane-2", "prod-control-plane-3"

	r := newRotation(t, sb, func(s string) string {
		return strings.Replace(s, `ready_timeout         = "60s"`, `ready_timeout         = "3s"`, 1)
	}, name)
	path := r.plan()
	reboots := sb.Fleet().Stats().Reboots[name]

	t.Cleanup(func() { _, _ = sb.Do(context.Background(), "etcd-alarm", sandbox.Request{Node: other}) })

	res, err := r.apply(path, apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
		if node == name && phase == state.PhaseConfigured {
			if _, err := sb.Do(ctx, "etcd-alarm", sandbox.Request{Node: other, Alarm: "NOSPACE"}); err != nil {
				t.Error(err)
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}

	x := r.result(res, name)
	if x.Outcome != state.OutcomeFailed || !x.Fenced || !strings.Contains(x.Message, "etcd quorum not confirmed before its reboot") ||
		!strings.Contains(x.Message, "NOSPACE") || sb.Fleet().Stats().Reboots[name] != reboots {
		t.Fatalf("an alarm raised after the drain: %+v", x)
	}

	if _, err := sb.Do(ctx, "etcd-alarm", sandbox.Request{Node: other}); err != nil {
		t.Fatal(err)
	}

	if rel := releaseHolder(t, r.cfg, res.Holder); rel.Held() != 0 {
		t.Fatalf("release: %+v", rel.Outcomes)
	}

	liftUnproven(t, sb, r.cfg, name) // its config was written, its reboot never came
}

// The machine ghcrsync configures and reboots is the Node it drained: a Node whose address
// moved to another machine — before the plan (an address reused), or after the claim — is
// refused before any Talos write, its claim undone; neither machine is written. The negative
// control: the same rotation with the address in place.
func TestTalosTargetIsTheNode(t *testing.T) {
	sb := sandboxtest.Get(t)
	ctx := context.Background()
	const name, elsewhere = "prod-worker-1", "prod-worker-2"

	move := func(to string) {
		t.Helper()

		if _, err := sb.Do(ctx, "move-address", sandbox.Request{Node: name, To: to}); err != nil {
			t.Error(err)
		}
	}

	waitIP := func(ip string) {
		sandboxtest.Eventually(t, 20*time.Second, name+" reports "+ip, func() error {
			if got := object.InternalIP(node(t, sb, name)); got != ip {
				return fmt.Errorf("InternalIP %s", got)
			}

			return nil
		})
	}

	var own, other string

	for _, m := range sb.Fleet().Machines() {
		switch m.Name {
		case name:
			own = m.IP
		case elsewhere:
			other = m.IP
		}
	}

	for _, tc := range []struct {
		name string
		when string // "plan", "apply", "claim", "" (never)
		want string
	}{
		// The plan sees the address shared with prod-worker-2 (a Node outside the selector).
		{"moved before the plan", "plan", "its InternalIP " + other + " is also reported by " + elsewhere},
		// Only the machine's own name tells: the Node alone reports the address at the claim.
		{"moved between the plan and the apply", "apply", `the machine at ` + other + ` says it is node "` + elsewhere + `"`},
		{"moved after the claim", "claim", "its InternalIP changed from"},
		{"in place", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() {
				move("")
				waitIP(own)
			})

			if tc.when == "plan" {
				move(elsewhere)
				waitIP(other)
			}

			r := newRotation(t, sb, nil, name)
			r.mayDeselect = map[string]bool{name: tc.when == "plan"}
			path := r.plan()
			writes := sb.Fleet().Stats().TalosWrites

			if tc.when == "plan" {
				np := r.planned.Nodes[0]
				if np.Action != plan.ActionDeselect || np.Reason != plan.ReasonInvalidInventory || !strings.Contains(np.Sentence, tc.want) {
					t.Fatalf("the plan: %+v", np)
				}
			}

			if tc.when == "apply" {
				move(elsewhere)
				waitIP(other)
			}

			res, err := r.apply(path, apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
				if tc.when == "claim" && phase == state.PhaseDrained {
					move(elsewhere)
					waitIP(other)
				}
			}})
			if err != nil {
				t.Fatal(err)
			}

			if tc.when == "plan" {
				after := sb.Fleet().Stats().TalosWrites
				if after[name] != writes[name] || after[elsewhere] != writes[elsewhere] || res.SafeToRevoke() ||
					!strings.Contains(res.Verdict.Sentence(), name) {
					t.Fatalf("a node the inventory cannot place: writes %v → %v, verdict %+v", writes, after, res.Verdict)
				}

				return
			}

			x := r.result(res, name)

			if tc.want == "" {
				if x.Outcome != state.OutcomeDone {
					t.Fatalf("the control: %+v", x)
				}

				return
			}

			after := sb.Fleet().Stats().TalosWrites
			if x.Outcome != state.OutcomeFailed || x.Fenced || !strings.Contains(x.Message, tc.want) || !strings.Contains(x.Message, "nothing was written to it") {
				t.Fatalf("%s: %+v", tc.name, x)
			}

			if after[name] != writes[name] || after[elsewhere] != writes[elsewhere] {
				t.Fatalf("a Talos write reached a machine: %v → %v", writes, after)
			}

			assertReleased(t, sb, name, false)
		})
	}
}

// A Node record that does not name one machine — two IPv4 InternalIPs, or none — is left alone:
// at plan time it is deselected and the verdict counts it unknown; when the record changes after
// the plan, the claim or the Talos write is refused and the claim undone, nothing written to any
// machine. The negative control: a dual-stack Node (one IPv4, one IPv6) is one machine and is
// rotated.
func TestInvalidNodeInventoryFailsClosed(t *testing.T) {
	sb := sandboxtest.Get(t)
	ctx := context.Background()
	const name = "prod-worker-2"

	var own string

	for _, m := range sb.Fleet().Machines() {
		if m.Name == name {
			own = m.IP
		}
	}

	report := func(ips []string) {
		t.Helper()

		if _, err := sb.Do(ctx, "report-ips", sandbox.Request{Node: name, IPs: ips}); err != nil {
			t.Error(err)
		}

		want := ips
		if want == nil {
			want = []string{own}
		}

		sandboxtest.Eventually(t, 20*time.Second, name+" reports "+strings.Join(want, ","), func() error {
			if got := object.FromNode(node(t, sb, name)).InternalIPs; strings.Join(got, ",") != strings.Join(want, ",") {
				return fmt.Errorf("InternalIPs %v", got)
			}

			return nil
		})
	}

	two, none, dual := []string{own, "10.250.0.9"}, []string{}, []string{own, "fd00::99"}

	for _, tc := range []struct {
		name string
		ips  []string
		when string // "plan", "apply" (before the claim), "drained" (before the Talos write)
		want string // the refusal or deselection; "" the control
	}{
		{"two IPv4 before the plan", two, "plan", "several InternalIPs of one family"},
		{"none between the plan and the claim", none, "apply", "refusing to claim " + name + ": its Node record does not name one machine (the Node reports no InternalIP"},
		{"a second IPv4 before the Talos write", two, "drained", "refusing to configure " + name + ": its Node record does not name one machine (the Node reports several"},
		{"dual stack", dual, "plan", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { report(nil) })

			if tc.when == "plan" {
				report(tc.ips)
			}

			r := newRotation(t, sb, nil, name)
			r.mayDeselect = map[string]bool{name: tc.when == "plan" && tc.want != ""}
			path := r.plan()
			writes := sb.Fleet().Stats().TalosWrites[name]

			if tc.when == "apply" {
				report(tc.ips)
			}

			res, err := r.apply(path, apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
				if tc.when == "drained" && phase == state.PhaseDrained {
					report(tc.ips)
				}
			}})
			if err != nil {
				t.Fatal(err)
			}

			after := sb.Fleet().Stats().TalosWrites[name]

			switch {
			case tc.want == "":
				if x := r.result(res, name); x.Outcome != state.OutcomeDone || !res.SafeToRevoke() {
					t.Fatalf("the control: %+v, verdict %+v", x, res.Verdict)
				}

				return
			case tc.when == "plan":
				np := r.planned.Nodes[0]
				if np.Reason != plan.ReasonInvalidInventory || !strings.Contains(np.Sentence, tc.want) {
					t.Fatalf("the plan: %+v", np)
				}
			default:
				if x := r.result(res, name); x.Outcome != state.OutcomeFailed || x.Fenced || !strings.Contains(x.Message, tc.want) {
					t.Fatalf("%s: %+v", tc.name, x)
				}

				assertReleased(t, sb, name, false)
			}

			if after != writes || res.SafeToRevoke() || !strings.Contains(res.Verdict.Sentence(), name) {
				t.Fatalf("Talos writes %d → %d, verdict %+v", writes, after, res.Verdict)
			}
		})
	}
}

// Pods that arrive on a node while it is drained — bound to it by nodeName, past the cordon —
// are evicted too before the Talos write: the drain lists the node again until it is empty. The
// pod lands right after the drain's first listing answered (with the pod that was there), so
// only a second listing can find it: a drain that lists once leaves it on the node.
func TestDrainEvictsPodsThatArriveDuringIt(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()
	const name = "prod-worker-3"

	sandboxtest.PinnedDeployment(t, kube, "drain-late", "early", name) // what the first listing finds

	owner, err := kube.CoreV1().ConfigMaps("drain-late").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "late-owner"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	var (
		mu       sync.Mutex
		draining bool
		late     string
	)

	arrive := func() {
		p, err := kube.CoreV1().Pods("drain-late").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "arrives-late-", OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID, Controller: ptr.To(true),
			}}},
			Spec: corev1.PodSpec{NodeName: name, Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Error(err)

			return
		}

		late = p.Name
	}

	r := newRotation(t, sb, nil, name)
	r.faults = &workspace.Faults{Kube: func(next http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := next.RoundTrip(req)

			listing := req.Method == http.MethodGet && req.URL.Path == "/api/v1/pods" &&
				req.URL.Query().Get("fieldSelector") == "spec.nodeName="+name

			mu.Lock()
			defer mu.Unlock()

			if err == nil && listing && draining && late == "" {
				arrive() // the first listing has answered; the pod lands before the drain goes on
			}

			return resp, err
		})
	}}

	res, err := r.apply(r.plan(), apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
		if node == name && phase == state.PhaseDrained {
			mu.Lock()
			draining = true
			mu.Unlock()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}

	if x := r.result(res, name); x.Outcome != state.OutcomeDone {
		t.Fatalf("%+v", x)
	}

	if late == "" {
		t.Fatal("no pod arrived: the drain never listed the node")
	}

	if p, err := kube.CoreV1().Pods("drain-late").Get(ctx, late, metav1.GetOptions{}); err == nil && p.DeletionTimestamp == nil {
		t.Fatalf("the pod that arrived during the drain is still on %s: %s", p.Spec.NodeName, p.Name)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
