package apply

import (
	"testing"

	"github.com/ghcrsync/ghcrsync/plan"
)

// The root waits only while readers rolling out are all that keeps the old credential in use.
func TestOnlyRollouts(t *testing.T) {
	rolling := plan.TemplateObs{Namespace: "kube-system", Secret: "hcloud", Key: "HCLOUD_CLUSTER_CONFIG", Restart: "kube-system/cluster-autoscaler"}
	other := plan.TemplateObs{Namespace: "kube-system", Secret: "other", Key: "HCLOUD_CLUSTER_CONFIG"}
	use := func(kind, name string, state plan.UseState) plan.Use {
		return plan.Use{Kind: kind, Name: name, State: state}
	}

	for _, tc := range []struct {
		name    string
		v       plan.Revocation
		rolling []plan.TemplateObs
		want    bool
	}{
		{"safe: nothing to wait for", plan.Revocation{SafeToRevoke: true, Uses: []plan.Use{use(plan.UseTemplate, rolling.Where(), plan.UseNew)}}, []plan.TemplateObs{rolling}, false},
		{"only a rolling reader's template", plan.Revocation{Uses: []plan.Use{use(plan.UseTemplate, rolling.Where(), plan.UseOld), use(plan.UseNode, "w1", plan.UseNew)}}, []plan.TemplateObs{rolling}, true},
		{"a rolling reader's template and a node on the old credential", plan.Revocation{Uses: []plan.Use{use(plan.UseTemplate, rolling.Where(), plan.UseOld), use(plan.UseNode, "w1", plan.UseOld)}}, []plan.TemplateObs{rolling}, false},
		{"another template, its reader not rolling", plan.Revocation{Uses: []plan.Use{use(plan.UseTemplate, other.Where(), plan.UseOld)}}, []plan.TemplateObs{rolling}, false},
		{"nothing rolling", plan.Revocation{Uses: []plan.Use{use(plan.UseTemplate, rolling.Where(), plan.UseOld)}}, nil, false},
		{"unsafe with no use named", plan.Revocation{}, []plan.TemplateObs{rolling}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := onlyRollouts(tc.v, tc.rolling); got != tc.want {
				t.Fatalf("onlyRollouts = %t, want %t", got, tc.want)
			}
		})
	}
}
