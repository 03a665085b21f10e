package apply_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/fence"
	"github.com/ghcrsync/ghcrsync/internal/holder"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/secretwrite"
	"github.com/ghcrsync/ghcrsync/internal/taints"
	"github.com/ghcrsync/ghcrsync/internal/workspace"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

var runSeq = 3000

// shortLease gives the rotation its own 4 s Lease, so a killed run's Lease expires quickly.
func shortLease(name string, more ...func(string) string) func(string) string {
	return func(s string) string {
		s = strings.Replace(s, `"ghcr-auth-refresh"`, `"`+name+`"`, 1)
		s = strings.Replace(s, `duration  = "15s"`, `duration  = "4s"`, 1)
		s = strings.Replace(s, `heartbeat = "5s"`, `heartbeat = "1s"`, 1)

		for _, m := range more {
			s = m(s)
		}

		return s
	}
}

// killRun applies the rotation's plan as GitHub Actions run ID attempt 1 and SIGKILLs it just
// before phase's mutation.
func killRun(t *testing.T, r *rotation, path string, phase state.Phase) string {
	t.Helper()

	runSeq++
	id := fmt.Sprint(runSeq)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GHCRSYNC_KILL_AT="+string(phase), "GHCRSYNC_KILL_CONFIG="+r.cfg, "GHCRSYNC_KILL_PLAN="+path,
		"GITHUB_RUN_ID="+id, "GITHUB_RUN_ATTEMPT=1")

	out, err := cmd.CombinedOutput()

	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the run was not killed before %s: %v\n%s", phase, err, out)
	}

	return id
}

func fences(t *testing.T, cfg string, holder string) fence.Report {
	t.Helper()

	rep, err := fencesCfg(context.Background(), cfg, holder)
	if err != nil {
		t.Fatal(err)
	}

	return rep
}

func release(t *testing.T, cfg string) *fence.RecoveryResult {
	t.Helper()

	res, err := recoverCfg(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}

	return res
}

func waitLeaseExpired(t *testing.T, sb *sandbox.Sandbox, name string) {
	t.Helper()

	sandboxtest.Eventually(t, 20*time.Second, "the killed run's Lease expires", func() error {
		l, err := sb.Kube().CoordinationV1().Leases("flux-system").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}

		if l.Spec.RenewTime != nil && time.Since(l.Spec.RenewTime.Time) < time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0))*time.Second+3*time.Second { // fence judges by the server's whole seconds, with 2 s of grace
			return errors.New("still live")
		}

		return nil
	})
}

func assertLeaseFree(t *testing.T, sb *sandbox.Sandbox, name string) {
	t.Helper()

	l, err := sb.Kube().CoordinationV1().Leases("flux-system").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil || ptr.Deref(l.Spec.HolderIdentity, "") != "" {
		t.Fatalf("lease %s still held: %v %+v", name, err, l)
	}
}

// apply killed with kill -9 before each phase's mutation (and before its steering taints go
// on): fences reports exactly what is held, at the state's phase, as releasable at once (the
// process on this host has exited, whatever its Lease and the CI API say), and release leaves no
// cordon, no ghcrsync annotation, no steering taint and no held Lease — and an operator's own
// taint of the same effect where it was. A second release is a no-op. Killed between its Talos
// write and its proof (configured, rebooting, proved: the phase is recorded before the proof
// runs), the node stays cordoned on an unproven hold; killed after it (released), it does not.
func TestReleaseAfterKillAtEachPhase(t *testing.T) {
	sb := sandboxtest.Get(t)
	const name = "prod-worker-1"

	operator := corev1.Taint{Key: "example.com/maintenance-window", Value: "tonight", Effect: corev1.TaintEffectPreferNoSchedule}
	setTaints(t, sb, name, append(node(t, sb, name).Spec.Taints, operator))
	t.Cleanup(func() { setTaints(t, sb, name, withoutTaint(node(t, sb, name).Spec.Taints, operator.Key)) })

	for _, phase := range []state.Phase{"suspending", "steering", state.PhaseClaimed, state.PhaseGuarded, state.PhaseDrained, state.PhaseConfigured,
		state.PhaseRebooting, state.PhaseProved, state.PhaseReleased, "resuming"} {
		t.Run(string(phase), func(t *testing.T) {
			leaseName := "recover-" + string(phase)
			r := newRotation(t, sb, shortLease(leaseName), name)
			id := killRun(t, r, r.plan(), phase)

			// The Flux Kustomization's suspension (the flux block), recorded before its write, is
			// held from "suspending" (only the record) to "resuming" (the node long released).
			want := []string{fence.KindNode, fence.KindSteering, fence.KindFlux, fence.KindLease}

			switch phase {
			case "suspending", "resuming":
				want = want[2:]
			case "steering": // killed before the node's taint and claim: the state's steering record remains
				want = want[1:]
			}

			rep := fences(t, r.cfg, "")
			if got := kinds(rep); !slices.Equal(got, want) || want[0] == fence.KindNode && rep.Fences[0].Name != name {
				t.Fatalf("fences %v, want %v: %+v", got, want, rep.Fences)
			}

			if f := rep.Fences[len(want)-2]; f.Kind != fence.KindFlux || (phase == "suspending") != (f.Evidence == "state record only") {
				t.Fatalf("the Flux fence killed at %s: %+v", phase, f)
			}

			if f := rep.Fences[0]; f.Kind == fence.KindNode && f.Phase != phase {
				t.Errorf("node fence phase %q, want %q (the state's, written before the mutation)", f.Phase, phase)
			}

			// The killed process ran on this host and has exited: its run is provably over, even
			// while its Lease has not expired yet and whatever the CI API says.
			for _, f := range rep.Fences {
				if !f.Releasable || f.Live || !strings.Contains(f.Holder, "-gh"+id+".1-") || !strings.Contains(f.Evidence+f.Reason, "exited") && f.Evidence != "state record only" {
					t.Fatalf("a killed run's fence: %+v", f)
				}
			}

			if res := release(t, r.cfg); res.Held() != 0 || len(res.Outcomes) != len(want) {
				t.Fatalf("release of a killed run: %+v", res.Outcomes)
			}

			// Killed after its Talos write and before its proof, the node is kept out of service
			// on an unproven hold (listed by fences) until a proof, or --uncordon-unproven.
			if phase == state.PhaseConfigured || phase == state.PhaseRebooting || phase == state.PhaseProved {
				if rep := fences(t, r.cfg, ""); len(rep.Fences) != 1 || rep.Fences[0].Kind != fence.KindUnproven || rep.Fences[0].Name != name {
					t.Fatalf("fences after release of a run killed at %s: %+v", phase, rep.Fences)
				}

				liftUnproven(t, sb, r.cfg, name)
			}

			assertReleased(t, sb, name, false)
			assertLeaseFree(t, sb, leaseName)

			n := node(t, sb, name)
			if _, ok := taints.Find(object.Taints(n.Spec.Taints), taints.Steering); ok {
				t.Fatalf("a steering taint is left after release: %v", n.Spec.Taints)
			}

			if _, ok := taints.Find(object.Taints(n.Spec.Taints), operator.Key); !ok {
				t.Fatalf("release took the operator's own %s taint: %v", operator.Effect, n.Spec.Taints)
			}

			if rec := r.readState().Record(name); want[0] == fence.KindNode && rec.Outcome != state.OutcomeReleased {
				t.Fatalf("state record: %+v", rec)
			}

			if st := r.readState(); len(st.Steered) != 0 || len(st.Suspended) != 0 {
				t.Fatalf("steering or suspension records after release: %+v %+v", st.Steered, st.Suspended)
			}

			if s, by := suspendedBy(kustomization(t, sb)); s || by != "" {
				t.Fatalf("release left the Kustomization suspended (%v) or annotated (%q)", s, by)
			}

			if rep := fences(t, r.cfg, ""); len(rep.Fences) != 0 || rep.Summary != "No fence is held." {
				t.Fatalf("fences after release: %+v", rep)
			}

			if res := release(t, r.cfg); len(res.Outcomes) != 0 {
				t.Fatalf("a second release did something: %+v", res.Outcomes)
			}

			waitReady(t, sb, name)
		})
	}
}

func kinds(rep fence.Report) []string {
	out := make([]string, 0, len(rep.Fences))
	for _, f := range rep.Fences {
		out = append(out, f.Kind)
	}

	return out
}

// setTaints replaces a node's taints (retrying the kubelet's heartbeats).
func setTaints(t *testing.T, sb *sandbox.Sandbox, name string, ts []corev1.Taint) {
	t.Helper()

	sandboxtest.PatchNode(t, sb.Kube(), name, map[string]any{"spec": map[string]any{"taints": ts}})
}

func withoutTaint(ts []corev1.Taint, key string) []corev1.Taint {
	return slices.DeleteFunc(slices.Clone(ts), func(x corev1.Taint) bool { return x.Key == key })
}

func waitReady(t *testing.T, sb *sandbox.Sandbox, name string) {
	t.Helper()

	sandboxtest.Eventually(t, 60*time.Second, name+" Ready", func() error {
		if !sandbox.NodeReady(node(t, sb, name)) {
			return errors.New("not Ready")
		}

		return nil
	})
}

// With the state file deleted, the recovery record on the node is enough; an admin's cordon
// (recorded there) stays.
func TestReleaseFromNodeAnnotationsAlone(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	const name = "prod-worker-2"

	sandboxtest.Cordon(t, kube, name)
	t.Cleanup(func() {
		sandboxtest.PatchNode(t, kube, name, map[string]any{"spec": map[string]any{"unschedulable": false}})
	})

	r := newRotation(t, sb, shortLease("recover-annotations"), name)
	id := killRun(t, r, r.plan(), state.PhaseConfigured)

	if err := os.Remove(r.state); err != nil {
		t.Fatal(err)
	}

	waitLeaseExpired(t, sb, "recover-annotations")

	if _, err := sb.Do(ctx, "set-run-status", sandbox.Request{ID: id, Attempt: "1", Status: "completed"}); err != nil {
		t.Fatal(err)
	}

	// node, steering taint, the Flux suspension (found by its annotation), Lease
	if res := release(t, r.cfg); res.Held() != 0 || len(res.Outcomes) != 4 {
		t.Fatalf("release without a state file: %+v", res.Outcomes)
	}

	if s, by := suspendedBy(kustomization(t, sb)); s || by != "" {
		t.Fatalf("release without a state file left the Kustomization suspended (%v) or annotated (%q)", s, by)
	}

	assertReleased(t, sb, name, true)
	assertLeaseFree(t, sb, "recover-annotations")
}

// With the kubernetes backend, a release from another working directory (a fresh CI runner)
// finds the state and finishes the job.
func TestReleaseWithKubernetesBackendElsewhere(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	const name = "prod-worker-3"

	kubeBackend := func(s string) string {
		return strings.Replace(s, `backend = "local"`, `backend = "kubernetes"`+"\n  secret  = \"ghcrsync-state-recover\"", 1)
	}

	r := newRotation(t, sb, shortLease("recover-kube", kubeBackend), name)
	id := killRun(t, r, r.plan(), state.PhaseDrained)

	if _, err := os.Stat(r.state); err == nil {
		t.Fatal("the kubernetes backend wrote a local state file")
	}

	// Another machine: a copy of the configuration in another folder, no local state.
	elsewhere := t.TempDir()
	b, _ := os.ReadFile(r.cfg)
	cfg := filepath.Join(elsewhere, "ghcrsync.hcl")

	if err := os.WriteFile(cfg, b, 0o600); err != nil {
		t.Fatal(err)
	}

	rep := fences(t, cfg, "")
	if got := kinds(rep); !slices.Equal(got, []string{fence.KindNode, fence.KindSteering, fence.KindFlux, fence.KindLease}) {
		t.Fatalf("fences from elsewhere: %+v", rep.Fences)
	}

	waitLeaseExpired(t, sb, "recover-kube")

	if _, err := sb.Do(ctx, "set-run-status", sandbox.Request{ID: id, Attempt: "1", Status: "completed"}); err != nil {
		t.Fatal(err)
	}

	if res := release(t, cfg); res.Held() != 0 {
		t.Fatalf("release from elsewhere: %+v", res.Outcomes)
	}

	assertReleased(t, sb, name, false)
	assertLeaseFree(t, sb, "recover-kube")

	st, err := pullState(cfg)
	if err != nil || st.Record(name) == nil || st.Record(name).Outcome != state.OutcomeReleased {
		t.Fatalf("state in the Secret: %v %+v", err, st)
	}
}

// A run on another runner: only the CI API can say it is over. While it says in_progress, or
// cannot be asked, release refuses; once it says completed, apply reclaims the dead run's fences
// itself before it starts.
func TestLivenessUnreachableThenApplyReclaims(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	const name = "prod-worker-1"

	r := newRotation(t, sb, shortLease("recover-reclaim"), name)
	id := killRun(t, r, r.plan(), state.PhaseGuarded)
	onAnotherRunner(t, sb, r, name, "recover-reclaim")
	waitLeaseExpired(t, sb, "recover-reclaim")

	if _, err := sb.Do(ctx, "set-run-status", sandbox.Request{ID: id, Attempt: "1", Status: "in_progress"}); err != nil {
		t.Fatal(err)
	}

	if res := release(t, r.cfg); res.Held() != 4 || !strings.Contains(res.Outcomes[0].Message, "has not completed") { // node, steering taint, Flux suspension, Lease
		t.Fatalf("release while the run is in progress: %+v", res.Outcomes)
	}

	if _, err := sb.Do(ctx, "set-run-status", sandbox.Request{ID: id, Attempt: "1", Status: "completed"}); err != nil {
		t.Fatal(err)
	}

	b, _ := os.ReadFile(r.cfg)
	unreachable := filepath.Join(r.dir, "unreachable.hcl")
	_ = os.WriteFile(unreachable, []byte(strings.Replace(string(b), sb.CIURL(), "http://127.0.0.1:1", 1)), 0o600)

	res := release(t, unreachable)
	if res.Held() != 4 || !strings.Contains(res.Outcomes[0].Message, "cannot be checked") {
		t.Fatalf("release with the liveness API unreachable: %+v", res.Outcomes)
	}

	if n := node(t, sb, name); n.Annotations[object.OwnerAnnotation] == "" {
		t.Fatal("the fence was released without evidence")
	}

	// A new plan (the fenced node is deselected as fenced-by-other) and an apply that reclaims.
	r2 := newRotation(t, sb, shortLease("recover-reclaim"), name, "prod-worker-3")
	r2.mayDeselect = map[string]bool{name: true} // fenced by the dead run: fenced-by-other
	path := r2.plan()

	st := r.readState()
	if err := os.WriteFile(r2.state, mustJSON(t, st), 0o600); err != nil {
		t.Fatal(err)
	}

	path = r2.plan() // bound to the copied state

	res2, err := r2.apply(path, applyHooks())
	if err != nil {
		t.Fatal(err)
	}

	if len(res2.Reclaimed) != 4 { // the node fence, its steering taint, the Flux suspension, the Lease
		t.Fatalf("reclaimed: %+v", res2.Reclaimed)
	}

	for _, x := range res2.Reclaimed {
		if !x.Released {
			t.Fatalf("reclaimed: %+v", res2.Reclaimed)
		}
	}

	if !strings.Contains(r2.log.String(), "reclaimed a fence of a terminated run") {
		t.Fatalf("apply did not report the reclaim:\n%s", r2.log.String())
	}

	assertReleased(t, sb, name, false)
}

// state push migrates a local state into the Kubernetes backend (refusing another lineage
// unless forced); state rm forgets a record and leaves the cluster alone.
func TestStatePushAndRemove(t *testing.T) {
	sb := sandboxtest.Get(t)
	dir := t.TempDir()

	local := &state.Local{Path: filepath.Join(dir, "local.json")}
	st := &state.State{Records: []state.Record{{Node: "prod-worker-9", Phase: state.PhaseReleased, Outcome: state.OutcomeDone}}}

	if err := local.Write(st); err != nil {
		t.Fatal(err)
	}

	r := newRotation(t, sb, func(s string) string {
		return strings.Replace(s, `backend = "local"`, `backend = "kubernetes"`+"\n  secret  = \"ghcrsync-state-push\"", 1)
	})
	pushed, err := pushState(r.cfg, local.Path)
	if err != nil {
		t.Fatal(err)
	}

	got, err := pullState(r.cfg)
	if err != nil || got.Lineage != st.Lineage || got.Record("prod-worker-9") == nil || got.Serial != pushed.Serial {
		t.Fatalf("pulled after push: %v %+v", err, got)
	}

	other := &state.Local{Path: filepath.Join(dir, "other.json")}
	if err := other.Write(&state.State{}); err != nil {
		t.Fatal(err)
	}

	if _, err := pushState(r.cfg, other.Path); err == nil || !strings.Contains(err.Error(), "pushing would replace another history") {
		t.Fatalf("push of another lineage: %v", err)
	}

	if err := removeState(r.cfg, "prod-worker-9"); err != nil {
		t.Fatal(err)
	}

	if got, _ := pullState(r.cfg); got.Record("prod-worker-9") != nil || got.Serial != pushed.Serial+1 {
		t.Fatalf("after rm: %+v", got)
	}

	if err := removeState(r.cfg, "prod-worker-9"); err == nil {
		t.Fatal("removing an absent record succeeded")
	}
}

// onAnotherRunner makes a killed run look as if it ran on another machine: its holder id (on the
// node, the Lease and in the state) names another host, so no local evidence applies.
func onAnotherRunner(t *testing.T, sb *sandbox.Sandbox, r *rotation, name, leaseName string) {
	t.Helper()

	moveHolder(t, sb, r, name, leaseName, func(id *holder.ID) { id.Host, id.Proc = "another-runner", "" })
}

// moveHolder rewrites the killed run's holder id everywhere it is written (the state, the node's
// owner annotation and steering taint, the Lease, which is renewed by the update) as edit says,
// and returns it.
func moveHolder(t *testing.T, sb *sandbox.Sandbox, r *rotation, name, leaseName string, edit func(*holder.ID)) string {
	t.Helper()

	ctx := context.Background()
	kube := sb.Kube()

	st := r.readState()
	old := st.Run.Holder

	id, ok := holder.Parse(old)
	if !ok {
		t.Fatalf("holder %q", old)
	}

	edit(&id)
	moved := id.String()

	st.Run.Holder = moved
	for i := range st.Records {
		st.Records[i].Owner = moved
	}

	for i := range st.Steered {
		st.Steered[i].Owner = moved
	}

	for i := range st.Suspended {
		st.Suspended[i].Owner = moved
	}

	if err := os.WriteFile(r.state, mustJSON(t, st), 0o600); err != nil {
		t.Fatal(err)
	}

	// The Flux suspension names the run by its annotation.
	sandboxtest.Eventually(t, 10*time.Second, "the suspension's annotation moved", func() error {
		k := kustomization(t, sb)
		a := k.GetAnnotations()
		a[object.SuspendedByAnnotation] = moved
		k.SetAnnotations(a)
		_, err := fluxClient(t, sb).Update(ctx, k, metav1.UpdateOptions{})

		return err
	})

	sandboxtest.PatchNode(t, kube, name, map[string]any{"metadata": map[string]any{"annotations": map[string]any{object.OwnerAnnotation: moved}}})

	// The steering taint names the run by its token, and by the annotation beside it.
	ts := node(t, sb, name).Spec.Taints
	for i := range ts {
		if ts[i].Key == taints.Steering {
			ts[i].Value = taints.RunToken(moved)
		}
	}

	sandboxtest.PatchNode(t, kube, name, map[string]any{"metadata": map[string]any{"annotations": map[string]any{object.SteeredByAnnotation: moved}},
		"spec": map[string]any{"taints": ts}})

	l, err := kube.CoordinationV1().Leases("flux-system").Get(ctx, leaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	l.Spec.HolderIdentity = ptr.To(moved)
	l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))

	if _, err := kube.CoordinationV1().Leases("flux-system").Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	return moved
}

// A host name and a dead pid are no proof that a run is over: the same host name is seen from
// another PID namespace (a container with the host's UTS namespace), where that pid means
// nothing. While the run's Lease is live by the API server's clock, its fence is live, for an id
// without a process identity and for one from another PID namespace; once the Lease has
// expired, the dead pid on this host is enough (the negative control: the guard still lets a
// dead run go). TestReleaseAfterKillAtEachPhase shows a unique identity ends a run at once.
func TestHostNameAndPIDAloneNeverEndALiveRun(t *testing.T) {
	sb := sandboxtest.Get(t)
	const name, leaseName = "prod-worker-1", "recover-same-host"

	r := newRotation(t, sb, shortLease(leaseName), name)
	killRun(t, r, r.plan(), state.PhaseClaimed)

	killed, _ := holder.Parse(r.readState().Run.Holder)
	space, start, ok := holder.ProcessParts(killed.Proc)
	boot, _, _ := strings.Cut(space, ".")

	if !ok {
		t.Fatalf("the killed run's holder %q has no process identity", killed)
	}

	for _, tc := range []struct {
		name string
		edit func(*holder.ID)
	}{
		{"no_process_identity", func(id *holder.ID) { id.Proc = "" }},
		{"another_pid_namespace", func(id *holder.ID) { id.Proc = boot + ".1." + start }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			moveHolder(t, sb, r, name, leaseName, tc.edit)

			for _, f := range fences(t, r.cfg, "").Fences {
				if f.Releasable || !f.Live {
					t.Fatalf("a run with a live Lease, judged by host name and pid: %+v", f)
				}
			}

			if res := release(t, r.cfg); res.Held() != 4 { // node, steering taint, Flux suspension, Lease
				t.Fatalf("release undid a live run's fence: %+v", res.Outcomes)
			}

			if n := node(t, sb, name); n.Annotations[object.OwnerAnnotation] == "" {
				t.Fatal("the fence was released")
			}
		})
	}

	// The control: the same id without a process identity, its Lease expired by the API
	// server's clock, is over (its pid on this host is gone).
	moveHolder(t, sb, r, name, leaseName, func(id *holder.ID) { id.Proc = "" })

	sandboxtest.Eventually(t, 30*time.Second, "the Lease expires by the API server's clock", func() error {
		for _, f := range fences(t, r.cfg, "").Fences {
			if !f.Releasable || !strings.Contains(f.Evidence, "no process") {
				return fmt.Errorf("%s: %s (%s)", f.Name, f.Reason, f.Evidence)
			}
		}

		return nil
	})

	if res := release(t, r.cfg); res.Held() != 0 {
		t.Fatalf("release of a dead run: %+v", res.Outcomes)
	}

	assertReleased(t, sb, name, false)
	assertLeaseFree(t, sb, leaseName)
}

// statusAnswer is an API server's Status answer with code: what an authorizer's refusal or a
// failing apiserver sends.
func statusAnswer(req *http.Request, code int, reason string) *http.Response {
	body := fmt.Sprintf(`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"injected %s","reason":%q,"code":%d}`, reason, reason, code)

	return &http.Response{StatusCode: code, Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(body)), Request: req}
}

// A fence is closed as "the node no longer exists" only on the API's authoritative answer: a
// NotFound for its name, or a Node of that name that is another object (another uid). A
// refusal to read the Nodes (403) or a failing read (500) releases nothing and closes no
// record; a Node deleted and registered again under the same name is not the fenced one — its
// record is closed and the new Node is left as it is. The negative control: the same fence,
// read without a fault, is released.
func TestRemovedTargetRequiresAuthoritativeUnambiguousInventory(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	ctx := context.Background()
	const name = "prod-worker-3"

	r := newRotation(t, sb, shortLease("removal-evidence"), name)
	id := killRun(t, r, r.plan(), state.PhaseConfigured)
	waitLeaseExpired(t, sb, "removal-evidence")

	if _, err := sb.Do(ctx, "set-run-status", sandbox.Request{ID: id, Attempt: "1", Status: "completed"}); err != nil {
		t.Fatal(err)
	}

	faulty := func(code int, reason string) *workspace.Faults {
		return &workspace.Faults{Kube: func(next http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(req *http.Request) (*http.Response, error) {
				if req.Method == http.MethodGet && strings.HasPrefix(req.URL.Path, "/api/v1/nodes") {
					return statusAnswer(req, code, reason), nil
				}

				return next.RoundTrip(req)
			})
		}}
	}

	for _, f := range []struct {
		name   string
		faults *workspace.Faults
	}{{"forbidden", faulty(http.StatusForbidden, "Forbidden")}, {"a failing read", faulty(http.StatusInternalServerError, "InternalError")}} {
		ws, err := workspace.Open(workspace.Options{ConfigPath: r.cfg, Lock: true, Faults: f.faults})
		if err != nil {
			t.Fatal(err)
		}

		res, err := fence.Recover(ctx, ws.Fences(), fence.RecoveryOptions{})
		ws.Close()

		if err == nil || !strings.Contains(err.Error(), "list nodes") {
			t.Fatalf("%s: a release without an authoritative inventory: %v %+v", f.name, err, res)
		}

		if rec := r.readState().Record(name); rec == nil || !rec.Holds() {
			t.Fatalf("%s: the record was closed: %+v", f.name, rec)
		}

		if n := node(t, sb, name); n.Annotations[object.OwnerAnnotation] == "" || !n.Spec.Unschedulable {
			t.Fatalf("%s: the fence was touched", f.name)
		}
	}

	// The Node deleted while its machine reboots: the kubelet registers it again at boot.
	old := node(t, sb, name).UID

	if err := kube.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	if _, err := sb.Do(ctx, "reboot", sandbox.Request{Node: name}); err != nil {
		t.Fatal(err)
	}

	sandboxtest.Eventually(t, 30*time.Second, name+" registered again", func() error {
		n, err := kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}

		if n.UID == old {
			return errors.New("the same object")
		}

		return nil
	})

	// Put the new Node in the test group (the label went with the old object), cordoned by an
	// operator: release must leave it exactly so.
	sandboxtest.PatchNode(t, kube, name, map[string]any{"metadata": map[string]any{"labels": map[string]any{"ghcrsync.dev/test-group": r.group}},
		"spec": map[string]any{"unschedulable": true}})
	t.Cleanup(func() {
		sandboxtest.PatchNode(t, kube, name, map[string]any{"spec": map[string]any{"unschedulable": false}})
	})

	res := release(t, r.cfg)
	if res.Held() != 0 {
		t.Fatalf("release: %+v", res.Outcomes)
	}

	if rec := r.readState().Record(name); rec == nil || rec.Holds() {
		t.Fatalf("the old Node's record is still open: %+v", rec)
	}

	if n := node(t, sb, name); !n.Spec.Unschedulable || n.Annotations[object.OwnerAnnotation] != "" {
		t.Fatalf("the new Node of the same name was touched: %+v %v", n.Spec, n.Annotations)
	}
}

// A liveness query that answers without a status (or for another run) proves nothing: the dead
// run's fences stay, and release says why. The negative control: the same run answered
// "completed" is released.
func TestRecoverFencesRefusesWhenTheLivenessQueryReturnsNoStatus(t *testing.T) {
	sb := sandboxtest.Get(t)
	ctx := context.Background()
	const name = "prod-worker-2"

	r := newRotation(t, sb, shortLease("no-status"), name)
	id := killRun(t, r, r.plan(), state.PhaseDrained)
	onAnotherRunner(t, sb, r, name, "no-status") // only the CI API can tell it ended
	waitLeaseExpired(t, sb, "no-status")

	for _, status := range []string{sandbox.NoStatus, "completed"} {
		if _, err := sb.Do(ctx, "set-run-status", sandbox.Request{ID: id, Attempt: "1", Status: status}); err != nil {
			t.Fatal(err)
		}

		res := release(t, r.cfg)

		if status == "completed" {
			if res.Held() != 0 {
				t.Fatalf("the control: %+v", res.Outcomes)
			}

			assertReleased(t, sb, name, false)

			return
		}

		var msgs []string
		for _, o := range res.Outcomes {
			msgs = append(msgs, o.Message+" "+o.Fence.Evidence)
		}

		if res.Held() == 0 || !strings.Contains(strings.Join(msgs, "\n"), "without a status") {
			t.Fatalf("a liveness answer without a status: %+v", res.Outcomes)
		}

		if n := node(t, sb, name); n.Annotations[object.OwnerAnnotation] == "" || !n.Spec.Unschedulable {
			t.Fatal("the fence was released on an answer that said nothing")
		}
	}
}

// The node feed `fences` judges from is the whole list or nothing: an answer cut short (a
// continue token, a body that ends mid-object) is an error, never "no fence is held"; and a node
// whose owner annotation is empty is reported, not skipped. The negative control: the same
// fleet read without a fault reports the node.
func TestFenceReportNodeFeedSurvivesEmptyFields(t *testing.T) {
	sb := sandboxtest.Get(t)
	ctx := context.Background()
	const name = "prod-worker-3"

	sandboxtest.PatchNode(t, sb.Kube(), name, map[string]any{"metadata": map[string]any{"annotations": map[string]any{object.OwnerAnnotation: ""}}})
	t.Cleanup(func() {
		sandboxtest.PatchNode(t, sb.Kube(), name, map[string]any{"metadata": map[string]any{"annotations": map[string]any{object.OwnerAnnotation: nil}}})
	})

	r := newRotation(t, sb, nil, name)
	rewrite := func(edit func([]byte) []byte) *workspace.Faults {
		return &workspace.Faults{Kube: func(next http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(req *http.Request) (*http.Response, error) {
				feed := req.Method == http.MethodGet && req.URL.Path == "/api/v1/nodes"
				if feed { // JSON, so the fault can edit it (client-go decodes what it is sent)
					req = req.Clone(req.Context())
					req.Header.Set("Accept", "application/json")
				}

				resp, err := next.RoundTrip(req)
				if err != nil || !feed {
					return resp, err
				}

				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()

				if err != nil {
					return nil, err
				}

				body = edit(body)
				resp.Body, resp.ContentLength = io.NopCloser(strings.NewReader(string(body))), int64(len(body))
				resp.Header.Del("Content-Length")

				return resp, nil
			})
		}}
	}

	report := func(faults *workspace.Faults) (fence.Report, error) {
		ws, err := workspace.Open(workspace.Options{ConfigPath: r.cfg, Faults: faults})
		if err != nil {
			return fence.Report{}, err
		}
		defer ws.Close()

		return fence.Inventory(ctx, ws.Fences(), fence.InventoryOptions{})
	}

	for _, tc := range []struct {
		name   string
		faults *workspace.Faults
		want   string
	}{
		{"a continue token", rewrite(func(b []byte) []byte {
			return []byte(strings.Replace(string(b), `"metadata":{`, `"metadata":{"continue":"more","remainingItemCount":3,`, 1))
		}), "part of the list only"},
		{"a body cut short", rewrite(func(b []byte) []byte { return b[:len(b)/2] }), "list nodes"},
	} {
		if rep, err := report(tc.faults); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: a partial node feed: %v %+v", tc.name, err, rep)
		}
	}

	rep, err := report(nil)
	if err != nil {
		t.Fatal(err)
	}

	for _, f := range rep.Fences {
		if f.Name == name {
			if f.Releasable || !strings.Contains(f.Reason, "annotation is empty") {
				t.Fatalf("a node with an empty owner: %+v", f)
			}

			return
		}
	}

	t.Fatalf("a node with an empty owner is not reported: %+v", rep)
}

// A recovery record ghcrsync cannot validate — here one that lacks was_cordoned, which would read
// as "was not cordoned" — is reported by `fences`, and while it is on any node, release
// releases nothing at all: not that node, not the dead run's other fences, not its Lease. The
// negative control: with the record removed, release finishes every fence (keeping the cordon
// of the node whose record is gone).
func TestFenceReportBlocksEveryJournalWhenAnyIsMalformed(t *testing.T) {
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	const name, tampered = "prod-worker-1", "prod-worker-2"

	r := newRotation(t, sb, shortLease("malformed-journal"), name)
	killRun(t, r, r.plan(), state.PhaseDrained)
	waitLeaseExpired(t, sb, "malformed-journal")

	holder := r.readState().Run.Holder
	n := node(t, sb, tampered)
	sandboxtest.PatchNode(t, kube, tampered, map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{
			object.OwnerAnnotation:  holder,
			object.PhaseAnnotation:  string(state.PhaseDrained),
			object.RecordAnnotation: `{"uid":"` + string(n.UID) + `","initial_taints":[],"desired_revision":"x","scale_down_guard_ours":false}`,
		}},
		"spec": map[string]any{"unschedulable": true},
	})
	t.Cleanup(func() {
		sandboxtest.PatchNode(t, kube, tampered, map[string]any{"metadata": map[string]any{"annotations": map[string]any{
			object.OwnerAnnotation: nil, object.PhaseAnnotation: nil, object.RecordAnnotation: nil}}, "spec": map[string]any{"unschedulable": false}})
	})

	rep := fences(t, r.cfg, "")
	if len(rep.Malformed) != 1 || rep.Malformed[0] != tampered {
		t.Fatalf("fences: %+v", rep)
	}

	for _, f := range rep.Fences {
		if f.Name == tampered && (f.Releasable || !strings.Contains(f.Reason, `lacks "was_cordoned"`)) {
			t.Fatalf("the malformed record's fence: %+v", f)
		}
	}

	if res, err := recoverCfg(context.Background(), r.cfg); err == nil || !strings.Contains(err.Error(), "refuses to release any fence") ||
		!strings.Contains(err.Error(), tampered) || (res != nil && len(res.Outcomes) > 0) {
		t.Fatalf("release with a malformed record: %v %+v", err, res)
	}

	if n := node(t, sb, name); n.Annotations[object.OwnerAnnotation] != holder || !n.Spec.Unschedulable {
		t.Fatal("release went on with the other fences")
	}

	// The record removed: what is left of that fence (an owner, a cordon) is released, the
	// cordon kept, and the rest with it.
	sandboxtest.PatchNode(t, kube, tampered, map[string]any{"metadata": map[string]any{"annotations": map[string]any{object.RecordAnnotation: nil}}})

	if res := release(t, r.cfg); res.Held() != 0 {
		t.Fatalf("the control: %+v", res.Outcomes)
	}

	assertReleased(t, sb, name, false)
	assertReleased(t, sb, tampered, true)
	assertLeaseFree(t, sb, "malformed-journal")
}

// L6: a fence reclaimed from a run killed after its Talos write (at rebooting: the node's config
// holds the new credential, its runtime never proved) never returns to service unproved. The
// next run's plan leaves the node to its reclaim, which puts it on ghcrsync's unproven hold; at
// every relist of that run the node is still cordoned and marked, or already proved by the run
// on its current boot (a relist rotates it as a late node), and the run ends with it proved,
// uncordoned. The control: killed before its Talos write (guarded), the reclaim returns the node
// to service at once, no hold.
func TestReclaimedMutatingFenceStaysHeldUntilProved(t *testing.T) {
	sb := sandboxtest.Get(t)
	const name = "prod-worker-1"

	for _, tc := range []struct {
		phase state.Phase
		held  bool
	}{{state.PhaseRebooting, true}, {state.PhaseGuarded, false}} {
		t.Run(string(tc.phase), func(t *testing.T) {
			r := newRotation(t, sb, shortLease("l6-"+string(tc.phase)), name)
			killRun(t, r, r.plan(), tc.phase)

			// The next run finds the node fenced by the dead run and leaves it to its reclaim.
			r.mayDeselect = map[string]bool{name: true}

			var seen []plan.Node

			res, err := r.apply(r.plan(), apply.Hooks{BeforeRelist: func(int) { seen = append(seen, object.FromNode(node(t, sb, name))) }})
			if err != nil {
				t.Fatal(err)
			}

			if len(res.Reclaimed) == 0 || len(seen) == 0 || seen[0].HeldUnproven != tc.held {
				t.Fatalf("the next run reclaimed %+v; at its first relist the node on the unproven hold: %v, want %v\n%s", res.Reclaimed, len(seen) > 0 && seen[0].HeldUnproven, tc.held, r.log.String())
			}

			for i, n := range seen {
				proved := n.VerifiedRevision == r.planned.CredentialRevision && n.VerifiedBoot == n.BootID
				if tc.held && !(n.HeldUnproven && n.Unschedulable) && !proved {
					t.Fatalf("at the next run's relist %d the node is out of the hold, unproved: %+v\n%s", i+1, n, r.log.String())
				}
			}

			if n := object.FromNode(node(t, sb, name)); n.HeldUnproven || n.VerifiedBoot != n.BootID {
				t.Fatalf("after the next run the node is on the hold (%v) or unproved on its boot (%q, boot %q)", n.HeldUnproven, n.VerifiedBoot, n.BootID)
			}

			assertReleased(t, sb, name, false)
			waitReady(t, sb, name)
		})
	}
}

// nodeReadFault answers the run's reads of Nodes, once armed, with a 403, a 500, a body cut
// short, or a NotFound for name: every GET of the Node, every list and watch of Nodes, and the
// watch the run already has (its stream ends), so the run's reads of the Node reach the fault.
type nodeReadFault struct {
	name, kind string
	armed      atomic.Bool
}

func (f *nodeReadFault) wrap(next http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		nodes := req.Method == http.MethodGet && (req.URL.Path == "/api/v1/nodes" || req.URL.Path == "/api/v1/nodes/"+f.name)
		if !nodes || !f.armed.Load() {
			resp, err := next.RoundTrip(req)
			if err == nil && nodes && req.URL.Query().Get("watch") != "" {
				resp.Body = &cutOff{ReadCloser: resp.Body, armed: &f.armed}
			}

			return resp, err
		}

		switch {
		case f.kind == "forbidden":
			return statusAnswer(req, http.StatusForbidden, "Forbidden"), nil
		case f.kind == "failing":
			return statusAnswer(req, http.StatusInternalServerError, "InternalError"), nil
		case f.kind == "notfound" && req.URL.Path != "/api/v1/nodes":
			return statusAnswer(req, http.StatusNotFound, "NotFound"), nil
		case f.kind == "notfound": // the list without the Node: it is gone
			return statusAnswer(req, http.StatusServiceUnavailable, "ServiceUnavailable"), nil
		}

		body := `{"kind":"Node","apiVersion":"v1","metadata":{"name":"` + f.name + `","uid":"` // truncated
		if req.URL.Path == "/api/v1/nodes" {
			body = `{"kind":"NodeList","apiVersion":"v1","metadata":{},"items":[{"metadata":{"name":"`
		}

		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(body)), Request: req}, nil
	})
}

// cutOff ends a watch's stream once the fault is armed.
type cutOff struct {
	io.ReadCloser
	armed *atomic.Bool
}

func (c *cutOff) Read(p []byte) (int, error) {
	if c.armed.Load() {
		return 0, io.ErrUnexpectedEOF
	}

	return c.ReadCloser.Read(p)
}

// D9 during the roll: the Node read that the run's next mutation is judged on answers 403, 500
// or a body cut short — before the Talos write (armed before the drain) or after it (armed
// before the reboot), the run's Node watch cut off too. No answer is evidence: the run asks again until ready_timeout, then fails the node,
// keeps its fence, and holds the root back. The control: an authoritative NotFound for the Node
// (its watch cut off too) is taken as the Node gone: before the Talos write it is deselected,
// after it gone-after-mutation — neither a failure.
func TestNodeReadFaultsDuringTheRollFailClosed(t *testing.T) {
	sb := sandboxtest.Get(t)
	const name = "prod-worker-2"

	for _, kind := range []string{"forbidden", "failing", "truncated", "notfound"} {
		for _, at := range []state.Phase{state.PhaseDrained, state.PhaseRebooting} {
			t.Run(kind+"/"+string(at), func(t *testing.T) {
				r := newRotation(t, sb, shortLease("d9-"+kind+"-"+string(at), func(s string) string {
					return strings.Replace(s, `ready_timeout         = "60s"`, `ready_timeout         = "6s"`, 1)
				}), name)
				f := &nodeReadFault{name: name, kind: kind}
				r.faults = &workspace.Faults{Kube: f.wrap}

				res, err := r.apply(r.plan(), apply.Hooks{BeforeMutation: func(node string, phase state.Phase) {
					if node == name && phase == at {
						f.armed.Store(true)
						time.Sleep(3 * time.Second) // the run's Node watch, cut off, is no longer fresh: its reads go to the API
					}
				}})
				f.armed.Store(false)

				if err != nil {
					t.Fatal(err)
				}

				x := r.result(res, name)
				root := heldRoot(res)
				t.Logf("%s at %s: %s (fenced %v): %s; root held back: %v", kind, at, x.Outcome, x.Fenced, x.Message, root)

				want := map[state.Phase]state.Outcome{state.PhaseDrained: state.OutcomeDeselected, state.PhaseRebooting: state.OutcomeGoneAfterMutation}[at]
				if kind != "notfound" {
					want = state.OutcomeFailed
				}

				switch {
				case x.Outcome != want:
					t.Fatalf("%s on the Node read at %s: %s, want %s\n%s", kind, at, x.Outcome, want, r.log.String())
				case kind != "notfound" && (!x.Fenced || !root || res.SafeToRevoke()):
					t.Fatalf("%s at %s: fence kept %v, root held back %v, safe %v: want the fence kept and the root held back", kind, at, x.Fenced, root, res.SafeToRevoke())
				}

				// The fence the run left (or, for a Node it took for gone, the claim still on it).
				releaseHolder(t, r.cfg, res.Holder)

				if n := node(t, sb, name); n.Annotations[object.UnprovenAnnotation] != "" {
					liftUnproven(t, sb, r.cfg, name)
				}

				assertReleased(t, sb, name, false)
				waitReady(t, sb, name)
			})
		}
	}
}

// heldRoot reports whether the run held the root Flux secret back.
func heldRoot(res *apply.Result) bool {
	for _, s := range res.Secrets {
		if s.Role == plan.RoleRoot {
			return s.Outcome == secretwrite.HeldBack
		}
	}

	return false
}
