package credential

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
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

// Prove shows the registry accepts the credential for each target (repository:tag): the Docker
// token flow — an anonymous request for the manifest to learn the auth challenge, a token
// request with Basic credentials, then the manifest with the bearer token. Every step must
// succeed. endpoint is the registry's base URL.
func Prove(ctx context.Context, client *http.Client, endpoint string, c *Credential, targets []string) error {
	for _, t := range targets {
		if err := proveOne(ctx, client, endpoint, c, t); err != nil {
			return err
		}
	}

	return nil
}

func proveOne(ctx context.Context, client *http.Client, endpoint string, c *Credential, target string) error {
	repo, ref, ok := strings.Cut(target, "@")
	if !ok {
		i := strings.LastIndex(target, ":")
		repo, ref = target[:i], target[i+1:]
	}

	manifestURL := fmt.Sprintf("%s/v2/%s/manifests/%s", endpoint, repo, ref)
	fail := func(step string, status int, err error) error {
		return &ProofError{Target: target, Step: step, Status: status, Err: err}
	}

	get := func(u, bearer string, basic bool) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
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
			req.SetBasicAuth(c.Username, c.password)
		}

		return client.Do(req)
	}

	resp, err := get(manifestURL, "", false)
	if err != nil {
		return fail("challenge", 0, err)
	}

	drain(resp)

	if resp.StatusCode == http.StatusOK {
		return fail("challenge", 0, fmt.Errorf("%s is readable without credentials, so it proves nothing: prove a private image", target))
	}

	if resp.StatusCode != http.StatusUnauthorized {
		return fail("challenge", resp.StatusCode, nil)
	}

	realm, params, err := parseChallenge(resp.Header.Get("WWW-Authenticate"))
	if err != nil {
		return fail("challenge", resp.StatusCode, err)
	}

	q := url.Values{}
	if s := params["service"]; s != "" {
		q.Set("service", s)
	}

	q.Set("scope", "repository:"+repo+":pull")

	tokResp, err := get(realm+"?"+q.Encode(), "", true)
	if err != nil {
		return fail("token", 0, err)
	}

	defer tokResp.Body.Close()

	if tokResp.StatusCode != http.StatusOK {
		drain(tokResp)

		return fail("token", tokResp.StatusCode, nil)
	}

	var tok struct {
		Token       string `json:"token"`
		AccessToken string `json:"access_token"`
	}

	if err := json.NewDecoder(io.LimitReader(tokResp.Body, 1<<20)).Decode(&tok); err != nil {
		return fail("token", 0, fmt.Errorf("token response is not JSON"))
	}

	bearer := tok.Token
	if bearer == "" {
		bearer = tok.AccessToken
	}

	mResp, err := get(manifestURL, bearer, false)
	if err != nil {
		return fail("manifest", 0, err)
	}

	drain(mResp)

	if mResp.StatusCode != http.StatusOK {
		return fail("manifest", mResp.StatusCode, nil)
	}

	return nil
}

func drain(r *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
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
