package permission

import (
	"slices"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/plan"
)

// OutsideRoles splits the denied permissions: the namespaces (of selected, those only the
// consumer selector names) where nothing needed is granted — the label came after the roles
// were rendered: a warning and an unwritten consumer, never a stop of every run — and the
// rest, which fail the command. A namespace where only some needs are granted is a broken
// rendering, and fails it.
func OutsideRoles(needs, denied []cluster.Access, selected []string) (outside []string, rest []cluster.Access) {
	in := func(a cluster.Access, ns string) bool {
		return a.Namespace == ns || a.Resource == "namespaces" && a.Name == ns
	}

	for _, ns := range selected {
		needed := slices.ContainsFunc(needs, func(a cluster.Access) bool { return in(a, ns) })
		granted := slices.ContainsFunc(needs, func(a cluster.Access) bool { return in(a, ns) && !slices.Contains(denied, a) })

		if needed && !granted {
			outside = append(outside, ns)
		}
	}

	for _, a := range denied {
		if !slices.ContainsFunc(outside, func(ns string) bool { return in(a, ns) }) {
			rest = append(rest, a)
		}
	}

	return outside, rest
}

// SelectorOnly are the namespaces of targets that only the consumer selector names (not an
// explicit consumer, not the root's).
func SelectorOnly(cfg *config.Config, targets []cluster.SecretTarget) []string {
	named := map[string]bool{}

	for _, set := range cfg.PullSecretSets() {
		for _, c := range set.Consumers {
			named[c.Namespace] = true
		}
	}

	if r := cfg.FluxRoot; r != nil {
		named[r.Namespace] = true
	}

	var out []string

	for _, t := range targets {
		if t.Role == plan.RoleConsumer && !named[t.Namespace] && !slices.Contains(out, t.Namespace) {
			out = append(out, t.Namespace)
		}
	}

	return out
}
