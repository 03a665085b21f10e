// Package answer is the one rule for what a Kubernetes API error says about a write: Lost, when
// no answer says whether the server applied it — the write must then be looked for (a fresh
// read shows it landed, or not), never assumed lost.
package answer

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"syscall"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Lost reports whether a write's error leaves open whether the server applied it: no
// answer at all (the connection dropped, the client gave up), or a timeout (of the request, or of
// an admission webhook) after which the object may have been stored. The write must then be
// looked for, not assumed lost.
func Lost(err error) bool {
	if err == nil {
		return false
	}

	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsInternalError(err) ||
			strings.Contains(err.Error(), "context deadline exceeded") || strings.Contains(err.Error(), "Timeout: request did not complete")
	}

	// No answer from the server: the transport failed, or the client stopped waiting.
	var (
		urlErr *url.Error
		netErr net.Error
	)

	return errors.As(err, &urlErr) || errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED)
}
