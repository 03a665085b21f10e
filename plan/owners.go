package plan

import (
	"strings"

	"github.com/ghcrsync/ghcrsync/internal/human"
)

// OtherOwner is another manager of an object the run writes (or leaves alone because of it),
// and what that means for the rotation.
type OtherOwner struct {
	Object  string `json:"object"` // "Secret ns/name" (its role in parentheses)
	Owner   string `json:"owner"`
	Meaning string `json:"meaning"`
}

// OtherOwners reports, for every pull secret and node template, who else manages it — the
// controller whose label or ownerReference it carries, every other field manager of its
// credential — and what that means: the Flux Kustomizations the run suspends (flux) answer the
// one that would switch the credential from Git mid-run.
func OtherOwners(s Snapshot, flux []FluxPlan) []OtherOwner {
	var out []OtherOwner

	for _, x := range s.Secrets {
		obj := "Secret " + x.Namespace + "/" + x.Name + " (" + x.Role + ")"

		if x.Foreign != "" {
			out = append(out, OtherOwner{Object: obj, Owner: x.Foreign, Meaning: controllerMeaning(x.Foreign, x.Role, x.Namespace+"/"+x.Name, flux)})
		}

		if x.OtherConfiguration != "" {
			out = append(out, OtherOwner{Object: obj, Owner: x.OtherConfiguration,
				Meaning: "another ghcrsync configuration marked it its own: two configurations writing one pull secret put their credentials back in turn; " +
					"name it in one configuration only (a configuration is known by its Lease: if this one's Lease was renamed, this is that mark, and the next write moves it)"})
		}

		out = append(out, writers(obj, x.Writers, x.Foreign)...)
	}

	seen := map[string]bool{}

	for _, t := range s.Templates {
		key := t.Namespace + "/" + t.Secret + ":" + t.Key
		if seen[key] {
			continue // one entry per Secret key, whatever its pools
		}

		seen[key] = true
		obj := "Secret " + key + " (node template " + t.Name + ")"

		if t.Foreign != "" {
			out = append(out, OtherOwner{Object: obj, Owner: t.Foreign, Meaning: controllerMeaning(t.Foreign, RoleTemplate, key, flux)})
		}

		out = append(out, writers(obj, t.Writers, t.Foreign)...)
	}

	return out
}

// controllerMeaning is what a controller owning the object means for the run.
func controllerMeaning(owner, role, where string, flux []FluxPlan) string {
	switch {
	case strings.HasPrefix(owner, "Flux (kustomize.toolkit.fluxcd.io/name="):
		name := strings.TrimSuffix(strings.TrimPrefix(owner, "Flux (kustomize.toolkit.fluxcd.io/name="), ")")
		what := "kustomize-controller applies " + where + " from Git (Kustomization " + name + ")"

		switch role {
		case RoleRoot:
			what += ": it switches the root when the SOPS file merges, before the nodes are rotated"
		case RoleTemplate:
			what += ": it reverts what ghcrsync writes at its next reconcile; keep the template's credential in Git"
		default:
			what += ": ghcrsync leaves it alone; it switches when the SOPS file merges, whatever the nodes hold"
		}

		return what + suspension(name, flux)
	case strings.HasPrefix(owner, "Flux (helm.toolkit.fluxcd.io/name="):
		return "helm-controller renders it from a HelmRelease: ghcrsync leaves pull secrets alone; the release's values must carry the new credential"
	case strings.HasPrefix(owner, "External Secrets"), strings.HasPrefix(owner, "ExternalSecret "):
		return "External Secrets syncs it from its store: update the store's value to the new credential; ghcrsync leaves it alone"
	}

	return "its owner (" + owner + ") may rewrite or delete it: ghcrsync leaves a pull secret with an owner alone"
}

// suspension says whether the run suspends the Kustomization named (by name: the label's
// namespace is the Kustomization's own, usually flux-system).
func suspension(name string, flux []FluxPlan) string {
	for _, f := range flux {
		switch {
		case f.Name == name && f.Action == FluxSuspend:
			return "; Kustomization " + f.Ref() + " is suspended for the run (flux block)"
		case f.Name == name:
			return "; Kustomization " + f.Ref() + " is in the flux block, not suspended: " + f.Reason
		}
	}

	return "; to hold it for the run, name it in flux { suspend = [\"flux-system/" + name + "\"] }"
}

// writers are the other field managers of the object's credential (the controller already
// reported is not repeated).
func writers(obj string, ws []Writer, foreign string) []OtherOwner {
	var out []OtherOwner

	for _, w := range ws {
		if strings.Contains(foreign, w.Manager) || known(w.Manager, foreign) {
			continue
		}

		at := ""
		if !w.At.IsZero() {
			at = " (" + w.Operation + ", " + human.Clock(w.At) + ")"
		}

		out = append(out, OtherOwner{Object: obj, Owner: "field manager " + w.Manager,
			Meaning: w.Manager + " last wrote its credential" + at + ": if it writes again it may put back the old one; apply's verdict reads it again at the end"})
	}

	return out
}

// known reports whether manager is the controller the label names (kustomize-controller for a
// Kustomization's label, and so on).
func known(manager, foreign string) bool {
	switch manager {
	case "kustomize-controller":
		return strings.Contains(foreign, "kustomize.toolkit.fluxcd.io")
	case "helm-controller":
		return strings.Contains(foreign, "helm.toolkit.fluxcd.io")
	case "external-secrets":
		return strings.HasPrefix(foreign, "External Secrets")
	}

	return false
}
