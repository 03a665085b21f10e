// Package prover asks the registry about credentials: it proves the desired credential (its
// prove targets, the runtime probe's images pinned by digest, its expiry, its isolation), each
// tenant's, and judges every credential the fleet was found holding — valid, refused, partial
// or unreachable — with the same token flow, waiting out the registry's passing trouble.
package prover

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/config"
	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/fleet"
	"github.com/ghcrsync/ghcrsync/plan"
)

// Credentials are the decrypted credentials, each decrypted once (the workspace's).
type Credentials interface {
	Credential() (*credential.Credential, error)
	TenantCredential(name string) (*credential.Credential, error)
}

// Prover proves the configuration's credentials on the registry, on its clock.
type Prover struct {
	Config      *config.Config
	Credentials Credentials
	Clock       clock.Clock
}

// Proved is what proving the credential found.
type Proved struct {
	// Probes are the runtime probe's images by their proved digests (REGISTRY/repo@sha256:…).
	Probes []string
	// Platforms are each probe image's platforms (by its Probes entry), where the registry's
	// manifest names them.
	Platforms map[string][]string
	// Expires is when the credential expires, where the registry reports it (zero: it does not).
	Expires time.Time
	// Retries is the registry's trouble waited out on the way ("" when it answered at once).
	Retries string
	// IsolatedFrom are the images the registry refused the credential (credential.deny).
	IsolatedFrom []string
}

// Prove proves the credential against the registry's token flow for every prove target and
// the runtime probe's image (which must be private: an image anyone can pull proves nothing
// about a node's credential), waiting out the registry's passing trouble (Retry). A credential
// the registry reports as expired is an error, whatever the registry still accepted.
func (p *Prover) Prove(ctx context.Context) (Proved, error) {
	cred, err := p.Credentials.Credential()
	if err != nil {
		return Proved{}, err
	}

	targets, probes := p.proveTargets()

	proof, out, err := p.prove(ctx, p.Config.Credential, cred, targets)
	if err != nil {
		return out, err
	}

	out.Platforms = map[string][]string{}

	for i, target := range probes {
		pinned := ByDigest(p.Config.Nodes.Probe.Images[i], proof.Digests[target])
		out.Probes = append(out.Probes, pinned)

		if pl := proof.Platforms[target]; len(pl) > 0 {
			out.Platforms[pinned] = pl
		}
	}

	return out, nil
}

// ProveTenants proves every tenant credential as Prove does the cluster's — its prove targets,
// then its isolation (deny) — each on its own: a tenant's proof says nothing of another's.
func (p *Prover) ProveTenants(ctx context.Context) (map[string]Proved, error) {
	out := map[string]Proved{}

	for _, t := range p.Config.Tenants {
		cred, err := p.Credentials.TenantCredential(t.Credential.Name)
		if err != nil {
			return nil, err
		}

		_, proved, err := p.prove(ctx, t.Credential, cred, t.Credential.Prove)
		if err != nil {
			return nil, err
		}

		out[t.Credential.Name] = proved
	}

	return out, nil
}

// prove proves one credential against targets (its prove targets, and the probe's for the
// cluster's), checks it has not expired, and proves its isolation (deny).
func (p *Prover) prove(ctx context.Context, cfg config.Credential, cred *credential.Credential, targets []string) (credential.Proof, Proved, error) {
	if len(cfg.Prove) == 0 {
		return credential.Proof{}, Proved{}, fmt.Errorf("credential %q has no prove targets: list a private image in credential.prove so the credential is proved before anything is planned (or pass --skip-proof)", cfg.Name)
	}

	reg := p.registryOf(cfg)

	proof, tried, err := p.retryOf(cfg).Prove(ctx, reg, cred, targets, proofTimeout, nil)
	if err != nil {
		return proof, Proved{}, fmt.Errorf("credential %q (%s): %w", cfg.Name, cfg.SopsFile, err)
	}

	if e := proof.Expires; !e.IsZero() && !p.Clock.Now().Before(e) {
		return proof, Proved{Expires: e}, fmt.Errorf("credential %q (%s) expired at %s (the registry says so): make a new token, put it in the SOPS file, and plan again",
			cfg.Name, cfg.SopsFile, e.UTC().Format(time.RFC3339))
	}

	// Isolation, right after the proof: the credential just pulled, so a refusal is of the image,
	// not of a credential that works nowhere.
	switch pulls, err := credential.Isolation(ctx, reg, cred, cfg.Deny); {
	case err != nil:
		return proof, Proved{}, fmt.Errorf("credential %q (%s): its isolation (credential.deny) could not be proved, so it is not assumed: %w", cfg.Name, cfg.SopsFile, err)
	case len(pulls) > 0:
		return proof, Proved{}, &credential.NotIsolatedError{Credential: cfg.Name, Images: pulls}
	}

	return proof, Proved{Expires: proof.Expires, Retries: tried.String(), IsolatedFrom: slices.Clone(cfg.Deny)}, nil
}

// Control asks the registry once, now, for the probe's images (by the digests the plan proved)
// with the new credential: accepted, a node's runtime denied the same pull because of the
// credential it holds, not because the registry refused everyone.
func (p *Prover) Control(ctx context.Context, probe plan.Probe) error {
	cred, err := p.Credentials.Credential()
	if err != nil {
		return err
	}

	var targets []string
	for _, img := range probe.Pulls() {
		targets = append(targets, strings.TrimPrefix(img, p.Config.Credential.Registry+"/"))
	}

	_, err = credential.ProveWithin(ctx, p.registry(), cred, targets, proofTimeout)

	return err
}

// proofTimeout bounds one attempt at a proof (its requests are bounded by the registry's own
// timeout; this bounds them together).
const proofTimeout = 60 * time.Second

// Retry is how the registry's passing trouble is waited out (credential.retry_window,
// credential.denied_window).
func (p *Prover) Retry() credential.Retry { return p.retryOf(p.Config.Credential) }

func (p *Prover) retryOf(c config.Credential) credential.Retry {
	return credential.Retry{Window: c.RetryWindow, Denied: c.DeniedWindow, Clock: p.Clock}
}

// registry is where the credential is proved.
func (p *Prover) registry() credential.Registry { return p.registryOf(p.Config.Credential) }

func (p *Prover) registryOf(c config.Credential) credential.Registry {
	return credential.Registry{Endpoint: c.Endpoint, TrustedHosts: c.TrustedHosts, Clock: p.Clock}
}

// proveTargets are the images a credential is proved against: the prove targets and the
// runtime probe's images (probes, in their order), repository:tag on the registry.
func (p *Prover) proveTargets() (targets, probes []string) {
	cfg := p.Config.Credential
	targets = slices.Clone(cfg.Prove)

	for _, img := range p.Config.Nodes.Probe.Images {
		probe := strings.TrimPrefix(img, cfg.Registry+"/")
		probes = append(probes, probe)

		if !slices.Contains(targets, probe) {
			targets = append(targets, probe)
		}
	}

	return targets, probes
}

// ByDigest is image (REGISTRY/repo:tag or REGISTRY/repo@digest) pinned to digest: what is pulled
// is exactly what was proved. An image without a known digest is returned as it is.
func ByDigest(image, digest string) string {
	if image == "" || digest == "" || strings.Contains(image, "@") {
		return image
	}

	repo := image
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		repo = image[:i]
	}

	return repo + "@" + digest
}

// CheckInUse asks the registry about each distinct credential held (by auth digest), with the
// same token flow and targets as the desired credential's proof: valid; refused (the registry
// rejects it, 401 or 403: revoked, expired, or without access to an image — the runtimes
// holding it cannot pull new images); or unreachable (no answer to go by). The desired
// credential was proved already and is not asked again. A plan made with --skip-proof asks
// nothing (nil).
func (p *Prover) CheckInUse(ctx context.Context, held []fleet.Held, desired string, skipped bool) []plan.CredentialInUse {
	if skipped || len(held) == 0 {
		return nil
	}

	type key struct{ credential, digest string }

	uses := map[key]*plan.CredentialInUse{}
	creds := map[key]*credential.Credential{}

	var order []key

	for _, h := range held {
		k := key{h.Credential, h.Cred.AuthDigest()}

		u, ok := uses[k]
		if !ok {
			u = &plan.CredentialInUse{Digest: k.digest, Credential: h.Credential}
			uses[k], creds[k] = u, h.Cred
			order = append(order, k)
		}

		if h.Node != "" {
			u.Nodes = append(u.Nodes, h.Node)
		} else {
			u.Secrets = append(u.Secrets, h.Secret)
		}
	}

	out := make([]plan.CredentialInUse, 0, len(order))

	for _, k := range order {
		u := uses[k]

		// Each credential in use is judged against the packages of the credential it stands for:
		// the cluster's (its prove targets and the probe's), or its tenant's.
		of, want, targets, ok := p.judgedAs(k.credential)
		if !ok {
			continue
		}

		to := desired
		if k.credential != "" && want != nil {
			to = want.AuthDigest()
		}

		if u.Desired = k.digest == to; u.Desired {
			u.State, u.Detail = plan.CredentialValid, "the credential this plan rotates to, proved above"
			out = append(out, *u)

			continue
		}

		u.State, u.Detail, u.Denied = p.judgeTargets(ctx, of, creds[k], want, targets)

		out = append(out, *u)
	}

	return out
}

// judgedAs is what a credential in use of the named credential ("": the cluster's) is judged
// against: that credential's configuration, its desired (decrypted already: the plan proved it)
// and its packages.
func (p *Prover) judgedAs(name string) (cfg config.Credential, desired *credential.Credential, targets []string, ok bool) {
	if name == "" {
		targets, _ = p.proveTargets()
		desired, _ = p.Credentials.Credential()

		return p.Config.Credential, desired, targets, true
	}

	t := p.Config.Tenant(name)
	if t == nil {
		return config.Credential{}, nil, nil, false
	}

	desired, _ = p.Credentials.TenantCredential(name)

	return t.Credential, desired, t.Credential.Prove, true
}

// judgeTargets asks the registry about a credential in use, package by package, waiting out
// the registry's passing trouble (Retry): refused when the registry refuses the credential
// itself (at the token step) or every package; partial when it pulls some packages and is
// denied others (a package the old token was never granted: a warning naming it, no
// emergency); else as the proof of each package says. A denial is checked against a control,
// the desired credential asked for the same package at that moment: accepted, the denial is
// this credential's (refused at once); denied too, the registry is refusing everyone for now,
// and the denial is waited out like a transient answer.
func (p *Prover) judgeTargets(ctx context.Context, of config.Credential, c, desired *credential.Credential, targets []string) (state, detail string, denied []string) {
	var firstErr error

	pulled := 0

	for _, t := range targets {
		var control func(context.Context) error

		if desired != nil {
			control = func(ctx context.Context) error {
				_, err := credential.ProveWithin(ctx, p.registryOf(of), desired, []string{t}, proofTimeout)

				return err
			}
		}

		_, tried, err := p.retryOf(of).Prove(ctx, p.registryOf(of), c, []string{t}, proofTimeout, control)

		var pe *credential.ProofError

		switch {
		case err == nil:
			pulled++

			if s := tried.String(); s != "" && detail == "" {
				detail = "valid, once the registry answered (" + s + ")"
			}

			continue
		case judgeProof(err) == plan.CredentialRefused && errors.As(err, &pe) && pe.Step == "manifest":
			denied = append(denied, t)
		default: // refused as a whole, or no answer: the other packages would say the same
			return judgeProof(err), err.Error(), nil
		}

		if firstErr == nil {
			firstErr = err
		}
	}

	switch {
	case len(denied) == 0:
		return plan.CredentialValid, detail, nil
	case pulled == 0:
		return plan.CredentialRefused, firstErr.Error(), nil
	}

	return plan.CredentialPartial, firstErr.Error(), denied
}

// judgeProof is what a proof's outcome says of a credential in use: refused only by the
// registry's own refusal (401, 403) — stable, where it was asked again.
func judgeProof(err error) string {
	var (
		pe      *credential.ProofError
		retried *credential.Error
	)

	switch {
	case err == nil:
		return plan.CredentialValid
	case errors.As(err, &retried):
		if retried.Stable {
			return plan.CredentialRefused
		}
	case errors.As(err, &pe) && (pe.Status == http.StatusUnauthorized || pe.Status == http.StatusForbidden):
		return plan.CredentialRefused
	}

	return plan.CredentialUnreachable
}
