package config

import (
	"path/filepath"
	"strings"
	"testing"
)

// A finding of validate never repeats a value env() returned, as the decoder's own errors do not:
// the SOPS file named through env() is refused without its path.
func TestValidateFindingsWithoutEnvValues(t *testing.T) {
	path := writeDir(t, strings.Replace(valid, `sops_file = "secret.enc.yaml"`, `sops_file = env("GHCRSYNC_TEST_SOPS_FILE")`, 1))
	sops := filepath.Join(filepath.Dir(path), "secret.enc.yaml")
	t.Setenv("GHCRSYNC_TEST_SOPS_FILE", sops)

	v := Validate(path)

	found := false

	for _, d := range v.Diagnostics {
		if d.Summary == "Invalid SOPS file" {
			found = true

			if strings.Contains(d.Detail, sops) || !strings.Contains(d.Detail, `env("GHCRSYNC_TEST_SOPS_FILE")`) {
				t.Fatalf("the finding repeats the env() value: %q", d.Detail)
			}
		}
	}

	if !found {
		t.Fatalf("no Invalid SOPS file finding: %+v", v.Diagnostics)
	}
}
