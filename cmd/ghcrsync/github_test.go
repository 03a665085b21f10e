package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/sandbox/sandboxtest"
	"github.com/ghcrsync/ghcrsync/internal/view"
)

// In GitHub Actions (GITHUB_ACTIONS=true) plan annotates its warnings, appends the Markdown
// plan to the step summary and writes it for a pull-request comment; an error becomes an
// error annotation; --output plain turns it all off.
func TestGitHubOutput(t *testing.T) {
	sb := sandboxtest.Get(t)
	cfg := sandboxEnv(t, sb)
	dir := t.TempDir()
	summary := filepath.Join(dir, "summary.md")

	t.Setenv("GITHUB_ACTIONS", "true")
	t.Setenv("GITHUB_STEP_SUMMARY", summary)

	md, out := filepath.Join(dir, "plan.md"), filepath.Join(dir, "plan.out")

	r := ghcrsync(t, "plan", "--config", cfg, "--out", out, "--markdown", md)
	if r.code != 0 || !strings.Contains(r.stdout, "\n::warning title=ghcrsync plan::") {
		t.Fatalf("plan in GitHub Actions: exit %d, want warning annotations\n%s", r.code, r.stdout)
	}

	written, _ := os.ReadFile(md)
	summed, _ := os.ReadFile(summary)

	for name, b := range map[string][]byte{"--markdown": written, "step summary": summed} {
		first, rest, _ := strings.Cut(string(b), "\n")
		if !strings.HasPrefix(first, view.MarkdownMarker+" cluster=") || !strings.HasSuffix(first, " -->") || !strings.HasPrefix(rest, "### ghcrsync plan: ") || !strings.Contains(string(b), "| # | Node | Role | Talos | Action | Disruption | Reason |") {
			t.Errorf("%s is not the Markdown plan:\n%s", name, b)
		}
	}

	shown := ghcrsync(t, "show", "--markdown", out)
	if shown.code != 0 || shown.stdout != string(written) {
		t.Errorf("show --markdown differs from plan --markdown:\n%s", shown.stdout)
	}

	bad := ghcrsync(t, "apply", "--config", cfg, filepath.Join(dir, "absent.plan"))
	if bad.code != 1 || !strings.Contains(bad.stdout, "::error title=ghcrsync apply::read plan file") {
		t.Errorf("an error in GitHub Actions: exit %d, want an error annotation\n%s", bad.code, bad.stdout)
	}

	plain := ghcrsync(t, "plan", "--config", cfg, "--output", "plain", "--verbose")
	if plain.code != 0 || strings.Contains(plain.stdout, "::") {
		t.Errorf("--output plain wrote annotations:\n%s", plain.stdout)
	}

	// --verbose says what the plan cost: one LIST of the Nodes, Talos reads.
	if !regexp.MustCompile(`Requests: Kubernetes \d+ \(.*LIST \d.*\); Talos \d+ \(`).MatchString(plain.stderr) {
		t.Errorf("plan --verbose: %s", plain.stderr)
	}

	// With --json, stdout is JSON only (jq reads it), and the annotations go to stderr (the
	// runner reads workflow commands from both streams).
	js := ghcrsync(t, "plan", "--config", cfg, "--json")
	if js.code != 0 || !json.Valid([]byte(js.stdout)) || strings.Contains(js.stdout, "::") || !strings.Contains(js.stderr, "::warning title=ghcrsync plan::") {
		t.Errorf("plan --json in GitHub Actions: exit %d\nstdout:\n%s\nstderr:\n%s", js.code, js.stdout, js.stderr)
	}

	if bad := ghcrsync(t, "apply", "--config", cfg, "--json", filepath.Join(dir, "absent.plan")); bad.code != 1 || bad.stdout != "" ||
		!strings.Contains(bad.stderr, "::error title=ghcrsync apply::read plan file") {
		t.Errorf("an error of apply --json in GitHub Actions: exit %d\nstdout:\n%s\nstderr:\n%s", bad.code, bad.stdout, bad.stderr)
	}

	if r := ghcrsync(t, "plan", "--config", cfg, "--output", "gitlab"); r.code != 1 || !strings.Contains(r.stderr, `unknown --output "gitlab"`) {
		t.Errorf("--output gitlab: exit %d\n%s", r.code, r.stderr)
	}
}
