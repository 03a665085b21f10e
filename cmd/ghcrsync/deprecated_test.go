package main

import (
	"strings"
	"testing"
)

// destroy still works for the scripts that call it, but is hidden and says on stderr (never on
// stdout, which may carry --json) that release is the command; the control: release says nothing.
func TestDestroyIsDeprecated(t *testing.T) {
	if help := ghcrsync(t, "--help"); strings.Contains(help.stdout, "destroy") {
		t.Fatalf("--help lists destroy:\n%s", help.stdout)
	}

	for _, tc := range []struct {
		name       string
		deprecated bool
	}{{"destroy", true}, {"release", false}} {
		t.Run(tc.name, func(t *testing.T) {
			r := ghcrsync(t, tc.name, "--dry-run", "--json", "--config", "/nonexistent/ghcrsync.hcl")
			if r.code != 1 || strings.Contains(r.stdout, "deprecated") ||
				strings.Contains(r.stderr, "ghcrsync destroy is deprecated; call ghcrsync release") != tc.deprecated {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
			}
		})
	}
}
