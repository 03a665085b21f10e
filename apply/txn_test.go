package apply

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// harness is an executor over in-memory fakes, recording every judgement in the world's log.
type harness struct {
	w     *world
	lease *fakeLease
	store *fakeStore
	e     *executor
	// refuseAt makes the judgement refuse (as if a genuine change landed) at this step.
	refuseAt plan.Step
}

func newHarness(t *testing.T, parallelism int, nodes ...string) *harness {
	t.Helper()

	w := newWorld()
	for _, n := range nodes {
		w.addNode(n, strings.HasPrefix(n, "cp"))
	}

	h := &harness{w: w, lease: &fakeLease{done: make(chan struct{})}, store: &fakeStore{w: w}}
	h.e = newExecutor(fakeNodes{w}, fakeTalos{w}, h.lease, h.store, &state.State{}, execOptions{
		Holder: "h1", Registry: "ghcr.io", ReadyTimeout: 2 * time.Second, WorkerParallelism: parallelism, Poll: time.Millisecond,
		AllowQuorumLoss: true, // the fakes' fleets have one or two control planes
	})
	h.e.judge = func(s plan.Subject) plan.Verdict {
		w.record("judge %s %s", s.Planned.UID[len("uid-"):], s.Step)

		if s.Step == h.refuseAt {
			return plan.Verdict{Decision: plan.Refuse, Reason: plan.ReasonTaintsChanged, Detail: "+ example.com/maintenance:NoSchedule"}
		}

		return plan.Judge(s)
	}

	return h
}

// ops is the log with the judgements of a node folded away, to compare mutation order.
func (h *harness) ops(node string, withJudge bool) []string {
	var out []string

	for _, l := range h.w.log {
		if !strings.Contains(l, " "+node) || (!withJudge && strings.HasPrefix(l, "judge ")) {
			continue
		}

		out = append(out, l)
	}

	return out
}

// The fence transaction's phases, in order: every mutation is preceded by the state write of its
// phase, and the state's phases are exactly the transaction's.
func TestFencePhaseOrderStateBeforeMutation(t *testing.T) {
	h := newHarness(t, 1, "w1")
	res := h.e.run(context.Background(), testPlan(h.w, plan.ActionFence, "w1"))

	if len(res) != 1 || res[0].Outcome != state.OutcomeDone {
		t.Fatalf("result: %+v", res)
	}

	want := []string{
		"state w1 claimed in-progress", "patch w1 claim",
		"state w1 claimed in-progress", // scale_down_guard_ours, known from the claim's own read
		"state w1 guarded in-progress", "patch w1 phase=guarded",
		"state w1 drained in-progress", "drain w1", "patch w1 phase=drained",
		"state w1 configured in-progress", "talos configure w1 live=false", "patch w1 phase=configured",
		"state w1 rebooting in-progress", "patch w1 phase=rebooting", "talos reboot w1",
		"state w1 ready in-progress", "patch w1 phase=ready",
		"state w1 proved in-progress", "probe w1", "patch w1 mark",
		"state w1 released in-progress", "patch w1 release",
		"state w1 released done",
	}

	if got := h.ops("w1", false); !slices.Equal(got, want) {
		t.Fatalf("operations:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(want, "\n     "))
	}

	var phases []state.Phase
	for _, st := range h.store.writes {
		if r := st.Record("w1"); r != nil && (len(phases) == 0 || phases[len(phases)-1] != r.Phase) {
			phases = append(phases, r.Phase)
		}
	}

	if !slices.Equal(phases, state.Phases[1:]) {
		t.Fatalf("state phases %v, want %v", phases, state.Phases[1:])
	}

	n, _ := fakeNodes{h.w}.Get(context.Background(), "w1")
	if n.Spec.Unschedulable || n.Annotations[cluster.OwnerAnnotation] != "" || n.Annotations[cluster.VerifiedRevisionAnnotation] != "rev-new" {
		t.Fatalf("node after the rotation: %+v", n.ObjectMeta.Annotations)
	}
}

// Every mutation is preceded by a judgement of the node as read for it (a CAS patch re-judges
// on its own read, after the state write).
func TestJudgedBeforeEveryMutation(t *testing.T) {
	h := newHarness(t, 1, "w1")
	h.e.run(context.Background(), testPlan(h.w, plan.ActionFence, "w1"))

	judged := false

	for _, l := range h.ops("w1", true) {
		switch {
		case strings.HasPrefix(l, "judge "):
			judged = true
		case strings.HasPrefix(l, "state "):
		case strings.Contains(l, " phase="):
			// A phase mirror is judged on its own read; that judgement is also the last one
			// before the mutation it announces.
			if !judged {
				t.Errorf("%q was not preceded by a judgement", l)
			}
		default:
			if !judged {
				t.Errorf("%q was not preceded by a judgement", l)
			}

			judged = false
		}
	}
}

// A refusal at each step stops the transaction there: no later mutation happens and the record
// ends failed with the refusal's reason. Before the Talos write the claim is undone (the node
// restored, the record released); after it, the fence stays at the phase reached.
func TestRefusalStopsAtEachStep(t *testing.T) {
	for _, tc := range []struct {
		step      plan.Step
		lastPhase state.Phase
		notAfter  string // no operation of this kind may happen
		fenced    bool   // the fence stays
	}{
		{plan.StepClaim, state.PhaseSelected, "patch w1 claim", false},
		{plan.StepGuard, state.PhaseReleased, "drain w1", false},
		{plan.StepDrain, state.PhaseReleased, "drain w1", false},
		{plan.StepConfigure, state.PhaseReleased, "talos configure", false},
		{plan.StepReboot, state.PhaseConfigured, "talos reboot", true},
		{plan.StepProve, state.PhaseReady, "probe w1", true},
		{plan.StepRelease, state.PhaseProved, "patch w1 release", true},
	} {
		t.Run(string(tc.step), func(t *testing.T) {
			h := newHarness(t, 1, "w1")
			h.refuseAt = tc.step

			res := h.e.run(context.Background(), testPlan(h.w, plan.ActionFence, "w1"))[0]
			if res.Outcome != state.OutcomeFailed || res.Reason != plan.ReasonTaintsChanged ||
				!strings.Contains(res.Message, "refusing to "+string(tc.step)+" w1: its taints changed") {
				t.Fatalf("result: %+v", res)
			}

			if rec := h.e.st.Record("w1"); rec.Phase != tc.lastPhase || rec.Outcome != state.OutcomeFailed {
				t.Fatalf("record: phase %s outcome %s, want %s failed", rec.Phase, rec.Outcome, tc.lastPhase)
			}

			for _, l := range h.ops("w1", false) {
				if strings.HasPrefix(l, tc.notAfter) {
					t.Fatalf("%q happened after a refusal at %s:\n%s", l, tc.step, strings.Join(h.ops("w1", false), "\n"))
				}
			}

			n, _ := fakeNodes{h.w}.Get(context.Background(), "w1")
			if fenced := n.Spec.Unschedulable && n.Annotations[cluster.OwnerAnnotation] == "h1"; fenced != tc.fenced {
				t.Fatalf("fenced %t, want %t: %+v", fenced, tc.fenced, n.Annotations)
			}

			if h.e.st.Record("w1").Holds() != tc.fenced {
				t.Fatalf("the record holds a fence: %t, want %t", !tc.fenced, tc.fenced)
			}
		})
	}
}

// A kubelet heartbeat between the claim's read and its patch is a conflict: re-read, re-judged
// and retried. Negative control: a foreign owner that lands in that window is refused.
func TestClaimConflictRetriedForeignOwnerRefused(t *testing.T) {
	h := newHarness(t, 1, "w1")
	h.w.conflicts["w1"] = 2

	if res := h.e.run(context.Background(), testPlan(h.w, plan.ActionFence, "w1"))[0]; res.Outcome != state.OutcomeDone {
		t.Fatalf("claim racing heartbeats: %+v", res)
	}

	h = newHarness(t, 1, "w1")
	claimed := false
	h.w.onPatch = func(w *world, node string) {
		if !claimed {
			claimed = true
			w.edit(node, func(n *corev1.Node) { n.Annotations = map[string]string{cluster.OwnerAnnotation: "other-run"} })
		}
	}

	res := h.e.run(context.Background(), testPlan(h.w, plan.ActionFence, "w1"))[0]
	if res.Outcome != state.OutcomeFailed || res.Reason != plan.ReasonFencedByOther {
		t.Fatalf("foreign owner in the claim window: %+v", res)
	}

	if rec := h.e.st.Record("w1"); rec.Phase != state.PhaseSelected {
		t.Fatalf("the refused claim is recorded at %s", rec.Phase)
	}

	if slices.Contains(h.ops("w1", false), "patch w1 claim") {
		t.Fatal("the claim landed over a foreign owner")
	}
}

// The autoscaler deleting a claimed node before its Talos write deselects it and undoes the
// claim; after the Talos write the same event is a failure that keeps the fence.
func TestDeletionDeselectsBeforeTalosFailsAfter(t *testing.T) {
	tbd := func(n *corev1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "ToBeDeletedByClusterAutoscaler", Value: "1764417100", Effect: corev1.TaintEffectNoSchedule})
	}

	h := newHarness(t, 1, "w1")
	h.e.o.Hooks.BeforeMutation = func(node string, phase state.Phase) {
		if phase == state.PhaseGuarded {
			h.w.edit(node, tbd)
		}
	}

	res := h.e.run(context.Background(), testPlan(h.w, plan.ActionFence, "w1"))[0]
	if res.Outcome != state.OutcomeDeselected || res.Reason != plan.ReasonAutoscalerDeleting || !strings.Contains(res.Message, "its fence was released") {
		t.Fatalf("before the Talos write: %+v", res)
	}

	if n, _ := (fakeNodes{h.w}).Get(context.Background(), "w1"); n.Spec.Unschedulable || n.Annotations[cluster.OwnerAnnotation] != "" {
		t.Fatal("the deselected node kept the fence")
	}

	h = newHarness(t, 1, "w1")
	h.e.o.Hooks.BeforeMutation = func(node string, phase state.Phase) {
		if phase == state.PhaseRebooting {
			h.w.edit(node, tbd)
		}
	}

	res = h.e.run(context.Background(), testPlan(h.w, plan.ActionFence, "w1"))[0]
	if res.Outcome != state.OutcomeFailed || !strings.Contains(res.Message, "its Talos config was already written") {
		t.Fatalf("after the Talos write: %+v", res)
	}

	if n, _ := (fakeNodes{h.w}).Get(context.Background(), "w1"); !n.Spec.Unschedulable || n.Annotations[cluster.OwnerAnnotation] != "h1" {
		t.Fatal("a node Talos was touched on lost its fence")
	}
}

// A node deleted after its Talos write is gone-after-mutation; deleted before, deselected.
func TestNodeDeleted(t *testing.T) {
	for _, tc := range []struct {
		at   state.Phase
		want state.Outcome
	}{{state.PhaseDrained, state.OutcomeDeselected}, {state.PhaseRebooting, state.OutcomeGoneAfterMutation}} {
		t.Run(string(tc.at), func(t *testing.T) {
			h := newHarness(t, 1, "w1")
			h.e.o.Hooks.BeforeMutation = func(node string, phase state.Phase) {
				if phase == tc.at {
					h.w.mu.Lock()
					delete(h.w.nodes, node)
					h.w.mu.Unlock()
				}
			}

			res := h.e.run(context.Background(), testPlan(h.w, plan.ActionFence, "w1"))[0]
			if res.Outcome != tc.want || res.Reason != plan.ReasonNotFound {
				t.Fatalf("%+v", res)
			}
		})
	}
}

// A failed drain restores the node: its fence is released and Talos was never called.
func TestFailedDrainRestores(t *testing.T) {
	h := newHarness(t, 1, "w1")
	h.w.drainErr["w1"] = errors.New("drain of w1 did not finish within 4s; still running: pdb-block/pinned")

	res := h.e.run(context.Background(), testPlan(h.w, plan.ActionFence, "w1"))[0]
	if res.Outcome != state.OutcomeFailed || !strings.Contains(res.Message, "the node was restored (fence released)") {
		t.Fatalf("%+v", res)
	}

	ops := h.ops("w1", false)
	if !slices.Contains(ops, "patch w1 release") || slices.ContainsFunc(ops, func(l string) bool { return strings.HasPrefix(l, "talos") }) {
		t.Fatalf("operations: %v", ops)
	}
}

// A live node is configured and proved with no claim, no drain and no reboot.
func TestLivePath(t *testing.T) {
	h := newHarness(t, 1, "w1")

	res := h.e.run(context.Background(), testPlan(h.w, plan.ActionApplyLive, "w1"))[0]
	if res.Outcome != state.OutcomeDone {
		t.Fatalf("%+v", res)
	}

	want := []string{
		"state w1 configured in-progress", "talos configure w1 live=true",
		"state w1 proved in-progress", "probe w1", "patch w1 mark",
		"state w1 released done",
	}

	if got := h.ops("w1", false); !slices.Equal(got, want) {
		t.Fatalf("operations:\n got %v\nwant %v", got, want)
	}
}

// A lost Lease stops the run: the node that met it fails, and no node starts after it.
func TestLeaseLostStopsNewNodes(t *testing.T) {
	h := newHarness(t, 1, "w1", "w2")
	h.e.o.Hooks.BeforeMutation = func(node string, phase state.Phase) {
		if node == "w1" && phase == state.PhaseDrained {
			h.lease.lose(errors.New("lease held-by-another"))
		}
	}

	res := h.e.run(context.Background(), testPlan(h.w, plan.ActionFence, "w1", "w2"))

	if res[0].Outcome != state.OutcomeFailed || !strings.Contains(res[0].Message, "lease lost") {
		t.Fatalf("w1: %+v", res[0])
	}

	if res[1].Outcome != state.OutcomeFailed || res[1].Message != "not started: the Lease was lost" {
		t.Fatalf("w2: %+v", res[1])
	}

	if len(h.ops("w2", false)) != 0 {
		t.Fatalf("w2 was touched: %v", h.ops("w2", false))
	}
}

// A failed control plane stops the control planes after it; workers run first.
func TestControlPlaneFailureStopsTheRest(t *testing.T) {
	h := newHarness(t, 2, "w1", "cp1", "cp2")
	h.w.probeErr["cp1"] = fmt.Errorf("the container runtime of cp1 cannot pull")

	res := h.e.run(context.Background(), testPlan(h.w, plan.ActionFence, "w1", "cp1", "cp2"))

	got := map[string]state.Outcome{}
	for _, r := range res {
		got[r.Node] = r.Outcome
	}

	if got["w1"] != state.OutcomeDone || got["cp1"] != state.OutcomeFailed || got["cp2"] != state.OutcomeSkipped {
		t.Fatalf("%+v", res)
	}

	if len(h.ops("cp2", false)) != 0 {
		t.Fatalf("cp2 was touched after cp1 failed: %v", h.ops("cp2", false))
	}

	if i, j := slices.Index(h.w.log, "state w1 released done"), slices.Index(h.w.log, "state cp1 claimed in-progress"); i < 0 || j < i {
		t.Fatal("a control plane started before the workers were done")
	}
}

// A state write that fails stops the node before the mutation it announces.
func TestStateWriteFailureStopsBeforeMutation(t *testing.T) {
	h := newHarness(t, 1, "w1")
	h.store.err = errors.New("disk full")

	res := h.e.run(context.Background(), testPlan(h.w, plan.ActionFence, "w1"))[0]
	if res.Outcome != state.OutcomeFailed || !strings.Contains(res.Message, "disk full") {
		t.Fatalf("%+v", res)
	}

	for _, l := range h.ops("w1", false) {
		if strings.HasPrefix(l, "patch") || strings.HasPrefix(l, "talos") || strings.HasPrefix(l, "drain") {
			t.Fatalf("%q happened without its state write", l)
		}
	}
}

// The failure budget: with max_failures = 1, after the first failed node no new node starts; the
// others are skipped and untouched. With a budget of 2, a second node is started.
func TestFailureBudget(t *testing.T) {
	for _, tc := range []struct {
		budget, failed, skipped int
	}{{1, 1, 2}, {2, 2, 1}} {
		t.Run(fmt.Sprint("max_failures=", tc.budget), func(t *testing.T) {
			h := newHarness(t, 1, "w1", "w2", "w3")
			h.e.o.MaxFailures = tc.budget

			for _, n := range []string{"w1", "w2", "w3"} {
				h.w.probeErr[n] = errors.New("the probe image cannot be pulled")
			}

			counts := map[state.Outcome]int{}
			for _, r := range h.e.run(context.Background(), testPlan(h.w, plan.ActionFence, "w1", "w2", "w3")) {
				counts[r.Outcome]++

				if r.Outcome == state.OutcomeSkipped && (!strings.Contains(r.Message, "failure budget") || len(h.ops(r.Node, false)) != 0) {
					t.Fatalf("skipped node: %+v %v", r, h.ops(r.Node, false))
				}
			}

			if counts[state.OutcomeFailed] != tc.failed || counts[state.OutcomeSkipped] != tc.skipped {
				t.Fatalf("outcomes %v", counts)
			}
		})
	}
}

// A cancelled run: a node before its Talos write has its claim undone and is recorded cancelled;
// a node past it stays fenced, recorded at its phase; no node starts after the cancellation.
func TestCancellation(t *testing.T) {
	for _, tc := range []struct {
		at     state.Phase
		phase  state.Phase
		fenced bool
	}{{state.PhaseDrained, state.PhaseReleased, false}, {state.PhaseRebooting, state.PhaseRebooting, true}} {
		t.Run(string(tc.at), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()

			h := newHarness(t, 1, "w1", "w2")
			h.e.o.Hooks.BeforeMutation = func(node string, phase state.Phase) {
				if node == "w1" && phase == tc.at {
					cancel()
				}
			}

			res := h.e.run(ctx, testPlan(h.w, plan.ActionFence, "w1", "w2"))

			if res[0].Outcome != state.OutcomeCancelled || res[1].Outcome != state.OutcomeSkipped || len(h.ops("w2", false)) != 0 {
				t.Fatalf("%+v", res)
			}

			rec := h.e.st.Record("w1")
			n, _ := fakeNodes{h.w}.Get(context.Background(), "w1")

			if rec.Phase != tc.phase || rec.Holds() != tc.fenced || (n.Annotations[cluster.OwnerAnnotation] == "h1") != tc.fenced || n.Spec.Unschedulable != tc.fenced {
				t.Fatalf("record %s holds %t; node %+v cordoned %t", rec.Phase, rec.Holds(), n.Annotations, n.Spec.Unschedulable)
			}
		})
	}
}
