package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// `ghcrsync version --json` says which build this is and which plan and state formats it reads
// (what a pipeline pins and checks); the plain form is one line.
func TestVersionJSON(t *testing.T) {
	r := ghcrsync(t, "version", "--json")

	var v view.VersionInfo
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || r.code != 0 {
		t.Fatalf("version --json: %d %v\n%s", r.code, err, r.stdout)
	}

	if v.Version != buildVersion() || !strings.HasPrefix(v.GoVersion, "go") || v.PlanFormat != plan.FormatVersion || v.StateFormat != state.FormatVersion || v.Platform == "" {
		t.Fatalf("version --json: %+v", v)
	}

	if plain := ghcrsync(t, "version"); plain.stdout != "ghcrsync "+buildVersion()+"\n" {
		t.Fatalf("version: %q", plain.stdout)
	}
}
