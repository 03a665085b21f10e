package credential

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// FromDocument (the decrypted SOPS document, walked by the key path, then the dockerconfigjson)
// never panics, and never returns a credential without a username and password.
func FuzzFromDocument(f *testing.F) {
	f.Add([]byte("stringData:\n  ghcr_dockerconfigjson: '{\"auths\":{\"ghcr.io\":{\"username\":\"u\",\"password\":\"p\"}}}'\n"), "stringData.ghcr_dockerconfigjson")
	f.Add([]byte("data:\n  x: eyJhdXRocyI6e319\n"), "data.x")
	f.Add([]byte(`{"a":{"b":"{\"auths\":{\"ghcr.io\":{\"auth\":\"dTpw\"}}}"}}`), "a.b")
	f.Add([]byte("a: [1, 2]\n"), "a.0")
	f.Add([]byte("&a [*a]"), "x")

	f.Fuzz(func(t *testing.T, doc []byte, key string) {
		c, err := FromDocument(doc, strings.Split(key, "."), "ghcr.io")
		if err != nil {
			return
		}

		if c.Username == "" || c.Password() == "" {
			t.Fatalf("accepted a credential without username or password: %q", doc)
		}
	})
}

// Parse never panics on a dockerconfigjson, and a credential it accepts has both parts.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"auths":{"ghcr.io":{"username":"u","password":"p"}}}`))
	f.Add([]byte(`{"auths":{"ghcr.io":{"auth":"dTpw","username":"u","password":"p"}}}`))
	f.Add([]byte(`{"auths":{"ghcr.io":{"auth":"!!"}}}`))
	f.Add([]byte(`{"auths":null}`))

	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b, "ghcr.io")
		if err == nil && (c.Username == "" || c.Password() == "") {
			t.Fatalf("accepted %q without username or password", b)
		}
	})
}

// The SOPS layer never panics on a malformed file (no key can decrypt these).
func FuzzDecrypt(f *testing.F) {
	f.Add([]byte("stringData:\n  x: ENC[AES256_GCM,data:abc,iv:def,tag:ghi,type:str]\nsops:\n  age: []\n  version: 3.13.3\n"))
	f.Add([]byte("sops: {}\n"))
	f.Add([]byte("a: b\n"))

	f.Fuzz(func(t *testing.T, b []byte) {
		t.Setenv("SOPS_AGE_KEY", "")
		t.Setenv("SOPS_AGE_KEY_FILE", "/nonexistent")

		if _, err := decryptDocument(b, "fuzz.enc.yaml"); err == nil {
			t.Fatalf("decrypted %q without any key", b)
		}
	})
}

// A proof against a hostile registry — any challenge header, token answer, manifest and
// expiry header — never panics, never succeeds without a manifest digest, never quotes the
// password, and never sends it anywhere but the registry's own host (a second server, on a host
// the proof does not trust, counts every request that carries it).
func FuzzProveAgainstAHostileRegistry(f *testing.F) {
	f.Add(`Bearer realm="{{self}}/token",service="r"`, []byte(`{"token":"t"}`), []byte(`{"schemaVersion":2}`), "2026-12-31 12:00:00 UTC")
	f.Add(`Bearer realm="{{elsewhere}}/token"`, []byte(`{"access_token":"t"}`), []byte(`{}`), "")
	f.Add(`Basic realm="x"`, []byte(`{}`), []byte(``), "garbage")
	f.Add(`Bearer realm="`, []byte(`{"token":""}`), []byte(`not json`), "")
	f.Add(`Bearer ,,,=,"`, []byte(`{"token":"{{password}}"}`), []byte(`{{password}}`), "{{password}}")

	var leaked atomic.Int32

	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, p, ok := r.BasicAuth(); ok && p == pass {
			leaked.Add(1)
		}

		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"token":"t"}`))
	}))
	f.Cleanup(elsewhere.Close)

	var (
		mu                  sync.Mutex
		challenge, expiry   string
		tokenBody, manifest []byte
	)

	reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()

		switch {
		case r.URL.Path == "/token":
			w.Header().Set(ExpirationHeader, expiry)
			_, _ = w.Write(tokenBody)
		case r.Header.Get("Authorization") == "":
			w.Header().Set("WWW-Authenticate", challenge)
			w.WriteHeader(http.StatusUnauthorized)
		default:
			w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
			_, _ = w.Write(manifest)
		}
	}))
	f.Cleanup(reg.Close)

	c, err := Parse([]byte(fmt.Sprintf(`{"auths":{"ghcr.io":{"username":%q,"password":%q}}}`, user, pass)), "ghcr.io")
	if err != nil {
		f.Fatal(err)
	}

	fill := strings.NewReplacer("{{self}}", reg.URL, "{{elsewhere}}", strings.Replace(elsewhere.URL, "127.0.0.1", "localhost", 1), "{{password}}", pass)

	f.Fuzz(func(t *testing.T, ch string, tok, man []byte, exp string) {
		mu.Lock()
		challenge, tokenBody, manifest, expiry = fill.Replace(ch), []byte(fill.Replace(string(tok))), []byte(fill.Replace(string(man))), fill.Replace(exp)
		mu.Unlock()

		proof, err := Prove(context.Background(), Registry{Endpoint: reg.URL, Timeout: 2 * time.Second}, c, []string{"org/x:v1"})
		if err == nil && !strings.HasPrefix(proof.Digests["org/x:v1"], "sha256:") {
			t.Fatalf("proved without a digest: %+v", proof)
		}

		if err != nil && strings.Contains(err.Error(), pass) {
			t.Fatalf("the error quotes the password: %v", err)
		}

		if n := leaked.Load(); n != 0 {
			t.Fatalf("the password was sent to an untrusted host %d time(s)", n)
		}
	})
}
