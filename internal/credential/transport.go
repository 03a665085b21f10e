package credential

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/pin"
	"github.com/ghcrsync/ghcrsync/internal/readlimit"
)

// pinned is the transport under every request of a proof. It sends a request only to a pinned
// destination (pin's rule: https, or plain http to a loopback host, on the registry's host or a
// trusted one) — whatever go-containerregistry was told by a challenge or a redirect — reads at
// most readlimit.Body of any answer, and keeps the earliest expiry a token realm reported for
// the credential.
type pinned struct {
	inner   *http.Transport
	hosts   []string
	timeout time.Duration // per request, its answer's body included
	clock   clock.Clock   // a Retry-After date is read against it

	mu      sync.Mutex
	expires time.Time
	// retryAfter is what the last 429 or 503 answer's Retry-After asked for.
	retryAfter time.Duration
}

func newPinned(hosts []string, timeout time.Duration, clk clock.Clock) *pinned {
	dialer := &net.Dialer{Timeout: timeout}

	return &pinned{hosts: hosts, timeout: timeout, clock: clk, inner: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dialer.DialContext,
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
		MaxIdleConnsPerHost:   2,
		IdleConnTimeout:       30 * time.Second,
	}}
}

// refusal is a request the transport did not send.
type refusal struct{ err error }

func (r *refusal) Error() string {
	return fmt.Sprintf("refused to send a request (%v); nothing was sent", r.err)
}

func (p *pinned) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := pin.URL(req.URL.String(), p.hosts); err != nil {
		if req.Body != nil {
			req.Body.Close()
		}

		return nil, &refusal{err}
	}

	// The request's deadline bounds its answer's body too: a registry that sends headers and
	// then drips the body is cut off, not waited for.
	ctx, cancel := context.WithTimeout(req.Context(), p.timeout)

	resp, err := p.inner.RoundTrip(req.WithContext(ctx))
	if err != nil {
		cancel()

		return nil, err
	}

	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		p.mu.Lock()
		p.retryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), p.clock.Now())
		p.mu.Unlock()
	}

	if _, _, basic := req.BasicAuth(); basic && resp.StatusCode == http.StatusOK {
		p.saw(parseExpiration(resp.Header.Get(ExpirationHeader)))
	}

	resp.Body = &capped{r: io.LimitReader(resp.Body, readlimit.Body+1), c: resp.Body, done: cancel}

	return resp, nil
}

// close lets go of the proof's idle connections.
func (p *pinned) close() { p.inner.CloseIdleConnections() }

func (p *pinned) saw(t time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()

	if !t.IsZero() && (p.expires.IsZero() || t.Before(p.expires)) {
		p.expires = t
	}
}

func (p *pinned) lastRetryAfter() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()

	return p.retryAfter
}

func (p *pinned) expiry() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()

	return p.expires
}

// capped is an answer's body read to readlimit.Body at most: past it, reading fails.
type capped struct {
	r    io.Reader
	c    io.Closer
	n    int64
	done context.CancelFunc // ends the request's deadline
}

func (b *capped) Read(buf []byte) (int, error) {
	n, err := b.r.Read(buf)
	b.n += int64(n)

	if b.n > readlimit.Body {
		return n, &readlimit.TooLargeError{What: "the registry's answer", Limit: readlimit.Body}
	}

	return n, err
}

func (b *capped) Close() error {
	defer b.done()

	return b.c.Close()
}
