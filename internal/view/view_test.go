package view_test

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"
	"time"

	goldenfile "github.com/ghcrsync/ghcrsync/internal/golden"
	"github.com/ghcrsync/ghcrsync/internal/secretwrite"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/fence"
	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

func golden(t *testing.T, name string, render func(*bytes.Buffer) error) {
	t.Helper()

	var b bytes.Buffer
	if err := render(&b); err != nil {
		t.Fatal(err)
	}

	goldenfile.Check(t, filepath.Join("testdata", name), b.Bytes())
}

var changed = &plan.Plan{CredentialRevision: "9f8e7d6c5b4a39281706f5e4d3c2b1a0", Summary: plan.Summary{Fence: 3}}

// verdictOf is the verdict of a small cluster: prod-worker-1 rotated and proved, prod-worker-2
// on the old credential (and, when old, an ESO-managed consumer and the root on it too).
func verdictOf(old bool) *plan.Revocation {
	in := plan.Input{CredentialRevision: changed.CredentialRevision, AuthDigest: "a1b2c3d4e5f60718", PullSecretRevision: "5e6f7a8b9c0d1e2f"}
	node := func(name, digest string) plan.Node {
		return plan.Node{Name: name, UID: "uid-" + name, InternalIPs: []string{"10.0.0." + name[len(name)-1:]}, Ready: true, BootID: "boot-" + name, VerifiedRevision: in.CredentialRevision,
			VerifiedBoot: "boot-" + name, Talos: &plan.TalosFacts{Version: "v1.13.9", ConfiguredDigest: digest}}
	}

	s := plan.Snapshot{
		Nodes: []plan.Node{node("prod-worker-1", in.AuthDigest), node("prod-worker-2", in.AuthDigest)},
		Secrets: []plan.SecretObs{
			{Namespace: "team-a", Name: "ghcr-pull", Role: plan.RoleConsumer, Exists: true, Type: "kubernetes.io/dockerconfigjson", Digest: in.PullSecretRevision},
			{Namespace: "flux-system", Name: "ghcr-auth", Role: plan.RoleRoot, Exists: true, Type: "kubernetes.io/dockerconfigjson", Digest: in.PullSecretRevision},
		},
		Templates: []plan.TemplateObs{{Name: "hcloud", Namespace: "kube-system", Secret: "hcloud-cluster-config", Key: "HCLOUD_CLUSTER_CONFIG", Pool: "cx43", Digest: in.AuthDigest}},
	}

	if old {
		s.Nodes[1] = node("prod-worker-2", "0ld0ld0ld0ld0ld0")
		s.Nodes[1].VerifiedRevision = ""
		s.Secrets = append(s.Secrets, plan.SecretObs{Namespace: "team-b", Name: "ghcr-pull", Role: plan.RoleConsumer, Exists: true,
			Type: "kubernetes.io/dockerconfigjson", Digest: "0ld5ecre70ld5ecr", Foreign: "External Secrets (reconcile.external-secrets.io/managed=true)"})
		s.Secrets[1].Digest = "0ld5ecre70ld5ecr"
	}

	v := plan.Inventory(s, in)

	return &v
}

func applyResult() *apply.Result {
	return &apply.Result{
		Plan:   changed,
		Holder: "9f8e7d6c5b4a3928-gh123.1-runner-4242-beef",
		Nodes: []apply.NodeResult{
			{Node: "prod-worker-1", Action: plan.ActionFence, Outcome: state.OutcomeDone, Message: "rotated: boot 1a2b3c4d5e6f… → 6f5e4d3c2b1a…, runtime proved, fence released",
				Timings: []apply.Timing{
					{Step: "claim", Duration: 40 * time.Millisecond}, {Step: "guard", Duration: 12 * time.Millisecond},
					{Step: "drain", Duration: 2100 * time.Millisecond}, {Step: "configure", Duration: 180 * time.Millisecond},
					{Step: "reboot", Duration: 30 * time.Millisecond}, {Step: "ready", Duration: 6420 * time.Millisecond},
					{Step: "prove", Duration: 610 * time.Millisecond}, {Step: "release", Duration: 25 * time.Millisecond},
				}},
			{Node: "autoscale-1", Action: plan.ActionFence, Outcome: state.OutcomeDeselected, Reason: plan.ReasonAutoscalerDeleting,
				Message: "deselected autoscale-1: the cluster autoscaler is deleting it (ToBeDeletedByClusterAutoscaler since 2026-11-29 11:51:40Z); its fence was released"},
			{Node: "prod-worker-2", Action: plan.ActionFence, Outcome: state.OutcomeFailed, Reason: plan.ReasonTaintsChanged,
				Message: "refusing to configure prod-worker-2: its taints changed outside ghcrsync: + example.com/maintenance:NoSchedule"},
		},
		Secrets: []secretwrite.Result{
			{Namespace: "team-a", Secret: "ghcr-pull", Role: plan.RoleConsumer, Outcome: secretwrite.Written, Message: "written and read back"},
			{Namespace: "flux-system", Secret: "ghcr-auth", Role: plan.RoleRoot, Outcome: secretwrite.HeldBack, Message: "the root Flux secret keeps its old credential: 1 part(s) of this run failed"},
		},
		Reclaimed: []fence.Outcome{{Fence: fence.Fence{Kind: fence.KindLease, Name: "flux-system/ghcr-auth-refresh", Holder: "dead-run"}, Released: true, Message: "Lease released"}},
		Verdict:   verdictOf(true),
		Flux: []apply.FluxResult{
			{Kustomization: "flux-system/flux-system", Suspended: true, Resumed: true, Message: "suspended for the run, resumed: Flux applies Git again"},
			{Kustomization: "flux-system/apps", Suspended: true, Left: true, Message: "LEFT SUSPENDED: the API is unreachable; `ghcrsync release` resumes it"},
			{Kustomization: "flux-system/infra", Message: "suspended already, not by ghcrsync: left suspended, and not resumed at the end"},
		},
	}
}

func TestApplyView(t *testing.T) {
	golden(t, "apply.txt", func(b *bytes.Buffer) error { return view.Apply(b, view.Human, applyResult()) })
	golden(t, "apply.json", func(b *bytes.Buffer) error { return view.Apply(b, view.JSON, applyResult()) })
	golden(t, "apply_timings.txt", func(b *bytes.Buffer) error { view.ApplyTimings(b, applyResult()); return nil })

	lost := applyResult()
	lost.Nodes, lost.Secrets, lost.ReleaseErr = lost.Nodes[:1], nil, errors.New("lease held-by-another: ours=a holder=b")
	golden(t, "apply_lease_not_released.txt", func(b *bytes.Buffer) error { return view.Apply(b, view.Human, lost) })

	budget := &apply.Result{Plan: changed, Holder: "h", MaxFailures: 1, Nodes: []apply.NodeResult{
		{Node: "prod-worker-1", Action: plan.ActionFence, Outcome: state.OutcomeFailed, Fenced: true,
			Message: "not proved: the container runtime of prod-worker-1 cannot pull ghcr.io/acme/probe:latest; the fence stays in place (see `ghcrsync fences`)"},
		{Node: "prod-worker-2", Action: plan.ActionFence, Outcome: state.OutcomeSkipped, Message: "not started: the failure budget is spent (nodes.max_failures = 1)"},
		{Node: "prod-worker-3", Action: plan.ActionFence, Outcome: state.OutcomeSkipped, Message: "not started: the failure budget is spent (nodes.max_failures = 1)"},
	}}
	golden(t, "apply_budget.txt", func(b *bytes.Buffer) error { return view.Apply(b, view.Human, budget) })

	cancelled := &apply.Result{Plan: changed, Holder: "h", Cancelled: true, ConfigPath: "/srv/ci config/ghcrsync.hcl", Nodes: []apply.NodeResult{
		{Node: "prod-worker-1", Action: plan.ActionFence, Outcome: state.OutcomeCancelled, Fenced: true,
			Message: "cancelled after its Talos config was written: the fence stays, recorded at phase rebooting (release it with `ghcrsync release`)"},
		{Node: "prod-worker-2", Action: plan.ActionFence, Outcome: state.OutcomeCancelled,
			Message: "cancelled before its Talos write: its claim was undone (cordon restored as recorded)"},
		{Node: "prod-worker-3", Action: plan.ActionFence, Outcome: state.OutcomeSkipped, Message: "not started: the run was cancelled"},
	}}
	cancelled.VerdictErr = errors.New("the cluster could not be read to judge whether the old credential is still used: list nodes: connection refused")
	golden(t, "apply_cancelled.txt", func(b *bytes.Buffer) error { return view.Apply(b, view.Human, cancelled) })
	golden(t, "apply_cancelled.json", func(b *bytes.Buffer) error { return view.Apply(b, view.JSON, cancelled) })

	none := &apply.Result{Plan: &plan.Plan{CredentialRevision: "9f8e7d6c5b4a3928"}, Verdict: verdictOf(false)}
	golden(t, "apply_no_changes.txt", func(b *bytes.Buffer) error { return view.Apply(b, view.Human, none) })
	golden(t, "apply_no_changes.json", func(b *bytes.Buffer) error { return view.Apply(b, view.JSON, none) })

	// The step summary and the annotations carry the verdict too.
	golden(t, "apply.md", func(b *bytes.Buffer) error { view.ApplyMarkdown(b, applyResult()); return nil })
	golden(t, "apply_safe.md", func(b *bytes.Buffer) error { view.ApplyMarkdown(b, none); return nil })

	// Only a pull secret failed (the root held back): the summary's head says so, as the exit
	// code does (Result.Counts, once).
	secretOnly := applyResult()
	secretOnly.Nodes, secretOnly.Flux = secretOnly.Nodes[:1], nil
	golden(t, "apply_secret_failed.md", func(b *bytes.Buffer) error { view.ApplyMarkdown(b, secretOnly); return nil })

	if secretOnly.Failed() != 1 {
		t.Fatalf("a run whose only failure is its held-back root counts %d failures", secretOnly.Failed())
	}
	golden(t, "apply.github", func(b *bytes.Buffer) error { view.ApplyAnnotations(b, applyResult()); return nil })
	golden(t, "apply_safe.github", func(b *bytes.Buffer) error { view.ApplyAnnotations(b, none); return nil })
}

func recovery(dryRun bool) *fence.RecoveryResult {
	wasCordoned := false
	node := fence.Fence{Kind: fence.KindNode, Name: "prod-worker-1", Holder: "9f8e7d6c5b4a3928-gh123.1-runner-4242-beef", Phase: "drained",
		Releasable: true, Reason: "held by a terminated run: releasable", Exists: true, Cordoned: true, WasCordoned: &wasCordoned,
		Evidence: "GitHub Actions run 123 attempt 1 of acme/platform is completed"}
	lease := fence.Fence{Kind: fence.KindLease, Name: "flux-system/ghcr-auth-refresh", Holder: node.Holder, Releasable: true,
		Reason: node.Reason, Exists: true, Evidence: "renewed 3m0s ago (duration 2m0s, transitions 1); " + node.Evidence}

	res := &fence.RecoveryResult{DryRun: dryRun, Report: fence.Report{Fences: []fence.Fence{node, lease}, Summary: "2 fences held by a terminated run: releasable."}}
	if !dryRun {
		res.Outcomes = []fence.Outcome{{Fence: node, Released: true, Message: "released and uncordoned"}, {Fence: lease, Message: "not released: the Lease was taken by another holder"}}
	}

	return res
}

func TestReleaseView(t *testing.T) {
	golden(t, "release.txt", func(b *bytes.Buffer) error { return view.Release(b, view.Human, recovery(false)) })
	golden(t, "release.json", func(b *bytes.Buffer) error { return view.Release(b, view.JSON, recovery(false)) })
	golden(t, "release_dry_run.txt", func(b *bytes.Buffer) error { return view.Release(b, view.Human, recovery(true)) })
	golden(t, "release_nothing.txt", func(b *bytes.Buffer) error {
		return view.Release(b, view.Human, &fence.RecoveryResult{Report: fence.Report{Fences: []fence.Fence{}, Summary: "No fence is held."}})
	})
}

func TestStateListView(t *testing.T) {
	started := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	st := &state.State{FormatVersion: state.FormatVersion, Lineage: "4f7c8a2e-1b3d-4c5e-8f9a-0b1c2d3e4f5a", Serial: 17,
		Run: &state.Run{Holder: "9f8e7d6c5b4a3928-gh123.1-runner-4242-beef", CredentialRevision: "9f8e7d6c5b4a3928", Started: started, Outcome: "failed"},
		Records: []state.Record{
			{Node: "prod-worker-1", Owner: "h", Action: "fence", Phase: state.PhaseReleased, Fence: state.Fence{UID: "u1", InitialTaints: []string{}}, Started: started, Updated: started, Outcome: state.OutcomeDone},
			{Node: "prod-worker-2", Owner: "h", Action: "fence", Phase: state.PhaseDrained, Fence: state.Fence{UID: "u2", InitialTaints: []string{}}, Started: started, Updated: started,
				Outcome: state.OutcomeFailed, LastError: "refusing to configure prod-worker-2: its taints changed outside ghcrsync:\n+ example.com/maintenance:NoSchedule"},
		}}

	golden(t, "state_list.txt", func(b *bytes.Buffer) error {
		return view.StateList(b, view.Human, st, "local file /srv/ghcrsync.state.json")
	})
	golden(t, "state_list.json", func(b *bytes.Buffer) error {
		return view.StateList(b, view.JSON, st, "local file /srv/ghcrsync.state.json")
	})
}
