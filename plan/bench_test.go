package plan_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/taints"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// fleet builds a snapshot of n nodes (3 control planes, the rest workers, a tenth of them
// autoscaler candidates) and n/10 pull secrets.
func fleet(n int) (plan.Snapshot, plan.Input) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	s := plan.Snapshot{TakenAt: now, APIEndpoint: "10.0.0.1"}

	for i := range n {
		ip := fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)
		node := plan.Node{
			Name: fmt.Sprintf("node-%04d", i), UID: fmt.Sprint(i), ControlPlane: i < 3, Ready: true,
			InternalIP: ip, InternalIPs: []string{ip}, Addresses: []string{ip},
			Taints: []taints.Taint{{Key: "example.com/pool", Value: "a", Effect: "NoSchedule"}},
			Talos:  &plan.TalosFacts{Version: "v1.13.9", ConfiguredDigest: "old", ConfigUpdated: now.Add(-time.Hour), CRIStarted: now.Add(-2 * time.Hour)},
		}

		if i%10 == 9 {
			node.Taints = append(node.Taints, taints.Taint{Key: taints.DeletionCandidate, Value: "1795953086", Effect: "PreferNoSchedule"})
		}

		s.Nodes = append(s.Nodes, node)
	}

	for i := range n / 10 {
		s.Secrets = append(s.Secrets, plan.SecretObs{Namespace: fmt.Sprintf("team-%03d", i), Name: "ghcr-pull", Role: plan.RoleConsumer, Exists: true, Type: "kubernetes.io/dockerconfigjson", Digest: "old"})
	}

	return s, plan.Input{Now: now, TTL: time.Hour, CredentialRevision: "rev", AuthDigest: "new", Registry: "ghcr.io", AutoscalerPolicy: "deselect"}
}

// BenchmarkPlan1000Nodes: planning stays a small, pure computation for a large fleet.
func BenchmarkPlan1000Nodes(b *testing.B) { benchPlan(b, 1000) }

// BenchmarkPlan10000Nodes: the planner at ten times the largest fleet the sandbox benchmarks.
func BenchmarkPlan10000Nodes(b *testing.B) { benchPlan(b, 10000) }

func benchPlan(b *testing.B, n int) {
	s, in := fleet(n)

	b.ReportAllocs()

	for b.Loop() {
		// Every node but the autoscaler candidates (deselected) is fenced: the benchmark is of
		// a plan that acts, not of one that leaves a fleet alone.
		if p := plan.Make(s, in); p.Summary.Fence < n*8/10 {
			b.Fatalf("%d of %d nodes planned to be fenced: the fixture no longer makes nodes the planner acts on", p.Summary.Fence, n)
		}
	}
}

// BenchmarkJudge: the one judgement every guard read runs (a claimed node with a churning
// autoscaler taint, re-read before its Talos write).
func BenchmarkJudge(b *testing.B) {
	s, in := fleet(10)
	p := plan.Make(s, in)
	n := s.Nodes[9]
	n.Owner = "holder-1"
	inv := p.Nodes[len(p.Nodes)-1].Invariants

	for _, np := range p.Nodes {
		if np.Name == n.Name {
			inv = np.Invariants
		}
	}

	b.ReportAllocs()

	for b.Loop() {
		v := plan.Judge(plan.Subject{Node: &n, Planned: &inv, Phase: state.PhaseDrained, Action: plan.ActionFence, Step: plan.StepConfigure, Holder: "holder-1", Desired: "new"})
		if v.Decision == "" {
			b.Fatal("no decision")
		}
	}
}

// BenchmarkEncodeDecode: a 1,000-node plan sealed and verified, as plan --out and apply do.
func BenchmarkEncodeDecode(b *testing.B) {
	s, in := fleet(1000)
	p := plan.Make(s, in)
	key := []byte("0123456789abcdef0123456789abcdef")

	b.ReportAllocs()

	for b.Loop() {
		data, err := plan.Encode(p, key)
		if err != nil {
			b.Fatal(err)
		}

		if _, err := plan.Decode(data, "bench.plan"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSchedulingTaints: the normalisation every guard runs.
func BenchmarkSchedulingTaints(b *testing.B) {
	ts := []taints.Taint{
		{Key: taints.Unschedulable, Effect: "NoSchedule"}, {Key: taints.DeletionCandidate, Value: "1795953086", Effect: "PreferNoSchedule"},
		{Key: taints.NotReady, Effect: "NoExecute"}, {Key: "example.com/pool", Value: "a", Effect: "NoSchedule"},
		{Key: "node-role.kubernetes.io/control-plane", Effect: "NoSchedule"},
	}

	b.ReportAllocs()

	for b.Loop() {
		if len(taints.Scheduling(ts)) != 2 {
			b.Fatal("rule changed")
		}
	}
}
