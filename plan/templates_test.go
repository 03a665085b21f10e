package plan

import "testing"

// The Hetzner autoscaler reads its template once, at start: a rewrite without a restart changes
// nothing it creates, which the plan says once per template block.
func TestStaleReaderWarnings(t *testing.T) {
	hcloud := func(pool, restart string, action TemplateAction) TemplatePlan {
		return TemplatePlan{TemplateObs: TemplateObs{Name: "workers", Namespace: "kube-system", Secret: "hcloud", Key: "HCLOUD_CLUSTER_CONFIG",
			Format: "hcloud-cluster-config", Pool: pool, Restart: restart}, Action: action}
	}

	talos := hcloud("", "", TemplateUpdate)
	talos.Format = "talos"

	for _, tc := range []struct {
		name string
		tps  []TemplatePlan
		want int
	}{
		{"rewritten without a restart, two pools", []TemplatePlan{hcloud("a", "", TemplateUpdate), hcloud("b", "", TemplateUpdate)}, 1},
		{"rewritten with a restart", []TemplatePlan{hcloud("a", "kube-system/cluster-autoscaler", TemplateUpdate)}, 0},
		{"unchanged", []TemplatePlan{hcloud("a", "", TemplateNoOp)}, 0},
		{"a Talos config template", []TemplatePlan{talos}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := staleReaderWarnings(tc.tps); len(got) != tc.want {
				t.Fatalf("%d warnings, want %d: %q", len(got), tc.want, got)
			}
		})
	}
}
