package apply

import "testing"

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
