package apply

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/human"
	"github.com/ghcrsync/ghcrsync/internal/requests"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// txn is one node's transaction. Each phase step returns nil to go on, or the result that ends
// the transaction.
type txn struct {
	e   *executor
	p   *plan.Plan
	np  plan.NodePlan
	log hclog.Logger
	rec state.Record
	ip  string
	// keyringProved says what proved a kubelet-keyring node's runtime (the result's message).
	keyringProved string
	// configChanged is what its runtime's start must follow to run on the config written
	// (talos.Configure), on the machine's clock; runtimeStarted is that start as awaited.
	configChanged, runtimeStarted time.Time
	// wroteOnBoot is the boot its Talos write's guard saw the machine on.
	wroteOnBoot string
}

type phaseStep struct {
	name string // the timing's name: where a node's seconds went
	run  func(context.Context) *NodeResult
}

func (t *txn) run(ctx context.Context) NodeResult {
	t.rec = state.Record{
		Node: t.np.Name, Owner: t.e.o.Holder, Action: string(t.np.Action), Phase: state.PhaseSelected,
		Fence: state.Fence{
			// A cordon that is ghcrsync's own unproven hold is not the node's: a proof lifts it.
			UID: t.np.UID, WasCordoned: t.np.Invariants.Unschedulable && !t.np.Invariants.HeldUnproven, HeldUnproven: t.np.Invariants.HeldUnproven,
			InitialTaints: t.np.Invariants.SchedulingTaints, DesiredRevision: t.p.CredentialRevision,
		},
		Started: t.e.clock.Now().UTC(),
	}

	// fence: (no other maintenance) claim → guarded → (kured's lock) → drained → configured → rebooting → ready → proved → released.
	steps := []phaseStep{
		{"others", t.others}, {"claim", t.claim}, {"guard", t.guarded}, {"kured", t.kuredLock}, {"drain", t.drain}, {"configure", t.configureStaged},
		{"reboot", t.reboot}, {"ready", t.waitReady}, {"prove", t.prove}, {"release", t.release},
	}
	done := t.rotated

	if t.np.Keyring != "" && t.np.Keyring != t.p.AuthDigest {
		// a keyring an earlier rotation wrote holds another credential: out before the reboot
		// (containerd then loads the credential, and the kubelet sends none of its own).
		steps = slices.Insert(steps, 6, phaseStep{"keyring", t.clearKeyring})
	}

	switch t.np.Action {
	case plan.ActionApplyLive:
		// live: configured → proved → released, with no cordon and no reboot.
		steps, done = []phaseStep{{"configure", t.configureLive}, {"restart", t.awaitRuntime}, {"prove", t.prove}}, t.rotatedLive

		if t.np.Role == plan.RoleControlPlane { // a CRI restart can leave static pods down
			steps = append(steps, phaseStep{"settle", t.settled})
		}
	case plan.ActionKeyring:
		// kubelet keyring: configured → keyring-written → proved → released, restarting nothing.
		steps, done = []phaseStep{{"configure", t.configureLive}, {"keyring", t.writeKeyring}, {"prove", t.proveKeyring}}, t.rotatedKeyring
	}

	if t.np.Role == plan.RoleControlPlane && t.np.Action != plan.ActionKeyring { // a keyring write takes nothing down
		steps = append([]phaseStep{{"quorum", t.quorum}}, steps...)
	}

	var timings []Timing

	for _, step := range steps {
		start := t.e.clock.Now()
		r := step.run(requests.WithStep(ctx, step.name)) // --verbose tallies its calls by step
		timings = append(timings, Timing{Step: step.name, Duration: t.e.clock.Now().Sub(start)})

		if r != nil {
			r.Timings = timings

			return *r
		}
	}

	r := done()
	r.Timings = timings

	return r
}

// quorum: a control plane is claimed, rebooted or updated live only while etcd keeps quorum
// without it (plan.Quorum). Refused before the claim, nothing is held; later, the fence stays.
func (t *txn) quorum(ctx context.Context) *NodeResult {
	if err := t.e.quorum(ctx, t.np.Name); err != nil {
		if r := t.interrupted(); r != nil {
			return r
		}

		msg := fmt.Sprintf("etcd quorum not confirmed before %s: %s", t.nextStep(), t.answer(err))
		if t.claimLanded() {
			return t.failKeepingFence(msg)
		}

		return t.fail(msg)
	}

	return nil
}

// nextStep names what the transaction is about to do, for the gate's message.
func (t *txn) nextStep() string {
	switch {
	case t.live():
		return "its live update"
	case t.rec.Phase.AtOrAfter(state.PhaseClaimed):
		return "its reboot"
	}

	return "claiming it"
}

// settled: after a control plane's live update, its etcd member and its static pods are
// healthy again before the next node is taken (a CRI restart can leave them down).
func (t *txn) settled(ctx context.Context) *NodeResult {
	err := clock.Until(ctx, t.e.clock, t.e.o.ReadyTimeout, time.Second, func() (bool, error) {
		v, err := t.e.etcd.Etcd(ctx, t.ip)
		switch {
		case err != nil:
			return false, err
		case len(v.Errors) > 0:
			return false, fmt.Errorf("its etcd member reports errors: %v", v.Errors)
		}

		if err := t.e.nodes.StaticPodsReady(ctx, t.np.Name); err != nil {
			return false, err
		}

		return true, nil
	})
	if err != nil {
		return t.failOrInterrupted("after its live update: " + t.answer(err))
	}

	return nil
}

func (t *txn) rotated() NodeResult {
	return t.finish(state.OutcomeDone, "", fmt.Sprintf("rotated: boot %s → %s, runtime proved, fence released", human.Short(t.rec.BootBefore), human.Short(t.rec.BootAfter)))
}

func (t *txn) rotatedLive() NodeResult {
	t.rec.Phase = state.PhaseReleased

	return t.finish(state.OutcomeDone, "", "rotated live: runtime proved, no cordon, no reboot")
}

func (t *txn) rotatedKeyring() NodeResult {
	t.rec.Phase = state.PhaseReleased

	return t.finish(state.OutcomeDone, "", "rotated through its kubelet keyring: runtime proved ("+t.keyringProved+"), no cordon, no drain, no reboot, no restart")
}

// progressEvery is how often a wait says what it is waiting for.
const progressEvery = 5 * time.Second
