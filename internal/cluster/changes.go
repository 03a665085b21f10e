package cluster

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/ghcrsync/ghcrsync/internal/clock"
)

// Changes signals, best effort, each time the named Node changes, until ctx ends: a watch on
// that one Node, reopened a second after it ends or fails (the API restarts while a control
// plane reboots). The channel holds at most one signal, so a burst is one wake-up. It never
// replaces a read: whoever waits reads and judges the Node on each signal, and still polls.
func (c *Connection) Changes(ctx context.Context, name string) <-chan struct{} {
	changed := make(chan struct{}, 1)
	opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}

	go func() {
		for ctx.Err() == nil {
			if w, err := c.Client.CoreV1().Nodes().Watch(ctx, opts); err == nil {
				forward(ctx, w.ResultChan(), changed)
				w.Stop()
			}

			_ = clock.Sleep(ctx, c.Clock, time.Second) // the loop ends with ctx
		}
	}()

	return changed
}

// forward turns each event into one pending signal until the events end or ctx does.
func forward[T any](ctx context.Context, events <-chan T, changed chan<- struct{}) {
	for {
		if _, ok := receive(ctx, events); !ok {
			return
		}

		select {
		case changed <- struct{}{}:
		default: // one pending signal is enough
		}
	}
}

// receive is the next event of a watch; false once the watch closed or ctx ended (never trust a
// watch to end with its context).
func receive[T any](ctx context.Context, events <-chan T) (T, bool) {
	select {
	case <-ctx.Done():
		var zero T

		return zero, false
	case ev, open := <-events:
		return ev, open
	}
}
