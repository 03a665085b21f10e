package credential

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
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

	s, err := r.open(c)
	if err != nil {
		return nil, err
	}
	defer s.close()

	for _, t := range targets {
		p, err := s.prover(ctx, t)
		if err != nil {
			return nil, s.rt.waitFor(err)
		}

		switch _, _, err := p.read(s.opts, s.ch); {
		case err == nil: // granted, or anyone may read it: so may the credential
			pulls = append(pulls, t)
		case !refused(err):
			return nil, s.rt.waitFor(err)
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
