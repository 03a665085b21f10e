package clock_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/clock"
)

var start = time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)

var errDown = errors.New("api down")

func TestUntil(t *testing.T) {
	tests := []struct {
		name      string
		trueAfter int   // cond is true from this call on (0: never)
		err       error // what cond says while false
		cancel    bool
		wantErr   string
		wantWaits int
	}{
		{name: "true at once waits nothing", trueAfter: 1},
		{name: "true on the third look", trueAfter: 3, wantWaits: 2},
		{name: "never true times out after the bound", wantErr: "timed out after 10s", wantWaits: 11},
		{name: "the last error is told", err: errDown, wantErr: "timed out after 10s: api down", wantWaits: 11},
		{name: "a cancelled context ends it", cancel: true, wantErr: context.Canceled.Error()},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := clock.NewFake(start)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()

			if tt.cancel {
				cancel()
			}

			calls := 0
			err := clock.Until(ctx, c, 10*time.Second, time.Second, func() (bool, error) {
				calls++

				return tt.trueAfter > 0 && calls >= tt.trueAfter, tt.err
			})

			if got := errString(err); got != tt.wantErr {
				t.Fatalf("Until = %q, want %q", got, tt.wantErr)
			}

			if got := len(c.Waits()); got != tt.wantWaits {
				t.Fatalf("waits = %d (%v), want %d", got, c.Waits(), tt.wantWaits)
			}
		})
	}
}

func TestRide(t *testing.T) {
	transient := func(err error) bool { return errors.Is(err, errDown) }
	final := errors.New("forbidden")

	tests := []struct {
		name      string
		answers   []error // one per attempt; the last repeats
		wantErr   error
		wantCalls int
		wantWaits []time.Duration
	}{
		{name: "success at once", answers: []error{nil}, wantCalls: 1},
		{name: "a transient error is ridden out", answers: []error{errDown, errDown, nil}, wantCalls: 3,
			wantWaits: []time.Duration{time.Second, 2 * time.Second}},
		{name: "a final error is not asked again", answers: []error{final}, wantErr: final, wantCalls: 1},
		{name: "a transient error past the bound is returned", answers: []error{errDown}, wantErr: errDown, wantCalls: 4,
			wantWaits: []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := clock.NewFake(start)
			calls := 0
			err := clock.Ride(t.Context(), c, 5*time.Second, func(a int) time.Duration { return time.Duration(a+1) * time.Second }, transient,
				func() error {
					calls++

					return tt.answers[min(calls, len(tt.answers))-1]
				})

			if !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Fatalf("Ride = %v, want %v", err, tt.wantErr)
			}

			if calls != tt.wantCalls || !slices.Equal(c.Waits(), tt.wantWaits) {
				t.Fatalf("calls %d, waits %v; want %d, %v", calls, c.Waits(), tt.wantCalls, tt.wantWaits)
			}
		})
	}
}

// A fake timeout ends its context only when waiting has moved the time past it, and says
// DeadlineExceeded as a real one does; a cancel says Canceled.
func TestFakeWithTimeout(t *testing.T) {
	c := clock.NewFake(start)

	ctx, cancel := c.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()

	<-c.After(2 * time.Second)

	if ctx.Err() != nil {
		t.Fatalf("ended after 2s of 3s: %v", ctx.Err())
	}

	if err := clock.Sleep(ctx, c, 2*time.Second); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a wait past the timeout: %v, want DeadlineExceeded", err)
	}

	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("after 4s of 3s: Err = %v, want DeadlineExceeded", ctx.Err())
	}

	if err := clock.Sleep(ctx, c, time.Hour); !errors.Is(err, context.DeadlineExceeded) || len(c.Waits()) != 2 {
		t.Fatalf("a wait on an ended context: %v (waits %v), want DeadlineExceeded and no wait", err, c.Waits())
	}

	ctx2, cancel2 := c.WithTimeout(t.Context(), time.Minute)
	cancel2()

	if !errors.Is(ctx2.Err(), context.Canceled) {
		t.Fatalf("cancelled: Err = %v, want Canceled", ctx2.Err())
	}

	if got := c.Now().Sub(start); got != 4*time.Second {
		t.Fatalf("time passed = %s, want 4s", got)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}

	return err.Error()
}

// SleepOr: a signal cuts the pause short, an ended context never waits, and with no signal it is
// a pause of d on the clock.
func TestSleepOr(t *testing.T) {
	t.Run("woken", func(t *testing.T) {
		wake := make(chan struct{}, 1)
		wake <- struct{}{}

		done := make(chan error, 1)
		go func() { done <- clock.SleepOr(context.Background(), clock.System, time.Hour, wake) }()

		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second): // a hang detector, not a timing assertion
			t.Fatal("a signalled SleepOr slept on")
		}
	})

	t.Run("cancelled", func(t *testing.T) {
		c := clock.NewFake(start)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()

		if err := clock.SleepOr(ctx, c, time.Minute, nil); !errors.Is(err, context.Canceled) || len(c.Waits()) != 0 {
			t.Fatalf("an ended context: %v, waits %v", err, c.Waits())
		}
	})

	t.Run("paused", func(t *testing.T) {
		c := clock.NewFake(start)

		if err := clock.SleepOr(context.Background(), c, 5*time.Second, nil); err != nil || !slices.Equal(c.Waits(), []time.Duration{5 * time.Second}) {
			t.Fatalf("no signal: %v, waits %v", err, c.Waits())
		}
	})
}
