package apply

import (
	"testing"

	"github.com/ghcrsync/ghcrsync/plan"
)

func TestAwaited(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		newBoot, ready, lifecycle bool
		want                      string
	}{
		{"still_down", false, false, false, "a new boot id, Ready"},
		{"booted_not_ready", true, false, false, "Ready"},
		{"ready_but_tainted", true, true, true, "its lifecycle taints to go"},
		{"old_boot_still_ready", false, true, false, "a new boot id"},
		{"nothing", true, true, false, "the next read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := awaited(tc.newBoot, tc.ready, tc.lifecycle); got != tc.want {
				t.Fatalf("awaited = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestCheckSelf(t *testing.T) {
	p := &plan.Plan{Nodes: []plan.NodePlan{
		{Name: "w1", Action: plan.ActionFence}, {Name: "w2", Action: plan.ActionApplyLive}, {Name: "w3", Action: plan.ActionDeselect},
	}}

	for _, tc := range []struct {
		name, self string
		refused    bool
	}{
		{"outside_the_cluster", "", false},
		{"on_a_fenced_node", "w1", true},
		{"on_a_live_node", "w2", false},
		{"on_a_deselected_node", "w3", false},
		{"on_a_node_not_in_the_plan", "cp9", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkSelf(p, "plan.out", tc.self)
			if (err != nil) != tc.refused || tc.refused && !IsRefused(err) {
				t.Fatalf("checkSelf(%q) = %v, refused want %v", tc.self, err, tc.refused)
			}
		})
	}
}
