// Package workflows checks the GitHub Actions workflows ghcrsync ships for teams to copy
// (docs/workflows/*.yml): actionlint finds no error in them, and no `run:` script interpolates
// an expression (a secret or an input reaches a script through `env` only: a quote in the value
// cannot break the script, which GitHub's hardening guide warns against).
package workflows

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rhysd/actionlint"
)

func shipped(t *testing.T) []string {
	t.Helper()

	files, err := filepath.Glob("../../docs/workflows/*.yml")
	if err != nil || len(files) != 4 {
		t.Fatalf("docs/workflows: %v %v (want plan, apply, continue and recover)", files, err)
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

	return errs
}

// interpolated lists the steps whose run script holds a ${{ … }} expression.
func interpolated(t *testing.T, content []byte) []string {
	t.Helper()

	wf, errs := actionlint.Parse(content)
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

			if !strings.Contains(string(content), "go install \"github.com/ghcrsync/ghcrsync/cmd/ghcrsync@$GHCRSYNC_VERSION\"") {
				t.Errorf("%s does not install a pinned ghcrsync", filepath.Base(path))
			}
		})
	}
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
}
