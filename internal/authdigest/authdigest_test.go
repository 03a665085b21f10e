package authdigest

import (
	"encoding/base64"
	"testing"
)

func TestForms(t *testing.T) {
	a := Of("u", "p")
	if len(a) != 64 || a == Of("u", "q") || Of("", "") != "" {
		t.Fatal("digest")
	}

	if FromFields("", "", base64.StdEncoding.EncodeToString([]byte("u:p"))) != a || FromFields("u", "p", "") != a {
		t.Fatal("the two forms disagree")
	}
}

func TestDockerConfig(t *testing.T) {
	if got := DockerConfig([]byte(`{}`)); got != "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a" {
		t.Fatal(got)
	}
}

// The digest is of the content, not the bytes: another tool's key order or indentation is the
// same pull secret; another value, or bytes that are not JSON, are not.
func TestDockerConfigIsOfTheContent(t *testing.T) {
	base := DockerConfig([]byte(`{"auths":{"ghcr.io":{"username":"u","password":"p","auth":"dTpw"}}}`))

	for _, tc := range []struct {
		name, doc string
		same      bool
	}{
		{name: "keys_sorted", doc: `{"auths":{"ghcr.io":{"auth":"dTpw","password":"p","username":"u"}}}`, same: true},
		{name: "indented", doc: "{\n  \"auths\": {\n    \"ghcr.io\": {\"password\": \"p\", \"auth\": \"dTpw\", \"username\": \"u\"}\n  }\n}\n", same: true},
		{name: "other_password", doc: `{"auths":{"ghcr.io":{"username":"u","password":"q","auth":"dTpx"}}}`},
		{name: "extra_registry", doc: `{"auths":{"ghcr.io":{"username":"u","password":"p","auth":"dTpw"},"docker.io":{"auth":"eDp5"}}}`},
		{name: "trailing_garbage", doc: `{"auths":{"ghcr.io":{"username":"u","password":"p","auth":"dTpw"}}} {}`},
		{name: "not_json", doc: `auths: ghcr.io`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := DockerConfig([]byte(tc.doc)) == base; got != tc.same {
				t.Fatalf("same digest = %v, want %v", got, tc.same)
			}
		})
	}
}
