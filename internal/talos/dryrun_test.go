package talos

import "testing"

// machined's dry-run answer, in one line.
func TestDryRunSummary(t *testing.T) {
	for _, tc := range []struct{ name, mode, details, want string }{
		{"staged", "STAGED", "Dry run summary:\nStaged configuration to be applied after a reboot (skipped in dry-run).\nConfig diff:\n\n+x", "STAGED: Staged configuration to be applied after a reboot"},
		{"no reboot", "NO_REBOOT", "Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\n", "NO_REBOOT: Applied configuration without a reboot"},
		{"no details", "STAGED", "", "STAGED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := dryRunSummary(tc.mode, tc.details); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}
