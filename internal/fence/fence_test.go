package fence_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	goldenfile "github.com/ghcrsync/ghcrsync/internal/golden"

	"github.com/ghcrsync/ghcrsync/internal/fence"
	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) *time.Time { t := now.Add(-d); return &t }

const (
	dead  = "9f8e7d6c5b4a3928-gh41.1-runner-7-aa11bb"
	alive = "9f8e7d6c5b4a3928-gh42.1-runner-8-cc22dd"
	local = "9f8e7d6c5b4a3928-local-laptop-4242-beef"
)

// observation covers: a terminated run's fences (a node in a Talos phase still rebooting, an
// admin-cordoned node, a node gone, a state-only record), a run still in progress, a local run
// with no liveness evidence, an unreachable liveness API, and the Lease of the terminated run.
func observation() fence.Observation {
	return fence.Observation{
		Now: now, ConfigPath: "/etc/ghcrsync/ghcrsync.hcl",
		Nodes: []fence.NodeObs{
			{Name: "prod-worker-1", Exists: true, UID: "u1", Owner: dead, Phase: "drained", Cordoned: true, ScaleDownGuard: true, Ready: true,
				Record: &state.Fence{UID: "u1"}},
			{Name: "prod-worker-2", Exists: true, UID: "u2", Owner: dead, Phase: "rebooting", Cordoned: true, Ready: false, Lifecycle: true,
				Record: &state.Fence{UID: "u2"}},
			{Name: "prod-worker-3", Exists: true, UID: "u3", Owner: dead, Phase: "claimed", Cordoned: true, Ready: true,
				Record: &state.Fence{UID: "u3", WasCordoned: true}},
			{Name: "autoscale-cx43-0011223344556677", StateRecord: &state.Record{Node: "autoscale-cx43-0011223344556677", Owner: dead, Phase: state.PhaseDrained}},
			{Name: "prod-worker-4", Exists: true, UID: "u4", Owner: alive, Phase: "guarded", Cordoned: true, Ready: true},
			{Name: "prod-worker-5", Exists: true, UID: "u5", Owner: local, Phase: "drained", Cordoned: true, Ready: true},
			{Name: "prod-worker-6", Exists: true, UID: "u6", Owner: "9f8e7d6c5b4a3928-gh43.2-runner-9-ee33ff", Phase: "drained", Cordoned: true, Ready: true},
		},
		Lease:           &fence.LeaseObs{Namespace: "flux-system", Name: "ghcr-auth-refresh", Holder: dead, RenewTime: at(5 * time.Minute), Duration: 2 * time.Minute, Transitions: 3},
		SecretsInFlight: []state.SecretRecord{{Namespace: "team-a", Name: "ghcr-pull", Role: "consumer", DesiredRevision: "9f8e7d6c5b4a3928170", Outcome: "writing"}},
		Verdicts: map[string]fence.Verdict{
			dead:  {Checked: true, Terminal: true, Evidence: "GitHub Actions run 41 attempt 1 of org/fleet is completed"},
			alive: {Checked: true, Evidence: "GitHub Actions run 42 attempt 1 of org/fleet is in_progress"},
			local: {Evidence: `run ref "local" is not a GitHub Actions run (gh<run id>.<attempt>)`},
			"9f8e7d6c5b4a3928-gh43.2-runner-9-ee33ff": {Err: errors.New("GitHub Actions API https://api.github.com unreachable: dial tcp: i/o timeout")},
		},
	}
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	goldenfile.Check(t, filepath.Join("testdata", name), got)
}

func TestFencesGolden(t *testing.T) {
	rep := fence.Classify(observation())

	var js, human bytes.Buffer
	if err := view.NewFences(view.Streams{Out: &js, JSON: true}).Report(rep); err != nil {
		t.Fatal(err)
	}

	_ = view.NewFences(view.Streams{Out: &human}).Report(rep)
	golden(t, "fences.json", js.Bytes())
	golden(t, "fences.txt", human.Bytes())

	if last := rep.Fences[len(rep.Fences)-1]; last.Kind != fence.KindLease {
		t.Fatal("the Lease is not last in release order")
	}
}

func TestLiveLeaseAndForce(t *testing.T) {
	o := observation()
	o.Lease.RenewTime = at(10 * time.Second) // live

	for _, f := range fence.Classify(o).Fences {
		if f.Holder == dead && (f.Releasable || !f.Live) {
			t.Fatalf("a fence of a holder with a live Lease is releasable: %+v", f)
		}
	}

	o.Holder, o.Force = dead, true
	for _, f := range fence.Classify(o).Fences {
		if f.Holder == dead && (!f.Releasable || !strings.Contains(f.Reason, "--force")) {
			t.Fatalf("--force with the holder: %+v", f)
		}
	}

	// Without evidence, naming the holder is what makes a local run's fence releasable.
	o = observation()
	o.Holder = local

	for _, f := range fence.Classify(o).Fences {
		if f.Holder == local && !f.Releasable {
			t.Fatalf("explicit holder: %+v", f)
		}
	}
}

// Values read from the cluster are shell-quoted in printed commands: a hostile owner annotation
// and node name survive a real shell as single arguments and execute nothing. A value with a
// newline gets no command at all, and cannot break the output's lines.
func TestCommandsResistInjection(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "pwned")
	hostile := "x'; touch " + marker + "; echo '$(touch " + marker + ")`touch " + marker + "` \"quoted\" \\ *"

	o := fence.Observation{
		Now: now, ConfigPath: "/tmp/my config's/ghcrsync.hcl", Holder: hostile,
		Nodes: []fence.NodeObs{{Name: "node $(touch " + marker + ")", Exists: true, UID: "u", Owner: hostile, Phase: "drained", Cordoned: true, Ready: true}},
	}

	rep := fence.Classify(o)
	if len(rep.Fences) != 1 || rep.Fences[0].Command == "" {
		t.Fatalf("no command: %+v", rep.Fences)
	}

	script := "ghcrsync() { for a in \"$@\"; do printf '%s\\0' \"$a\"; done; }\n" + rep.Fences[0].Command

	out, err := exec.Command("sh", "-c", script).Output()
	if err != nil {
		t.Fatalf("sh: %v", err)
	}

	args := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	want := []string{"release", "--config", o.ConfigPath, "--node", o.Nodes[0].Name, "--holder", hostile}

	if strings.Join(args, "|") != strings.Join(want, "|") {
		t.Fatalf("the shell parsed %q\nwant %q", args, want)
	}

	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the printed command executed an injected command")
	}

	// A newline: no command, and the output keeps its lines.
	o.Holder = "evil\nnext\"line"
	o.Nodes[0].Owner = o.Holder
	rep = fence.Classify(o)

	if rep.Fences[0].Command != "" {
		t.Fatalf("a command was printed for a value with a newline: %q", rep.Fences[0].Command)
	}

	var human bytes.Buffer
	_ = view.NewFences(view.Streams{Out: &human}).Report(rep)

	for _, line := range strings.Split(human.String(), "\n") {
		if strings.HasPrefix(line, "next") {
			t.Fatalf("a newline in a cluster value broke the output's lines:\n%s", human.String())
		}
	}
}

// A Flux suspension record is judged by what the Kustomization carries now: the run's own
// suspension is a fence judged by its run's liveness; anything else (resumed, a person's, another
// run's, a replaced object) leaves only the record, releasable at once.
func TestFluxFences(t *testing.T) {
	rec := state.Suspension{Namespace: "flux-system", Name: "flux-system", UID: "k1", Owner: dead}
	held := func(by, uid string) plan.KustomizationObs {
		return plan.KustomizationObs{Namespace: "flux-system", Name: "flux-system", Exists: true, UID: uid, Suspended: true, SuspendedBy: by}
	}

	for _, tc := range []struct {
		name       string
		record     state.Suspension
		now        plan.KustomizationObs
		releasable bool
		live       bool
		evidence   string
	}{
		{"suspended by a terminated run", rec, held(dead, "k1"), true, false, "completed"},
		{"suspended by a live run", state.Suspension{Namespace: "flux-system", Name: "flux-system", Owner: alive}, held(alive, "k1"), false, true, "in_progress"},
		{"resumed already", rec, plan.KustomizationObs{Exists: true, UID: "k1"}, true, false, "state record only"},
		{"a person's suspension", rec, held("", "k1"), true, false, "state record only"},
		{"another run's suspension", rec, held(alive, "k1"), true, false, "state record only"},
		{"replaced by another object", rec, held(dead, "k2"), true, false, "state record only"},
		{"deleted", rec, plan.KustomizationObs{}, true, false, "state record only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := observation()
			o.Nodes, o.Lease = nil, nil
			o.Flux = []fence.FluxObs{{Record: tc.record, Now: tc.now}}

			rep := fence.Classify(o)
			if len(rep.Fences) != 1 {
				t.Fatalf("fences: %+v", rep.Fences)
			}

			f := rep.Fences[0]
			if f.Kind != fence.KindFlux || f.Name != "flux-system/flux-system" || f.Releasable != tc.releasable || f.Live != tc.live || !strings.Contains(f.Evidence, tc.evidence) {
				t.Fatalf("got %+v", f)
			}

			// The run's own suspension gets its exact release command (no --node: it is not a
			// node's); a record alone is closed by any release.
			if ours := tc.evidence != "state record only"; ours && f.Releasable && (strings.Contains(f.Command, "--node") || !strings.Contains(f.Command, "--holder")) ||
				!ours && f.Command != "" {
				t.Fatalf("release command %q", f.Command)
			}
		})
	}
}
