package credential

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/pin"
)

// ProofError says which target failed at which step of the registry's token flow.
type ProofError struct {
	Target string
	Step   string // "challenge", "token", "manifest"
	Status int
	Err    error
	// RetryAfter is what the registry asked to be left alone for (a 429 or 503's Retry-After).
	RetryAfter time.Duration
}

func (e *ProofError) Error() string {
	msg := fmt.Sprintf("registry proof of %s failed at the %s step", e.Target, e.Step)
	if e.Status != 0 {
		msg += fmt.Sprintf(": %d %s", e.Status, http.StatusText(e.Status))
	}

	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}

	switch e.Status {
	case http.StatusUnauthorized, http.StatusForbidden:
		msg += " — the registry rejects this credential (revoked, expired, or without access to the image)"
	}

	return msg
}

func (e *ProofError) Unwrap() error { return e.Err }

// Registry is where a proof is made: the registry's base URL, and the hosts besides its own
// (and the credential's registry name) its token realm may be on.
type Registry struct {
	Endpoint     string
	TrustedHosts []string
	Timeout      time.Duration // per request (0: 30 s)
	Clock        clock.Clock   // a Retry-After date is read against it (nil: clock.System)
}

// realmHosts are the hosts the password may be sent to.
func (r Registry) realmHosts(c *Credential) []string {
	return append([]string{pin.Host(r.Endpoint), strings.ToLower(c.Registry)}, r.TrustedHosts...)
}

// name is the registry as go-containerregistry addresses it: the endpoint's host, over plain
// http only where the endpoint says so (pin allows that for a loopback host alone).
func (r Registry) name() (name.Registry, []name.Option, error) {
	if err := pin.Base(r.Endpoint); err != nil {
		return name.Registry{}, nil, fmt.Errorf("credential.endpoint: %w", err)
	}

	u, _ := url.Parse(r.Endpoint)

	var opts []name.Option
	if u.Scheme == "http" {
		opts = append(opts, name.Insecure)
	}

	reg, err := name.NewRegistry(u.Host, opts...)
	if err != nil {
		return name.Registry{}, nil, fmt.Errorf("credential.endpoint's host is not a registry name: %w", err)
	}

	return reg, opts, nil
}

// Prove shows the registry accepts the credential for each target (repository:tag or
// repository@digest), through go-containerregistry's Docker token flow: the auth challenge
// (GET /v2/), a token for the repository's pull scope in exchange for the credential, then the
// manifest with that token. Every step must succeed, and the image must not be readable
// anonymously (a public image proves nothing).
//
// The credential goes only to a token realm on a pinned host (https, the registry's own host or
// a trusted one): the realm is checked before it is asked, and every request of the proof —
// redirects included — passes through a transport that refuses any other destination.
//
// It returns each target's manifest digest ("sha256:…", verified against the manifest), so a
// proof made later can pull exactly the image proved here, and the credential's expiry where the
// registry reports it.
func Prove(ctx context.Context, r Registry, c *Credential, targets []string) (Proof, error) {
	s, err := r.open(c)
	if err != nil {
		return Proof{}, err
	}
	defer s.close()

	proof := Proof{Digests: map[string]string{}, Platforms: map[string][]string{}}

	for _, t := range targets {
		p, err := s.prover(ctx, t)
		if err != nil {
			return Proof{}, s.rt.waitFor(err)
		}

		d, platforms, err := p.prove(s.opts, s.ch)
		if err != nil {
			return Proof{}, s.rt.waitFor(err)
		}

		proof.Digests[t] = d
		if len(platforms) > 0 {
			proof.Platforms[t] = platforms
		}
	}

	proof.Expires = s.rt.expiry()

	return proof, nil
}

// session is one proof's way to the registry: its name, the transport pinned to the hosts the
// credential may go to, the credential's authenticator, and the registry's challenge once asked.
type session struct {
	reg  name.Registry
	opts []name.Option
	rt   *pinned
	auth authn.Authenticator
	ch   *transport.Challenge
}

// open starts a session with the registry for the credential; close ends it.
func (r Registry) open(c *Credential) (*session, error) {
	reg, opts, err := r.name()
	if err != nil {
		return nil, &ProofError{Target: r.Endpoint, Step: "challenge", Err: err}
	}

	timeout := r.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}

	return &session{reg: reg, opts: opts, rt: newPinned(r.realmHosts(c), timeout, clock.Or(r.Clock)),
		auth: authn.FromConfig(authn.AuthConfig{Username: c.Username, Password: c.password})}, nil
}

func (s *session) close() { s.rt.close() }

// prover is the session's prover for one target. The challenge is the registry's, not a
// target's: asked once, by the first target (which names it if it fails).
func (s *session) prover(ctx context.Context, target string) (*prover, error) {
	p := &prover{ctx: ctx, rt: s.rt, reg: s.reg, target: target, auth: s.auth}

	if s.ch == nil {
		ch, err := p.challenge()
		if err != nil {
			return nil, err
		}

		s.ch = ch
	}

	return p, nil
}

// waitFor notes on a transient proof error what the registry asked to be left alone for.
func (p *pinned) waitFor(err error) error {
	var pe *ProofError
	if errors.As(err, &pe) && ClassOfStatus(pe.Status) == Transient {
		pe.RetryAfter = p.lastRetryAfter()
	}

	return err
}

// ProveWithin is one Prove, its requests bounded together by timeout: one attempt of a retried
// proof, or a control asked once.
func ProveWithin(ctx context.Context, reg Registry, c *Credential, targets []string, timeout time.Duration) (Proof, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	return Prove(ctx, reg, c, targets)
}

// Prove is Prove asked again as r says while the registry's answers are transient or a denial
// is not stable (each attempt bounded by timeout), with what it went through.
func (r Retry) Prove(ctx context.Context, reg Registry, c *Credential, targets []string, timeout time.Duration, control func(context.Context) error) (Proof, Outcome, error) {
	var proof Proof

	try := func(ctx context.Context) Attempt {
		var err error

		proof, err = ProveWithin(ctx, reg, c, targets, timeout)

		var pe *ProofError
		if errors.As(err, &pe) {
			return Attempt{Err: err, RetryAfter: pe.RetryAfter}
		}

		return Attempt{Err: err}
	}

	out, err := r.Do(ctx, try, ClassOf, control)

	return proof, out, err
}

// prover is one target's token flow.
type prover struct {
	ctx    context.Context
	rt     *pinned
	reg    name.Registry
	auth   authn.Authenticator
	target string
	// realm is the token realm the registry's challenge named.
	realm string
}

// challenge asks the registry how it wants to be authenticated (GET /v2/), and checks the
// answer is Docker token auth whose realm the credential may go to.
func (p *prover) challenge() (*transport.Challenge, error) {
	ch, err := transport.Ping(p.ctx, p.reg, p.rt)
	if err != nil {
		return nil, p.fail("challenge", err)
	}

	if err := p.bearer(ch); err != nil {
		return nil, err
	}

	return ch, nil
}

func (p *prover) prove(opts []name.Option, ch *transport.Challenge) (string, []string, error) {
	desc, anonymous, err := p.read(opts, ch)

	switch {
	case err != nil:
		return "", nil, err
	case anonymous:
		return "", nil, p.say("challenge", "%s is readable without credentials (an anonymous token pulls it), so it proves nothing: prove a private image", p.target)
	}

	return desc.Digest.String(), platforms(desc), nil
}

// read reads the target's manifest with the credential, by the token flow; anonymous when
// anyone may read it (an anonymous token pulls it: the credential is then not asked).
func (p *prover) read(opts []name.Option, ch *transport.Challenge) (desc *remote.Descriptor, anonymous bool, err error) {
	p.realm = ch.Parameters["realm"]

	ref, err := p.reference(opts)
	if err != nil {
		return nil, false, err
	}

	scopes := []string{ref.Scope(transport.PullScope)}

	if p.anonymous(ref, ch, scopes) {
		return nil, true, nil
	}

	tok, err := transport.Exchange(p.ctx, p.reg, p.auth, p.rt, scopes, ch)
	if err != nil {
		return nil, false, p.fail("token", err)
	}

	if desc, err = p.get(ref, ch, p.auth, tok); err != nil {
		return nil, false, p.fail("manifest", err)
	}

	return desc, false, nil
}

// platforms are the os/arch[/variant] an image offers: an index's entries (attestation
// manifests, "unknown/unknown", left out), or a single image's config. Nil when they cannot be
// read: the caller then knows nothing, and warns of nothing.
func platforms(desc *remote.Descriptor) []string {
	var out []string

	add := func(pl *v1.Platform) {
		if pl == nil || pl.OS == "" || pl.OS == "unknown" || pl.Architecture == "" || pl.Architecture == "unknown" {
			return
		}

		s := pl.OS + "/" + pl.Architecture
		if pl.Variant != "" {
			s += "/" + pl.Variant
		}

		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}

	switch {
	case desc.MediaType.IsIndex():
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil
		}

		m, err := idx.IndexManifest()
		if err != nil {
			return nil
		}

		for _, d := range m.Manifests {
			add(d.Platform)
		}
	case desc.MediaType.IsImage():
		img, err := desc.Image()
		if err != nil {
			return nil
		}

		cf, err := img.ConfigFile()
		if err != nil {
			return nil
		}

		add(cf.Platform())
	}

	slices.Sort(out)

	return out
}

// reference is the target on this registry.
func (p *prover) reference(opts []name.Option) (name.Reference, error) {
	ref, err := name.ParseReference(p.reg.RegistryStr()+"/"+p.target, append([]name.Option{name.StrictValidation}, opts...)...)
	if err != nil || ref.Context().RegistryStr() != p.reg.RegistryStr() {
		return nil, p.say("challenge", "%q is not repository:tag or repository@digest", p.target)
	}

	return ref, nil
}

// bearer checks the challenge is Docker token auth whose realm the credential may go to.
func (p *prover) bearer(ch *transport.Challenge) error {
	switch {
	case ch.Scheme == "":
		return p.say("challenge", "the registry asks for no credentials, so a pull proves nothing: prove a private image on a registry that requires them")
	case !strings.EqualFold(ch.Scheme, "bearer"):
		return p.say("challenge", "registry did not offer bearer token auth (it asked for %q)", clip(ch.Scheme))
	}

	realm := ch.Parameters["realm"]
	if realm == "" {
		return p.say("challenge", "the registry's WWW-Authenticate challenge has no realm")
	}

	if err := pin.URL(realm, p.rt.hosts); err != nil {
		return p.say("token", "the registry names a token realm the credential may not be sent to (%w; credential.trusted_hosts); the credential was not sent", err)
	}

	return nil
}

// anonymous reports whether anyone can pull the target: a registry that hands out anonymous
// tokens (GHCR does, for public packages) answers the manifest to one.
func (p *prover) anonymous(ref name.Reference, ch *transport.Challenge, scopes []string) bool {
	tok, err := transport.Exchange(p.ctx, p.reg, authn.Anonymous, p.rt, scopes, ch)
	if err != nil {
		return false // no anonymous token: private
	}

	_, err = p.get(ref, ch, authn.Anonymous, tok)

	return err == nil
}

// get reads the target's manifest with a token (remote verifies its digest).
func (p *prover) get(ref name.Reference, ch *transport.Challenge, auth authn.Authenticator, tok *transport.Token) (*remote.Descriptor, error) {
	rt, err := transport.FromToken(p.reg, auth, p.rt, ch, tok)
	if err != nil {
		return nil, err
	}

	return remote.Get(ref, remote.WithTransport(rt), remote.WithContext(p.ctx))
}

// fail is the step's error from go-containerregistry. A registry's answer is named by its status, never quoted: its
// body is hostile data and may echo what was sent. A failed answer from the token realm is the
// token step's, whichever step asked for it (a token refreshed while reading the manifest).
func (p *prover) fail(step string, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		if te.Request != nil && p.realm != "" && sameEndpoint(te.Request.URL, p.realm) {
			step = "token"
		}

		return &ProofError{Target: p.target, Step: step, Status: te.StatusCode}
	}

	var refused *refusal
	if errors.As(err, &refused) {
		return &ProofError{Target: p.target, Step: step, Err: refused}
	}

	return &ProofError{Target: p.target, Step: step, Err: plain(err)}
}

// say is a step's error in ghcrsync's own words.
func (p *prover) say(step, format string, args ...any) error {
	return &ProofError{Target: p.target, Step: step, Err: fmt.Errorf(format, args...)}
}

// plain keeps what an error says of the network, and drops what it quotes of a registry's
// answer (go-containerregistry quotes a malformed token answer whole).
func plain(err error) error {
	var ue *url.Error

	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.As(err, &ue):
		return fmt.Errorf("%s to %s: %w", ue.Op, pin.Host(ue.URL), ue.Err)
	}

	return errors.New("the registry's answer could not be read as a token or a manifest (malformed, or its digest does not match); it is not repeated here")
}

// sameEndpoint reports whether u is the realm (scheme, host and path; the query differs).
func sameEndpoint(u *url.URL, realm string) bool {
	r, err := url.Parse(realm)

	return err == nil && u != nil && strings.EqualFold(u.Scheme, r.Scheme) && strings.EqualFold(u.Host, r.Host) && u.Path == r.Path
}

func clip(s string) string {
	if len(s) > 32 {
		return s[:32] + "…"
	}

	return s
}

// Proof is what proving a credential found.
type Proof struct {
	// Digests are the targets' manifest digests.
	Digests map[string]string
	// Platforms are the platforms each target offers (os/arch[/variant]), where readable.
	Platforms map[string][]string
	// Expires is when the credential stops working, as the registry reported it with its token
	// (GitHub's GitHub-Authentication-Token-Expiration header); zero when it did not.
	Expires time.Time
}

// ExpirationHeader is where GitHub reports a token's expiry ("2026-12-31 12:00:00 UTC").
const ExpirationHeader = "GitHub-Authentication-Token-Expiration"

// parseExpiration reads an ExpirationHeader value; zero if there is none or it is not a time
// (a hostile or garbled value is ignored, never trusted to mean "valid").
func parseExpiration(v string) time.Time {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > 64 {
		return time.Time{}
	}

	for _, layout := range []string{"2006-01-02 15:04:05 MST", "2006-01-02 15:04:05 -0700", time.RFC3339} {
		if t, err := time.Parse(layout, v); err == nil {
			return t.UTC()
		}
	}

	return time.Time{}
}
