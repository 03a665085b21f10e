// Package clock is ghcrsync's one source of time. Every component that reads the time or waits
// is handed a Clock, and every wait is one of this package's: Sleep (a pause that ends with the
// context), SleepOr (one a signal may cut short), Until (poll a condition to a bound) and Ride
// (retry a transient failure to a bound) — no select on After outside it (internal/workspace's
// TestOneWait holds that). System is the
// machine's clock; Fake is simulated time, in which time passes only by waiting, so a scripted
// run that waits out a ten-minute bound ends in milliseconds.
package clock

import (
	"context"
	"fmt"
	"time"
)

// Clock tells the time, waits, and bounds a context.
type Clock interface {
	Now() time.Time
	// After sends the time once d has passed.
	After(d time.Duration) <-chan time.Time
	// WithTimeout is context.WithTimeout on this clock.
	WithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc)
}

// System is the machine's clock.
var System Clock = system{}

type system struct{}

func (system) Now() time.Time                         { return time.Now() }
func (system) After(d time.Duration) <-chan time.Time { return time.After(d) }
func (system) WithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d)
}

// Or is c, or System when c is nil: the default of an option a caller may leave unset.
func Or(c Clock) Clock {
	if c == nil {
		return System
	}

	return c
}

// Since is the time passed on c since t.
func Since(c Clock, t time.Time) time.Duration { return c.Now().Sub(t) }

// Sleep waits d on c, or returns ctx's error if it ends first.
func Sleep(ctx context.Context, c Clock, d time.Duration) error {
	if err := ctx.Err(); err != nil { // an ended context never waits, whatever the clock
		return err
	}

	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-c.After(d):
		return ctx.Err() // a context that ended as the wait did (a Fake's timeout it passed) ends it
	}
}

// SleepOr is Sleep that also ends, early and with no error, when wake signals (a nil wake never
// does): a poll that a watch may cut short.
func SleepOr(ctx context.Context, c Clock, d time.Duration, wake <-chan struct{}) error {
	if err := ctx.Err(); err != nil {
		return err
	}

	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-wake:
		return nil
	case <-c.After(d):
		return ctx.Err()
	}
}

// Until polls cond every interval until it is true, ctx ends, or timeout passes. An error from
// cond (an unreachable API, say) is retried, and the last one is reported with the timeout.
func Until(ctx context.Context, c Clock, timeout, interval time.Duration, cond func() (bool, error)) error {
	deadline := c.Now().Add(timeout)

	var last error

	for {
		ok, err := cond()
		if ok {
			return nil
		}

		if err != nil {
			last = err
		}

		if c.Now().After(deadline) {
			if last != nil {
				return fmt.Errorf("timed out after %s: %w", timeout, last)
			}

			return fmt.Errorf("timed out after %s", timeout)
		}

		if err := Sleep(ctx, c, interval); err != nil {
			return err
		}
	}
}

// Ride calls f until it succeeds, fails in a way transient does not forgive, ctx ends, or bound
// passes; it waits every between attempts (every(attempt), attempt counting from 0) and returns
// f's last error.
func Ride(ctx context.Context, c Clock, bound time.Duration, every func(attempt int) time.Duration,
	transient func(error) bool, f func() error) error {
	deadline := c.Now().Add(bound)

	for attempt := 0; ; attempt++ {
		err := f()
		if err == nil || !transient(err) || !c.Now().Before(deadline) || ctx.Err() != nil {
			return err
		}

		if Sleep(ctx, c, every(attempt)) != nil {
			return err
		}
	}
}

// Every is a fixed interval for Ride.
func Every(d time.Duration) func(int) time.Duration { return func(int) time.Duration { return d } }
