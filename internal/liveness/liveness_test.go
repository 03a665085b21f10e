package liveness

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/holder"
)

// What the GitHub Actions answer proves: a run attempt is over only when the answer is about that
// attempt and says "completed"; anything else is an error (the run counts as alive).
func TestGitHubActionsAnswers(t *testing.T) {
	for _, tc := range []struct {
		name     string
		code     int
		body     string
		terminal bool
		err      string // "" no error
	}{
		{"completed", 200, `{"id": 42, "run_attempt": 1, "status": "completed"}`, true, ""},
		{"in progress", 200, `{"id": 42, "run_attempt": 1, "status": "in_progress"}`, false, ""},
		{"no status", 200, `{"id": 42, "run_attempt": 1}`, false, "without a status"},
		{"empty object", 200, `{}`, false, "without a status"},
		{"another run", 200, `{"id": 43, "run_attempt": 1, "status": "completed"}`, false, "answered for run 43 attempt 1, not run 42 attempt 1"},
		{"another attempt", 200, `{"id": 42, "run_attempt": 2, "status": "completed"}`, false, "not run 42 attempt 1"},
		{"not JSON", 200, `<html>`, false, "unreadable answer"},
		{"not found", 404, `{"message": "Not Found"}`, false, "answered 404"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/repos/org/repo/actions/runs/42/attempts/1" {
					http.NotFound(w, r)

					return
				}

				w.WriteHeader(tc.code)
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()

			u, _ := url.Parse(srv.URL)
			g := &GitHubActions{APIURL: srv.URL, Repository: "org/repo", TrustedHosts: []string{u.Hostname()}, Client: srv.Client()}

			v, err := g.Check(context.Background(), holder.ID{RunRef: "gh42.1"})

			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("error %v, want %q", err, tc.err)
			case v.Terminal != tc.terminal:
				t.Fatalf("terminal %t, want %t (%+v)", v.Terminal, tc.terminal, v)
			}
		})
	}
}

// assess, the decision alone: every status GitHub documents for a run, and answers about
// another run or attempt. Only "completed" about this very attempt ends the run.
func TestAssess(t *testing.T) {
	g := &GitHubActions{Repository: "org/repo"}

	for _, tc := range []struct {
		name     string
		answer   attemptAnswer
		terminal bool
		err      string
	}{
		{"completed", attemptAnswer{ID: 42, RunAttempt: 1, Status: "completed"}, true, ""},
		{"queued", attemptAnswer{ID: 42, RunAttempt: 1, Status: "queued"}, false, ""},
		{"in progress", attemptAnswer{ID: 42, RunAttempt: 1, Status: "in_progress"}, false, ""},
		{"waiting for an approval", attemptAnswer{ID: 42, RunAttempt: 1, Status: "waiting"}, false, ""},
		{"requested", attemptAnswer{ID: 42, RunAttempt: 1, Status: "requested"}, false, ""},
		{"pending", attemptAnswer{ID: 42, RunAttempt: 1, Status: "pending"}, false, ""},
		{"a status GitHub may add later", attemptAnswer{ID: 42, RunAttempt: 1, Status: "Completed "}, false, ""},
		{"no status", attemptAnswer{ID: 42, RunAttempt: 1}, false, "without a status"},
		{"another run, completed", attemptAnswer{ID: 7, RunAttempt: 1, Status: "completed"}, false, "not run 42 attempt 1"},
		{"a later attempt, completed", attemptAnswer{ID: 42, RunAttempt: 2, Status: "completed"}, false, "not run 42 attempt 1"},
		{"no id", attemptAnswer{RunAttempt: 1, Status: "completed"}, false, "not run 42 attempt 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := g.assess(tc.answer, "42", "1")

			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("error %v, want %q", err, tc.err)
			case v.Terminal != tc.terminal:
				t.Fatalf("terminal %t, want %t (%+v)", v.Terminal, tc.terminal, v)
			case err == nil && !v.Applicable:
				t.Fatalf("a judged answer is not applicable: %+v", v)
			}
		})
	}
}
