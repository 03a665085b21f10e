package permission

import (
	"slices"
	"strings"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/cluster"
	"github.com/ghcrsync/ghcrsync/internal/config"
)

// A connected rendering leaves out what needs a namespace that does not exist (and names it);
// the roles' own namespace and cluster-wide needs always stay.
func TestWithoutAbsent(t *testing.T) {
	need := func(ns string) cluster.Access { return cluster.Access{Verb: "get", Resource: "secrets", Namespace: ns} }

	for _, tc := range []struct {
		name        string
		needs       []cluster.Access
		existing    []string
		wantNeeds   int
		wantSkipped []string
	}{
		{"every namespace exists", []cluster.Access{need("apps"), need("")}, []string{"apps"}, 2, nil},
		{"a consumer namespace is missing", []cluster.Access{need("apps"), need("gone"), need("")}, []string{"apps"}, 2, []string{"gone"}},
		{"the roles' own namespace always stays", []cluster.Access{need("ghcrsync-system")}, nil, 1, nil},
		{"two missing, named once each, sorted", []cluster.Access{need("b"), need("a"), need("b")}, nil, 0, []string{"a", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ids := []Identity{{Class: "apply", Needs: slices.Clone(tc.needs)}}

			skipped := withoutAbsent(ids, "ghcrsync-system", tc.existing)
			if len(ids[0].Needs) != tc.wantNeeds || !slices.Equal(skipped, tc.wantSkipped) {
				t.Fatalf("needs %v, skipped %v; want %d needs, skipped %v", ids[0].Needs, skipped, tc.wantNeeds, tc.wantSkipped)
			}
		})
	}
}

// ghcrsync's identities never live in a namespace of the cluster's or Flux's: the policies bound
// its identities by exact user name, and a rendering there would bound the wrong ones.
func TestReservedNamespacesAreRefused(t *testing.T) {
	cfg := &config.Config{}

	for _, ns := range ReservedNamespaces {
		if _, _, err := ForConfiguration(cfg, ns, nil, nil, true); err == nil || !strings.Contains(err.Error(), "--namespace "+ns) {
			t.Errorf("--namespace %s: %v", ns, err)
		}
	}

	cond := identitiesCondition("ghcrsync-system").Expression
	if strings.Contains(cond, "startsWith") || !strings.Contains(cond, `"system:serviceaccount:ghcrsync-system:ghcrsync-apply"`) {
		t.Fatalf("the identities are not matched by exact name: %s", cond)
	}
}
