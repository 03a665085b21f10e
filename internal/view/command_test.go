package view_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ghcrsync/ghcrsync/apply"
	"github.com/ghcrsync/ghcrsync/internal/view"
	"github.com/ghcrsync/ghcrsync/plan"
	"github.com/ghcrsync/ghcrsync/state"
)

// Where each part of apply's output goes, by stream settings: the result on stdout, progress,
// timings and requests on stderr (--verbose only), workflow commands on stdout — or stderr when
// stdout carries JSON — and a step summary that cannot be written is a warning, never fatal.
func TestApplyViewStreams(t *testing.T) {
	res := &apply.Result{Plan: changed, Holder: "h", MaxFailures: 1, Nodes: []apply.NodeResult{
		{Node: "w1", Action: plan.ActionFence, Outcome: state.OutcomeFailed, Message: "not proved"}, // annotated
	}}
	counted := func() (string, string, string) {
		return "get=3", "0", "  prove        Kubernetes 1 (POST 1); Talos 0\n"
	}

	for _, tc := range []struct {
		name                   string
		s                      view.Streams
		summary                string // GITHUB_STEP_SUMMARY: "" unset, "dir" a directory (unwritable)
		outHas, errHas, errNot []string
		outNot                 []string
	}{
		{name: "human", s: view.Streams{}, outHas: []string{"Lease released (holder h)", "✗ w1"}, errNot: []string{"Requests:", "::"}, outNot: []string{"::"}},
		{name: "verbose", s: view.Streams{Verbose: true}, errHas: []string{"Requests: Kubernetes get=3; Talos 0.", "Requests by step:\n  prove        Kubernetes 1 (POST 1)"}},
		{name: "json", s: view.Streams{JSON: true}, outHas: []string{`"type":"summary"`}, outNot: []string{"Lease released"}},
		{name: "github", s: view.Streams{GitHub: true}, summary: "file", outHas: []string{"::"}, errNot: []string{"::"}},
		{name: "github_json_annotates_stderr", s: view.Streams{GitHub: true, JSON: true}, summary: "file", errHas: []string{"::"}, outNot: []string{"::"}},
		{name: "unwritable_summary_warns", s: view.Streams{GitHub: true}, summary: "dir", outHas: []string{"::warning title=ghcrsync apply::step summary"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			switch tc.summary {
			case "":
				t.Setenv("GITHUB_STEP_SUMMARY", "")
			case "file":
				t.Setenv("GITHUB_STEP_SUMMARY", filepath.Join(t.TempDir(), "summary.md"))
			case "dir":
				t.Setenv("GITHUB_STEP_SUMMARY", t.TempDir())
			}

			var out, errOut bytes.Buffer
			tc.s.Out, tc.s.Err = &out, &errOut

			if err := view.NewApply(tc.s).Result(res, counted); err != nil {
				t.Fatal(err)
			}

			check := func(stream string, got string, has, not []string) {
				for _, h := range has {
					if !strings.Contains(got, h) {
						t.Errorf("%s lacks %q:\n%s", stream, h, got)
					}
				}

				for _, n := range not {
					if strings.Contains(got, n) {
						t.Errorf("%s has %q:\n%s", stream, n, got)
					}
				}
			}

			check("stdout", out.String(), tc.outHas, tc.outNot)
			check("stderr", errOut.String(), tc.errHas, tc.errNot)

			if tc.summary == "file" {
				if b, err := os.ReadFile(os.Getenv("GITHUB_STEP_SUMMARY")); err != nil || len(b) == 0 {
					t.Errorf("no step summary written: %v", err)
				}
			}
		})
	}
}

// Under GitHub Actions apply sets step outputs a workflow's next step decides on (outcome,
// remaining, safe_to_revoke) — appended to $GITHUB_OUTPUT, one line each; without GitHub output,
// nothing is written there.
func TestApplyStepOutputs(t *testing.T) {
	res := &apply.Result{Plan: changed, Holder: "h", MaxFailures: 1, Nodes: []apply.NodeResult{
		{Node: "w1", Action: plan.ActionFence, Outcome: state.OutcomeFailed, Message: "not proved"},
	}}

	for _, tc := range []struct {
		name string
		s    view.Streams
		want string
	}{
		{name: "github", s: view.Streams{GitHub: true}, want: "earlier=1\noutcome=partial\nremaining=0\nsafe_to_revoke=false\n"},
		{name: "plain", s: view.Streams{}, want: "earlier=1\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "output")
			if err := os.WriteFile(path, []byte("earlier=1\n"), 0o644); err != nil {
				t.Fatal(err)
			}

			t.Setenv("GITHUB_OUTPUT", path)
			t.Setenv("GITHUB_STEP_SUMMARY", "")

			var out, errOut bytes.Buffer
			tc.s.Out, tc.s.Err = &out, &errOut

			if err := view.NewApply(tc.s).Result(res, nil); err != nil {
				t.Fatal(err)
			}

			if b, _ := os.ReadFile(path); string(b) != tc.want {
				t.Fatalf("$GITHUB_OUTPUT: got %q, want %q", b, tc.want)
			}
		})
	}
}
