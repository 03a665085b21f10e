package plan

import (
	"errors"
	"strings"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/taints"
)

// The destination rule before each eviction (PARITY H7, H8): every node an evicted pod can be
// scheduled onto must pull; tainted and cordoned nodes take no pod, so they count neither as
// capacity nor as a danger.
func TestCheckDestinations(t *testing.T) {
	const rev = "rev1"

	emergency := []CredentialInUse{
		{Digest: "old", Nodes: []string{"stale"}, State: CredentialRefused},
		{Digest: "new", Desired: true, Nodes: []string{"current"}, State: CredentialValid},
	}
	ordinary := []CredentialInUse{{Digest: "old", Nodes: []string{"stale"}, State: CredentialValid}}
	// The new credential in every config (pushed to "pushed" without a reboot), the old one
	// refused where a node still holds it.
	pushed := []CredentialInUse{
		{Digest: "old", Nodes: []string{"stale"}, State: CredentialRefused},
		{Digest: "new", Desired: true, Nodes: []string{"current", "pushed"}, State: CredentialValid},
	}

	ready := func(name string) Destination { return Destination{Name: name, Ready: true} }
	hard := Destination{Name: "stale", Ready: true, Taints: []taints.Taint{{Key: taints.Steering, Effect: taints.NoSchedule}}}
	soft := Destination{Name: "stale", Ready: true, Taints: []taints.Taint{{Key: taints.Steering, Effect: taints.PreferNoSchedule}}}
	proved := Destination{Name: "stale", Ready: true, VerifiedRevision: rev, VerifiedBoot: "b2", BootID: "b2"}
	provedEarlierBoot := Destination{Name: "stale", Ready: true, VerifiedRevision: rev, VerifiedBoot: "b1", BootID: "b2"}

	for _, tc := range []struct {
		name         string
		inUse        []CredentialInUse
		effect       string
		allowPending bool
		stale        []string // the plan's StaleRuntimes
		pods         int
		ds           []Destination
		refuse       string // "" passes
		wait         bool   // the refusal is one the drain waits out (ErrUncordonLag)
	}{
		{name: "ordinary_everyone_pulls", inUse: ordinary, effect: taints.PreferNoSchedule, pods: 2, ds: []Destination{ready("drained"), soft}},
		{name: "stale_schedulable_peer_refuses", inUse: emergency, effect: taints.NoSchedule, pods: 1, ds: []Destination{ready("drained"), ready("current"), ready("stale")}, refuse: "onto stale"},
		{name: "soft_taint_still_takes_pods", inUse: emergency, effect: taints.NoSchedule, pods: 1, ds: []Destination{ready("current"), soft}, refuse: "onto stale"},
		{name: "hard_tainted_peer_does_not_count", inUse: emergency, effect: taints.NoSchedule, pods: 1, ds: []Destination{ready("current"), hard}},
		{name: "cordoned_peer_does_not_count", inUse: emergency, effect: taints.NoSchedule, pods: 1, ds: []Destination{ready("current"), {Name: "stale", Ready: true, Unschedulable: true}}},
		{name: "not_ready_peer_does_not_count", inUse: emergency, effect: taints.NoSchedule, pods: 1, ds: []Destination{ready("current"), {Name: "stale"}}},
		{name: "proved_this_boot_pulls", inUse: emergency, effect: taints.NoSchedule, pods: 1, ds: []Destination{proved}},
		{name: "proved_on_an_earlier_boot_does_not", inUse: emergency, effect: taints.NoSchedule, pods: 1, ds: []Destination{provedEarlierBoot}, refuse: "refused by the registry"},
		{name: "unknown_node_in_an_emergency", inUse: emergency, effect: taints.NoSchedule, pods: 1, ds: []Destination{ready("joined")}, refuse: "not known to pull"},
		{name: "unknown_node_ordinarily_pulls", inUse: ordinary, effect: taints.PreferNoSchedule, pods: 1, ds: []Destination{ready("joined")}},
		{name: "nowhere_to_go", inUse: emergency, effect: taints.NoSchedule, pods: 1, ds: []Destination{hard}, refuse: "wait Pending"},
		{name: "nowhere_to_go_allowed", inUse: emergency, effect: taints.NoSchedule, allowPending: true, pods: 1, ds: []Destination{hard}},
		{name: "nothing_to_evict", inUse: emergency, effect: taints.NoSchedule, pods: 0, ds: []Destination{hard}},
		// H7's residual: an untainted, Ready, schedulable node whose config holds the new
		// credential (an operator pushed it with --mode=no-reboot) while its runtime still runs
		// with what it booted with, in an emergency: it takes pods and cannot be known to pull.
		{name: "untainted_stale_runtime_in_an_emergency", inUse: pushed, stale: []string{"pushed"}, effect: taints.NoSchedule, pods: 1,
			ds: []Destination{ready("current"), ready("pushed")}, refuse: "still uses the credential it booted with"},
		{name: "stale_runtime_proved_this_boot_pulls", inUse: pushed, stale: []string{"pushed"}, effect: taints.NoSchedule, pods: 1,
			ds: []Destination{ready("current"), {Name: "pushed", Ready: true, VerifiedRevision: rev, VerifiedBoot: "b2", BootID: "b2"}}},
		// I4: the seed just uncordoned, its cordon's mirror taint not yet taken off: the check
		// waits (asked again) instead of refusing; a node still cordoned is refused.
		{name: "uncordoned_seed_mirror_taint_lingers_waits", inUse: emergency, effect: taints.NoSchedule, pods: 1,
			ds: []Destination{hard, {Name: "current", Ready: true, Taints: []taints.Taint{{Key: taints.Unschedulable, Effect: taints.NoSchedule}}}}, refuse: "the eviction waits", wait: true},
		{name: "cordoned_node_with_the_mirror_taint_refuses", inUse: emergency, effect: taints.NoSchedule, pods: 1,
			ds: []Destination{hard, {Name: "current", Ready: true, Unschedulable: true, Taints: []taints.Taint{{Key: taints.Unschedulable, Effect: taints.NoSchedule}}}}, refuse: "wait Pending"},
		{name: "mirror_taint_and_another_hard_taint_refuses", inUse: emergency, effect: taints.NoSchedule, pods: 1,
			ds: []Destination{{Name: "current", Ready: true, Taints: []taints.Taint{{Key: taints.Unschedulable, Effect: taints.NoSchedule}, {Key: "x", Effect: taints.NoSchedule}}}}, refuse: "wait Pending"},
		{name: "stale_runtime_cordoned_takes_nothing", inUse: pushed, stale: []string{"pushed"}, effect: taints.NoSchedule, pods: 1,
			ds: []Destination{ready("current"), {Name: "pushed", Ready: true, Unschedulable: true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Plan{CredentialRevision: rev, CredentialsInUse: tc.inUse, StaleRuntimes: tc.stale, Steering: Steering{Effect: tc.effect, AllowPending: tc.allowPending}}

			err := p.CheckDestinations("drained", tc.pods, tc.ds)

			switch {
			case tc.refuse == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.refuse != "" && (err == nil || !strings.Contains(err.Error(), tc.refuse)):
				t.Fatalf("err %v, want one saying %q", err, tc.refuse)
			case err != nil && errors.Is(err, ErrUncordonLag) != tc.wait:
				t.Fatalf("err %v: waited out %v, want %v", err, !tc.wait, tc.wait)
			}
		})
	}
}

// The seed is the emptiest fenced worker; its pods' fate is said, and an emergency with
// nowhere to send them is blocked unless --allow-pending (PARITY I1, I2).
func TestSteer(t *testing.T) {
	worker := func(name string, pods int) Node { return Node{Name: name, UID: name, Ready: true, Pods: pods} }
	refused := []CredentialInUse{{Digest: "old", Nodes: []string{"w1", "w2", "w3"}, State: CredentialRefused}}

	for _, tc := range []struct {
		name         string
		nodes        []Node
		inUse        []CredentialInUse
		allowPending bool
		seed, effect string
		blocked      bool
		says         string
	}{
		{name: "ordinary_empty_worker_first", nodes: []Node{worker("w1", 2), worker("w2", 0), worker("w3", 1)}, seed: "w2", effect: taints.PreferNoSchedule, says: "is empty"},
		{name: "ordinary_no_empty_worker", nodes: []Node{worker("w1", 2), worker("w2", 1)}, seed: "w2", effect: taints.PreferNoSchedule, says: "evicted again"},
		{name: "ordinary_allow_pending", nodes: []Node{worker("w1", 2), worker("w2", 1)}, allowPending: true, seed: "w2", effect: taints.NoSchedule, says: "wait Pending"},
		{name: "emergency_empty_seed", nodes: []Node{worker("w1", 2), worker("w2", 0), worker("w3", 1)}, inUse: refused, seed: "w2", effect: taints.NoSchedule, says: "is empty"},
		{name: "emergency_all_stale_no_empty", nodes: []Node{worker("w1", 2), worker("w2", 1), worker("w3", 1)}, inUse: refused, seed: "w2", effect: taints.NoSchedule, blocked: true, says: "--allow-pending"},
		{name: "emergency_allow_pending", nodes: []Node{worker("w1", 2), worker("w2", 1)}, inUse: refused, allowPending: true, seed: "w2", effect: taints.NoSchedule, says: "wait Pending"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Plan{CredentialRevision: "rev1", CredentialsInUse: tc.inUse}
			for i, n := range tc.nodes {
				p.Nodes = append(p.Nodes, NodePlan{Name: n.Name, Role: RoleWorker, Action: ActionFence, Pods: n.Pods, Order: i + 1})
			}

			order(p.Nodes)

			st := steer(p, Snapshot{Nodes: tc.nodes}, tc.allowPending)
			if st.Seed != tc.seed || st.Effect != tc.effect || (st.Blocked != "") != tc.blocked || !strings.Contains(st.Sentence, tc.says) {
				t.Fatalf("steering %+v", st)
			}
		})
	}
}
