package plan_test

import (
	"bytes"
	"encoding/json"
	goldenfile "github.com/ghcrsync/ghcrsync/internal/golden"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

type goldenInput struct {
	Now                time.Time         `json:"now"`
	TTLSeconds         int               `json:"ttl_seconds"`
	CredentialRevision string            `json:"credential_revision"`
	PullSecretRevision string            `json:"pull_secret_revision"`
	AuthDigest         string            `json:"auth_digest"`
	Registry           string            `json:"registry"`
	ProofSkipped       bool              `json:"proof_skipped"`
	CredentialExpires  time.Time         `json:"credential_expires"`
	IsolatedFrom       []string          `json:"isolated_from"`
	ConfigDigest       string            `json:"config_digest"`
	Exclude            []string          `json:"exclude"`
	SelfNode           string            `json:"self_node"`
	AutoscalerPolicy   string            `json:"autoscaler_policy"`
	State              plan.StateRef     `json:"state"`
	Known              map[string]string `json:"known"`
	SelectedVerdict    bool              `json:"selected_verdict"`
	// Timing overrides the configuration's defaults of the estimate (budget, samples, ...).
	Timing *struct {
		BudgetSeconds     float64        `json:"budget_seconds"`
		ReserveSeconds    float64        `json:"reserve_seconds"`
		WorkerParallelism int            `json:"worker_parallelism"`
		Samples           []state.Sample `json:"samples"`
	} `json:"timing"`
	Rotation *state.Rotation `json:"rotation"`
	// Credential and Tenants: several credentials (tenant credential blocks).
	Credential string                `json:"credential"`
	Tenants    []plan.TenantRotation `json:"tenants"`
	// Keyring: nodes.kubelet_keyring is configured.
	Keyring *plan.KeyringPolicy `json:"keyring"`
}

func load(t *testing.T, dir string) (plan.Snapshot, plan.Input) {
	t.Helper()

	var s plan.Snapshot

	var in goldenInput

	for file, v := range map[string]any{"snapshot.json": &s, "input.json": &in} {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}

		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()

		if err := dec.Decode(v); err != nil {
			t.Fatalf("%s/%s: %v", dir, file, err)
		}
	}

	// The configuration's defaults (internal/config), unless the case sets its own.
	timing := plan.Timing{ExpectedNodeTime: 6 * time.Minute, ExpectedLiveTime: 30 * time.Second, ExpectedKeyringTime: 5*time.Minute + 30*time.Second,
		WorkerParallelism: 1, LiveParallelism: 10,
		DrainTimeout: 45 * time.Minute, Reserve: 2 * time.Minute}

	if x := in.Timing; x != nil {
		timing.Budget, timing.Samples = time.Duration(x.BudgetSeconds*float64(time.Second)), x.Samples
		if x.ReserveSeconds > 0 {
			timing.Reserve = time.Duration(x.ReserveSeconds * float64(time.Second))
		}

		if x.WorkerParallelism > 0 {
			timing.WorkerParallelism = x.WorkerParallelism
		}
	}

	return s, plan.Input{
		Now: in.Now, TTL: time.Duration(in.TTLSeconds) * time.Second, CredentialRevision: in.CredentialRevision, PullSecretRevision: in.PullSecretRevision,
		AuthDigest: in.AuthDigest, Registry: in.Registry, ProofSkipped: in.ProofSkipped, CredentialExpires: in.CredentialExpires, IsolatedFrom: in.IsolatedFrom, ConfigDigest: in.ConfigDigest,
		Exclude: in.Exclude, SelfNode: in.SelfNode, AutoscalerPolicy: in.AutoscalerPolicy, State: in.State, Known: in.Known,
		SelectedVerdict: in.SelectedVerdict, Timing: timing, Rotation: in.Rotation, Credential: in.Credential, Tenants: in.Tenants,
		Keyring: in.Keyring,
	}
}

func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	goldenfile.Check(t, path, got)
}

// Each case is a snapshot and its inputs under testdata/CASE; the expected human and JSON
// renderings sit beside them.
func TestGolden(t *testing.T) {
	t.Setenv("GITHUB_STEP_SUMMARY", "") // the annotations only: no step summary is appended

	dirs, _ := filepath.Glob("testdata/*/snapshot.json")
	if len(dirs) == 0 {
		t.Fatal("no golden cases")
	}

	reasons := map[plan.Reason]bool{}
	actions := map[plan.Action]bool{}

	for _, f := range dirs {
		dir := filepath.Dir(f)

		t.Run(filepath.Base(dir), func(t *testing.T) {
			s, in := load(t, dir)
			p := plan.Make(s, in)

			for _, n := range p.Nodes {
				reasons[n.Reason] = true
				actions[n.Action] = true
			}

			var human, js bytes.Buffer

			var md, gh bytes.Buffer

			for _, r := range []struct {
				out      *bytes.Buffer
				json, md bool
			}{{&human, false, false}, {&js, true, false}, {&md, false, true}} {
				if err := view.NewShow(view.Streams{Out: r.out, JSON: r.json}).Plan(p, r.md); err != nil {
					t.Fatal(err)
				}
			}

			// The annotations plan --output github writes (its step summary goes nowhere here).
			view.NewPlan(view.Streams{Out: &gh, GitHub: true}).Published(p, nil)

			golden(t, filepath.Join(dir, "plan.txt"), human.Bytes())
			golden(t, filepath.Join(dir, "plan.json"), js.Bytes())
			golden(t, filepath.Join(dir, "plan.md"), md.Bytes())
			golden(t, filepath.Join(dir, "plan.github"), gh.Bytes())

			// The planner is a function: the same inputs give the same plan.
			again, _ := json.Marshal(plan.Make(s, in))
			first, _ := json.Marshal(p)

			if !bytes.Equal(first, again) {
				t.Fatal("planning twice gave different plans")
			}
		})
	}

	// These only arise during a run (testdata/judge covers them); a plan cannot give them.
	runOnly := []plan.Reason{plan.ReasonRebooted, plan.ReasonCordonChanged, plan.ReasonTaintsChanged, plan.ReasonConfigChanged, plan.ReasonFenceRemoved, plan.ReasonNeverClaimed, plan.ReasonStagedConfig, plan.ReasonRoleChanged}

	for _, r := range plan.Reasons {
		if !reasons[r] && !slices.Contains(runOnly, r) {
			t.Errorf("no golden case covers reason %s", r)
		}
	}

	for _, a := range []plan.Action{plan.ActionFence, plan.ActionApplyLive, plan.ActionKeyring, plan.ActionNoOp, plan.ActionDeselect} {
		if !actions[a] {
			t.Errorf("no golden case covers action %s", a)
		}
	}
}

// Workers first, then control planes one at a time, the API endpoint's node last.
func TestOrdering(t *testing.T) {
	s, in := load(t, "testdata/rotation")
	p := plan.Make(s, in)

	var acted []plan.NodePlan

	for _, n := range p.Nodes {
		if n.Order > 0 {
			acted = append(acted, n)
		}
	}

	if len(acted) < 4 {
		t.Fatalf("too few nodes acted on: %d", len(acted))
	}

	seenCP := false

	for i, n := range acted {
		if n.Order != i+1 {
			t.Fatalf("order numbers not consecutive: %+v", acted)
		}

		if n.Role == plan.RoleControlPlane {
			seenCP = true
		} else if seenCP {
			t.Fatalf("worker %s ordered after a control plane", n.Name)
		}
	}

	last := acted[len(acted)-1]
	if !last.Endpoint || last.Name != p.EndpointNode || p.EndpointNode != "prod-control-plane-1" {
		t.Fatalf("the API endpoint's node is not last: %+v", last)
	}
}

func TestInvariantsSnapshot(t *testing.T) {
	s, in := load(t, "testdata/rotation")
	p := plan.Make(s, in)

	for _, n := range p.Nodes {
		if n.Name != "prod-worker-2" {
			continue
		}

		inv := n.Invariants
		if inv.UID != "uid-prod-worker-2" || !inv.Unschedulable || inv.BootID != "boot-prod-worker-2" ||
			!slices.Equal(inv.SchedulingTaints, []string{"example.com/maintenance:NoSchedule"}) {
			t.Fatalf("invariants: %+v", inv)
		}

		return
	}

	t.Fatal("prod-worker-2 missing")
}

func TestLiveRegistryAuth(t *testing.T) {
	for v, want := range map[string]bool{"v1.13.9": false, "v1.14.0": true, "1.14.2": true, "v2.0.0": true, "v1.9.5": false} {
		if got, err := plan.ParseTalosVersion(v); err != nil || got.AtLeast(plan.TalosLiveRegistryAuth) != want {
			t.Errorf("%s: %+v %v", v, got, err)
		}
	}

	for _, v := range []string{"", "banana", "v1"} {
		if _, err := plan.ParseTalosVersion(v); err == nil {
			t.Errorf("%q accepted", v)
		}
	}
}

func TestPlanFile(t *testing.T) {
	s, in := load(t, "testdata/rotation")
	p := plan.Make(s, in)
	path := filepath.Join(t.TempDir(), "plan.out")

	if err := plan.Save(path, p, []byte("key")); err != nil {
		t.Fatal(err)
	}

	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("plan file mode %v", fi.Mode())
	}

	got, err := plan.Load(path)
	if err != nil {
		t.Fatal(err)
	}

	a, _ := json.Marshal(p)
	b, _ := json.Marshal(got)

	if !bytes.Equal(a, b) {
		t.Fatal("plan changed through save and load")
	}

	data, _ := os.ReadFile(path)

	for name, edit := range map[string]func(string) string{
		"edited_action":  func(s string) string { return strings.Replace(s, `"action": "fence"`, `"action": "no-op"`, 1) },
		"edited_value":   func(s string) string { return strings.Replace(s, "prod-worker-1", "prod-worker-X", 1) },
		"truncated":      func(s string) string { return s[:len(s)/2] },
		"empty":          func(string) string { return "" },
		"other_checksum": func(s string) string { return strings.Replace(s, "sha256:", "sha256:00", 1) },
	} {
		t.Run(name, func(t *testing.T) {
			bad := filepath.Join(t.TempDir(), "plan.out")
			edited := edit(string(data))

			if edited == string(data) {
				t.Fatal("the edit changed nothing")
			}

			_ = os.WriteFile(bad, []byte(edited), 0o600)

			if _, err := plan.Load(bad); err == nil || !strings.Contains(err.Error(), "the plan file is corrupt or was edited") {
				t.Fatalf("want corrupt, got %v", err)
			}
		})
	}
}
