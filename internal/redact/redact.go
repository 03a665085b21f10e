// Package redact is the one rule for what of an answer from the Kubernetes API or Talos may be
// written where others read it: Events (readable cluster-wide), the state's last error, the
// plan and the run's result. Those answers are text ghcrsync does not control: a validation
// error can quote a field's value, an admission webhook says what it likes, and Talos's refusal
// of an immediate apply carries the machine-config diff, credential included. Error keeps
// ghcrsync's own words and replaces each such answer by its class (status code and reason, the
// field paths of a validation error); the full text belongs in the local log, at debug level.
package redact

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Hint is what a redacted message says about where the full answer is.
const Hint = "(the full answer is logged at --log-level debug)"

// sensitive are the keys whose values Scrub masks, in YAML ("password: x", a diff's "+ auth: x")
// and in JSON ("password":"x"): the credential fields of a dockerconfigjson and of Talos's
// registry auth.
var (
	sensitiveYAML = regexp.MustCompile(`(?im)^([\s+\-]*(?:password|auth|identitytoken|registrytoken|token)\s*:\s*)\S.*$`)
	sensitiveJSON = regexp.MustCompile(`(?i)("(?:password|auth|identitytoken|registrytoken|token)"\s*:\s*)"(?:[^"\\]|\\.)*"`)
)

// base64Run is a run of base64 long enough to hide a credential field (a Secret's data is
// quoted so by the API server).
var base64Run = regexp.MustCompile(`[A-Za-z0-9+/]{16,}={0,2}`)

// Scrub is an answer's full text for the local debug log: everything but the values of
// credential fields — in YAML, in JSON, or in base64 that decodes to either — which never
// reach a log.
func Scrub(text string) string {
	text = base64Run.ReplaceAllStringFunc(text, func(run string) string {
		raw, err := base64.StdEncoding.DecodeString(run)
		if err != nil || !sensitive(string(raw)) {
			return run
		}

		return "[redacted base64]"
	})
	text = sensitiveYAML.ReplaceAllString(text, "${1}[redacted]")

	return sensitiveJSON.ReplaceAllString(text, `${1}"[redacted]"`)
}

func sensitive(s string) bool { return sensitiveYAML.MatchString(s) || sensitiveJSON.MatchString(s) }

// Error is err's text, with the text of every Kubernetes API status and Talos (gRPC) status in
// its chain replaced by the answer's class. nil gives "".
func Error(err error) string {
	if err == nil {
		return ""
	}

	text := err.Error()
	redacted := false

	for _, e := range answers(err) {
		if full := e.Error(); full != "" && strings.Contains(text, full) {
			text = strings.ReplaceAll(text, full, Class(e))
			redacted = true
		}
	}

	if redacted && !strings.Contains(text, Hint) {
		text += " " + Hint
	}

	return text
}

// Logged is Error(err), with the full answer — scrubbed of credential values — written to log at
// debug level first: the one place the answer's own text goes.
func Logged(log hclog.Logger, err error) string {
	if err == nil {
		return ""
	}

	if log != nil && len(answers(err)) > 0 {
		log.Debug("the full answer", "error", Scrub(err.Error()))
	}

	return Error(err)
}

// Class names an answer without its text: "the Kubernetes API answered 409 Conflict",
// "Talos answered FailedPrecondition".
func Class(err error) string {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		s := st.Status()
		msg := fmt.Sprintf("the Kubernetes API answered %d %s", s.Code, orText(string(s.Reason), http.StatusText(int(s.Code))))

		if d := s.Details; d != nil {
			var fields []string

			for _, c := range d.Causes {
				if c.Field != "" {
					fields = append(fields, c.Field)
				}
			}

			if len(fields) > 0 {
				msg += " (fields " + strings.Join(fields, ", ") + ")"
			}
		}

		return msg
	}

	if s, ok := grpcStatus(err); ok {
		return "Talos answered " + s.Code().String()
	}

	return err.Error()
}

// answers are the errors in err's chain that carry an API's own text, outermost first; the
// chain below an answer is not searched (its text is part of the answer's).
func answers(err error) []error {
	var out []error

	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}

		if _, ok := e.(apierrors.APIStatus); ok {
			out = append(out, e)

			return
		}

		if _, ok := e.(interface{ GRPCStatus() *status.Status }); ok {
			out = append(out, e)

			return
		}

		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}

	walk(err)

	return out
}

func grpcStatus(err error) (*status.Status, bool) {
	var g interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &g) {
		return nil, false
	}

	s := g.GRPCStatus()

	return s, s != nil
}

func orText(s, def string) string {
	if s == "" {
		return def
	}

	return s
}
