package credential

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/clock"
)

func status(code int) error {
	return &ProofError{Target: "ghcr.io/acme/app:1", Step: "manifest", Status: code}
}

func TestRetryDo(t *testing.T) {
	ok := func(context.Context) error { return nil }
	refusing := func(context.Context) error { return status(http.StatusForbidden) }

	tests := []struct {
		name    string
		answers []Attempt // the registry's answers in turn; past the end: success
		control func(context.Context) error
		window  time.Duration
		denied  time.Duration

		wantErr      string // "" for success
		wantAttempts int
		wantStable   bool
		wantSleeps   func(t *testing.T, sleeps []time.Duration)
	}{
		{
			name:         "success at once is no retry",
			window:       time.Minute,
			wantAttempts: 1,
		},
		{
			name:         "transient answers are waited out",
			answers:      []Attempt{{Err: status(429)}, {Err: status(503)}, {Err: status(502)}},
			window:       time.Minute,
			wantAttempts: 4,
		},
		{
			name:    "Retry-After is honoured",
			answers: []Attempt{{Err: status(429), RetryAfter: 10 * time.Second}},
			window:  time.Minute, wantAttempts: 2,
			wantSleeps: func(t *testing.T, sleeps []time.Duration) {
				if len(sleeps) != 1 || sleeps[0] < 8*time.Second || sleeps[0] > 12*time.Second {
					t.Fatalf("want one pause of 10s ±20%%, got %v", sleeps)
				}
			},
		},
		{
			name:    "a Retry-After past the window stops at once",
			answers: []Attempt{{Err: status(429), RetryAfter: 5 * time.Minute}},
			window:  time.Minute, wantErr: "retry window (1m0s) ran out", wantAttempts: 1,
		},
		{
			name:         "a final answer is not asked again",
			answers:      []Attempt{{Err: status(http.StatusNotFound)}},
			window:       time.Minute,
			wantErr:      "404 Not Found",
			wantAttempts: 1,
		},
		{
			name:         "no answer at all is final: a configuration to fix",
			answers:      []Attempt{{Err: errors.New("dial tcp: connection refused")}},
			window:       time.Minute,
			wantErr:      "connection refused",
			wantAttempts: 1,
		},
		{
			name: "transient answers past the window say the registry is in trouble",
			answers: []Attempt{{Err: status(503)}, {Err: status(503)}, {Err: status(503)}, {Err: status(503)},
				{Err: status(503)}, {Err: status(503)}, {Err: status(503)}, {Err: status(503)}},
			window:  10 * time.Second,
			wantErr: "the registry is in trouble, not (yet) refusing this credential; run again later",
		},
		{
			name:         "a passing denial (GHCR's incident) is waited out",
			answers:      []Attempt{{Err: status(403)}, {Err: status(403)}},
			window:       2 * time.Minute,
			denied:       45 * time.Second,
			wantAttempts: 3,
		},
		{
			name: "a denial that lasts is refused (stable)",
			answers: []Attempt{{Err: status(403)}, {Err: status(403)}, {Err: status(403)}, {Err: status(403)},
				{Err: status(403)}, {Err: status(403)}, {Err: status(403)}, {Err: status(403)}, {Err: status(403)}},
			window:     2 * time.Minute,
			denied:     45 * time.Second,
			wantErr:    "refused (stable): still denied",
			wantStable: true,
			wantSleeps: func(t *testing.T, sleeps []time.Duration) {
				var total time.Duration
				for _, s := range sleeps {
					total += s
				}

				if total < 45*time.Second || total > 50*time.Second {
					t.Fatalf("a denial is stable once it has lasted the denied window (45s): waited %v (%v)", total, sleeps)
				}
			},
		},
		{
			name:         "a denial while the control is accepted is stable once asked again at once",
			answers:      []Attempt{{Err: status(401)}, {Err: status(401)}},
			control:      ok,
			window:       2 * time.Minute,
			denied:       45 * time.Second,
			wantErr:      "the registry accepted the new credential for it at that moment",
			wantAttempts: 2,
			wantStable:   true,
			wantSleeps: func(t *testing.T, sleeps []time.Duration) {
				if len(sleeps) != 0 {
					t.Fatalf("a controlled denial is confirmed at once, not after a pause: %v", sleeps)
				}
			},
		},
		{
			name:         "the end of an incident: denied, the control accepted, then accepted",
			answers:      []Attempt{{Err: status(403)}},
			control:      ok,
			window:       2 * time.Minute,
			denied:       45 * time.Second,
			wantAttempts: 2,
		},
		{
			name: "denials among transient answers are the registry's trouble, not a lasting refusal",
			answers: []Attempt{{Err: status(403)}, {Err: status(403)}, {Err: status(503)}, {Err: status(403)}, {Err: status(403)},
				{Err: status(429)}, {Err: status(403)}, {Err: status(403)}},
			window:       5 * time.Minute,
			denied:       20 * time.Second,
			wantAttempts: 9,
		},
		{
			name:         "a denial while the control is refused too is everyone's: waited out",
			answers:      []Attempt{{Err: status(403)}},
			control:      refusing,
			window:       2 * time.Minute,
			denied:       45 * time.Second,
			wantAttempts: 2,
		},
		{
			name:         "a zero Retry does not retry",
			answers:      []Attempt{{Err: status(429)}},
			wantErr:      "429",
			wantAttempts: 1,
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := clock.NewFake(time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC))
			r := Retry{Window: tt.window, Denied: tt.denied, Clock: c}
			i := 0
			try := func(context.Context) Attempt {
				defer func() { i++ }()

				if i < len(tt.answers) {
					return tt.answers[i]
				}

				return Attempt{}
			}

			out, err := r.Do(context.Background(), try, ClassOf, tt.control)

			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("want success, got %v (%s)", err, out)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("want an error containing %q, got %v", tt.wantErr, err)
			}

			if tt.wantAttempts != 0 && out.Attempts != tt.wantAttempts {
				t.Fatalf("attempts: want %d, got %d (%s)", tt.wantAttempts, out.Attempts, out)
			}

			if Refused(err) != tt.wantStable {
				t.Fatalf("Refused: want %v, got %v (%v)", tt.wantStable, Refused(err), err)
			}

			if out.Took > tt.window && tt.window > 0 {
				t.Fatalf("retrying took %v, past its window %v", out.Took, tt.window)
			}

			if tt.wantSleeps != nil {
				tt.wantSleeps(t, c.Waits())
			}
		})
	}
}

func TestRetryStopsWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()

	c := clock.NewFake(time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC))
	r := Retry{Window: time.Minute, Denied: time.Minute, Clock: c}

	_, err := r.Do(ctx, func(context.Context) Attempt { return Attempt{Err: status(503)} }, ClassOf, nil)
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "503") {
		t.Fatalf("want the cancellation with the last answer, got %v", err)
	}
}

func TestOutcomeString(t *testing.T) {
	o := Outcome{Attempts: 4, Transient: []string{"503", "429", "503"}, Denials: 1, Took: 12400 * time.Millisecond}
	if got, want := o.String(), "4 attempts over 12s: 429 ×1, 503 ×2, DENIED ×1"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}

	if got := (Outcome{Attempts: 1}).String(); got != "" {
		t.Fatalf("one attempt says nothing, got %q", got)
	}
}

func TestClassOfPullMessage(t *testing.T) {
	tests := []struct {
		name string
		msg  string
		want Class
	}{
		{"containerd 429", `failed to pull and unpack image "ghcr.io/acme/app:1": failed to copy: httpReadSeeker: failed open: unexpected status code https://ghcr.io/v2/acme/app/manifests/1: 429 Too Many Requests`, Transient},
		{"containerd 503", `failed to resolve reference "ghcr.io/acme/app:1": unexpected status from HEAD request to https://ghcr.io/v2/acme/app/manifests/1: 503 Service Unavailable`, Transient},
		{"containerd 403", `failed to resolve reference "ghcr.io/acme/app:1": failed to authorize: failed to fetch anonymous token: unexpected status from GET request to https://ghcr.io/token: 403 Forbidden`, Denied},
		{"containerd 401", `failed to resolve reference "ghcr.io/acme/app:1": pulling from host ghcr.io failed with status code [manifests 1]: 401 Unauthorized`, Denied},
		{"docker hub rate limit", `toomanyrequests: You have reached your pull rate limit.`, Transient},
		{"pull access denied", `pull access denied, repository does not exist or may require authorization`, Denied},
		{"denied body", `denied: requested access to the resource is denied`, Denied},
		{"not found", `failed to resolve reference "ghcr.io/acme/app:1": ghcr.io/acme/app:1: not found`, Final},
		{"no such host", `dial tcp: lookup ghcr.io: no such host`, Final},
		{"a number that is not a status", `pulled 429 bytes of 503 Gb`, Final},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ClassOfPullMessage(tt.msg); got != tt.want {
				t.Fatalf("ClassOfPullMessage(%q) = %s, want %s", tt.msg, got, tt.want)
			}
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)

	tests := []struct {
		name, v string
		want    time.Duration
	}{
		{"seconds", "7", 7 * time.Second},
		{"none", "", 0},
		{"garbage", "soon", 0},
		{"negative", "-5", 0},
		{"http date", now.Add(30 * time.Second).Format(http.TimeFormat), 30 * time.Second},
		{"hostile: capped", "86400", 5 * time.Minute},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := parseRetryAfter(tt.v, now); got != tt.want {
				t.Fatalf("parseRetryAfter(%q) = %v, want %v", tt.v, got, tt.want)
			}
		})
	}
}

// decide, the retry's rule with no clock and no call: each case an attempt's class at a moment
// of the run, with what the retry remembers, and what follows.
func TestRetryDecide(t *testing.T) {
	r := Retry{Window: 2 * time.Minute, Denied: 45 * time.Second}
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

	for _, tc := range []struct {
		name     string
		state    retryState
		at       time.Duration // since the start
		class    Class
		accepted bool
		pause    time.Duration
		want     decision
	}{
		{"final at once", retryState{}, 0, Final, false, time.Second, decision{final: true}},
		{"a first denial waits a quarter of the denial window", retryState{}, 0, Denied, false, time.Second, decision{wait: 45 * time.Second / 4}},
		{"a denial at its window is stable", retryState{firstDenial: t0}, 45 * time.Second, Denied, false, time.Second, decision{stop: true, stable: true}},
		{"a denial is asked again at its window, not after", retryState{firstDenial: t0}, 40 * time.Second, Denied, false, 15 * time.Second, decision{wait: 5 * time.Second}},
		{"the control accepted once: asked again at once", retryState{}, 0, Denied, true, time.Second, decision{wait: 0}},
		{"the control accepted twice: refused (stable) by the control", retryState{confirmed: true, firstDenial: t0}, 2 * time.Second, Denied, true, time.Second, decision{stop: true, stable: true, control: true}},
		{"transient: waits its pause", retryState{firstDenial: t0, confirmed: true}, 10 * time.Second, Transient, false, 4 * time.Second, decision{wait: 4 * time.Second}},
		{"transient past the window: stops, not stable", retryState{}, 2 * time.Minute, Transient, false, time.Second, decision{stop: true}},
		{"a pause longer than the window left: stops", retryState{}, 110 * time.Second, Transient, false, 15 * time.Second, decision{stop: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.state
			s.start = t0

			if got := r.decide(&s, t0.Add(tc.at), tc.class, tc.accepted, tc.pause); got != tc.want {
				t.Fatalf("decide: %+v, want %+v", got, tc.want)
			}

			if tc.class == Transient && (!s.firstDenial.IsZero() || s.confirmed) {
				t.Fatalf("a transient answer keeps the denial's clock: %+v", s)
			}
		})
	}
}
