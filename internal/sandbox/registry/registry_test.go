package registry

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// The registry speaks Docker token auth like ghcr.io: a private manifest needs a bearer token,
// the token endpoint needs valid Basic credentials, anonymous tokens are denied private
// repositories, and a revoked user's tokens stop working at once.
func TestRegistryTokenAuth(t *testing.T) {
	ctx := context.Background()
	reg, err := Start()
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { reg.Close(context.Background()) })

	reg.AddCredential("reg-test", "s3cret")

	manifest := reg.URL() + "/v2/ghcrsync/private-probe/manifests/v1"

	do := func(url, user, pass, bearer string) (int, http.Header, []byte) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}

		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}

		req.Header.Set("Accept", "application/vnd.docker.distribution.manifest.v2+json")

		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()

		body, _ := io.ReadAll(resp.Body)

		return resp.StatusCode, resp.Header, body
	}

	token := func(user, pass string) (int, string) {
		code, _, body := do(reg.URL()+"/token?service=sandbox-registry&scope=repository:ghcrsync/private-probe:pull", user, pass, "")

		var tok struct{ Token string }
		_ = json.Unmarshal(body, &tok)

		return code, tok.Token
	}

	code, hdr, _ := do(manifest, "", "", "")
	if code != http.StatusUnauthorized || !strings.Contains(hdr.Get("WWW-Authenticate"), `realm="`+reg.URL()+`/token"`) {
		t.Fatalf("no token: %d %q", code, hdr.Get("WWW-Authenticate"))
	}

	if code, _ := token("reg-test", "wrong"); code != http.StatusUnauthorized {
		t.Fatalf("bad password: token endpoint answered %d", code)
	}

	_, anon := token("", "")
	if code, _, _ := do(manifest, "", "", anon); code != http.StatusForbidden {
		t.Fatalf("anonymous token on a private image: %d", code)
	}

	code, good := token("reg-test", "s3cret")
	if code != http.StatusOK || good == "" {
		t.Fatalf("valid credential: %d", code)
	}

	if code, _, _ := do(manifest, "", "", good); code != http.StatusOK {
		t.Fatalf("manifest with a valid token: %d", code)
	}

	reg.RevokeCredential("reg-test")

	if code, _, _ := do(manifest, "", "", good); code != http.StatusUnauthorized {
		t.Fatalf("revoked user's token still works: %d", code)
	}

	if code, _ := token("reg-test", "s3cret"); code != http.StatusUnauthorized {
		t.Fatalf("revoked credential still gets tokens: %d", code)
	}
}

// Two registries serve the same image, digest for digest, under the same name (as one ghcr.io
// does for every cluster): a digest proved against one pulls from the other.
func TestImagesAreTheSameInEveryRegistry(t *testing.T) {
	ctx := context.Background()
	digests := make([]string, 2)

	for i := range digests {
		r, err := Start()
		if err != nil {
			t.Fatal(err)
		}

		r.AddCredential("u", "p")

		if digests[i], err = r.Pull(ctx, RegistryHost+"/"+PrivateImages[0], "u", "p"); err != nil {
			t.Fatal(err)
		}

		r.Close(ctx)
	}

	if digests[0] == "" || digests[0] != digests[1] {
		t.Fatalf("digests %v", digests)
	}
}
