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

// Refused reports whether the server answered a write with a refusal of the write itself —
// admission (a policy, a webhook) or validation denied it — and its message. An authorization
// refusal (RBAC: the identity may not make the request) is not: it says nothing about whether
// the write would be admitted for another identity.
func Refused(err error) (string, bool) {
	var status apierrors.APIStatus
	if err == nil || !errors.As(err, &status) {
		return "", false
	}

	msg := status.Status().Message

	switch {
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsRequestEntityTooLargeError(err):
		return msg, true
	case apierrors.IsForbidden(err):
		rbac := strings.Contains(msg, " cannot ") && strings.Contains(msg, "resource ")

		return msg, !rbac
	}

	return "", false
}

// Transient reports whether a failed request may succeed when retried: the API was unreachable
// (no status from the server), overloaded, or timed out. A status the server decided (Conflict,
// NotFound, Forbidden, Invalid…) is not transient.
func Transient(err error) bool {
	if err == nil {
		return false
	}

	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return true
	}

	return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsServiceUnavailable(err) ||
		apierrors.IsTooManyRequests(err) || apierrors.IsInternalError(err)
}
