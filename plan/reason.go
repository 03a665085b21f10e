package plan

import "fmt"

// Reason is why a node got its action, or why the judgement deselected or refused it: one
// enumerated code with its wording, used by plan, apply, release and events alike.
type Reason string

const (
	ReasonConfigOutdated      Reason = "config-outdated"
	ReasonRuntimeUnproven     Reason = "runtime-unproven"
	ReasonInSync              Reason = "in-sync"
	ReasonAutoscalerCandidate Reason = "autoscaler-candidate"
	ReasonAutoscalerDeleting  Reason = "autoscaler-deleting"
	ReasonDeleting            Reason = "deleting"
	ReasonNotFound            Reason = "not-found"
	ReasonFencedByOther       Reason = "fenced-by-other"
	ReasonNotReady            Reason = "not-ready"
	ReasonTalosUnreachable    Reason = "talos-unreachable"
	ReasonExcluded            Reason = "excluded"
	ReasonUnclassifiable      Reason = "unclassifiable"
	ReasonRebooted            Reason = "rebooted"
	ReasonCordonChanged       Reason = "cordon-changed"
	ReasonTaintsChanged       Reason = "taints-changed"
	ReasonConfigChanged       Reason = "config-changed"
	ReasonFenceRemoved        Reason = "fence-removed"
	ReasonNeverClaimed        Reason = "never-claimed"
	ReasonStagedConfig        Reason = "staged-config"
	ReasonRunsGhcrsync        Reason = "runs-ghcrsync"
	ReasonInvalidInventory    Reason = "invalid-inventory"
	ReasonTalosUnsupported    Reason = "talos-unsupported"
	ReasonTalosRefuses        Reason = "talos-refuses"
	ReasonKeyringStale        Reason = "keyring-stale"
	ReasonRoleChanged         Reason = "role-changed"
)

// Reasons lists every reason code.
var Reasons = []Reason{
	ReasonConfigOutdated, ReasonRuntimeUnproven, ReasonInSync, ReasonAutoscalerCandidate,
	ReasonAutoscalerDeleting, ReasonDeleting, ReasonNotFound, ReasonFencedByOther, ReasonNotReady,
	ReasonTalosUnreachable, ReasonExcluded, ReasonUnclassifiable, ReasonRebooted, ReasonCordonChanged,
	ReasonTaintsChanged, ReasonConfigChanged, ReasonFenceRemoved, ReasonNeverClaimed, ReasonStagedConfig,
	ReasonRunsGhcrsync, ReasonInvalidInventory, ReasonTalosUnsupported, ReasonTalosRefuses, ReasonKeyringStale, ReasonRoleChanged,
}

// clauses say each reason about the node ("it", "its"); the node itself is named by whoever
// renders the clause (the plan view's line, or Verdict.Message).
var clauses = map[Reason]string{
	ReasonConfigOutdated:      "its Talos config carries another credential (%s)",
	ReasonRuntimeUnproven:     "its Talos config already carries the credential, but nothing proves its container runtime loaded it (%s)",
	ReasonInSync:              "it already uses credential revision %s",
	ReasonAutoscalerCandidate: "it is a scale-down candidate of the cluster autoscaler (%s); fencing it would race the autoscaler",
	ReasonAutoscalerDeleting:  "the cluster autoscaler is deleting it (%s)",
	ReasonDeleting:            "it is being deleted (%s)",
	ReasonNotFound:            "it is gone from the Kubernetes API (%s)",
	ReasonFencedByOther:       "it is fenced by another run (%s); see `ghcrsync fences`",
	ReasonNotReady:            "it is not Ready (%s); ghcrsync only acts on a node it can prove afterwards",
	ReasonTalosUnreachable:    "its Talos API did not answer (%s)",
	ReasonExcluded:            "it is excluded by the configuration (%s)",
	ReasonUnclassifiable:      "it cannot be classified with certainty (%s), so ghcrsync leaves it alone",
	ReasonRebooted:            "it rebooted since the plan (%s): what the plan saw of it is stale; run plan again",
	ReasonCordonChanged:       "its cordon changed outside ghcrsync (%s)",
	ReasonTaintsChanged:       "its taints changed outside ghcrsync: %s",
	ReasonConfigChanged:       "its Talos config changed outside ghcrsync since the plan (%s)",
	ReasonRoleChanged:         "its role changed since the plan (%s): whether it passes the etcd quorum gate is the plan's to say; run plan again",
	ReasonFenceRemoved:        "ghcrsync's owner annotation was removed outside ghcrsync (%s)",
	ReasonNeverClaimed:        "ghcrsync's claim never landed on it (%s): nothing of ghcrsync's is there to undo",
	ReasonStagedConfig:        "it has a config staged for its next boot that differs from its active one (%s); ghcrsync never drops an operator's staged change",
	ReasonRunsGhcrsync:        "ghcrsync itself runs on it (%s): fencing it would drain this very run; a run from another node rotates it",
	ReasonInvalidInventory:    "its Node record does not name one machine (%s), so ghcrsync leaves it alone",
	ReasonTalosRefuses:        "its Talos refuses the config ghcrsync would write (a dry run: %s), so ghcrsync leaves it alone",
	ReasonKeyringStale:        "its kubelet keyring holds another credential (%s), which the kubelet sends with every pull before containerd's own",
	ReasonTalosUnsupported:    "its Talos cannot take the RegistryAuthConfig document (%s; it needs " + TalosMinimum.String() + " or later), so ghcrsync leaves it alone",
}

// Sentence says the reason about the node; detail fills in the specifics.
func (r Reason) Sentence(detail string) string {
	f, ok := clauses[r]
	if !ok {
		return fmt.Sprintf("%s (%s)", r, detail)
	}

	return fmt.Sprintf(f, detail)
}
