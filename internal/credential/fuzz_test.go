package credential

import (
	"strings"
	"testing"
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

// parseChallenge never panics on a registry's WWW-Authenticate header; a realm it returns is
// never empty.
func FuzzParseChallenge(f *testing.F) {
	f.Add(`Bearer realm="https://ghcr.io/token",service="ghcr.io",scope="repository:org/x:pull"`)
	f.Add(`Bearer realm=https://r/token,service=r`)
	f.Add(`Basic realm="x"`)
	f.Add(`Bearer realm="`)
	f.Add(`Bearer ,,,=,"`)

	f.Fuzz(func(t *testing.T, h string) {
		realm, params, err := parseChallenge(h)
		if err == nil && (realm == "" || params["realm"] != realm) {
			t.Fatalf("parseChallenge(%q) = %q, %v", h, realm, params)
		}
	})
}
