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

// sopsCredential is the credential registry/user/pass as apply reads it: from a SOPS file
// encrypted for a new age key (so with its own data key), decrypted with that key.
func sopsCredential(t *testing.T, registry, user, pass string) *credential.Credential {
	t.Helper()

	identity, recipient, err := secretfile.NewAgeKey()
	if err != nil {
		t.Fatal(err)
	}

	enc, err := secretfile.Encrypt(secretfile.DockerConfigJSON(registry, user, pass), recipient)
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	path := filepath.Join(dir, "secret.enc.yaml")

	if err := os.WriteFile(path, enc, 0o600); err != nil {
		t.Fatal(err)
	}

	t.Setenv("SOPS_AGE_KEY_FILE", "")
	t.Setenv("SOPS_AGE_KEY", string(identity))

	c, err := credential.Load(path, secretfile.KeyPath, registry)
	if err != nil {
		t.Fatal(err)
	}

	return c
}

func planKey(t *testing.T, c *credential.Credential) []byte {
	t.Helper()

	key, err := c.PlanKey()
	if err != nil {
		t.Fatal(err)
	}

	return key
}

// v2Key is how ghcrsync sealed plans before this version: from the credential alone, which the
// person who minted the token knows.
func v2Key(c *credential.Credential) []byte {
	k, _ := hkdf.Key(sha256.New, []byte(c.Password()), []byte("ghcrsync.dev plan-key salt 2026"),
		"ghcrsync plan authentication v2\x00"+c.Registry+"\x00"+c.Username, sha256.Size)

	return k
}

// Every way of turning a public digest, or the credential alone, into a key — as the key,
// through the v1 derivation, through HKDF with the v2 salt and context, or the v2 key itself —
// seals a plan that apply's key refuses. The negative control: under the v1 scheme, the revision
// printed in every plan gave the key.
func TestPlanKeyIsNotComputableFromPublicDigests(t *testing.T) {
	canonical := secretfile.DockerConfigJSON("ghcr.io", "fleet-new", "ghp_0123456789abcdef0123456789abcdef")
	cred := sopsCredential(t, "ghcr.io", "fleet-new", "ghp_0123456789abcdef0123456789abcdef")

	if !bytesEqual(cred.DockerConfigJSON(), canonical) {
		t.Fatal("the fixture's dockerconfigjson is not the canonical one")
	}

	// The control: the attack the v1 scheme allowed reproduces, so this test can see one.
	rev, _ := hex.DecodeString(cred.Revision())
	if !hmac.Equal(v1Key(canonical), v1Key(rev)) {
		t.Fatal("control: the v1 key was computable from the revision of a canonical dockerconfigjson; the fixture is not canonical")
	}

	real := planKey(t, cred)
	if hmac.Equal(real, v1Key(canonical)) || hmac.Equal(real, v2Key(cred)) {
		t.Fatal("the plan key is still the v1 or v2 key")
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

	values := publicValues(cred)
	values["the token alone"] = []byte(cred.Password())

	for value, material := range values {
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

	// What the token's minter could make before: the v2 key, from the credential alone.
	forged := filepath.Join(dir, "forged-v2.plan")
	if err := plan.Save(forged, p, v2Key(cred)); err != nil {
		t.Fatal(err)
	}

	if got, err := plan.Load(forged); err != nil || got.Authentic(real) {
		t.Fatalf("a plan sealed with the credential alone (v2's key) is authentic: %v", err)
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

// The key depends on the SOPS file's data key (the same credential encrypted again, under
// another data key, gives another key), on the secret, and on the registry and user it is bound
// to; it is the same for every read of one file. A credential not read from a SOPS file has none.
func TestPlanKeyBinding(t *testing.T) {
	base := sopsCredential(t, "ghcr.io", "u", "ghp_secret_one")
	for name, other := range map[string]*credential.Credential{
		"the same credential re-encrypted": sopsCredential(t, "ghcr.io", "u", "ghp_secret_one"),
		"another password":                 sopsCredential(t, "ghcr.io", "u", "ghp_secret_two"),
		"another user":                     sopsCredential(t, "ghcr.io", "v", "ghp_secret_one"),
		"another registry":                 sopsCredential(t, "registry.example.com", "u", "ghp_secret_one"),
	} {
		if hmac.Equal(planKey(t, base), planKey(t, other)) {
			t.Errorf("%s gives the same plan key", name)
		}
	}

	if !hmac.Equal(planKey(t, base), planKey(t, base)) {
		t.Error("the plan key is not deterministic")
	}

	parsed, err := credential.Parse(secretfile.DockerConfigJSON("ghcr.io", "u", "ghp_secret_one"), "ghcr.io")
	if err != nil {
		t.Fatal(err)
	}

	if _, err := parsed.PlanKey(); err == nil {
		t.Error("a credential with no SOPS data key gave a plan key")
	}
}

func bytesEqual(a, b []byte) bool { return string(a) == string(b) }

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
