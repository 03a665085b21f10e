// Package liveness decides whether the run behind a Lease holder id has ended, from evidence
// outside the cluster: the GitHub Actions run-attempt API. Anything short of a definite
// "completed" — another status, an error, an unreachable API — means alive (fail closed).
package liveness

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/holder"
	"github.com/ghcrsync/ghcrsync/internal/pin"
	"github.com/ghcrsync/ghcrsync/internal/readlimit"
)

// Source is a liveness source: it judges whether the run behind a holder id has ended.
type Source interface {
	Check(ctx context.Context, id holder.ID) (Verdict, error)
}

var ghRef = regexp.MustCompile(`^gh([0-9]+)\.([0-9]+)$`)

// GitHubActions checks run attempts through the GitHub REST API.
type GitHubActions struct {
	APIURL     string
	Repository string
	Token      string
	// TrustedHosts are the hosts the token may be sent to (pin.URL): the configuration checks
	// APIURL against them, and Check again before every request and redirect.
	TrustedHosts []string
	Client       *http.Client
}

// Verdict is the evidence about one run. Applicable is false when the run ref is not one the
// source can judge (a local run): there is no evidence either way.
type Verdict struct {
	Applicable bool
	Terminal   bool
	// Unique is evidence that cannot be about another process (Local: a process identity of
	// this PID namespace and boot).
	Unique   bool
	Evidence string
}

// Check asks whether the holder's GitHub Actions run attempt is completed. An error means the
// evidence could not be had: the caller treats the run as alive.
func (g *GitHubActions) Check(ctx context.Context, id holder.ID) (Verdict, error) {
	m := ghRef.FindStringSubmatch(id.RunRef)
	if m == nil {
		return Verdict{Evidence: fmt.Sprintf("run ref %q is not a GitHub Actions run (gh<run id>.<attempt>)", id.RunRef)}, nil
	}

	a, err := g.attempt(ctx, m[1], m[2])
	if err != nil {
		return Verdict{}, err
	}

	return g.assess(a, m[1], m[2])
}

// attemptAnswer is what the run-attempt API says of one attempt.
type attemptAnswer struct {
	ID         int64  `json:"id"`
	RunAttempt int    `json:"run_attempt"`
	Status     string `json:"status"`
}

// attempt reads the run attempt from the API: the token goes only to a pinned host.
func (g *GitHubActions) attempt(ctx context.Context, run, attempt string) (attemptAnswer, error) {
	url := fmt.Sprintf("%s/repos/%s/actions/runs/%s/attempts/%s", g.APIURL, g.Repository, run, attempt)

	if err := pin.URL(url, g.TrustedHosts); err != nil {
		return attemptAnswer{}, fmt.Errorf("GitHub Actions API: %w; the token was not sent", err)
	}

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return attemptAnswer{}, err
	}

	req.Header.Set("Accept", "application/vnd.github+json")

	if g.Token != "" {
		req.Header.Set("Authorization", "Bearer "+g.Token)
	}

	client := g.Client
	if client == nil {
		client = &http.Client{Timeout: 15 * time.Second, CheckRedirect: pin.Redirects(g.TrustedHosts)}
	}

	resp, err := client.Do(req)
	if err != nil {
		return attemptAnswer{}, fmt.Errorf("GitHub Actions API %s unreachable: %w", g.APIURL, err)
	}
	defer resp.Body.Close()

	if resp.StatusCode != http.StatusOK {
		return attemptAnswer{}, fmt.Errorf("GitHub Actions API answered %d for run %s attempt %s of %s", resp.StatusCode, run, attempt, g.Repository)
	}

	var a attemptAnswer
	if err := json.NewDecoder(io.LimitReader(resp.Body, readlimit.Body)).Decode(&a); err != nil {
		return attemptAnswer{}, fmt.Errorf("GitHub Actions API: unreadable answer: %w", err)
	}

	return a, nil
}

// assess judges an answer about run's attempt. One that does not say which run it is about, or
// what state it is in, proves nothing: the holder counts as alive. Only "completed" ends it.
func (g *GitHubActions) assess(a attemptAnswer, run, attempt string) (Verdict, error) {
	switch {
	case a.Status == "":
		return Verdict{}, fmt.Errorf("GitHub Actions API answered for run %s attempt %s of %s without a status: whether it ended cannot be told", run, attempt, g.Repository)
	case fmt.Sprint(a.ID) != run || fmt.Sprint(a.RunAttempt) != attempt:
		return Verdict{}, fmt.Errorf("GitHub Actions API answered for run %d attempt %d, not run %s attempt %s of %s: whether it ended cannot be told",
			a.ID, a.RunAttempt, run, attempt, g.Repository)
	}

	ev := fmt.Sprintf("GitHub Actions run %s attempt %s of %s is %s", run, attempt, g.Repository, a.Status)

	return Verdict{Applicable: true, Terminal: a.Status == "completed", Evidence: ev}, nil
}
