package actions

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Which shipped workflows each event starts, by GitHub's rules for their triggers.
func TestTriggeredByTheShippedWorkflows(t *testing.T) {
	dir := "../../../docs/workflows"
	cred, cfg := "clusters/prod/ghcr-secret.enc.yaml", "ghcrsync.hcl"

	for _, tc := range []struct {
		name string
		ev   Event
		want []string
	}{
		{"a pull request changing the credential", Event{Name: "pull_request", Branch: "main", Changed: []string{cred}}, []string{"validate.yml"}},
		{"its target run", Event{Name: "pull_request_target", Branch: "main", Changed: []string{cred}}, []string{"plan.yml"}},
		{"a pull request changing only a workflow", Event{Name: "pull_request_target", Branch: "main", Changed: []string{".github/workflows/apply.yml"}}, nil},
		{"a push of the configuration to main", Event{Name: "push", Branch: "main", Changed: []string{"README.md", cfg}}, []string{"apply.yml"}},
		{"a push of the credential to another branch", Event{Name: "push", Branch: "dev", Changed: []string{cred}}, nil},
		{"a push of anything else", Event{Name: "push", Branch: "main", Changed: []string{"README.md"}}, nil},
		{"a tag", Event{Name: "push", Tag: "v0.3.0"}, []string{"release.yml"}},
		{"another tag", Event{Name: "push", Tag: "latest"}, nil},
		{"the hour", Event{Name: "schedule", Branch: "main"}, []string{"continue.yml"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Triggered(dir, tc.ev)
			if err != nil {
				t.Fatal(err)
			}

			if !slices.Equal(got, tc.want) {
				t.Fatalf("%+v starts %v, want %v", tc.ev, got, tc.want)
			}
		})
	}
}

func TestGlob(t *testing.T) {
	for _, tc := range []struct {
		pattern, path string
		want          bool
	}{
		{"ghcrsync.hcl", "ghcrsync.hcl", true},
		{"ghcrsync.hcl", "ghcrsyncXhcl", false},
		{"clusters/*/ghcr-secret.enc.yaml", "clusters/prod/ghcr-secret.enc.yaml", true},
		{"clusters/*.yaml", "clusters/prod/a.yaml", false},
		{"clusters/**.yaml", "clusters/prod/a.yaml", true},
		{"v*", "v0.3.0", true},
	} {
		if got := glob(tc.pattern).MatchString(tc.path); got != tc.want {
			t.Errorf("%q ~ %q: %v, want %v", tc.pattern, tc.path, got, tc.want)
		}
	}
}

// A workflow without any filter runs on every push; one that ignores paths runs when a change
// is outside them.
func TestTriggeredFilters(t *testing.T) {
	dir := t.TempDir()
	_ = os.WriteFile(filepath.Join(dir, "any.yml"), []byte("on: push\njobs:\n  a:\n    runs-on: x\n    steps:\n      - run: true\n"), 0o600)
	_ = os.WriteFile(filepath.Join(dir, "ignore.yml"), []byte("on:\n  push:\n    paths-ignore: [\"docs/**\"]\njobs:\n  a:\n    runs-on: x\n    steps:\n      - run: true\n"), 0o600)

	for _, tc := range []struct {
		changed []string
		want    []string
	}{
		{[]string{"docs/a.md"}, []string{"any.yml"}},
		{[]string{"docs/a.md", "main.go"}, []string{"any.yml", "ignore.yml"}},
	} {
		got, err := Triggered(dir, Event{Name: "push", Branch: "main", Changed: tc.changed})
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("a push of %v starts %v (%v), want %v", tc.changed, got, err, tc.want)
		}
	}
}

// Parse drops only the error of the key actionlint does not know yet (concurrency's queue): any
// other unknown key is still an error.
func TestParseDropsOnlyTheQueueKey(t *testing.T) {
	wf := "on: push\nconcurrency:\n  group: g\n  queue: max\n%sjobs:\n  a:\n    runs-on: x\n    steps:\n      - run: true\n"

	if _, errs := Parse([]byte(fmt.Sprintf(wf, ""))); len(errs) != 0 {
		t.Fatalf("queue: max: %v", errs)
	}

	if _, errs := Parse([]byte(fmt.Sprintf(wf, "  bogus: 1\n"))); len(errs) != 1 || !strings.Contains(errs[0].Message, `"bogus"`) {
		t.Fatalf("an unknown key beside it: %v", errs)
	}
}
