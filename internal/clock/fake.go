package clock

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Fake is simulated time for tests: it stands still until something waits on it, and a wait of
// d moves it on by d at once (firing every WithTimeout it passes). So a run that rides out a
// ten-minute bound ends in milliseconds, and the time it reads is the time its waits add up to.
// Goroutines waiting together share it: each one's wait moves everyone's time.
type Fake struct {
	mu        sync.Mutex
	now       time.Time
	waits     []time.Duration
	deadlines []deadline
}

type deadline struct {
	at     time.Time
	cancel context.CancelCauseFunc
}

// NewFake is a Fake that starts at start.
func NewFake(start time.Time) *Fake { return &Fake{now: start} }

// Now is the simulated time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()

	return f.now
}

// After moves the time on by d and sends it at once.
func (f *Fake) After(d time.Duration) <-chan time.Time {
	f.mu.Lock()
	f.waits = append(f.waits, d)
	now := f.advance(d)
	f.mu.Unlock()

	ch := make(chan time.Time, 1)
	ch <- now

	return ch
}

// Advance moves the time on by d without a wait (a test's "meanwhile").
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.advance(d)
}

// advance moves now on by d (when positive), ending the contexts whose timeout it passes; f.mu
// is held.
func (f *Fake) advance(d time.Duration) time.Time {
	if d > 0 {
		f.now = f.now.Add(d)
	}

	kept := f.deadlines[:0]

	for _, dl := range f.deadlines {
		if f.now.Before(dl.at) {
			kept = append(kept, dl)

			continue
		}

		dl.cancel(context.DeadlineExceeded)
	}

	f.deadlines = kept

	return f.now
}

// Waits are the waits asked of the clock so far, in order.
func (f *Fake) Waits() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()

	return append([]time.Duration(nil), f.waits...)
}

// WithTimeout is a context that ends once the simulated time has passed d from now (its Err is
// then context.DeadlineExceeded, as a real timeout's).
func (f *Fake) WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)

	f.mu.Lock()
	f.deadlines = append(f.deadlines, deadline{at: f.now.Add(d), cancel: cancel})
	f.advance(0)
	f.mu.Unlock()

	return timeoutCtx{ctx}, func() { cancel(context.Canceled) }
}

// timeoutCtx reports a passed timeout as context.DeadlineExceeded.
type timeoutCtx struct{ context.Context }

func (c timeoutCtx) Err() error {
	err := c.Context.Err()
	if err != nil && errors.Is(context.Cause(c.Context), context.DeadlineExceeded) {
		return context.DeadlineExceeded
	}

	return err
}
