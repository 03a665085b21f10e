package cluster

import (
	"net/http"
	"sync"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/clock"
)

// serverClock reads the API server's clock off its answers' Date headers: the time a Lease
// expires by is the server's, never this machine's (whose clock may be off). It is advanced by
// the machine's monotonic clock (clock.System), whatever clock the connection is handed: an
// answer's arrival is real network time, as a request's own timeout is.
type serverClock struct {
	mu       sync.Mutex
	date     time.Time // the latest Date header
	received time.Time // when it arrived, on this machine's monotonic clock
}

func (c *serverClock) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err == nil {
			if d, perr := http.ParseTime(resp.Header.Get("Date")); perr == nil {
				c.mu.Lock()
				c.date, c.received = d, clock.System.Now()
				c.mu.Unlock()
			}
		}

		return resp, err
	})
}

// now is the server's time, had from its latest answer and this machine's monotonic clock
// since; ok is false before any answer carried a Date.
func (c *serverClock) now() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()

	if c.date.IsZero() {
		return time.Time{}, false
	}

	return c.date.Add(clock.Since(clock.System, c.received)), true
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// ServerNow is the API server's clock (its latest Date header, advanced by this machine's
// monotonic clock since); ok is false before the server has answered.
func (c *Connection) ServerNow() (time.Time, bool) {
	if c.server == nil {
		return time.Time{}, false
	}

	return c.server.now()
}
