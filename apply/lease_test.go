package apply_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/authdigest"
	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/lease"
	"github.com/ghcrsync/ghcrsync/internal/object"
	"github.com/ghcrsync/ghcrsync/internal/sandbox"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/secretwrite"
	"github.com/ghcrsync/ghcrsync/internal/talos"
	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// Release always wins against the run's own heartbeat: renewals are cancelled and waited for,
// and the release compares the holder only. 30 rounds with a 10 ms heartbeat, released at a
// random moment. Negative control: a Lease taken by another holder is not released.
func TestLeaseReleaseRacesHeartbeat(t *testing.T) {
	ctx := context.Background()
	kube := sandboxtest.Get(t).Kube()

	for i := range 30 {
		l, err := lease.Acquire(ctx, kube, lease.Options{
			Namespace: "default", Name: "race", Holder: fmt.Sprintf("run-%d", i), Duration: 5 * time.Second, Heartbeat: 10 * time.Millisecond,
		})
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}

		l.Start(ctx)
		time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond)

		if err := l.Release(ctx); err != nil {
			t.Fatalf("round %d: release lost to the heartbeat: %v", i, err)
		}

		cur, _ := kube.CoordinationV1().Leases("default").Get(ctx, "race", metav1.GetOptions{})
		if h := ptr.Deref(cur.Spec.HolderIdentity, ""); h != "" {
			t.Fatalf("round %d: holder %q after release", i, h)
		}
	}

	l, err := lease.Acquire(ctx, kube, lease.Options{Namespace: "default", Name: "race", Holder: "ours", Duration: 5 * time.Second, Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}

	cur, _ := kube.CoordinationV1().Leases("default").Get(ctx, "race", metav1.GetOptions{})
	cur.Spec.HolderIdentity = ptr.To("intruder")

	if _, err := kube.CoordinationV1().Leases("default").Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	var le *lease.Error
	if err := l.Release(ctx); !errors.As(err, &le) || le.Class != lease.HeldByAnother || le.Holder != "intruder" {
		t.Fatalf("release of a Lease held by another: %v", err)
	}

	cur, _ = kube.CoordinationV1().Leases("default").Get(ctx, "race", metav1.GetOptions{})
	if ptr.Deref(cur.Spec.HolderIdentity, "") != "intruder" {
		t.Fatal("our release cleared another holder")
	}
}

// A Lease held by someone else is never taken over, even long expired; apply refuses before it
// writes anything, naming the holder and how to inspect it.
func TestApplyNeverTakesOverAHeldLease(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	kube := sb.Kube()

	r := newRotation(t, sb, func(s string) string { return strings.Replace(s, `"ghcr-auth-refresh"`, `"held-elsewhere"`, 1) }, "prod-worker-1")
	path := r.plan()

	old := metav1.NewMicroTime(time.Now().Add(-time.Hour))
	_, err := kube.CoordinationV1().Leases("flux-system").Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "held-elsewhere"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("abandoned-run-gh9.1"), LeaseDurationSeconds: ptr.To(int32(15)),
			RenewTime: &old, LeaseTransitions: ptr.To(int32(4))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	_, err = r.apply(path, apply.Hooks{})
	if err == nil || !strings.Contains(err.Error(), "holder=abandoned-run-gh9.1") || !strings.Contains(err.Error(), "never takes over") ||
		!strings.Contains(err.Error(), "ghcrsync fences") || !strings.Contains(err.Error(), "transitions=4") {
		t.Fatalf("want a refusal naming the holder, got %v", err)
	}

	if n := node(t, sb, "prod-worker-1"); n.Annotations[object.OwnerAnnotation] != "" || n.Spec.Unschedulable {
		t.Fatal("a refused apply touched a node")
	}
}

// A stale plan (expired, another config, another credential, another state serial) is refused
// before any write: the apiserver audit log has no write by the run's identity.
func TestStalePlansAreRefused(t *testing.T) {
	sb := sandboxtest.Get(t)
	kc := filepath.Join(t.TempDir(), "kubeconfig")

	if err := sb.WriteKubeconfig(kc, "stale-plan-test", "system:masters"); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name  string
		spoil func(r *rotation)
		clock clock.Clock
		want  string
	}{
		{name: "expired", clock: clock.NewFake(time.Now().Add(2 * time.Hour)), want: "it expired at"},
		{name: "config_changed", spoil: func(r *rotation) {
			b, _ := os.ReadFile(r.cfg)
			_ = os.WriteFile(r.cfg, append(b, []byte("\n# edited\n")...), 0o600)
		}, want: "another configuration"},
		{name: "credential_changed", spoil: func(r *rotation) {
			other := newRotation(r.t, r.sb, nil)
			b, _ := os.ReadFile(filepath.Join(other.dir, "secret.enc.yaml"))
			_ = os.WriteFile(filepath.Join(r.dir, "secret.enc.yaml"), b, 0o600)
		}, want: "another credential revision"},
		{name: "state_changed", spoil: func(r *rotation) {
			l := &state.Local{Path: r.state}
			st, _ := l.Read()
			_ = l.Write(st)
		}, want: "the state was changed by another operation after the plan was created"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRotation(t, sb, func(s string) string { return strings.Replace(s, `"`+sb.Path("kubeconfig")+`"`, `"`+kc+`"`, 1) }, "prod-worker-1")
			path := r.plan()

			if tc.spoil != nil {
				tc.spoil(r)
			}

			_, err := applyCfg(context.Background(), applyOptions{ConfigPath: r.cfg, PlanPath: path, Clock: tc.clock})
			if !apply.IsStale(err) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "Saved plan is stale") {
				t.Fatalf("want stale (%s), got %v", tc.want, err)
			}
		})
	}

	time.Sleep(time.Second)

	if writes, err := sb.AuditedWrites("stale-plan-test"); err != nil || len(writes) != 0 {
		t.Fatalf("a refused plan wrote to the cluster: %v %+v", err, writes)
	}
}

// runKillHelper runs in a child process: apply the plan and SIGKILL this process just before the
// named phase's mutation.
func runKillHelper() bool {
	target := state.Phase(os.Getenv("GHCRSYNC_KILL_AT"))

	kill := func(_ string, phase state.Phase) {
		if phase == target {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}

	res, err := applyCfg(context.Background(), applyOptions{
		ConfigPath: os.Getenv("GHCRSYNC_KILL_CONFIG"), PlanPath: os.Getenv("GHCRSYNC_KILL_PLAN"),
		Hooks: apply.Hooks{BeforeMutation: kill, BeforeFlux: kill},
	})
	fmt.Fprintf(os.Stderr, "kill helper: phase %s never reached (%v)\n", target, err)

	if res != nil {
		for _, r := range res.Nodes {
			fmt.Fprintf(os.Stderr, "  %s: %s %s\n", r.Node, r.Outcome, r.Message)
		}
	}
	os.Exit(3)

	return true
}

// apply killed with SIGKILL just before each phase's mutation leaves a state whose last record
// tells the truth: the cluster is exactly as the recorded phase allows.
func TestKillDashNineAtEachPhase(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	const name = "prod-worker-3"

	tc, err := talos.Connect(ctx, sb.Path(sandbox.TalosconfigFile), "", nil, 0)
	if err != nil {
		t.Fatal(err)
	}

	defer tc.Close()

	m, _ := sb.Fleet().Machine(name)

	for _, phase := range []state.Phase{state.PhaseClaimed, state.PhaseGuarded, state.PhaseDrained, state.PhaseConfigured,
		state.PhaseRebooting, state.PhaseProved, state.PhaseReleased} {
		t.Run(string(phase), func(t *testing.T) {
			leaseName := "kill-" + string(phase)
			r := newRotation(t, sb, func(s string) string { return strings.Replace(s, `"ghcr-auth-refresh"`, `"`+leaseName+`"`, 1) }, name)
			path := r.plan()
			bootBefore := node(t, sb, name).Status.NodeInfo.BootID

			killRun(t, r, path, phase)

			rec := r.readState().Record(name)
			if rec == nil || rec.Phase != phase || rec.Outcome != state.OutcomeInProgress {
				t.Fatalf("state's last record: %+v", rec)
			}

			n := node(t, sb, name)
			owner := n.Annotations[object.OwnerAnnotation]
			facts, err := tc.ConfigFacts(ctx, plan.Node{InternalIP: m.IP}, "ghcr.io")
			if err != nil {
				t.Fatal(err)
			}

			newDigest := authdigest.Of(r.cred.Username, r.cred.Password)
			check := map[string]bool{}

			switch phase {
			case state.PhaseClaimed:
				check["not claimed yet"] = owner == "" && !n.Spec.Unschedulable
			case state.PhaseGuarded, state.PhaseDrained:
				check["claimed by the run"] = owner == rec.Owner && n.Spec.Unschedulable
				check["Talos untouched"] = facts.StagedDigest != newDigest
			case state.PhaseConfigured:
				check["claimed"] = owner == rec.Owner
				check["Talos untouched"] = facts.StagedDigest != newDigest
			case state.PhaseRebooting:
				check["config staged"] = facts.StagedDigest == newDigest && facts.ConfiguredDigest != newDigest
				check["not rebooted"] = n.Status.NodeInfo.BootID == bootBefore
			case state.PhaseProved:
				check["rebooted onto the new config"] = n.Status.NodeInfo.BootID != bootBefore && facts.ConfiguredDigest == newDigest
				check["no verified marker yet"] = n.Annotations[object.VerifiedRevisionAnnotation] != r.planned.CredentialRevision
			case state.PhaseReleased:
				check["verified"] = n.Annotations[object.VerifiedRevisionAnnotation] == r.planned.CredentialRevision
				check["fence still held"] = owner == rec.Owner && n.Spec.Unschedulable
			}

			for what, ok := range check {
				if !ok {
					t.Errorf("killed before %s: %s does not hold (owner %q, cordoned %t, boot %s→%s, staged %.8s, active %.8s)",
						phase, what, owner, n.Spec.Unschedulable, bootBefore, n.Status.NodeInfo.BootID, facts.StagedDigest, facts.ConfiguredDigest)
				}
			}

			// Undo what the dead run left (the release command belongs to another issue).
			sandboxtest.PatchNode(t, kube, name, map[string]any{
				"metadata": map[string]any{"annotations": map[string]any{
					object.OwnerAnnotation: nil, object.PhaseAnnotation: nil, object.RecordAnnotation: nil,
					"ghcrsync.dev/scale-down-disabled-by": nil, sandbox.ScaleDownDisabledAnnotation: nil,
				}},
				"spec": map[string]any{"unschedulable": false},
			})
			waitReady(t, sb, name)
		})
	}
}

// The Lease rides out the API outage of the endpoint node's reboot: renewals fail as
// api-unreachable, and once the API is back a Lease that still names us is renewed and live.
// Negative control: a Lease taken by someone else during the outage is lost for good.
func TestLeaseRidesOutEndpointOutage(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	viaEndpoint := sandboxtest.Kube(t) // the kubeconfig's client: through the endpoint
	direct := sb.Kube()
	const endpointNode = "prod-control-plane-1"

	var logs sandboxtest.SyncBuffer

	l, err := lease.Acquire(ctx, viaEndpoint, lease.Options{
		Namespace: "default", Name: "outage", Holder: "outage-run", Duration: 15 * time.Second, Heartbeat: 200 * time.Millisecond,
		Logf: func(f string, a ...any) { fmt.Fprintf(&logs, f+"\n", a...) },
	})
	if err != nil {
		t.Fatal(err)
	}

	l.Start(ctx)
	defer l.Stop()

	reboot := func() {
		sandboxtest.PatchNode(t, direct, endpointNode, map[string]any{
			"metadata": map[string]any{"annotations": map[string]any{object.OwnerAnnotation: "outage-run"}},
			"spec":     map[string]any{"unschedulable": true},
		})

		m, _ := sb.Fleet().Machine(endpointNode)
		boot := m.BootID()

		if _, err := sb.Do(ctx, "reboot", sandbox.Request{Node: endpointNode}); err != nil {
			t.Fatal(err)
		}

		sandboxtest.Eventually(t, 60*time.Second, "endpoint node back", func() error {
			if b := m.BootID(); b == "" || b == boot {
				return errors.New("rebooting")
			}

			return nil
		})

		sandboxtest.PatchNode(t, direct, endpointNode, map[string]any{
			"metadata": map[string]any{"annotations": map[string]any{object.OwnerAnnotation: nil}},
			"spec":     map[string]any{"unschedulable": false},
		})
	}

	reboot()

	sandboxtest.Eventually(t, 15*time.Second, "the Lease is renewed after the outage", func() error {
		if !strings.Contains(logs.String(), "the API is back and the Lease still names us") {
			return errors.New("not yet")
		}

		return l.Assert()
	})

	if !strings.Contains(logs.String(), "api-unreachable") {
		t.Fatalf("no renewal failed during the outage:\n%s", logs.String())
	}

	// Negative control: someone takes the Lease while ours cannot renew.
	cur, _ := direct.CoordinationV1().Leases("default").Get(ctx, "outage", metav1.GetOptions{})
	cur.Spec.HolderIdentity = ptr.To("usurper")

	if _, err := direct.CoordinationV1().Leases("default").Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	var le *lease.Error

	sandboxtest.Eventually(t, 10*time.Second, "the Lease is lost to another holder", func() error {
		if err := l.Assert(); !errors.As(err, &le) || le.Class != lease.HeldByAnother {
			return fmt.Errorf("assert: %v", err)
		}

		return nil
	})

	if le.Holder != "usurper" || !strings.Contains(le.Error(), "same_holder=false") {
		t.Fatalf("diagnostic: %v", le)
	}

	if got := sb.Fleet().Stats().UnsafeWrites; got != 0 {
		t.Fatalf("unsafe writes: %d", got)
	}
}

// Between a pull secret's read and its write, the Lease is read again: a Lease another holder
// took (or that was deleted) since the heartbeat's last renewal writes nothing, and every later
// write stops too. The negative control: another write to the Lease that keeps this run as its
// holder (what a renewal looks like) does not stop the write.
func TestLeaseLossDuringSecretReadStopsBeforePatch(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	kube := sb.Kube()

	for _, tc := range []struct {
		name  string
		touch func(l *coordinationv1.Lease) // nil: delete it
		lost  bool
	}{
		{"taken by another holder", func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("intruder") }, true},
		{"deleted", nil, true},
		{"renewed, still ours", func(l *coordinationv1.Lease) { l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now())) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leaseName := "secret-race-" + strings.ReplaceAll(tc.name, " ", "-")
			leaseName = strings.ReplaceAll(leaseName, ",", "")
			leases := kube.CoordinationV1().Leases("flux-system")

			t.Cleanup(func() { _ = leases.Delete(context.Background(), leaseName, metav1.DeleteOptions{}) })

			r := newRotation(t, sb, func(s string) string { return strings.Replace(s, `"ghcr-auth-refresh"`, `"`+leaseName+`"`, 1) }, "prod-worker-1")
			path := r.plan()

			before, err := kube.CoreV1().Secrets("team-a").Get(ctx, "ghcr-pull", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}

			res, err := applyCfg(ctx, applyOptions{ConfigPath: r.cfg, PlanPath: path, Logger: hclog.NewNullLogger(),
				SecretHooks: secretwrite.Hooks{BetweenReadAndWrite: func(ns, name string, attempt int) {
					if ns != "team-a" || attempt != 0 {
						return
					}

					if tc.touch == nil {
						if err := leases.Delete(ctx, leaseName, metav1.DeleteOptions{}); err != nil {
							t.Error(err)
						}

						return
					}

					l, err := leases.Get(ctx, leaseName, metav1.GetOptions{})
					if err == nil {
						tc.touch(l)
						_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
					}

					if err != nil {
						t.Error(err)
					}
				}},
			})
			if err != nil {
				t.Fatal(err)
			}

			after, err := kube.CoreV1().Secrets("team-a").Get(ctx, "ghcr-pull", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}

			var teamA secretwrite.Result

			for _, s := range res.Secrets {
				if s.Namespace == "team-a" {
					teamA = s
				}
			}

			written := string(after.Data[corev1.DockerConfigJsonKey]) != string(before.Data[corev1.DockerConfigJsonKey])

			if !tc.lost {
				if !written || teamA.Outcome != secretwrite.Written || res.ReleaseErr != nil {
					t.Fatalf("the control: %+v, release %v", teamA, res.ReleaseErr)
				}

				return
			}

			if written || teamA.Outcome != secretwrite.Failed || !strings.Contains(teamA.Message, "held-by-another") {
				t.Fatalf("a write after the Lease was lost: written %t, %+v", written, teamA)
			}

			for _, s := range res.Secrets { // the node templates were written before the nodes
				if s.Outcome == secretwrite.Written && s.Role != plan.RoleTemplate {
					t.Errorf("written after the Lease was lost: %+v", s)
				}
			}

			if res.SafeToRevoke() || res.ReleaseErr == nil {
				t.Fatalf("a run that lost its Lease: release %v, verdict %+v", res.ReleaseErr, res.Verdict)
			}
		})
	}
}

// A Lease that is gone when the run comes to release it is reported — nothing is held, but the
// mutual exclusion was not known to hold to the end — and the run does not exit 0; `release`
// of a dead run's Lease that no longer exists counts it released. The negative control: the same
// run with the Lease in place releases it without a word.
func TestDeletedLeaseIsReportedDuringRelease(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	leases := kube.CoordinationV1().Leases("default")

	l, err := lease.Acquire(ctx, kube, lease.Options{Namespace: "default", Name: "deleted-before-release", Holder: "ours", Duration: time.Minute, Heartbeat: time.Minute})
	if err != nil {
		t.Fatal(err)
	}

	l.Start(ctx)

	if err := leases.Delete(ctx, "deleted-before-release", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	if err := l.Release(ctx); !lease.IsDeleted(err) || !strings.Contains(err.Error(), "another run could have acquired it") {
		t.Fatalf("release of a deleted Lease: %v", err)
	}

	for _, deleteIt := range []bool{true, false} {
		t.Run(map[bool]string{true: "deleted before the release", false: "in place"}[deleteIt], func(t *testing.T) {
			leaseName := fmt.Sprintf("deleted-run-%t", deleteIt)
			t.Cleanup(func() {
				_ = kube.CoordinationV1().Leases("flux-system").Delete(context.Background(), leaseName, metav1.DeleteOptions{})
			})

			r := newRotation(t, sb, func(s string) string { return strings.Replace(s, `"ghcr-auth-refresh"`, `"`+leaseName+`"`, 1) }, "prod-worker-1")
			path := r.plan()

			res, err := r.apply(path, apply.Hooks{BeforeRoot: func() {
				if deleteIt {
					if err := kube.CoordinationV1().Leases("flux-system").Delete(ctx, leaseName, metav1.DeleteOptions{}); err != nil {
						t.Error(err)
					}
				}
			}})
			if err != nil {
				t.Fatal(err)
			}

			var out strings.Builder
			if err := view.NewApply(view.Streams{Out: &out}).Result(res, nil); err != nil {
				t.Fatal(err)
			}

			if !deleteIt {
				if res.ReleaseErr != nil || !strings.Contains(out.String(), "Lease released") {
					t.Fatalf("the control: %v\n%s", res.ReleaseErr, out.String())
				}

				return
			}

			if !lease.IsDeleted(res.ReleaseErr) || !strings.Contains(out.String(), "The run's Lease was gone before its release") ||
				strings.Contains(out.String(), "Lease released") || len(res.Held()) != 0 {
				t.Fatalf("a run whose Lease was deleted: %v\n%s", res.ReleaseErr, out.String())
			}
		})
	}
}

// A Lease the API server refuses to create fails the run before anything is touched, and the
// error names the Lease, the step and the API's answer. The negative control: the same policy
// on another Lease name, and the run acquires its own.
func TestSynchronizationLeaseAcquisitionReportsTheAPICause(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Get(t)
	kube := sb.Kube()
	leases := kube.CoordinationV1().Leases("flux-system")
	const ours = "acquire-refused"

	dryRunCreate := func(name string) func() error {
		return func() error {
			_, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})

			return err
		}
	}

	for _, tc := range []struct{ name, deny string }{{"its Lease refused", ours}, {"another Lease refused", "not-ours"}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { _ = leases.Delete(context.Background(), ours, metav1.DeleteOptions{}) })

			r := newRotation(t, sb, func(s string) string { return strings.Replace(s, `"ghcr-auth-refresh"`, `"`+ours+`"`, 1) }, "prod-worker-1")
			path := r.plan()

			denyByPolicy(t, kube, "leases", admissionregistrationv1.Create, "flux-system", tc.deny, "leases are frozen", dryRunCreate(tc.deny))

			res, err := r.apply(path, apply.Hooks{})

			if tc.deny != ours {
				if err != nil || r.result(res, "prod-worker-1").Outcome != state.OutcomeDone {
					t.Fatalf("the control: %v", err)
				}

				return
			}

			if err == nil || !strings.Contains(err.Error(), "create lease flux-system/"+ours) || !strings.Contains(err.Error(), "leases are frozen") {
				t.Fatalf("a refused Lease: %v", err)
			}

			if n := node(t, sb, "prod-worker-1"); n.Annotations[object.OwnerAnnotation] != "" || n.Spec.Unschedulable {
				t.Fatal("a run without its Lease touched a node")
			}
		})
	}
}
