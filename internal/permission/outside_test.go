package permission

import (
	"slices"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/plan"
)

// A namespace the consumer selector alone names, where nothing needed is granted, is outside the
// roles (a warning, its consumer unwritten); one where only part is granted is a broken
// rendering and fails with the rest; a denial elsewhere always fails.
func TestOutsideRoles(t *testing.T) {
	get := func(ns string) cluster.Access {
		return cluster.Access{Verb: "get", Resource: "secrets", Namespace: ns, Name: "ghcr-pull"}
	}
	patch := func(ns string) cluster.Access {
		return cluster.Access{Verb: "patch", Resource: "secrets", Namespace: ns, Name: "ghcr-pull"}
	}
	lease := cluster.Access{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: "flux-system"}
	needs := []cluster.Access{get("new"), patch("new"), get("old"), patch("old"), lease}

	for _, tc := range []struct {
		name        string
		denied      []cluster.Access
		wantOutside []string
		wantRest    []cluster.Access
	}{
		{"everything granted", nil, nil, nil},
		{"a namespace labelled after the roles were rendered", []cluster.Access{get("new"), patch("new")}, []string{"new"}, nil},
		{"a namespace granted in part: a broken rendering", []cluster.Access{patch("new")}, nil, []cluster.Access{patch("new")}},
		{"the Lease denied as well: that fails", []cluster.Access{get("new"), patch("new"), lease}, []string{"new"}, []cluster.Access{lease}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outside, rest := OutsideRoles(needs, tc.denied, []string{"new", "old"})
			if !slices.Equal(outside, tc.wantOutside) || !slices.Equal(rest, tc.wantRest) {
				t.Fatalf("outside %v, rest %v; want %v, %v", outside, rest, tc.wantOutside, tc.wantRest)
			}
		})
	}
}

// Only the namespaces the consumer selector alone names may be outside the roles: an explicit
// consumer's or the root's never is.
func TestSelectorOnly(t *testing.T) {
	cfg := &config.Config{
		Consumers: []config.Consumer{{Namespace: "apps", Secret: "ghcr-pull"}},
		FluxRoot:  &config.FluxRoot{Namespace: "flux-system", Secret: "ghcr-auth"},
	}
	targets := []cluster.SecretTarget{
		{Namespace: "apps", Name: "ghcr-pull", Role: plan.RoleConsumer},
		{Namespace: "labelled", Name: "ghcr-pull", Role: plan.RoleConsumer},
		{Namespace: "labelled", Name: "other", Role: plan.RoleConsumer},
		{Namespace: "flux-system", Name: "ghcr-auth", Role: plan.RoleRoot},
	}

	if got := SelectorOnly(cfg, targets); !slices.Equal(got, []string{"labelled"}) {
		t.Fatalf("SelectorOnly = %v, want [labelled]", got)
	}
}
