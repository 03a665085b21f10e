package plan_test

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/authdigest"
	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/secretfile"
	"github.com/ghcrsync/ghcrsync/plan"
)

// v1Key is how ghcrsync sealed plans before: an HMAC keyed with the whole dockerconfigjson.
func v1Key(keyMaterial []byte) []byte {
	m := hmac.New(sha256.New, keyMaterial)
	m.Write([]byte("ghcrsync plan authentication v1"))

	return m.Sum(nil)
}

// publicValues is every digest of the credential ghcrsync writes somewhere anyone may read it
// (the plan, the state, node annotations, Events, the holder id), as text and as the bytes it
// encodes.
func publicValues(c *credential.Credential) map[string][]byte {
	out := map[string][]byte{}

	for name, hexDigest := range map[string]string{
		"revision":             c.Revision(),
		"auth digest":          c.AuthDigest(),
		"pull-secret revision": c.PullSecretRevision(),
		"talos auth digest":    authdigest.FromFields(c.Username, c.Password(), ""),
	} {
		raw, err := hex.DecodeString(hexDigest)
		if err != nil {
			panic(err)
		}

		out[name+" (hex)"] = []byte(hexDigest)
		out[name+" (bytes)"] = raw
		out[name+" (holder prefix)"] = []byte(hexDigest[:16])
	}

	return out
}

// Every way of turning a public digest into a key — as the key, through the v1 derivation, or
// through HKDF with the v2 salt and context — seals a plan that apply's key refuses. The
// negative control: under the v1 scheme, the revision printed in every plan gave the key.
func TestPlanKeyIsNotComputableFromPublicDigests(t *testing.T) {
	canonical := secretfile.DockerConfigJSON("ghcr.io", "fleet-new", "ghp_0123456789abcdef0123456789abcdef")

	cred, err := credential.Parse(canonical, "ghcr.io")
	if err != nil {
		t.Fatal(err)
	}

	// The control: the attack the v1 scheme allowed reproduces, so this test can see one.
	rev, _ := hex.DecodeString(cred.Revision())
	if !hmac.Equal(v1Key(canonical), v1Key(rev)) {
		t.Fatal("control: the v1 key was computable from the revision of a canonical dockerconfigjson; the fixture is not canonical")
	}

	real := cred.PlanKey()
	if hmac.Equal(real, v1Key(canonical)) {
		t.Fatal("the plan key is still the v1 key")
	}

	p := readPlan(t)
	derive := map[string]func([]byte) []byte{
		"as the key":    func(b []byte) []byte { return b },
		"v1 derivation": v1Key,
		"sha-256 of it": func(b []byte) []byte { s := sha256.Sum256(b); return s[:] },
		"hkdf with no salt": func(b []byte) []byte {
			k, _ := hkdf.Key(sha256.New, b, nil, "ghcrsync plan authentication v2", 32)
			return k
		},
	}

	dir := t.TempDir()
	tried := 0

	for value, material := range publicValues(cred) {
		for how, f := range derive {
			key := f(material)
			tried++

			if hmac.Equal(key, real) {
				t.Errorf("the plan key equals the %s, %s", value, how)
			}

			forged := filepath.Join(dir, "forged.plan")
			if err := plan.Save(forged, p, key); err != nil {
				t.Fatal(err)
			}

			got, err := plan.Load(forged)
			if err != nil {
				t.Fatal(err)
			}

			if got.Authentic(real) {
				t.Errorf("a plan sealed with the %s, %s, is authentic", value, how)
			}
		}
	}

	if tried < 40 {
		t.Fatalf("only %d forgeries tried", tried)
	}

	// The positive control: a plan sealed with the real key is authentic.
	sealed := filepath.Join(dir, "sealed.plan")
	if err := plan.Save(sealed, p, real); err != nil {
		t.Fatal(err)
	}

	if got, err := plan.Load(sealed); err != nil || !got.Authentic(real) || got.RetiredSeal() {
		t.Fatalf("a plan sealed with the plan key: %v, authentic %v", err, err == nil && got.Authentic(real))
	}
}

// The key depends on the secret, and on the registry and user it is bound to.
func TestPlanKeyBinding(t *testing.T) {
	key := func(registry, user, pass string) []byte {
		c, err := credential.Parse(secretfile.DockerConfigJSON(registry, user, pass), registry)
		if err != nil {
			t.Fatal(err)
		}

		return c.PlanKey()
	}

	base := key("ghcr.io", "u", "ghp_secret_one")
	for name, other := range map[string][]byte{
		"another password": key("ghcr.io", "u", "ghp_secret_two"),
		"another user":     key("ghcr.io", "v", "ghp_secret_one"),
		"another registry": key("registry.example.com", "u", "ghp_secret_one"),
	} {
		if hmac.Equal(base, other) {
			t.Errorf("%s gives the same plan key", name)
		}
	}

	if !hmac.Equal(base, key("ghcr.io", "u", "ghp_secret_one")) {
		t.Error("the plan key is not deterministic")
	}
}

func readPlan(t *testing.T) *plan.Plan {
	t.Helper()

	body, err := os.ReadFile(filepath.Join("testdata", "rotation", "plan.json"))
	if err != nil {
		t.Fatal(err)
	}

	var p plan.Plan
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatal(err)
	}

	return &p
}
