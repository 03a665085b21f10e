package apply

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	goldenfile "github.com/ghcrsync/ghcrsync/internal/golden"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/progress"
	"github.com/ghcrsync/ghcrsync/internal/taints"
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
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) // the waits take no time
	h.e = newExecutor(ports{nodes: fakeNodes{w}, workloads: fakeNodes{w}, talos: fakeTalos{w}, etcd: fakeTalos{w}, keyrings: fakeKeyrings{w, clk}, lease: h.lease, store: h.store,
		others: fakeOthers{w}}, &state.State{}, execOptions{
		Holder: "h1", Registry: "ghcr.io", ReadyTimeout: 10 * time.Minute, WorkerParallelism: parallelism, Poll: 500 * time.Millisecond,
		Clock:           clk,
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

// txnScript is one block of testdata/txn/*.txt: a fleet of in-memory fakes, a plan, the faults
// and the events that land during the run, and — after "=>" — everything the transaction did,
// in order, and what it left (rewritten by -update):
//
//	case NAME
//	fleet w1 cp1                 nodes (cp… are control planes)
//	plan fence w1 cp1            the action (fence | apply-live) and the nodes, in order
//	parallelism 2                workers at a time (default 1)
//	max-failures 2               the failure budget (default 1)
//	refuse STEP                  the judgement refuses at STEP, as if a genuine change landed
//	conflicts w1 2               w1's next 2 patches lose to a heartbeat
//	foreign-owner w1 H           another run's claim lands on w1 before ghcrsync's first patch
//	drain-fails w1 MESSAGE       (also probe-fails NODE MESSAGE, state-fails MESSAGE)
//	held-by w1 REASON            another maintenance tool holds w1 (kured, an upgrade, …)
//	kured                        kured is installed: its lock is taken for each reboot
//	kured-taken w1               kured takes its lock between ghcrsync's check and its write
//	at w1 PHASE EVENT            before w1's PHASE mutation: delete | lose-lease | cancel |
//	                             taint KEY=VALUE:EFFECT | delete-after-reads N |
//	                             untaint-after-reads N KEY (at w1's N-th read from then on)
//	=>
//	judge w1 claim               the log: judgements, state writes, mutations
//	…
//	result w1: OUTCOME [REASON]: MESSAGE
//	phases w1: PHASE …          the phases the state recorded, in order
//	record w1: PHASE OUTCOME holds|free
//	node w1: cordoned|schedulable owner=H
type txnScript struct {
	goldenfile.Case

	fleet, nodes []string
	action       plan.Action
	parallelism  int
	maxFailures  int
	refuseAt     plan.Step
	faults       []string // conflicts, foreign-owner, drain-fails, probe-fails, state-fails lines
	events       []string // "at" lines
}

// Every transaction script: the phase order with the state write before each mutation, the
// refusal at each step, the faults and the events that land mid-run. Every script's log is also
// checked for a judgement before each mutation, and together they refuse at every step.
func TestTxnScripts(t *testing.T) {
	files, _ := filepath.Glob("testdata/txn/*.txt")
	if len(files) == 0 {
		t.Fatal("no testdata/txn/*.txt")
	}

	refused := map[plan.Step]bool{}
	fullOrder := false

	for _, file := range files {
		header, scripts := readTxnScripts(t, file)
		blocks, rendered := make([]goldenfile.Case, 0, len(scripts)), make([][]string, 0, len(scripts))

		for _, s := range scripts {
			h, res, got := s.run(t)

			if !goldenfile.Updating() && !slices.Equal(got, s.Want) {
				t.Errorf("%s: case %s:\n got:\n  %s\nwant:\n  %s", s.At(), s.Name, strings.Join(got, "\n  "), strings.Join(s.Want, "\n  "))
			}

			for _, r := range res {
				checkJudgedBeforeEveryMutation(t, s, h.ops(r.Node, true), r.Outcome != state.OutcomeDone)
			}

			refused[s.refuseAt] = refused[s.refuseAt] || s.refuseAt != ""
			fullOrder = fullOrder || slices.Contains(got, "phases w1: "+phaseWords(state.Phases[1:]))
			blocks, rendered = append(blocks, s.Case), append(rendered, got)
		}

		if goldenfile.Updating() {
			goldenfile.WriteCases(t, file, header, blocks, rendered)
		}
	}

	for _, step := range []plan.Step{plan.StepClaim, plan.StepGuard, plan.StepDrain, plan.StepConfigure, plan.StepReboot, plan.StepProve, plan.StepRelease} {
		if !refused[step] {
			t.Errorf("no txn script refuses at %s", step)
		}
	}

	if !fullOrder {
		t.Errorf("no txn script records every phase of a fence in order (%s)", phaseWords(state.Phases[1:]))
	}
}

// checkJudgedBeforeEveryMutation: every mutation in a node's log follows a judgement (a phase
// mirror is judged on its own read, and that judgement also stands for the mutation it
// announces). The undo of a node that did not finish (undone) is judged by fence.Undo itself
// (plan.Judge at StepUndo, the judgement release shares: plan/testdata/judge/undo.txt), which the
// harness does not see.
func checkJudgedBeforeEveryMutation(t *testing.T, s txnScript, log []string, undone bool) {
	t.Helper()

	judged := false

	for _, l := range log {
		switch {
		case strings.HasPrefix(l, "judge "):
			judged = true
		case strings.HasPrefix(l, "state "), strings.HasPrefix(l, "others "):
			// a state write announces; the other tools' holds are a read
		case strings.HasPrefix(l, "kured "):
			// kured's lock is kured's object, judged by its own rule (the write tests the value read)
		case undone && strings.HasPrefix(l, "patch ") && strings.HasSuffix(l, " release"):
		case !judged:
			t.Errorf("%s: case %s: %q was not preceded by a judgement", s.At(), s.Name, l)
		case !strings.Contains(l, " phase="):
			judged = false
		}
	}
}

// run runs the script's plan on a harness and renders what happened.
func (s txnScript) run(t *testing.T) (*harness, []NodeResult, []string) {
	t.Helper()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	h := newHarness(t, s.parallelism, s.fleet...)
	h.refuseAt = s.refuseAt

	if s.maxFailures > 0 {
		h.e.o.MaxFailures = s.maxFailures
	}

	for _, f := range s.faults {
		s.fault(t, h, f)
	}

	h.e.o.Hooks.BeforeMutation = func(node string, phase state.Phase) {
		for _, ev := range s.events {
			if f := strings.Fields(ev); f[1] == node && f[2] == string(phase) {
				s.event(h, node, f[3:], cancel)
			}
		}
	}

	res := h.e.run(ctx, testPlan(h.w, s.action, s.nodes...))

	got := slices.Clone(h.w.log)
	for _, r := range res {
		got = append(got, renderResult(r))
	}

	for _, n := range s.nodes {
		got = append(got, renderPhases(h, n), renderRecord(h, n), renderNode(h, n))
	}

	return h, res, got
}

// fault arms one fault line before the run.
func (s txnScript) fault(t *testing.T, h *harness, line string) {
	t.Helper()

	f := strings.Fields(line)
	rest := func(i int) string { return strings.Join(f[i:], " ") }

	switch f[0] {
	case "conflicts":
		n, err := strconv.Atoi(f[2])
		if err != nil {
			t.Fatalf("%s: case %s: %q: %v", s.At(), s.Name, line, err)
		}

		h.w.conflicts[f[1]] = n
	case "foreign-owner":
		landed := false
		h.w.onPatch = func(w *world, node string) {
			if node == f[1] && !landed {
				landed = true
				w.edit(node, func(n *corev1.Node) { n.Annotations = map[string]string{object.OwnerAnnotation: f[2]} })
			}
		}
	case "drain-fails":
		h.w.drainErr[f[1]] = errors.New(rest(2))
	case "probe-fails":
		h.w.probeErr[f[1]] = errors.New(rest(2))
	case "runtime-stays":
		h.w.runtimeStays[f[1]] = true
	case "restarted-before": // NODE: its runtime restarted between the run's last look and the write
		h.w.restartedBefore[f[1]] = true
	case "keyring-held": // NODE DIGEST: an earlier rotation wrote the node's keyring
		h.w.keyrings[f[1]], h.w.keyringHeld[f[1]] = f[2], f[2]
	case "keyring-unread":
		h.w.keyringUnread[f[1]] = true
	case "state-fails":
		h.store.err = errors.New(rest(1))
	case "held-by": // NODE REASON: another maintenance tool holds the node
		h.w.heldBy[f[1]] = rest(2)
	case "kured": // kured is installed: its lock is taken for each reboot and given back
		h.w.kured = true
	case "kured-taken": // NODE: kured takes its lock between ghcrsync's check and its write
		h.w.kured, h.w.kuredTaken[f[1]] = true, true
	}
}

// event is what lands before a node's mutation.
func (s txnScript) event(h *harness, node string, what []string, cancel context.CancelFunc) {
	switch what[0] {
	case "delete":
		h.w.mu.Lock()
		delete(h.w.nodes, node)
		h.w.mu.Unlock()
	case "lose-lease":
		h.lease.lose(errors.New("lease held-by-another"))
	case "cancel":
		cancel()
	case "taint": // KEY=VALUE:EFFECT (checked by parse)
		kv, effect, _ := strings.Cut(what[1], ":")
		key, value, _ := strings.Cut(kv, "=")
		h.w.edit(node, func(n *corev1.Node) {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: key, Value: value, Effect: corev1.TaintEffect(effect)})
		})
	case "delete-after-reads", "untaint-after-reads": // N [KEY] (checked by parse)
		reads, _ := strconv.Atoi(what[1])
		do := func(w *world, node string) { delete(w.nodes, node) }

		if what[0] == "untaint-after-reads" {
			do = func(w *world, node string) {
				w.editLocked(node, func(n *corev1.Node) {
					n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.Key == what[2] })
				})
			}
		}

		h.w.mu.Lock()
		h.w.due[node] = &dueEvent{reads: reads, do: do}
		h.w.mu.Unlock()
	}
}

func renderResult(r NodeResult) string {
	reason := ""
	if r.Reason != "" {
		reason = " " + string(r.Reason)
	}

	return fmt.Sprintf("result %s: %s%s: %s", r.Node, r.Outcome, reason, r.Message)
}

// renderPhases are the phases the state recorded for node, in order (repeats folded).
func renderPhases(h *harness, node string) string {
	var phases []state.Phase

	for _, st := range h.store.writes {
		if r := st.Record(node); r != nil && (len(phases) == 0 || phases[len(phases)-1] != r.Phase) {
			phases = append(phases, r.Phase)
		}
	}

	if len(phases) == 0 {
		return "phases " + node + ": none"
	}

	return "phases " + node + ": " + phaseWords(phases)
}

func phaseWords(phases []state.Phase) string {
	words := make([]string, len(phases))
	for i, p := range phases {
		words[i] = string(p)
	}

	return strings.Join(words, " ")
}

func renderRecord(h *harness, node string) string {
	r := h.e.st.Record(node)
	if r == nil {
		return "record " + node + ": none"
	}

	holds := "free"
	if r.Holds() {
		holds = "holds"
	}

	return fmt.Sprintf("record %s: %s %s %s", node, r.Phase, orInProgress(r.Outcome), holds)
}

func renderNode(h *harness, node string) string {
	n, err := fakeNodes{h.w}.Get(context.Background(), node)
	if err != nil {
		return "node " + node + ": deleted"
	}

	cordon := "schedulable"
	if n.Spec.Unschedulable {
		cordon = "cordoned"
	}

	owner := n.Annotations[object.OwnerAnnotation]
	if owner == "" {
		owner = "none"
	}

	verified := n.Annotations[object.VerifiedRevisionAnnotation]
	if verified == "" {
		verified = "none"
	}

	return fmt.Sprintf("node %s: %s owner=%s verified=%s", node, cordon, owner, verified)
}

// readTxnScripts reads a file's scripts (golden.ReadCases) and parses each.
func readTxnScripts(t *testing.T, file string) ([]string, []txnScript) {
	t.Helper()

	header, blocks := goldenfile.ReadCases(t, file)
	scripts := make([]txnScript, 0, len(blocks))

	for _, b := range blocks {
		s := txnScript{Case: b, parallelism: 1}

		for _, text := range b.Input {
			if strings.HasPrefix(text, "#") {
				continue
			}

			if err := s.parse(text); err != nil {
				t.Fatalf("%s: case %s: %v", b.At(), b.Name, err)
			}
		}

		scripts = append(scripts, s)
	}

	return header, scripts
}

// parse reads one input line into the script.
func (s *txnScript) parse(text string) error {
	f := strings.Fields(text)
	need := func(n int) error {
		if len(f) < n {
			return fmt.Errorf("%q: %s needs %d field(s)", text, f[0], n-1)
		}

		return nil
	}

	var err error

	switch f[0] {
	case "fleet":
		s.fleet = f[1:]
	case "plan":
		if err = need(3); err == nil {
			s.action, s.nodes = plan.Action(f[1]), f[2:]
		}
	case "parallelism":
		if err = need(2); err == nil {
			s.parallelism, err = strconv.Atoi(f[1])
		}
	case "max-failures":
		if err = need(2); err == nil {
			s.maxFailures, err = strconv.Atoi(f[1])
		}
	case "refuse":
		if err = need(2); err == nil {
			s.refuseAt = plan.Step(f[1])
		}
	case "conflicts", "foreign-owner", "drain-fails", "probe-fails", "keyring-held", "held-by":
		if err = need(3); err == nil {
			s.faults = append(s.faults, text)
		}
	case "kured":
		s.faults = append(s.faults, text)
	case "state-fails", "runtime-stays", "restarted-before", "keyring-unread", "kured-taken":
		if err = need(2); err == nil {
			s.faults = append(s.faults, text)
		}
	case "at":
		if err = need(4); err == nil {
			err = checkEvent(text, f[3:])
			s.events = append(s.events, text)
		}
	default:
		err = fmt.Errorf("%q: unknown line (fleet, plan, parallelism, max-failures, refuse, conflicts, foreign-owner, drain-fails, probe-fails, state-fails, runtime-stays, restarted-before, keyring-held, keyring-unread, at)", text)
	}

	return err
}

// checkEvent refuses an "at" line whose event the scripts do not know.
func checkEvent(text string, what []string) error {
	switch what[0] {
	case "delete", "lose-lease", "cancel":
		return nil
	case "taint":
		if len(what) == 2 && strings.Contains(what[1], ":") {
			return nil
		}

		return fmt.Errorf("%q: taint needs KEY=VALUE:EFFECT", text)
	case "delete-after-reads", "untaint-after-reads":
		if len(what) == map[string]int{"delete-after-reads": 2, "untaint-after-reads": 3}[what[0]] {
			if n, err := strconv.Atoi(what[1]); err == nil && n > 0 {
				return nil
			}
		}

		return fmt.Errorf("%q: needs delete-after-reads N or untaint-after-reads N KEY, N > 0", text)
	}

	return fmt.Errorf("%q: unknown event %q (delete, lose-lease, cancel, taint KEY=VALUE:EFFECT, delete-after-reads N, untaint-after-reads N KEY)", text, what[0])
}

// Inputs missing a part are refused before anything is read or written.
func TestRunRefusesIncompleteInputs(t *testing.T) {
	if _, err := Run(context.Background(), Inputs{}, &plan.Plan{}, Options{}); err == nil || !strings.Contains(err.Error(), "incomplete inputs, no configuration, ") ||
		!strings.Contains(err.Error(), "Leasing port") {
		t.Fatalf("error %v: want every missing input named", err)
	}
}

// Negative control of the wait for a node being deleted after its Talos write: a deletion that
// neither finishes nor is given up within ready_timeout is refused, and the fence stays.
func TestDeletionThatNeverEndsKeepsTheFence(t *testing.T) {
	h := newHarness(t, 1, "w1")
	h.e.o.ReadyTimeout = 100 * time.Millisecond

	var waits []progress.Event

	h.e.o.Progress = func(e progress.Event) { waits = append(waits, e) }
	h.e.o.Hooks.BeforeMutation = func(node string, phase state.Phase) {
		if phase == state.PhaseRebooting {
			h.w.edit(node, func(n *corev1.Node) {
				n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: taints.ToBeDeleted, Value: "1764417100", Effect: corev1.TaintEffectNoSchedule})
			})
		}
	}

	res := h.e.run(context.Background(), testPlan(h.w, plan.ActionFence, "w1"))

	r := res[0]
	if r.Outcome != state.OutcomeFailed || r.Reason != plan.ReasonAutoscalerDeleting || !r.Fenced ||
		!strings.Contains(r.Message, "still there after ready_timeout 100ms") || !strings.Contains(r.Message, "so the fence stays") {
		t.Fatalf("a deletion that never ends: %s %s fenced=%t: %s", r.Outcome, r.Reason, r.Fenced, r.Message)
	}

	if n := renderNode(h, "w1"); !strings.Contains(n, "cordoned owner=h1") {
		t.Fatalf("the fence did not stay: %s", n)
	}

	if len(waits) == 0 {
		t.Fatal("the wait reported no progress")
	}

	if w, ok := waits[0].(progress.WaitingGone); !ok || w.Node != "w1" || !strings.Contains(w.Why, "the cluster autoscaler is deleting it") {
		t.Fatalf("the wait's progress: %#v", waits[0])
	}
}
