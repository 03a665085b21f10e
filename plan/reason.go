package plan

import "fmt"

// Reason is why a node got its action: one enumerated code with its sentence, used by plan,
// apply and events alike.
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
)

// Reasons lists every reason code.
var Reasons = []Reason{
	ReasonConfigOutdated, ReasonRuntimeUnproven, ReasonInSync, ReasonAutoscalerCandidate,
	ReasonAutoscalerDeleting, ReasonDeleting, ReasonNotFound, ReasonFencedByOther, ReasonNotReady,
	ReasonTalosUnreachable, ReasonExcluded, ReasonUnclassifiable,
}

var sentences = map[Reason]string{
	ReasonConfigOutdated:      "%s's Talos config carries another credential (%s)",
	ReasonRuntimeUnproven:     "%s's Talos config already carries the credential, but nothing proves its container runtime loaded it (%s)",
	ReasonInSync:              "%s already uses credential revision %s",
	ReasonAutoscalerCandidate: "%s is a scale-down candidate of the cluster autoscaler (%s); fencing it would race the autoscaler",
	ReasonAutoscalerDeleting:  "%s is being deleted by the cluster autoscaler (%s)",
	ReasonDeleting:            "%s is being deleted (%s)",
	ReasonNotFound:            "%s is gone from the Kubernetes API (%s)",
	ReasonFencedByOther:       "%s is fenced by another run (%s); see `ghcrsync fences`",
	ReasonNotReady:            "%s is not Ready (%s); ghcrsync does not fence a node it cannot prove afterwards",
	ReasonTalosUnreachable:    "%s's Talos API did not answer (%s)",
	ReasonExcluded:            "%s is excluded by the configuration (%s)",
	ReasonUnclassifiable:      "%s cannot be classified with certainty (%s), so ghcrsync leaves it alone",
}

// Sentence explains the reason for node; detail fills in the specifics.
func (r Reason) Sentence(node, detail string) string {
	f, ok := sentences[r]
	if !ok {
		return fmt.Sprintf("%s: %s (%s)", node, r, detail)
	}

	return fmt.Sprintf(f, node, detail)
}
