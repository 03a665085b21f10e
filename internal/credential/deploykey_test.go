package credential

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/sandbox/secretfile"
)

// The plan key comes from what only the deploy side holds, its age identity: whoever encrypts
// a new token knows the token and the data key they chose, and adds, if they like, a recipient
// of their own — and still derives another key than the deploy side's. The controls: the deploy
// side derives the same key every time, and the data key and token alone (the v3 scheme) gave it.
func TestPlanKeyNeedsTheDeployIdentity(t *testing.T) {
	deploy, deployRecipient, err := secretfile.NewAgeKey()
	if err != nil {
		t.Fatal(err)
	}

	minter, minterRecipient, err := secretfile.NewAgeKey()
	if err != nil {
		t.Fatal(err)
	}

	// The minter encrypts the token for the deploy side's recipient and for their own.
	enc, err := secretfile.Encrypt(secretfile.DockerConfigJSON("ghcr.io", "fleet", "ghp_minted"), deployRecipient, minterRecipient)
	if err != nil {
		t.Fatal(err)
	}

	path := filepath.Join(t.TempDir(), "secret.enc.yaml")
	if err := os.WriteFile(path, enc, 0o600); err != nil {
		t.Fatal(err)
	}

	load := func(identity []byte) *Credential {
		t.Helper()
		t.Setenv("SOPS_AGE_KEY_FILE", "")
		t.Setenv("SOPS_AGE_KEY", string(identity))
		t.Setenv("XDG_CONFIG_HOME", t.TempDir())

		c, err := Load(path, secretfile.KeyPath, "ghcr.io")
		if err != nil {
			t.Fatal(err)
		}

		return c
	}

	key := func(c *Credential) []byte {
		t.Helper()

		k, err := c.PlanKey()
		if err != nil {
			t.Fatal(err)
		}

		return k
	}

	asDeploy, asMinter := load(deploy), load(minter)
	real := key(asDeploy)

	if !hmac.Equal(real, key(load(deploy))) {
		t.Fatal("control: the deploy side's key is not the same at each read")
	}

	if !hmac.Equal(asDeploy.dataKey, asMinter.dataKey) || asMinter.Password() != asDeploy.Password() {
		t.Fatal("control: the minter does not hold the data key and the token; the test proves nothing")
	}

	if hmac.Equal(real, key(asMinter)) {
		t.Fatal("the minter's own recipient gives the deploy side's plan key")
	}

	// The v3 key: the data key and the token, which the minter holds.
	v3ikm := append(append(append([]byte{}, asMinter.dataKey...), 0), asMinter.Password()...)
	v3, _ := hkdf.Key(sha256.New, v3ikm, []byte(planKeySalt), "ghcrsync plan authentication v3\x00ghcr.io\x00fleet", sha256.Size)

	for name, k := range map[string][]byte{
		"v3 (data key and token)":               v3,
		"v4 info without the identity":          hkdfOf(t, v3ikm),
		"the data key and token with no prefix": hkdfOf(t, append([]byte{0}, v3ikm...)),
	} {
		if hmac.Equal(real, k) {
			t.Errorf("the plan key is computable from %s", name)
		}
	}

	// A key the file does not list (SOPS_AGE_KEY holding another identity as well) is not used.
	other, _, _ := secretfile.NewAgeKey()
	if both := load(append(append([]byte{}, other...), deploy...)); !hmac.Equal(real, key(both)) {
		t.Fatal("an identity the file does not list changed the plan key")
	}
}

// A file decrypted with no identity ghcrsync can read as one of its recipients' seals no plan,
// and says so; the credential is read all the same.
func TestNoDeployIdentityNoPlanKey(t *testing.T) {
	c := &Credential{dataKey: []byte("k"), password: "p", deployErr: ErrNoDeployKey}

	if _, err := c.PlanKey(); !errors.Is(err, ErrNoDeployKey) {
		t.Fatalf("PlanKey without the deploy identity: %v", err)
	}
}

func hkdfOf(t *testing.T, ikm []byte) []byte {
	t.Helper()

	k, err := hkdf.Key(sha256.New, ikm, []byte(planKeySalt), planKeyInfo+"\x00ghcr.io\x00fleet", sha256.Size)
	if err != nil {
		t.Fatal(err)
	}

	return k
}
