package plan

import (
	"strings"
	"testing"
)

func TestProbeArchWarnings(t *testing.T) {
	const img = "ghcr.io/acme/probe@sha256:1"

	nodes := Snapshot{Nodes: []Node{{Name: "w-amd", Arch: "amd64"}, {Name: "w-arm", Arch: "arm64"}, {Name: "w-arm2", Arch: "arm64"}, {Name: "w-none"}}}
	acted := []NodePlan{{Name: "w-amd", Action: ActionFence}, {Name: "w-arm", Action: ActionApplyLive}, {Name: "w-arm2", Action: ActionFence}, {Name: "w-none", Action: ActionFence}}

	for _, tc := range []struct {
		name      string
		platforms map[string][]string
		nodes     []NodePlan
		want      []string // each a warning's words; none: no warning
	}{
		{name: "multi_arch_index", platforms: map[string][]string{img: {"linux/amd64", "linux/arm64/v8"}}, nodes: acted},
		{name: "amd64_only", platforms: map[string][]string{img: {"linux/amd64"}}, nodes: acted,
			want: []string{"offers linux/amd64 only; w-arm, w-arm2 are linux/arm64"}},
		{name: "platforms_unknown", platforms: nil, nodes: acted},
		{name: "arm_nodes_left_alone", platforms: map[string][]string{img: {"linux/amd64"}},
			nodes: []NodePlan{{Name: "w-amd", Action: ActionFence}, {Name: "w-arm", Action: ActionNoOp}}},
		{name: "windows_variant_only", platforms: map[string][]string{img: {"windows/amd64"}},
			nodes: []NodePlan{{Name: "w-amd", Action: ActionFence}}, want: []string{"w-amd is linux/amd64"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Plan{Probe: Probe{Image: img, Platforms: tc.platforms}, Nodes: tc.nodes}

			got := probeArchWarnings(p, nodes)
			if len(got) != len(tc.want) {
				t.Fatalf("got %q, want %d warning(s)", got, len(tc.want))
			}

			for i, w := range tc.want {
				if !strings.Contains(got[i], w) || !strings.Contains(got[i], "multi-arch") {
					t.Fatalf("warning %q does not say %q", got[i], w)
				}
			}
		})
	}
}
