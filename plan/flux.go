package plan

// FluxAction is what the run does to a Flux Kustomization the flux block names.
type FluxAction string

const (
	// FluxSuspend: suspended for the run (a recorded fence), resumed at its end.
	FluxSuspend FluxAction = "suspend"
	// FluxLeave: suspended already by someone else: left as it is, and never resumed by ghcrsync.
	FluxLeave FluxAction = "leave"
)

// FluxPlan is one Kustomization's action.
type FluxPlan struct {
	Namespace string     `json:"namespace"`
	Name      string     `json:"name"`
	UID       string     `json:"uid,omitempty"`
	Action    FluxAction `json:"action"`
	Reason    string     `json:"reason"`
}

// Ref is the Kustomization's namespace/name.
func (f FluxPlan) Ref() string { return f.Namespace + "/" + f.Name }

// planFlux decides each named Kustomization's action (the observer refuses one that does not
// exist: a GitOps controller under another name would switch the credential mid-run).
func planFlux(obs []KustomizationObs, changes bool) []FluxPlan {
	out := make([]FluxPlan, 0, len(obs))

	for _, k := range obs {
		fp := FluxPlan{Namespace: k.Namespace, Name: k.Name, UID: k.UID, Action: FluxSuspend,
			Reason: "kustomize-controller does not apply it from Git while the run goes on: suspended at the start, resumed at the end (also by `ghcrsync release`)"}

		switch {
		case !changes:
			fp.Action, fp.Reason = FluxLeave, "the plan writes nothing, so apply suspends nothing"
		case k.Suspended && k.SuspendedBy == "":
			fp.Action, fp.Reason = FluxLeave, "suspended already, not by ghcrsync: left suspended, and not resumed at the end"
		case k.Suspended:
			fp.Reason = "suspended by ghcrsync run " + k.SuspendedBy + " (a fence: apply reclaims it when that run is over, or `ghcrsync release`); then " + fp.Reason
		}

		out = append(out, fp)
	}

	return out
}
