package credential

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/authdigest"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/secretfile"
)

const (
	user = "fleet-new"
	pass = "ghp_0123456789abcdef0123456789abcdef"
)

var keyPath = []string{"stringData", "ghcr_dockerconfigjson"}

// fixture writes an age key and a SOPS file holding dockerconfigjson, and points
// SOPS_AGE_KEY_FILE at the key.
func fixture(t *testing.T, dockerconfigjson []byte) string {
	t.Helper()

	dir := t.TempDir()

	id, recipient, err := secretfile.NewAgeKey()
	if err != nil {
		t.Fatal(err)
	}

	enc, err := secretfile.Encrypt(dockerconfigjson, recipient)
	if err != nil {
		t.Fatal(err)
	}

	if err := os.WriteFile(filepath.Join(dir, "age.key"), id, 0o600); err != nil {
		t.Fatal(err)
	}

	if err := os.WriteFile(filepath.Join(dir, "secret.enc.yaml"), enc, 0o600); err != nil {
		t.Fatal(err)
	}

	t.Setenv("SOPS_AGE_KEY_FILE", filepath.Join(dir, "age.key"))
	t.Setenv("SOPS_AGE_KEY", "")

	return filepath.Join(dir, "secret.enc.yaml")
}

func TestLoad(t *testing.T) {
	doc := secretfile.DockerConfigJSON("ghcr.io", user, pass)
	path := fixture(t, doc)

	c, err := Load(path, keyPath, "ghcr.io")
	if err != nil {
		t.Fatal(err)
	}

	if c.Username != user || c.Password() != pass || string(c.DockerConfigJSON()) != string(doc) {
		t.Fatalf("decoded %s", c)
	}

	if len(c.Revision()) != 64 || c.AuthDigest() != authdigest.Of(user, pass) {
		t.Fatal("digests")
	}

	for _, f := range []string{"%v", "%+v", "%s", "%#v"} {
		if s := fmt.Sprintf(f, c); strings.Contains(s, pass) {
			t.Fatalf("%s prints the secret: %s", f, s)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	auth := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

	for _, tc := range []struct {
		name    string
		doc     string
		setup   func(t *testing.T, path string)
		keyPath []string
		want    string
	}{
		{name: "wrong_age_key", doc: string(secretfile.DockerConfigJSON("ghcr.io", user, pass)), setup: func(t *testing.T, _ string) {
			id, _, _ := secretfile.NewAgeKey()
			other := filepath.Join(t.TempDir(), "other.key")
			_ = os.WriteFile(other, id, 0o600)
			t.Setenv("SOPS_AGE_KEY_FILE", other)
		}, want: "cannot decrypt"},
		{name: "not_sops", doc: "{}", setup: func(t *testing.T, path string) {
			_ = os.WriteFile(path, []byte("stringData:\n  ghcr_dockerconfigjson: x\n"), 0o600)
		}, want: "not SOPS-encrypted"},
		{name: "tampered", doc: string(secretfile.DockerConfigJSON("ghcr.io", user, pass)), setup: func(t *testing.T, path string) {
			b, _ := os.ReadFile(path)
			// Change one character inside the encrypted value: GCM authentication fails.
			s := string(b)
			i := strings.Index(s, "ghcr_dockerconfigjson: ENC[AES256_GCM,data:") + len("ghcr_dockerconfigjson: ENC[AES256_GCM,data:") + 4
			c := byte('A')
			if s[i] == 'A' {
				c = 'B'
			}

			s = s[:i] + string(c) + s[i+1:]
			_ = os.WriteFile(path, []byte(s), 0o600)
		}, want: "damaged or edited after encryption"},
		{name: "missing_key_path", doc: "{}", keyPath: []string{"stringData", "other"}, want: `no "other" under "stringData"`},
		{name: "not_json", doc: "{not json", want: "not JSON"},
		{name: "no_registry_entry", doc: `{"auths":{"docker.io":{"username":"u","password":"p"}}}`, want: `no auths entry for "ghcr.io"`},
		{name: "empty_password", doc: `{"auths":{"ghcr.io":{"username":"u","password":""}}}`, want: "non-empty username and password"},
		{name: "auth_not_base64", doc: `{"auths":{"ghcr.io":{"auth":"%%%"}}}`, want: "not base64"},
		{name: "auth_no_colon", doc: fmt.Sprintf(`{"auths":{"ghcr.io":{"auth":%q}}}`, auth("nocolon")), want: `not base64 of "user:password"`},
		{name: "forms_disagree", doc: fmt.Sprintf(`{"auths":{"ghcr.io":{"username":"u","password":"p","auth":%q}}}`, auth("u:other")), want: "disagree"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := fixture(t, []byte(tc.doc))
			if tc.setup != nil {
				tc.setup(t, path)
			}

			kp := keyPath
			if tc.keyPath != nil {
				kp = tc.keyPath
			}

			_, err := Load(path, kp, "ghcr.io")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want error containing %q, got %v", tc.want, err)
			}

			if strings.Contains(err.Error(), pass) || strings.Contains(err.Error(), "other") && tc.name == "forms_disagree" {
				t.Fatalf("error reveals a secret: %v", err)
			}
		})
	}
}

func TestAuthOnlyForm(t *testing.T) {
	doc := fmt.Sprintf(`{"auths":{"ghcr.io":{"auth":%q}}}`, base64.StdEncoding.EncodeToString([]byte(user+":"+pass)))

	c, err := Parse([]byte(doc), "ghcr.io")
	if err != nil || c.Username != user || c.Password() != pass {
		t.Fatalf("%v %v", c, err)
	}
}

// Prove runs the token flow against the sandbox registry: accepted, rejected at the token step,
// and a public image refused as proof.
// The expiry header as GitHub writes it, and values that are not a time (ignored, never "valid").
func TestParseExpiration(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"github", "2026-12-31 12:00:00 UTC", "2026-12-31T12:00:00Z"},
		{"offset", "2026-12-31 13:00:00 +0100", "2026-12-31T12:00:00Z"},
		{"rfc3339", "2026-12-31T12:00:00Z", "2026-12-31T12:00:00Z"},
		{"empty", "", ""},
		{"garbage", "soon", ""},
		{"hostile", strings.Repeat("9", 100), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ""
			if e := parseExpiration(tc.in); !e.IsZero() {
				got = e.Format(time.RFC3339)
			}

			if got != tc.want {
				t.Fatalf("parseExpiration(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestProve(t *testing.T) {
	ctx := context.Background()

	reg, c := registryWithCredential(t)

	targets := []string{"ghcrsync/private-probe:v1", "ghcrsync/app:v1"}
	proof, err := Prove(ctx, Registry{Endpoint: reg.URL()}, c, targets)
	if err != nil || !strings.HasPrefix(proof.Digests[targets[0]], "sha256:") || !proof.Expires.IsZero() {
		t.Fatalf("valid credential: %+v %v", proof, err)
	}

	// The registry reports the token's expiry as GitHub does: the proof carries it.
	expires := time.Now().Add(72 * time.Hour).UTC().Truncate(time.Second)
	reg.SetExpiry(user, expires)

	if proof, err := Prove(ctx, Registry{Endpoint: reg.URL()}, c, targets); err != nil || !proof.Expires.Equal(expires) {
		t.Fatalf("expiring credential: expires %s, want %s (%v)", proof.Expires, expires, err)
	}

	reg.SetExpiry(user, time.Time{})

	if _, err := Prove(ctx, Registry{Endpoint: reg.URL()}, c, []string{"ghcrsync/absent:v1"}); err == nil {
		t.Fatal("a missing image was proved")
	}

	reg.RevokeCredential(user)

	_, err = Prove(ctx, Registry{Endpoint: reg.URL()}, c, targets)

	var pe *ProofError
	if !errors.As(err, &pe) || pe.Step != "token" || pe.Status != http.StatusUnauthorized {
		t.Fatalf("revoked credential: want a 401 at the token step, got %v", err)
	}

	if !strings.Contains(err.Error(), "rejects this credential") || strings.Contains(err.Error(), pass) {
		t.Fatalf("message: %v", err)
	}

	// An image anyone pulls with an anonymous token (a public package) proves nothing; the
	// negative control is the private images above, proved with the same flow.
	reg.AddCredential(user, pass)

	if _, err := Prove(ctx, Registry{Endpoint: reg.URL()}, c, []string{registry.PublicImage}); err == nil ||
		!strings.Contains(err.Error(), "readable without credentials") {
		t.Fatalf("a public image as proof: %v", err)
	}
}

// The password goes only to a token realm on a pinned host: a challenge naming another host (or
// plain http to a remote one) fails the proof at the token step before anything is sent there;
// the realm's host listed in trusted_hosts is used. The negative control: the same realm, when
// trusted, receives the password.
func TestProveSendsThePasswordOnlyToAPinnedRealm(t *testing.T) {
	ctx := context.Background()

	reg, err := registry.Start()
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { reg.Close(ctx) })
	reg.AddCredential(user, pass)

	var got atomic.Int32

	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, p, ok := r.BasicAuth(); ok && p == pass {
			got.Add(1)
		}

		http.Error(w, "no", http.StatusUnauthorized)
	}))
	t.Cleanup(evil.Close)

	// The same loopback port under another name: a host the endpoint's name does not cover.
	elsewhere := strings.Replace(evil.URL, "127.0.0.1", "localhost", 1) + "/token"

	c, err := Parse(secretfile.DockerConfigJSON("ghcr.io", user, pass), "ghcr.io")
	if err != nil {
		t.Fatal(err)
	}

	targets := []string{"ghcrsync/private-probe:v1"}

	for _, tc := range []struct{ name, realm, want string }{
		{"realm_on_another_host", elsewhere, "its host localhost is not trusted"},
		{"realm_over_plain_http_to_a_remote_host", "http://ghcr.io/token", "must be https"},
		{"realm_not_a_url", "token-service", "must be an https:// URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg.SetRealm(tc.realm)
			t.Cleanup(func() { reg.SetRealm("") })

			_, err := Prove(ctx, Registry{Endpoint: reg.URL()}, c, targets)

			var pe *ProofError
			if !errors.As(err, &pe) || pe.Step != "token" || !strings.Contains(err.Error(), tc.want) ||
				!strings.Contains(err.Error(), "the credential was not sent") {
				t.Fatalf("got %v, want a refusal at the token step naming %q", err, tc.want)
			}
		})
	}

	if n := got.Load(); n != 0 {
		t.Fatalf("the untrusted realm received the password %d time(s)", n)
	}

	// The control: listed in trusted_hosts, the realm is asked (and refuses: the proof fails
	// with its 401).
	reg.SetRealm(elsewhere)
	t.Cleanup(func() { reg.SetRealm("") })

	if _, err := Prove(ctx, Registry{Endpoint: reg.URL(), TrustedHosts: []string{"localhost"}}, c, targets); err == nil || got.Load() != 1 {
		t.Fatalf("a trusted realm: %v, received the password %d time(s)", err, got.Load())
	}
}

// An auths key written with a scheme or a path ("https://ghcr.io", as `docker login` and some
// tools write it) names the registry as the kubelet reads it: it is normalised — the credential
// found, and written out under the registry's own name — not refused. Two keys for one registry
// are refused (the kubelet would try both: a second credential would outlive the rotation), and
// so is a key for another host.
func TestAuthsKeyNormalised(t *testing.T) {
	entry := fmt.Sprintf(`{"username":%q,"password":%q}`, user, pass)

	for _, tc := range []struct {
		name, doc, want string
	}{
		{name: "plain", doc: `{"auths":{"ghcr.io":` + entry + `}}`},
		{name: "https_scheme", doc: `{"auths":{"https://ghcr.io":` + entry + `}}`},
		{name: "scheme_and_path", doc: `{"auths":{"https://ghcr.io/v2/":` + entry + `},"credsStore":"x"}`},
		{name: "upper_case_host", doc: `{"auths":{"https://GHCR.io":` + entry + `}}`},
		{name: "plain_and_scheme_keys", doc: `{"auths":{"ghcr.io":` + entry + `,"https://ghcr.io":{"username":"a","password":"b"}}}`, want: `all name "ghcr.io"`},
		{name: "two_keys_for_one_host", doc: `{"auths":{"https://ghcr.io":` + entry + `,"http://ghcr.io/v1/":` + entry + `}}`, want: `all name "ghcr.io"`},
		{name: "another_host", doc: `{"auths":{"https://ghcr.io.example.com":` + entry + `}}`, want: `no auths entry for "ghcr.io"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.doc), "ghcr.io")
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), pass) {
					t.Fatalf("want an error saying %q, got %v", tc.want, err)
				}

				return
			}

			if err != nil || c.Username != user || c.Password() != pass {
				t.Fatalf("%v", err)
			}

			// Written out under "ghcr.io": it parses again with the plain key, nothing else lost.
			out := string(c.DockerConfigJSON())
			if !strings.Contains(out, `"ghcr.io":`) || strings.Contains(out, "://") {
				t.Fatalf("written out as %s", strings.ReplaceAll(out, pass, "<password>"))
			}

			if strings.Contains(tc.doc, "credsStore") && !strings.Contains(out, "credsStore") {
				t.Fatal("another field of the document was lost")
			}
		})
	}
}

// The proof reads the platforms a target offers: an image index's (buildx's multi-arch image),
// a single image's from its config; an image that names none gives none (nothing is guessed).
func TestProveReadsPlatforms(t *testing.T) {
	ctx := context.Background()

	reg, err := registry.Start()
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { reg.Close(ctx) })
	reg.AddCredential(user, pass)

	if err := reg.PushIndex("ghcrsync/multi-probe:v1", "linux/amd64", "linux/arm64/v8"); err != nil {
		t.Fatal(err)
	}

	if err := reg.PushIndex("ghcrsync/amd-probe:v1", "linux/amd64"); err != nil {
		t.Fatal(err)
	}

	c, err := Parse(secretfile.DockerConfigJSON("ghcr.io", user, pass), "ghcr.io")
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		target string
		want   string
	}{
		{"ghcrsync/multi-probe:v1", "linux/amd64 linux/arm64/v8"},
		{"ghcrsync/amd-probe:v1", "linux/amd64"},
		{"ghcrsync/private-probe:v1", ""}, // a seeded image whose config names no platform
	} {
		proof, err := Prove(ctx, Registry{Endpoint: reg.URL()}, c, []string{tc.target})
		if err != nil || strings.Join(proof.Platforms[tc.target], " ") != tc.want {
			t.Fatalf("%s: platforms %v, want %q (%v)", tc.target, proof.Platforms[tc.target], tc.want, err)
		}
	}
}

// Isolation against a real token-auth registry: a package the registry refuses the credential
// (403 at the manifest, as GHCR answers a package not granted) proves isolation; one granted, or
// one anyone may read, is named as pulled; a missing image or an unreachable registry proves
// nothing either way and is an error, never "isolated".
func TestIsolation(t *testing.T) {
	ctx := context.Background()

	reg, c := registryWithCredential(t)

	other := "ghcrsync/app:v1" // another tenant's package
	at := Registry{Endpoint: reg.URL()}

	for _, tc := range []struct {
		name    string
		denied  bool
		targets []string
		pulls   []string
		err     string
	}{
		{"refused: isolated", true, []string{other}, nil, ""},
		{"granted: pulled", false, []string{other}, []string{other}, ""},
		{"public: anyone pulls it", true, []string{other, registry.PublicImage}, []string{registry.PublicImage}, ""},
		{"missing: unknown", true, []string{other, "ghcrsync/absent:v1"}, nil, "absent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.denied {
				reg.DenyRepository(user, "ghcrsync/app")
				t.Cleanup(func() { reg.AllowRepository(user, "ghcrsync/app") })
			}

			pulls, err := Isolation(ctx, at, c, tc.targets)
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("Isolation: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("Isolation = %v, %v; want an error naming %s", pulls, err, tc.err)
			case tc.err == "" && !slices.Equal(pulls, tc.pulls):
				t.Fatalf("Isolation pulls %v, want %v", pulls, tc.pulls)
			}

			if err != nil && strings.Contains(err.Error(), pass) {
				t.Fatalf("the password in an error: %v", err)
			}
		})
	}

	reg.Close(ctx)

	if _, err := Isolation(ctx, at, c, []string{other}); err == nil {
		t.Fatal("an unreachable registry proved isolation")
	}
}

// registryWithCredential starts the sandbox's token-auth registry for the test, with the test's
// credential added.
func registryWithCredential(t *testing.T) (*registry.Registry, *Credential) {
	t.Helper()

	reg, err := registry.Start()
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { reg.Close(context.Background()) })

	reg.AddCredential(user, pass)

	c, err := Parse(secretfile.DockerConfigJSON("ghcr.io", user, pass), "ghcr.io")
	if err != nil {
		t.Fatal(err)
	}

	return reg, c
}
