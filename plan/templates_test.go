package plan

import (
	"testing"
	"time"
)

// The Hetzner autoscaler reads its template once, at start: a rewrite without a restart changes
// nothing it creates, which the plan says once per template block.
func TestStaleReaderWarnings(t *testing.T) {
	hcloud := func(pool, restart string, action TemplateAction) TemplatePlan {
		return TemplatePlan{TemplateObs: TemplateObs{Name: "workers", Namespace: "kube-system", Secret: "hcloud", Key: "HCLOUD_CLUSTER_CONFIG",
			Format: "hcloud-cluster-config", Pool: pool, Restart: restart}, Action: action}
	}

	talos := hcloud("", "", TemplateUpdate)
	talos.Format = "talos"

	for _, tc := range []struct {
		name string
		tps  []TemplatePlan
		want int
	}{
		{"rewritten without a restart, two pools", []TemplatePlan{hcloud("a", "", TemplateUpdate), hcloud("b", "", TemplateUpdate)}, 1},
		{"rewritten with a restart", []TemplatePlan{hcloud("a", "kube-system/cluster-autoscaler", TemplateUpdate)}, 0},
		{"unchanged", []TemplatePlan{hcloud("a", "", TemplateNoOp)}, 0},
		{"a Talos config template", []TemplatePlan{talos}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := staleReaderWarnings(tc.tps); len(got) != tc.want {
				t.Fatalf("%d warnings, want %d: %q", len(got), tc.want, got)
			}
		})
	}
}

// A template read once at start (the Hetzner autoscaler's) is in use only as its reader read it:
// the template's action and its verdict use follow the reader's evidence, the apiserver's times.
func TestTemplateReader(t *testing.T) {
	const digest = "sha256:new"

	written := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	obs := func(format, restart string, reader *ReaderObs, held string) TemplateObs {
		return TemplateObs{Name: "workers", Namespace: "kube-system", Secret: "hcloud", Key: "K", Format: format, Pool: "a",
			Digest: held, Restart: restart, WrittenAt: written, Reader: reader}
	}
	const dep = "kube-system/cluster-autoscaler"

	for _, tc := range []struct {
		name   string
		obs    TemplateObs
		action TemplateAction
		use    UseState
		// rolling: waiting for the reader's rollout is all the template needs (RollingOut).
		rolling bool
	}{
		{"restarted after the write, rolled out", obs("hcloud-cluster-config", dep, &ReaderObs{StartedFrom: written.Add(time.Second), RolledOut: true}, digest), TemplateNoOp, UseNew, false},
		{"restarted in the same second", obs("hcloud-cluster-config", dep, &ReaderObs{StartedFrom: written, RolledOut: true}, digest), TemplateNoOp, UseNew, false},
		{"not restarted since the write", obs("hcloud-cluster-config", dep, &ReaderObs{StartedFrom: written.Add(-time.Hour), RolledOut: true}, digest), TemplateRestart, UseOld, false},
		{"still rolling out", obs("hcloud-cluster-config", dep, &ReaderObs{StartedFrom: written.Add(time.Second)}, digest), TemplateRestart, UseOld, true},
		{"rolling out, a pod from before the write still running", obs("hcloud-cluster-config", dep, &ReaderObs{StartedFrom: written.Add(-time.Hour)}, digest), TemplateRestart, UseOld, false},
		{"rolling out, another credential", obs("hcloud-cluster-config", dep, &ReaderObs{StartedFrom: written.Add(time.Second)}, "sha256:old"), TemplateUpdate, UseOld, false},
		{"its deployment missing", obs("hcloud-cluster-config", dep, &ReaderObs{Missing: true}, digest), TemplateNoOp, UseOld, false},
		{"no restart_deployment", obs("hcloud-cluster-config", "", nil, digest), TemplateNoOp, UseUnknown, false},
		{"another credential: written (and restarted) anyway", obs("hcloud-cluster-config", dep, &ReaderObs{StartedFrom: written.Add(-time.Hour), RolledOut: true}, "sha256:old"), TemplateUpdate, UseOld, false},
		{"a format read at every use", obs("talos", "", nil, digest), TemplateNoOp, UseNew, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := planTemplates([]TemplateObs{tc.obs}, digest); got[0].Action != tc.action {
				t.Errorf("action %s (%s), want %s", got[0].Action, got[0].Reason, tc.action)
			}

			if u := templateUse(tc.obs, digest); u.State != tc.use {
				t.Errorf("use %s (%s), want %s", u.State, u.Why, tc.use)
			}

			if got := (Snapshot{Templates: []TemplateObs{tc.obs}}).ReadersRollingOut(digest); (len(got) == 1) != tc.rolling {
				t.Errorf("rolling out: %v, want %t", got, tc.rolling)
			}
		})
	}
}

// A credential is expiring under ExpiryWarning before its expiry; a zero expiry (not reported)
// never is.
func TestCredentialExpiring(t *testing.T) {
	created := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

	for _, tc := range []struct {
		name string
		at   time.Time
		want bool
	}{
		{"not reported", time.Time{}, false},
		{"a second under 14 days", created.Add(ExpiryWarning - time.Second), true},
		{"exactly 14 days", created.Add(ExpiryWarning), false},
		{"tomorrow", created.Add(24 * time.Hour), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Plan{CreatedAt: created, CredentialExpiresAt: tc.at}
			if got := p.CredentialExpiring(); got != tc.want {
				t.Fatalf("expiring %t, want %t", got, tc.want)
			}
		})
	}
}
