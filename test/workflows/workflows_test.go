// Package workflows checks the GitHub Actions workflows ghcrsync ships for teams to copy
// (docs/workflows/*.yml) as an organisation that requires it reads them: actionlint finds no
// error; no `run:` script interpolates an expression (a secret or an input reaches a script
// through `env` only: a quote in the value cannot break the script, which GitHub's hardening
// guide warns against); every action is pinned by a full commit SHA with its version in a
// comment; every job has a timeout that leaves the budget's safe stop room (GHCRSYNC_WITHIN + 15
// ≤ timeout-minutes ≤ 60, the deploy lane's hour); the install step is one text in every
// workflow; the required check (validate.yml) runs on every pull request and merge-queue entry
// with no path filter and no secret; plan.yml has a concurrency group per pull request; apply.yml
// runs on a change of the configuration as of the credential. cmd/ghcrsync's workflow test
// plays them on the sandbox.
package workflows

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rhysd/actionlint"

	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/actions"
)

func shipped(t *testing.T) []string {
	t.Helper()

	files, err := filepath.Glob("../../docs/workflows/*.yml")
	if err != nil || len(files) != 6 {
		t.Fatalf("docs/workflows: %v %v (want validate, plan, apply, continue, recover and release)", files, err)
	}

	return files
}

// lint is actionlint over one workflow's content (shellcheck and pyflakes are not run: they
// are not Go modules).
func lint(t *testing.T, path string, content []byte) []*actionlint.Error {
	t.Helper()

	l, err := actionlint.NewLinter(io.Discard, &actionlint.LinterOptions{})
	if err != nil {
		t.Fatal(err)
	}

	errs, err := l.Lint(path, content, nil)
	if err != nil {
		t.Fatal(err)
	}

	return slices.DeleteFunc(errs, actions.NewerThanTheLinter)
}

// interpolated lists the steps whose run script holds a ${{ … }} expression.
func interpolated(t *testing.T, content []byte) []string {
	t.Helper()

	wf, errs := actions.Parse(content)
	if len(errs) > 0 {
		t.Fatalf("parse: %v", errs[0])
	}

	var out []string

	for id, job := range wf.Jobs {
		for i, step := range job.Steps {
			if run, ok := step.Exec.(*actionlint.ExecRun); ok && run.Run != nil && strings.Contains(run.Run.Value, "${{") {
				out = append(out, id+" step "+strconv.Itoa(i+1))
			}
		}
	}

	return out
}

func TestShippedWorkflowsLint(t *testing.T) {
	for _, path := range shipped(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			content, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}

			for _, e := range lint(t, path, content) {
				t.Errorf("actionlint: %s:%d:%d: %s [%s]", filepath.Base(path), e.Line, e.Column, e.Message, e.Kind)
			}

			if bad := interpolated(t, content); len(bad) > 0 {
				t.Errorf("%s interpolates an expression into a script (pass it through env): %v", filepath.Base(path), bad)
			}

			for _, u := range unpinned(content) {
				t.Errorf("%s: %s is not pinned by a full commit SHA with `# vX.Y.Z`", filepath.Base(path), u)
			}

			for _, p := range timeouts(t, content) {
				t.Errorf("%s: %s", filepath.Base(path), p)
			}

			for _, s := range applyAfterCancel(t, content) {
				t.Errorf("%s: %s runs ghcrsync apply under an if: that holds after a cancellation: a cancelled run would take the Lease again", filepath.Base(path), s)
			}
		})
	}
}

// afterCancel matches an if: that holds after the run was cancelled: always(), or cancelled()
// not negated (`!cancelled()` is the opposite).
var afterCancel = regexp.MustCompile(`always\(\)|(^|[^!\s]\s*|[^!])cancelled\(\)`)

// applyAfterCancel lists the steps that run `ghcrsync apply` — the command that takes the run
// Lease and fences nodes — under an if: that holds after a cancellation (always(), cancelled()):
// the runner would start a new run in the middle of the cancelled one's wind-down (A11b).
func applyAfterCancel(t *testing.T, content []byte) []string {
	t.Helper()

	wf, errs := actions.Parse(content)
	if len(errs) > 0 {
		t.Fatalf("parse: %v", errs[0])
	}

	var out []string

	for id, job := range wf.Jobs {
		jobIf := ""
		if job.If != nil {
			jobIf = job.If.Value
		}

		for i, step := range job.Steps {
			run, ok := step.Exec.(*actionlint.ExecRun)
			if !ok || run.Run == nil || !regexp.MustCompile(`\bghcrsync\s+apply\b`).MatchString(run.Run.Value) {
				continue
			}

			stepIf := ""
			if step.If != nil {
				stepIf = step.If.Value
			}

			if afterCancel.MatchString(stepIf) || afterCancel.MatchString(jobIf) {
				out = append(out, id+" step "+strconv.Itoa(i+1))
			}
		}
	}

	return out
}

var pinned = regexp.MustCompile(`^\s*(- )?uses: [\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+(\.\d+){0,2}$`)

// unpinned are the uses: lines not pinned by a full commit SHA with the version in a comment.
func unpinned(content []byte) []string {
	var out []string

	for i, line := range strings.Split(string(content), "\n") {
		if strings.Contains(line, "uses:") && !pinned.MatchString(line) {
			out = append(out, fmt.Sprintf("line %d %q", i+1, strings.TrimSpace(line)))
		}
	}

	return out
}

// timeouts are the jobs without timeout-minutes, over the hour, or too short for their budget
// (GHCRSYNC_WITHIN + 15 minutes: the install, the plan, the recovery).
func timeouts(t *testing.T, content []byte) []string {
	t.Helper()

	wf, errs := actions.Parse(content)
	if len(errs) > 0 {
		t.Fatalf("parse: %v", errs[0])
	}

	var out []string

	for id, job := range wf.Jobs {
		if job.TimeoutMinutes == nil {
			out = append(out, "job "+id+" has no timeout-minutes")

			continue
		}

		timeout := time.Duration(job.TimeoutMinutes.Value) * time.Minute
		if timeout > time.Hour {
			out = append(out, fmt.Sprintf("job %s's timeout-minutes %v is over the deploy lane's hour", id, timeout))
		}

		for _, v := range envVars(job.Env) {
			if v.Name.Value != "GHCRSYNC_WITHIN" {
				continue
			}

			if d, err := time.ParseDuration(v.Value.Value); err != nil || d+15*time.Minute > timeout {
				out = append(out, fmt.Sprintf("job %s: GHCRSYNC_WITHIN %s + 15m is over timeout-minutes %v: the job would be killed before the budget's safe stop", id, v.Value.Value, timeout))
			}
		}
	}

	return out
}

func envVars(e *actionlint.Env) []*actionlint.EnvVar {
	if e == nil {
		return nil
	}

	out := make([]*actionlint.EnvVar, 0, len(e.Vars))
	for _, v := range e.Vars {
		out = append(out, v)
	}

	return out
}

func hooks(wf *actionlint.Workflow) map[string]*actionlint.WebhookEvent {
	out := map[string]*actionlint.WebhookEvent{}

	for _, ev := range wf.On {
		if w, ok := ev.(*actionlint.WebhookEvent); ok {
			out[w.Hook.Value] = w
		}
	}

	return out
}

func parse(t *testing.T, name string) (*actionlint.Workflow, []byte) {
	t.Helper()

	content, err := os.ReadFile(filepath.Join("..", "..", "docs", "workflows", name))
	if err != nil {
		t.Fatal(err)
	}

	wf, errs := actions.Parse(content)
	if len(errs) > 0 {
		t.Fatalf("%s: %v", name, errs[0])
	}

	return wf, content
}

// The merge queue's shape: the required check always reports and holds no secret; the plan is
// cancelled by a newer push; apply runs on a change of either input.
func TestShippedWorkflowsFitAMergeQueue(t *testing.T) {
	validate, content := parse(t, "validate.yml")
	on := hooks(validate)

	if len(on) != 2 || on["pull_request"] == nil || on["merge_group"] == nil {
		t.Errorf("validate.yml runs on %v, want pull_request and merge_group", on)
	}

	for name, w := range on {
		if w.Paths != nil || w.PathsIgnore != nil || w.Branches != nil {
			t.Errorf("validate.yml: its %s trigger is filtered: a required check must always report", name)
		}
	}

	// The one exception: a private fork's release token, read-only and only for the download
	// (with github.token in its place where it is not set).
	if strings.Contains(strings.ReplaceAll(string(content), "secrets.GHCRSYNC_RELEASES_TOKEN || github.token", ""), "secrets.") {
		t.Error("validate.yml reads a secret: the required check must hold none (but a private fork's release token)")
	}

	if plan, _ := parse(t, "plan.yml"); plan.Concurrency == nil || !strings.Contains(plan.Concurrency.Group.Value, "pull_request.number") {
		t.Error("plan.yml has no concurrency group per pull request")
	}

	// The deploy and its continuation queue in one group: neither replaces a pending other.
	for _, name := range []string{"apply.yml", "continue.yml"} {
		if wf, content := parse(t, name); wf.Concurrency == nil || wf.Concurrency.Group.Value != "ghcrsync-prod" ||
			!regexp.MustCompile(`(?m)^  queue: max\b`).Match(content) {
			t.Errorf("%s is not in the concurrency group ghcrsync-prod with queue: max", name)
		}
	}

	// Every file a shipped example configuration reads (as the repository keeps it: the file as
	// ghcrsync.hcl at the root, its SOPS files where it names them) starts the plan of a pull
	// request that changes it, and the deploy of its merge.
	for _, example := range []string{"production.hcl", "tenants.hcl"} { // in-cluster.hcl is the Job's, from its mounted inputs
		cfg, err := config.LoadNames(filepath.Join("..", "..", "config", "examples", example))
		if err != nil {
			t.Fatal(err)
		}

		inputs := []string{"ghcrsync.hcl"}
		for _, f := range cfg.SopsFiles() {
			rel, _ := filepath.Rel(filepath.Dir(cfg.Path), f)
			inputs = append(inputs, filepath.ToSlash(rel))
		}

		for _, in := range inputs {
			for _, c := range []struct {
				event, workflow string
			}{{"pull_request_target", "plan.yml"}, {"push", "apply.yml"}} {
				got, err := actions.Triggered(filepath.Join("..", "..", "docs", "workflows"), actions.Event{Name: c.event, Branch: "main", Changed: []string{in}})
				if err != nil || !slices.Contains(got, c.workflow) {
					t.Errorf("%s reads %s: a change of it starts %v on %s (%v), not %s", example, in, got, c.event, err, c.workflow)
				}
			}
		}
	}
}

// Every workflow that runs ghcrsync installs it with the same steps (a download of the pinned
// release, its checksum checked), never by compiling it; and every run, a cache hit included,
// checks the archive against the digest the workflow pins (required: an unset pin fails).
func TestShippedWorkflowsInstallOneWay(t *testing.T) {
	steps := map[string]map[string]string{"Download ghcrsync": {}, "Install ghcrsync": {}}

	for _, path := range shipped(t) {
		name := filepath.Base(path)

		wf, content := parse(t, name)
		if strings.Contains(string(content), "go install") {
			t.Errorf("%s compiles ghcrsync (go install): install the release", name)
		}

		for _, job := range wf.Jobs {
			for _, step := range job.Steps {
				run, ok := step.Exec.(*actionlint.ExecRun)
				if !ok || step.Name == nil || steps[step.Name.Value] == nil {
					continue
				}

				steps[step.Name.Value][name] = run.Run.Value

				if step.Name.Value == "Install ghcrsync" && step.If != nil {
					t.Errorf("%s installs ghcrsync only %s: the pinned digest must be checked on every run, a cache hit included", name, step.If.Value)
				}
			}

			if steps["Install ghcrsync"][name] != "" && !declares(job.Env, "GHCRSYNC_SHA256") {
				t.Errorf("%s pins no GHCRSYNC_SHA256 in its job's env", name)
			}
		}
	}

	for step, scripts := range steps {
		if len(scripts) != 5 {
			t.Fatalf("%d workflows have a %q step, want the 5 that run ghcrsync: %v", len(scripts), step, scripts)
		}

		first := scripts["validate.yml"]
		for name, script := range scripts {
			if script != first || !strings.Contains(script, "sha256sum --check") {
				t.Errorf("%s's %s step differs from validate.yml's or checks no checksum: keep them one step, copied", name, step)
			}
		}
	}

	if install := steps["Install ghcrsync"]["validate.yml"]; !strings.Contains(install, `${GHCRSYNC_SHA256:?`) || !strings.Contains(install, `"$GHCRSYNC_SHA256  $archive" | sha256sum --check --strict`) {
		t.Errorf("the Install ghcrsync step does not require and check GHCRSYNC_SHA256:\n%s", install)
	}
}

// declares reports whether env sets the variable name.
func declares(env *actionlint.Env, name string) bool {
	if env == nil {
		return false
	}

	for _, v := range env.Vars {
		if v.Name.Value == name {
			return true
		}
	}

	return false
}

// The negative controls: the same checks find what they exist for.
func TestWorkflowChecksFindWhatTheyExistFor(t *testing.T) {
	interpolating := []byte(`name: x
on: push
jobs:
  a:
    runs-on: ubuntu-latest
    steps:
      - run: printf '%s' "${{ secrets.KUBECONFIG }}" > kubeconfig
`)
	if bad := interpolated(t, interpolating); len(bad) != 1 {
		t.Fatalf("a secret interpolated into a script was not found: %v", bad)
	}

	broken := []byte(`name: x
on: push
jobs:
  a:
    runs-on: ubuntu-latest
    steps:
      - run: echo
        if: ${{ github.evnt_name == 'push' }}
        timeout-minute: 5
`)
	if errs := lint(t, "broken.yml", broken); len(errs) == 0 {
		t.Fatal("actionlint found nothing in a broken workflow")
	}

	tagPinned := []byte("      - uses: actions/checkout@v6\n      - uses: actions/cache@9255dc7a253b0ccc959486e2bca901246202afeb\n")
	if bad := unpinned(tagPinned); len(bad) != 2 {
		t.Fatalf("a tag pin and a SHA pin without its version were not both found: %v", bad)
	}

	short := []byte(`name: x
on: push
jobs:
  a:
    runs-on: ubuntu-latest
    timeout-minutes: 50
    env:
      GHCRSYNC_WITHIN: 40m
    steps:
      - run: echo
  b:
    runs-on: ubuntu-latest
    steps:
      - run: echo
`)
	if bad := timeouts(t, short); len(bad) != 2 {
		t.Fatalf("a timeout shorter than its budget + 15 and a job without one were not both found: %v", bad)
	}

	afterCancelling := []byte(`name: x
on: push
jobs:
  a:
    runs-on: ubuntu-latest
    steps:
      - run: exec ghcrsync apply plan.out
        if: always()
      - run: ghcrsync apply plan.out
        if: ${{ cancelled() || failure() }}
      - run: ghcrsync apply plan.out
        if: ${{ !cancelled() }}
      - run: ghcrsync release
        if: cancelled()
  b:
    if: always()
    runs-on: ubuntu-latest
    steps:
      - run: ghcrsync apply plan.out
`)
	if bad := applyAfterCancel(t, afterCancelling); len(bad) != 3 {
		t.Fatalf("apply under always(), under cancelled() and in a job under always() were not all found, or !cancelled() or a release was: %v", bad)
	}
}
