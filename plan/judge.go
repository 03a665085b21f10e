package plan

import (
	"slices"
	"strconv"

	"github.com/ghcrsync/ghcrsync/internal/human"
	"github.com/ghcrsync/ghcrsync/internal/taints"
	"github.com/ghcrsync/ghcrsync/state"
)

// Step is what is about to be done to a node when it is judged.
type Step string

// Steps of a node's transaction (each guards the mutation of the phase it enters), and of a
// recovery.
const (
	StepPlan      Step = "plan"                         // planning: no transaction yet
	StepClaim     Step = "claim"                        // → claimed: owner, record, scale-down guard, cordon
	StepGuard     Step = "guard"                        // → guarded
	StepDrain     Step = "drain"                        // → drained: evictions
	StepConfigure Step = "configure"                    // → configured: the Talos write
	StepKeyring   Step = "write the kubelet keyring of" // → keyring-written: the writer pod on the node
	StepReboot    Step = "reboot"                       // → rebooting
	StepWait      Step = "wait for"                     // → ready: a reboot is in flight, NotReady is expected
	StepProve     Step = "prove"                        // → proved: the runtime probe and the verified marker
	StepRelease   Step = "release"                      // → released: the fence comes off
	StepCheck     Step = "check"                        // no mutation: what became of the node after a failed call
	StepAnnotate  Step = "annotate"                     // record on the node what was done (the phase mirror, the verified marker)
	StepUndo      Step = "undo"                         // recovery: undo a recorded fence (release, reclaim)
)

// Subject is everything the judgement looks at.
type Subject struct {
	// Node is the node as read now; nil when the API says it does not exist.
	Node *Node
	// Planned are the plan's invariants for the node; nil while planning.
	Planned *Invariants
	// Phase is the phase the node's transaction is in: the last one whose mutation may have
	// started (state.PhaseSelected before anything).
	Phase  state.Phase
	Action Action // what the node needs (fence, apply-live, no-op; "" when unknown)
	Step   Step
	Holder string // this run's holder id (the fence's holder for StepUndo)
	// Desired is the digest of the desired credential; CandidatePolicy the configured policy for
	// autoscaler scale-down candidates (planning only).
	Desired         string
	CandidatePolicy string
}

// Decision is the judgement's answer.
type Decision string

const (
	// Proceed: the mutation may start.
	Proceed Decision = "proceed"
	// Deselect: leave the node to a later run; not a failure (its claim, if any, is undone).
	Deselect Decision = "deselect"
	// Refuse: a genuine violation; the node fails closed.
	Refuse Decision = "refuse"
	// Gone: the node vanished after its Talos config was written; nothing is left to release.
	Gone Decision = "gone"
	// Await: the node is being deleted after its Talos config was written (the cluster
	// autoscaler can act on a decision it made before the claim's scale-down guard landed).
	// Nothing more is done to it: the executor waits, up to ready_timeout, for it to go (Gone)
	// or for the deletion to be given up (judged again); past that, it refuses.
	Await Decision = "await"
)

// Verdict is a decision with its reason.
type Verdict struct {
	Decision Decision
	Reason   Reason
	Detail   string
}

// Message renders the verdict about node: the one wording of every deselection and refusal.
func (v Verdict) Message(node string, step Step) string {
	switch v.Decision {
	case Deselect:
		return "deselected " + node + ": " + v.Reason.Sentence(v.Detail)
	case Refuse:
		return "refusing to " + string(step) + " " + node + ": " + v.Reason.Sentence(v.Detail)
	case Gone:
		return node + " vanished after its Talos config was written: " + v.Reason.Sentence(v.Detail) + "; nothing left to release"
	case Await:
		return "waiting for " + node + " to go: " + v.Reason.Sentence(v.Detail)
	}

	return "proceed with " + node
}

func proceed() Verdict { return Verdict{Decision: Proceed} }

func verdict(d Decision, r Reason, detail string) Verdict {
	return Verdict{Decision: d, Reason: r, Detail: detail}
}

// Judge decides whether ghcrsync may act on a node now, must leave it alone, or must refuse.
// It is the only place that compares a node with the plan's invariants: the planner, the
// executor before every mutation, and release all ask it.
func Judge(s Subject) Verdict {
	switch {
	case s.Planned == nil:
		return judgePlanning(s)
	case s.Step == StepUndo:
		return judgeUndo(s)
	}

	return judgeTransaction(s)
}

// judgePlanning: the rules that deselect a node from a plan.
func judgePlanning(s Subject) Verdict {
	n := s.Node

	if v, ok := deletion(n, Deselect); ok {
		return v
	}

	if n.Owner != "" {
		detail := "owner " + n.Owner
		if n.Phase != "" {
			detail += ", phase " + string(n.Phase)
		}

		return verdict(Deselect, ReasonFencedByOther, detail)
	}

	if !s.Action.Acts() {
		return proceed() // these rules only matter when ghcrsync would act
	}

	if t, ok := taints.Find(n.Taints, taints.DeletionCandidate); ok && s.CandidatePolicy != "include" {
		return verdict(Deselect, ReasonAutoscalerCandidate, "taint since "+taintSince(t))
	}

	if !n.Ready {
		return verdict(Deselect, ReasonNotReady, "Ready condition is not True")
	}

	if v, ok := staged(n, s.Action, s.Desired, Deselect); ok {
		return v
	}

	return proceed()
}

// staged: a config an operator staged for the next boot is never dropped. A live apply would
// activate it, so it refuses any; a fence goes on only when the staged config already carries
// the desired credential (ghcrsync then builds on it, and the reboot applies both).
func staged(n *Node, action Action, desired string, d Decision) (Verdict, bool) {
	if n.Talos == nil || !n.Talos.StagedDiffers {
		return Verdict{}, false
	}

	if action == ActionFence && desired != "" && n.Talos.StagedDigest == desired {
		return Verdict{}, false
	}

	return verdict(d, ReasonStagedConfig, "its staged config carries "+human.ShortOrNone(n.Talos.StagedDigest)+", desired "+human.ShortOrNone(desired)+
		"; apply or discard the staged change, then plan again"), true
}

// judgeTransaction: the re-validation before each mutation of a node's transaction.
func judgeTransaction(s Subject) Verdict {
	n, p := s.Node, s.Planned
	mutated := s.Phase.TalosWritten()
	claimed := s.Action == ActionFence && s.Step != StepClaim && s.Phase.AtOrAfter(state.PhaseClaimed)

	if v, ok := identity(n, p, mutated); ok {
		return v
	}

	if v, ok := ownership(n, s.Holder, claimed); ok {
		return v
	}

	if s.Step == StepAnnotate {
		return proceed() // only bookkeeping of what was done: the next step's judgement sees the rest
	}

	if v, ok := deletion(n, map[bool]Decision{false: Deselect, true: Await}[mutated]); ok {
		if mutated {
			v.Detail += "; its Talos config was already written"
		}

		return v
	}

	if problem := recordProblem(n); problem != "" && !mutated {
		return verdict(Refuse, ReasonInvalidInventory, problem)
	}

	if n.ControlPlane != p.ControlPlane && !mutated {
		return verdict(Refuse, ReasonRoleChanged, map[bool]string{true: "planned a worker, now a control plane", false: "planned a control plane, now a worker"}[n.ControlPlane])
	}

	if s.Phase == state.PhaseSelected && p.BootID != "" && n.BootID != "" && n.BootID != p.BootID {
		return verdict(Deselect, ReasonRebooted, "boot "+human.Short(p.BootID)+" → "+human.Short(n.BootID))
	}

	if v, ok := scheduling(n, p, claimed); ok {
		return v
	}

	if s.Step != StepWait && s.Step != StepCheck && !n.Ready {
		return verdict(Refuse, ReasonNotReady, "since the plan was made")
	}

	if n.Talos != nil && !mutated && n.Talos.ConfiguredDigest != p.ConfiguredDigest && n.Talos.ConfiguredDigest != s.Desired {
		return verdict(Refuse, ReasonConfigChanged, "configured "+human.ShortOrNone(n.Talos.ConfiguredDigest)+
			", planned "+human.ShortOrNone(p.ConfiguredDigest)+", desired "+human.ShortOrNone(s.Desired))
	}

	if !mutated {
		if v, ok := staged(n, s.Action, s.Desired, Refuse); ok {
			return v
		}
	}

	return proceed()
}

// judgeUndo: may a recorded fence be undone on this node? Only what ghcrsync did: the node must
// carry this holder's owner annotation, or — the annotation gone — the record must show the claim
// landed (the transaction reached guarded) on this very node. Anything else is left alone.
func judgeUndo(s Subject) Verdict {
	n, p := s.Node, s.Planned

	if v, ok := identity(n, p, false); ok {
		v.Detail += "; nothing of the fence is left on the cluster"

		return v
	}

	// A fence is ghcrsync's only while the node carries its owner annotation: without it, the
	// cordon and taints are somebody else's (an operator's), whatever the record says.
	switch {
	case n.Owner != "" && n.Owner != s.Holder:
		return verdict(Refuse, ReasonFencedByOther, "owner "+n.Owner+", not "+s.Holder)
	case n.Owner == "" && !s.Phase.AtOrAfter(state.PhaseGuarded):
		return verdict(Deselect, ReasonNeverClaimed, "no owner annotation, and the record stops at "+string(s.Phase))
	case n.Owner == "":
		return verdict(Deselect, ReasonFenceRemoved, "the record stops at "+string(s.Phase)+"; its cordon and taints are left as they are")
	}

	return proceed()
}

// identity: the node is still the one the plan saw.
func identity(n *Node, p *Invariants, mutated bool) (Verdict, bool) {
	d := Deselect
	if mutated {
		d = Gone
	}

	switch {
	case n == nil:
		return verdict(d, ReasonNotFound, "deleted after the plan was made"), true
	case n.UID != p.UID:
		return verdict(d, ReasonNotFound, "replaced by a new Node of the same name, uid "+n.UID), true
	}

	return Verdict{}, false
}

// ownership: nobody else fenced it; once claimed, it is still ours.
func ownership(n *Node, holder string, claimed bool) (Verdict, bool) {
	switch {
	case claimed && n.Owner == "":
		return verdict(Refuse, ReasonFenceRemoved, "after the claim; the cordon and taints are no longer known to be ghcrsync's"), true
	case claimed && n.Owner != holder:
		return verdict(Refuse, ReasonFencedByOther, "owner "+n.Owner+", after this run's claim"), true
	case !claimed && n.Owner != "" && n.Owner != holder:
		return verdict(Refuse, ReasonFencedByOther, "owner "+n.Owner), true
	}

	return Verdict{}, false
}

// deletion: Kubernetes or the cluster autoscaler is deleting the node.
func deletion(n *Node, d Decision) (Verdict, bool) {
	if n.Deleting != nil {
		return verdict(d, ReasonDeleting, "deletionTimestamp "+human.Clock(*n.Deleting)), true
	}

	if t, ok := taints.Find(n.Taints, taints.ToBeDeleted); ok {
		return verdict(d, ReasonAutoscalerDeleting, taints.ToBeDeleted+" since "+taintSince(t)), true
	}

	return Verdict{}, false
}

// scheduling: the cordon and the scheduling taints are as the plan saw them (or, once claimed,
// as ghcrsync's claim left them).
func scheduling(n *Node, p *Invariants, claimed bool) (Verdict, bool) {
	switch {
	case claimed && !n.Unschedulable:
		return verdict(Refuse, ReasonCordonChanged, "uncordoned after ghcrsync cordoned it"), true
	case !claimed && n.Unschedulable != p.Unschedulable:
		return verdict(Refuse, ReasonCordonChanged, map[bool]string{true: "cordoned", false: "uncordoned"}[n.Unschedulable]+" since the plan"), true
	}

	if now := taints.Scheduling(n.Taints); !slices.Equal(now, p.SchedulingTaints) {
		return verdict(Refuse, ReasonTaintsChanged, taints.DescribeDiff(taints.Diff(p.SchedulingTaints, now))), true
	}

	return Verdict{}, false
}

// taintSince renders the instant an autoscaler taint carries, or its raw value.
func taintSince(t taints.Taint) string {
	if at, ok := taints.Since(t); ok {
		return human.Clock(at)
	}

	return "value " + strconv.Quote(t.Value)
}
