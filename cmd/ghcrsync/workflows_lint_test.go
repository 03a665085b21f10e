package main

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rhysd/actionlint"
)

// The shipped workflows as an organisation that requires it reads them: actionlint finds
// nothing; every action is pinned by a full commit SHA with its version in a comment; the
// install step is the same in every workflow; every job has a timeout that leaves the budget's
// safe stop room (GHCRSYNC_WITHIN + 15 ≤ timeout-minutes ≤ 60, the merge queue's eviction);
// the required check (validate.yml) runs on every pull request and merge-queue entry, with no
// path filter and no secret; plan.yml has a concurrency group; apply.yml runs on a change of
// the configuration as of the credential.
func TestShippedWorkflowsLint(t *testing.T) {
	files, _ := filepath.Glob("../../docs/workflows/*.yml")
	if len(files) < 6 {
		t.Fatalf("docs/workflows has %d workflows: %v", len(files), files)
	}

	l, err := actionlint.NewLinter(io.Discard, &actionlint.LinterOptions{})
	if err != nil {
		t.Fatal(err)
	}

	if errs, err := l.LintFiles(files, nil); err != nil || len(errs) > 0 {
		for _, e := range errs {
			t.Errorf("actionlint: %s:%d:%d: %s", e.Filepath, e.Line, e.Column, e.Message)
		}

		t.Fatal(err)
	}

	pinned := regexp.MustCompile(`^\s*(- )?uses: [\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+(\.\d+){0,2}$`)
	installs := map[string]string{}

	for _, f := range files {
		name := filepath.Base(f)

		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}

		for i, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "uses:") && !pinned.MatchString(line) {
				t.Errorf("%s:%d: %q is not pinned by a full commit SHA with `# vX.Y.Z`", name, i+1, strings.TrimSpace(line))
			}
		}

		wf, errs := actionlint.Parse(b)
		if len(errs) > 0 {
			t.Fatal(errs)
		}

		for id, job := range wf.Jobs {
			if job.TimeoutMinutes == nil {
				t.Errorf("%s: job %s has no timeout-minutes", name, id)

				continue
			}

			timeout := time.Duration(job.TimeoutMinutes.Value) * time.Minute
			if timeout > time.Hour {
				t.Errorf("%s: job %s's timeout-minutes %v is over the merge queue's hour", name, id, timeout)
			}

			if within, ok := envOf(job.Env)["GHCRSYNC_WITHIN"]; ok {
				d, err := time.ParseDuration(within)
				if err != nil || d+15*time.Minute > timeout {
					t.Errorf("%s: job %s: GHCRSYNC_WITHIN %s + 15m is over timeout-minutes %v: the job would be killed before the budget's safe stop", name, id, within, timeout)
				}
			}

			for _, step := range job.Steps {
				if run, ok := step.Exec.(*actionlint.ExecRun); ok && stepName(step) == "Install ghcrsync" {
					installs[name] = run.Run.Value
				}
			}
		}

		switch name {
		case "validate.yml":
			var hooks []string

			for _, ev := range wf.On {
				w, ok := ev.(*actionlint.WebhookEvent)
				if !ok {
					continue
				}

				hooks = append(hooks, w.Hook.Value)
				if w.Paths != nil || w.PathsIgnore != nil || w.Branches != nil {
					t.Errorf("validate.yml: its %s trigger is filtered: a required check must always report", w.Hook.Value)
				}
			}

			if slices.Sort(hooks); !slices.Equal(hooks, []string{"merge_group", "pull_request"}) {
				t.Errorf("validate.yml runs on %v, want pull_request and merge_group", hooks)
			}

			if strings.Contains(string(b), "secrets.") {
				t.Errorf("validate.yml reads a secret: the required check must hold none")
			}
		case "plan.yml":
			if wf.Concurrency == nil || !strings.Contains(wf.Concurrency.Group.Value, "pull_request.number") {
				t.Errorf("plan.yml has no concurrency group per pull request")
			}
		case "apply.yml":
			for _, ev := range wf.On {
				if w, ok := ev.(*actionlint.WebhookEvent); ok && w.Hook.Value == "push" {
					var paths []string
					for _, p := range w.Paths.Values {
						paths = append(paths, p.Value)
					}

					if !slices.Contains(paths, "ghcrsync.hcl") || !slices.Contains(paths, "clusters/prod/ghcr-secret.enc.yaml") {
						t.Errorf("apply.yml runs on a push of %v: a change of the configuration or of the credential must both apply", paths)
					}
				}
			}
		}
	}

	var first string

	for name, script := range installs {
		if first == "" {
			first = script
		} else if script != first {
			t.Errorf("%s's Install ghcrsync step differs from the others': keep them one step, copied", name)
		}
	}

	if len(installs) < 5 {
		t.Errorf("only %d workflows install ghcrsync from a release: %v", len(installs), installs)
	}
}
