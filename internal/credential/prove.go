package credential

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/pin"
	"github.com/ghcrsync/ghcrsync/internal/readlimit"
)

// ProofError says which target failed at which step of the registry's token flow.
type ProofError struct {
	Target string
	Step   string // "challenge", "token", "manifest"
	Status int
	Err    error
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
}

// realmHosts are the hosts the password may be sent to.
func (r Registry) realmHosts(c *Credential) []string {
	return append([]string{pin.Host(r.Endpoint), strings.ToLower(c.Registry)}, r.TrustedHosts...)
}

// Prove shows the registry accepts the credential for each target (repository:tag): the Docker
// token flow — an anonymous request for the manifest to learn the auth challenge, a token
// request with Basic credentials, then the manifest with the bearer token. Every step must
// succeed. The password goes only to a token realm on a pinned host (https, the registry's own
// host or a trusted one), and no request follows a redirect elsewhere.
//
// It returns each target's manifest digest ("sha256:…", as the registry answered it), so a proof
// made later can pull exactly the image proved here, and the credential's expiry where the
// registry reports it.
func Prove(ctx context.Context, r Registry, c *Credential, targets []string) (Proof, error) {
	hosts := r.realmHosts(c)

	timeout := r.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}

	client := &http.Client{Timeout: timeout, CheckRedirect: pin.Redirects(hosts)}

	proof := Proof{Digests: map[string]string{}}

	for _, t := range targets {
		d, expires, err := proveOne(ctx, client, r.Endpoint, hosts, c, t)
		if err != nil {
			return Proof{}, err
		}

		proof.Digests[t] = d
		if !expires.IsZero() && (proof.Expires.IsZero() || expires.Before(proof.Expires)) {
			proof.Expires = expires
		}
	}

	return proof, nil
}

// Proof is what proving a credential found.
type Proof struct {
	// Digests are the targets' manifest digests.
	Digests map[string]string
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

// prover is one target's token flow.
type prover struct {
	ctx    context.Context
	client *http.Client
	c      *Credential
	target string
	repo   string
	// manifest is the manifest's URL.
	manifest string
	// realmHosts are the hosts a token realm may be on.
	realmHosts []string
	// expires is the credential's expiry as the token realm reported it.
	expires time.Time
}

func proveOne(ctx context.Context, client *http.Client, endpoint string, realmHosts []string, c *Credential, target string) (string, time.Time, error) {
	repo, ref, ok := strings.Cut(target, "@")
	if !ok {
		i := strings.LastIndex(target, ":")
		if i < 0 || strings.Contains(target[i:], "/") {
			return "", time.Time{}, &ProofError{Target: target, Step: "challenge", Err: fmt.Errorf("%q is not repository:tag or repository@digest", target)}
		}

		repo, ref = target[:i], target[i+1:]
	}

	p := &prover{ctx: ctx, client: client, c: c, target: target, repo: repo, realmHosts: realmHosts,
		manifest: fmt.Sprintf("%s/v2/%s/manifests/%s", endpoint, repo, ref)}

	realm, params, err := p.challenge()
	if err != nil {
		return "", time.Time{}, err
	}

	if err := p.private(realm, params); err != nil {
		return "", time.Time{}, err
	}

	bearer, err := p.token(realm, params)
	if err != nil {
		return "", time.Time{}, err
	}

	digest, err := p.pull(bearer)

	return digest, p.expires, err
}

func (p *prover) fail(step string, status int, err error) error {
	return &ProofError{Target: p.target, Step: step, Status: status, Err: err}
}

func (p *prover) get(u, bearer string, basic bool) (*http.Response, error) {
	req, err := http.NewRequestWithContext(p.ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}

	req.Header.Set("Accept", strings.Join([]string{
		"application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
		"application/vnd.docker.distribution.manifest.v2+json", "application/vnd.docker.distribution.manifest.list.v2+json",
	}, ", "))

	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}

	if basic {
		req.SetBasicAuth(p.c.Username, p.c.password)
	}

	return p.client.Do(req)
}

// challenge asks for the manifest anonymously and reads the auth challenge.
func (p *prover) challenge() (string, map[string]string, error) {
	resp, err := p.get(p.manifest, "", false)
	if err != nil {
		return "", nil, p.fail("challenge", 0, err)
	}

	drain(resp)

	switch resp.StatusCode {
	case http.StatusOK:
		return "", nil, p.fail("challenge", 0, fmt.Errorf("%s is readable without credentials, so it proves nothing: prove a private image", p.target))
	case http.StatusUnauthorized:
	default:
		return "", nil, p.fail("challenge", resp.StatusCode, nil)
	}

	realm, params, err := parseChallenge(resp.Header.Get("WWW-Authenticate"))
	if err != nil {
		return "", nil, p.fail("challenge", resp.StatusCode, err)
	}

	return realm, params, nil
}

// private refuses an image anyone can pull: a registry that hands out anonymous tokens (GHCR
// does, for public packages) answers the manifest to one. A pull of such an image proves
// nothing about a credential.
func (p *prover) private(realm string, params map[string]string) error {
	bearer, err := p.tokenAs(realm, params, false)
	if err != nil {
		return nil // no anonymous token: private
	}

	resp, err := p.get(p.manifest, bearer, false)
	if err != nil {
		return p.fail("challenge", 0, err)
	}

	drain(resp)

	if resp.StatusCode == http.StatusOK {
		return p.fail("challenge", 0, fmt.Errorf("%s is readable without credentials (an anonymous token pulls it), so it proves nothing: prove a private image", p.target))
	}

	return nil
}

// token trades the credential for a pull token at the realm, if the realm is pinned.
func (p *prover) token(realm string, params map[string]string) (string, error) {
	return p.tokenAs(realm, params, true)
}

// tokenAs asks the realm for a pull token, with the credential (basic) or anonymously.
func (p *prover) tokenAs(realm string, params map[string]string, basic bool) (string, error) {
	if err := pin.URL(realm, p.realmHosts); err != nil {
		return "", p.fail("token", 0, fmt.Errorf("the registry names a token realm the credential may not be sent to (%w; credential.trusted_hosts); the credential was not sent", err))
	}

	q := url.Values{}
	if s := params["service"]; s != "" {
		q.Set("service", s)
	}

	q.Set("scope", "repository:"+p.repo+":pull")

	resp, err := p.get(realm+"?"+q.Encode(), "", basic)
	if err != nil {
		return "", p.fail("token", 0, err)
	}

	defer drain(resp)

	if resp.StatusCode != http.StatusOK {
		return "", p.fail("token", resp.StatusCode, nil)
	}

	if basic {
		p.expires = parseExpiration(resp.Header.Get(ExpirationHeader))
	}

	var tok struct {
		Token       string `json:"token"`
		AccessToken string `json:"access_token"`
	}

	if err := json.NewDecoder(io.LimitReader(resp.Body, readlimit.Body)).Decode(&tok); err != nil {
		return "", p.fail("token", 0, fmt.Errorf("token response is not JSON"))
	}

	if tok.Token != "" {
		return tok.Token, nil
	}

	return tok.AccessToken, nil
}

// pull reads the manifest with the token, and its digest.
func (p *prover) pull(bearer string) (string, error) {
	resp, err := p.get(p.manifest, bearer, false)
	if err != nil {
		return "", p.fail("manifest", 0, err)
	}

	drain(resp)

	if resp.StatusCode != http.StatusOK {
		return "", p.fail("manifest", resp.StatusCode, nil)
	}

	digest := resp.Header.Get("Docker-Content-Digest")
	if digest != "" && !digestRef.MatchString(digest) {
		return "", p.fail("manifest", 0, fmt.Errorf("the registry answered a malformed manifest digest"))
	}

	return digest, nil
}

// digestRef is a manifest digest as registries name it.
var digestRef = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

func drain(r *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, readlimit.Body))
	r.Body.Close()
}

// parseChallenge reads `Bearer realm="…",service="…",scope="…"`.
func parseChallenge(h string) (string, map[string]string, error) {
	scheme, rest, _ := strings.Cut(h, " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", nil, fmt.Errorf("registry did not offer bearer token auth (WWW-Authenticate %q)", h)
	}

	params := map[string]string{}

	for rest != "" {
		rest = strings.TrimLeft(rest, " ,")

		k, v, ok := strings.Cut(rest, "=")
		if !ok {
			break
		}

		if strings.HasPrefix(v, `"`) {
			end := strings.Index(v[1:], `"`)
			if end < 0 {
				return "", nil, fmt.Errorf("malformed WWW-Authenticate %q", h)
			}

			params[strings.ToLower(k)], rest = v[1:end+1], v[end+2:]
		} else {
			val, after, _ := strings.Cut(v, ",")
			params[strings.ToLower(k)], rest = val, after
		}
	}

	if params["realm"] == "" {
		return "", nil, fmt.Errorf("WWW-Authenticate has no realm: %q", h)
	}

	return params["realm"], params, nil
}
