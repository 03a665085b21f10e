package credential

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// Isolation proves the credential cannot pull what it must not (another tenant's packages): it
// asks the registry for each target with the credential, by the same token flow as Prove. A
// target the registry refuses — 401 or 403, at the token or the manifest step — is one the
// credential is isolated from. It returns the targets the credential pulls (its manifest was
// read, or anyone may read it), and an error when a target's answer proves neither (the
// registry unreachable, the image not found, a malformed answer): isolation is then unknown,
// and a caller fails closed.
func Isolation(ctx context.Context, r Registry, c *Credential, targets []string) (pulls []string, err error) {
	if len(targets) == 0 {
		return nil, nil
	}

	reg, opts, err := r.name()
	if err != nil {
		return nil, &ProofError{Target: r.Endpoint, Step: "challenge", Err: err}
	}

	timeout := r.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}

	rt := newPinned(r.realmHosts(c), timeout)
	defer rt.close()

	auth := authn.FromConfig(authn.AuthConfig{Username: c.Username, Password: c.password})

	var ch *transport.Challenge

	for _, t := range targets {
		p := &prover{ctx: ctx, rt: rt, reg: reg, target: t, auth: auth}

		if ch == nil {
			if ch, err = p.challenge(); err != nil {
				return nil, rt.waitFor(err)
			}
		}

		p.realm = ch.Parameters["realm"]

		ref, err := p.reference(opts)
		if err != nil {
			return nil, err
		}

		scopes := []string{ref.Scope(transport.PullScope)}

		if p.anonymous(ref, ch, scopes) {
			pulls = append(pulls, t) // anyone may: so may the credential

			continue
		}

		tok, err := transport.Exchange(p.ctx, p.reg, p.auth, p.rt, scopes, ch)
		if err == nil {
			_, err = p.get(ref, ch, p.auth, tok)
			if err == nil {
				pulls = append(pulls, t)

				continue
			}

			err = p.fail("manifest", err)
		} else {
			err = p.fail("token", err)
		}

		if !refused(err) {
			return nil, rt.waitFor(err)
		}
	}

	return pulls, nil
}

// refused reports whether a proof step failed on the registry's refusal of the credential (401,
// 403): a denial, not a missing image or an unreachable registry.
func refused(err error) bool {
	var pe *ProofError

	return errors.As(err, &pe) && (pe.Status == http.StatusUnauthorized || pe.Status == http.StatusForbidden)
}

// NotIsolatedError is a credential that pulls images it must not (credential.deny).
type NotIsolatedError struct {
	Credential string
	Images     []string
}

func (e *NotIsolatedError) Error() string {
	return fmt.Sprintf("credential %q pulls %s, which credential.deny says it must not (another tenant's packages): "+
		"take its access to them away in the registry (the GHCR package's settings), or remove them from deny, and plan again",
		e.Credential, strings.Join(e.Images, ", "))
}
