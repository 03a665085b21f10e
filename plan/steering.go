package plan

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ghcrsync/ghcrsync/internal/human"
	"github.com/ghcrsync/ghcrsync/internal/taints"
)

// Steering is how a run keeps evicted pods off nodes that are not rotated yet: its own taint
// (taints.Steering) on every node it will rotate, removed from each as it is proved; the worker
// rolled first (the seed); and whether pods may wait Pending for it.
type Steering struct {
	// Effect is the taint's: PreferNoSchedule in an ordinary rotation (pods prefer rotated
	// nodes), NoSchedule in an emergency one whose refused credential is on nodes, or with
	// --allow-pending (pods never land on a node not yet rotated: one that cannot pull, or will
	// be drained again).
	Effect string `json:"effect"`
	// Seed is the fenced worker rolled first: the emptiest. With a NoSchedule effect it rolls
	// alone, and the other workers start once it is proved (it is where their pods go).
	Seed     string `json:"seed,omitempty"`
	SeedPods int    `json:"seed_pods,omitempty"`
	// AllowPending lets the seed's pods wait Pending until it is rotated (--allow-pending).
	AllowPending bool   `json:"allow_pending,omitempty"`
	Sentence     string `json:"sentence"`
	// Blocked says why apply refuses the plan: an emergency in which the seed's pods would
	// have nowhere to go that can pull, and --allow-pending was not given.
	Blocked string `json:"blocked,omitempty"`
}

// Hard reports whether pods never land on a node not yet rotated (a NoSchedule effect): then
// the seed rolls alone first.
func (s Steering) Hard() bool { return s.Effect == taints.NoSchedule }

// Destination is a node as a drain's evicted pods see it.
type Destination struct {
	Name             string
	Ready            bool
	Unschedulable    bool
	Taints           []taints.Taint
	VerifiedRevision string
	VerifiedBoot     string
	BootID           string
}

// DestinationOf is a snapshot node as a destination.
func DestinationOf(n Node) Destination {
	return Destination{Name: n.Name, Ready: n.Ready, Unschedulable: n.Unschedulable, Taints: n.Taints,
		VerifiedRevision: n.VerifiedRevision, VerifiedBoot: n.VerifiedBoot, BootID: n.BootID}
}

// Takes reports whether an evicted pod may be scheduled onto d: Ready, schedulable, and no
// taint that keeps pods off (NoSchedule, NoExecute — ghcrsync's own included). A
// PreferNoSchedule taint only steers.
func (d Destination) Takes() bool {
	return d.Ready && !d.Unschedulable && !slices.ContainsFunc(d.Taints, taints.Hard)
}

// CanPull reports whether d's runtime can pull with a credential the registry accepts: proved
// by this plan's revision on its current boot, or holding a credential in use the registry did
// not refuse. A node the plan knows nothing of can pull in an ordinary rotation (the credential
// in use is accepted), and is not known to where nodes hold a refused one. why says what it
// is not.
func (p *Plan) CanPull(d Destination) (ok bool, why string) {
	if d.VerifiedRevision == p.CredentialRevision && d.VerifiedBoot != "" && d.VerifiedBoot == d.BootID {
		return true, ""
	}

	if p.Emergency() && slices.Contains(p.StaleRuntimes, d.Name) {
		return false, "its container runtime still uses the credential it booted with (it started before its config last changed, and its " +
			"Talos loads none live), which may be the refused one"
	}

	for _, u := range p.CredentialsInUse {
		if slices.Contains(u.Nodes, d.Name) {
			if u.State == CredentialRefused && !u.Desired {
				return false, "its credential " + human.Short(u.Digest) + " is refused by the registry"
			}

			return true, ""
		}
	}

	if p.NodesRefused() {
		return false, "it is not known to pull with a credential the registry accepts (the plan does not cover it, and this run has not proved it)"
	}

	return true, ""
}

// NodesRefused reports whether a credential the registry refused may be what nodes' runtimes
// pull with: held in their configs, or — in an emergency — by a runtime that has not loaded its
// config (StaleRuntimes: what it booted with is unknown, and may be the refused one). Their
// runtimes cannot pull, so an evicted pod must never land on one.
func (p *Plan) NodesRefused() bool {
	for _, u := range p.Refused() {
		if len(u.Nodes) > 0 {
			return true
		}
	}

	return p.Emergency() && len(p.StaleRuntimes) > 0
}

// CheckDestinations is the rule before each eviction from node (pods: how many it has to
// evict): every node an evicted pod can be scheduled onto must pull — a Ready, schedulable,
// untainted node that cannot would take a pod into ErrImagePull — and, unless the plan lets
// pods wait Pending, one at least must take them. Tainted and cordoned nodes take no pod and so
// do not count, neither as capacity nor as a danger.
func (p *Plan) CheckDestinations(node string, pods int, ds []Destination) error {
	able := 0

	for _, d := range ds {
		if d.Name == node || !d.Takes() {
			continue
		}

		if ok, why := p.CanPull(d); !ok {
			return fmt.Errorf("an evicted pod could be scheduled onto %s, which is Ready and schedulable but cannot pull: %s; "+
				"cordon or taint %s (or include it in the rotation), then apply again", d.Name, why, d.Name)
		}

		able++
	}

	if pods > 0 && able == 0 && !p.Steering.AllowPending && p.Steering.Hard() {
		if d, ok := p.uncordoning(node, ds); ok {
			return fmt.Errorf("%w: %s is uncordoned and can pull, and still carries %s (the node lifecycle controller takes it off a moment after the uncordon): the eviction waits for it",
				ErrUncordonLag, d, taints.Unschedulable)
		}

		return fmt.Errorf("no Ready, schedulable node that can pull can take its %d %s: they would wait Pending; "+
			"re-plan with --allow-pending to accept that, or free a worker", pods, human.Plural(pods, "pod", "pods"))
	}

	return nil
}

// ErrUncordonLag is a destination check that finds no node to take the pods only because a node
// just uncordoned (the seed, released) still carries the taint mirroring its cordon: the
// drain asks again (it waits, bounded by its timeout) instead of refusing.
var ErrUncordonLag = errors.New("a node is being uncordoned")

// uncordoning names a node other than node that takes pods (Takes), and can pull, once the node
// lifecycle controller catches up: it carries the node.kubernetes.io/unschedulable that mirrors a
// cordon, and without that taint it would take them.
func (p *Plan) uncordoning(node string, ds []Destination) (string, bool) {
	mirror := func(t taints.Taint) bool { return t.Key == taints.Unschedulable }

	for _, d := range ds {
		if d.Name == node || !slices.ContainsFunc(d.Taints, mirror) {
			continue
		}

		d.Taints = slices.DeleteFunc(slices.Clone(d.Taints), mirror)
		if ok, _ := p.CanPull(d); ok && d.Takes() {
			return d.Name, true
		}
	}

	return "", false
}

// steer decides the run's steering from the ordered plan and the snapshot.
func steer(p *Plan, s Snapshot, allowPending bool) Steering {
	refused := p.NodesRefused()

	st := Steering{Effect: taints.PreferNoSchedule, AllowPending: allowPending}
	if refused || allowPending {
		st.Effect = taints.NoSchedule
	}

	seed, fenced := firstDrained(p)
	if seed == nil {
		st.Sentence = "no worker is drained: nothing is evicted"

		return st
	}

	st.Seed, st.SeedPods = seed.Name, seed.Pods
	able := destinations(p, s, fenced)

	pods := fmt.Sprintf("%d %s", seed.Pods, human.Plural(seed.Pods, "pod", "pods"))

	switch {
	case seed.Pods == 0:
		st.Sentence = seed.Name + " is empty and rolls first: the pods of the next nodes land on it"
	case len(able) > 0:
		st.Sentence = seed.Name + " rolls first: its " + pods + " can go to " + describeNames(able)
	case refused && !allowPending:
		st.Blocked = "no worker is empty and no Ready, schedulable node can pull: the " + pods + " on " + seed.Name +
			", the first to roll, would have nowhere to go (the nodes not rotated yet cannot pull); re-plan with --allow-pending " +
			"to let them wait Pending until " + seed.Name + " is rotated (about one reboot), or free a worker"
		st.Sentence = st.Blocked
	case allowPending:
		st.Sentence = "the " + pods + " on " + seed.Name + ", the first to roll, wait Pending until it is rotated (--allow-pending): " +
			"no pod lands on a node not yet rotated, and each is evicted once"
	case !slices.ContainsFunc(s.Nodes, func(n Node) bool { return n.Name != seed.Name && DestinationOf(n).Takes() }):
		st.Sentence = "no other node takes pods (the rest are tainted, cordoned or not Ready): the " + pods + " on " + seed.Name +
			", the first to roll, wait Pending until it is back (about one reboot), and a PodDisruptionBudget that needs them running holds its drain"
	default:
		st.Sentence = "no worker is empty: the " + pods + " on " + seed.Name + ", the first to roll, move onto nodes rotated later " +
			"and are evicted again there; --allow-pending lets them wait Pending for " + seed.Name + " instead"
	}

	return st
}

// firstDrained is the first worker the plan fences (the seed of the roll), and every node it
// fences.
func firstDrained(p *Plan) (*NodePlan, map[string]bool) {
	var seed *NodePlan

	fenced := map[string]bool{}

	for i := range p.Nodes {
		n := &p.Nodes[i]
		if n.Order > 0 && n.Action == ActionFence {
			fenced[n.Name] = true

			if seed == nil && n.Role == RoleWorker {
				seed = n
			}
		}
	}

	return seed, fenced
}

// destinations are the nodes the seed's pods can go to: not fenced, taking pods, and able to
// pull (rotated live before any drain, or holding a credential the registry accepts).
func destinations(p *Plan, s Snapshot, fenced map[string]bool) []string {
	var able []string

	for _, n := range s.Nodes {
		np, _ := p.Node(n.Name)
		d := DestinationOf(n)

		switch {
		case fenced[n.Name] || !d.Takes():
		case np.Action.InPlace() && np.Role == RoleWorker: // rotated in place before any drain
			able = append(able, n.Name)
		default:
			if ok, _ := p.CanPull(d); ok {
				able = append(able, n.Name)
			}
		}
	}

	return able
}

func describeNames(names []string) string {
	if len(names) > 3 {
		return strings.Join(names[:3], ", ") + fmt.Sprintf(" and %d more", len(names)-3)
	}

	return strings.Join(names, ", ")
}
