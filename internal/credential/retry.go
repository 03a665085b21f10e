package credential

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/clock"
)

// Class is what a registry's answer says about asking again: the one rule for the registry
// proof, the credentials-in-use check and the runtime proof.
type Class int

const (
	// Final is an answer that waiting does not change: not found, malformed, unreachable
	// (no answer at all is a configuration to fix, not a registry to wait for), not sent.
	Final Class = iota
	// Transient is the registry busy or failing: 429 Too Many Requests and 5xx. Asked again
	// within the retry window, after what Retry-After says or a growing pause.
	Transient
	// Denied is 401 or 403: the credential refused — or, for a while, everyone refused (GHCR
	// answers DENIED in bursts during its incidents). Final once it is stable.
	Denied
)

func (c Class) String() string {
	switch c {
	case Transient:
		return "transient"
	case Denied:
		return "denied"
	}

	return "final"
}

// ClassOfStatus classifies an HTTP status.
func ClassOfStatus(status int) Class {
	switch {
	case status == http.StatusUnauthorized, status == http.StatusForbidden:
		return Denied
	case status == http.StatusTooManyRequests, status == http.StatusInternalServerError, status == http.StatusBadGateway,
		status == http.StatusServiceUnavailable, status == http.StatusGatewayTimeout:
		return Transient
	}

	return Final
}

// ClassOf classifies a proof's error: by the registry's status where it answered one.
func ClassOf(err error) Class {
	var pe *ProofError
	if errors.As(err, &pe) && pe.Status != 0 {
		return ClassOfStatus(pe.Status)
	}

	return Final
}

var (
	pullStatus = regexp.MustCompile(`\b(401 Unauthorized|403 Forbidden|429 Too Many Requests|500 Internal Server Error|502 Bad Gateway|503 Service Unavailable|504 Gateway Timeout)`)
	pullDenied = regexp.MustCompile(`(?i)pull access denied|\bdenied: |insufficient_scope|\bunauthorized: `)
)

// ClassOfPullMessage classifies a container runtime's pull error as the kubelet reports it
// (containerd: "…: 429 Too Many Requests", "…: 403 Forbidden", "pull access denied, …",
// "toomanyrequests: …").
func ClassOfPullMessage(msg string) Class {
	if m := pullStatus.FindString(msg); m != "" {
		status, _ := strconv.Atoi(m[:3])

		return ClassOfStatus(status)
	}

	switch {
	case strings.Contains(strings.ToLower(msg), "toomanyrequests"):
		return Transient
	case pullDenied.MatchString(msg):
		return Denied
	}

	return Final
}

// Retry is how long a registry's passing trouble is waited out. Transient answers are asked
// again within Window, after what Retry-After says (when it fits) or a growing pause; a denial
// is asked again after a pause, and is final ("refused (stable)") once it has lasted Denied — or
// as soon as the control request, where there is one, shows the registry accepting at that
// moment twice in a row (what is refused is then this credential, not everyone).
type Retry struct {
	Window time.Duration
	Denied time.Duration
	// Clock times the waits (nil: clock.System; tests make time pass faster).
	Clock clock.Clock
}

// Attempt is one try's error and, for a transient answer, how long the registry asked to be
// left alone (its Retry-After; 0 when it said nothing).
type Attempt struct {
	Err        error
	RetryAfter time.Duration
}

// Outcome is what retrying went through: the attempts, and the answers that were not final by
// their class.
type Outcome struct {
	Attempts  int
	Transient []string // the transient answers, e.g. "429", "503"
	Denials   int
	Took      time.Duration
}

// String says what was waited out ("3 attempts over 12s: 429 ×1, 503 ×1"; "" when the first
// answer was the last).
func (o Outcome) String() string {
	if o.Attempts <= 1 {
		return ""
	}

	var parts []string

	if len(o.Transient) > 0 {
		counts := map[string]int{}
		for _, s := range o.Transient {
			counts[s]++
		}

		keys := make([]string, 0, len(counts))
		for k := range counts {
			keys = append(keys, k)
		}

		slices.Sort(keys)

		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s ×%d", k, counts[k]))
		}
	}

	if o.Denials > 0 {
		parts = append(parts, fmt.Sprintf("DENIED ×%d", o.Denials))
	}

	return fmt.Sprintf("%d attempts over %s: %s", o.Attempts, o.Took.Round(time.Second), strings.Join(parts, ", "))
}

// Error is the last answer once retrying has stopped, and why it stopped: Stable for a denial
// that lasted (or that the control showed is this credential's), else the window spent.
type Error struct {
	Err     error
	Class   Class
	Stable  bool
	Control bool // the control request was accepted while this was denied
	Outcome Outcome
	Window  time.Duration
}

func (e *Error) Error() string {
	switch {
	case e.Stable && e.Control:
		return fmt.Sprintf("%v — refused (stable): the registry accepted the new credential for it at that moment, so it refuses this one, not everyone", e.Err)
	case e.Stable:
		return fmt.Sprintf("%v — refused (stable): still denied when asked again (%s)", e.Err, e.Outcome)
	case e.Class == Denied || e.Class == Transient:
		return fmt.Sprintf("%v — still failing when the retry window (%s) ran out (%s): the registry is in trouble, not (yet) refusing this credential; run again later",
			e.Err, e.Window, e.Outcome)
	}

	return e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// Refused reports whether err is a stable denial: the registry refuses the credential.
func Refused(err error) bool {
	var re *Error

	return errors.As(err, &re) && re.Stable
}

// Do runs try until it succeeds or its answer is final: a Final class at once, a denial once it
// is stable, a transient answer when the window is spent. control, when not nil, is asked on a
// denial; its success makes the denial stable at once (its own failure says the registry is
// refusing everyone for now: waited out like a transient answer) — asked once more at once
// first, so the end of an incident is not taken for a refusal. Any answer other than a denial
// starts the denial's clock again. classify says what an attempt's error is. The outcome is
// returned with success too ("after 4 attempts …"). What to do after each failed attempt is
// decide's; Do asks, waits and counts.
func (r Retry) Do(ctx context.Context, try func(context.Context) Attempt, classify func(error) Class, control func(context.Context) error) (Outcome, error) {
	clk := clock.Or(r.Clock)
	s := retryState{start: clk.Now(), pause: time.Second}

	var out Outcome

	for {
		a := try(ctx)
		out.Attempts++
		out.Took = clk.Now().Sub(s.start)

		if a.Err == nil {
			return out, nil
		}

		class := classify(a.Err)
		accepted := class == Denied && control != nil && control(ctx) == nil

		switch class {
		case Denied:
			out.Denials++
		case Transient:
			out.Transient = append(out.Transient, statusOf(a.Err))
		}

		d := r.decide(&s, clk.Now(), class, accepted, jitter(cmp.Or(a.RetryAfter, s.pause)))

		switch {
		case d.final:
			return out, a.Err
		case d.stop:
			return out, &Error{Err: a.Err, Class: class, Stable: d.stable, Control: d.control, Outcome: out, Window: r.Window}
		}

		if d.wait > 0 {
			if err := clock.Sleep(ctx, clk, d.wait); err != nil {
				return out, fmt.Errorf("%w (while waiting to ask the registry again after: %v)", err, a.Err)
			}
		}

		s.pause = min(2*s.pause, 15*time.Second)
	}
}

// retryState is what the retry remembers between attempts.
type retryState struct {
	start       time.Time
	firstDenial time.Time // when the denials under way began (reset by any other answer)
	confirmed   bool      // the control was accepted at the last denial
	pause       time.Duration
}

// decision is what follows a failed attempt: return its error as it is (final), stop with it
// (stop: stable, control say what the Error says), or ask again after wait.
type decision struct {
	final, stop, stable, control bool
	wait                         time.Duration
}

// decide is the retry's rule, with no clock and no call: after an attempt of class at now (accepted:
// the control was accepted for the new credential at that denial), and a pause of d (the
// registry's Retry-After, or the backoff, jittered).
func (r Retry) decide(s *retryState, now time.Time, class Class, accepted bool, d time.Duration) decision {
	switch class {
	case Final:
		return decision{final: true}
	case Denied:
		if s.firstDenial.IsZero() {
			s.firstDenial = now
		}

		if accepted {
			// Accepted for the new credential while this was denied: this credential is
			// refused — once asked again at once shows it was not the end of an incident.
			if s.confirmed {
				return decision{stop: true, stable: true, control: true}
			}

			s.confirmed, d = true, 0

			break
		}

		s.confirmed = false

		if now.Sub(s.firstDenial) >= r.Denied {
			return decision{stop: true, stable: true}
		}

		// The denial's own clock: asked again before it would be stable, and at it.
		d = min(max(d, r.Denied/4), s.firstDenial.Add(r.Denied).Sub(now))
	case Transient:
		s.firstDenial, s.confirmed = time.Time{}, false // a registry in trouble, not a lasting denial
	}

	if left := s.start.Add(r.Window).Sub(now); d > left || left <= 0 {
		return decision{stop: true}
	}

	return decision{wait: d}
}

// statusOf is the status a transient error carries ("429"), or its class.
func statusOf(err error) string {
	var pe *ProofError
	if errors.As(err, &pe) && pe.Status != 0 {
		return strconv.Itoa(pe.Status)
	}

	var pull interface{ PullMessage() string }
	if errors.As(err, &pull) {
		if m := pullStatus.FindString(pull.PullMessage()); m != "" {
			return m[:3]
		}
	}

	return "transient"
}

// jitter spreads d by ±20%, so parallel proofs do not ask again in step.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// parseRetryAfter reads a Retry-After header: seconds, or an HTTP date; 0 when there is none
// or it is not one (capped at 5 minutes: a hostile value does not park a run).
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}

	var d time.Duration

	if n, err := strconv.Atoi(v); err == nil {
		d = time.Duration(n) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}

	return min(max(d, 0), 5*time.Minute)
}
