package sandbox

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"filippo.io/age"
	"github.com/getsops/sops/v3"
	"github.com/getsops/sops/v3/aes"
	sopsage "github.com/getsops/sops/v3/age"
	"github.com/getsops/sops/v3/cmd/sops/common"
	sopsconfig "github.com/getsops/sops/v3/config"
	"github.com/getsops/sops/v3/keys"
	sopsyaml "github.com/getsops/sops/v3/stores/yaml"
	"github.com/getsops/sops/v3/version"
)

// SecretKeyPath is where the dockerconfigjson sits in the SOPS file, as Flux repos keep it.
var SecretKeyPath = []string{"stringData", "ghcr_dockerconfigjson"}

// newCredential makes a random credential for the named user.
func newCredential(user string) Credential {
	b := make([]byte, 18)
	_, _ = rand.Read(b)

	return Credential{Username: user, Password: "ghp_" + hex.EncodeToString(b)}
}

// DockerConfigJSON renders the credential as a .dockerconfigjson for RegistryHost.
func DockerConfigJSON(c Credential) []byte {
	b, _ := json.Marshal(map[string]any{"auths": map[string]any{RegistryHost: map[string]string{
		"username": c.Username,
		"password": c.Password,
		"auth":     base64.StdEncoding.EncodeToString([]byte(c.Username + ":" + c.Password)),
	}}})

	return b
}

// newAgeKey generates an age identity file's content and its recipient.
func newAgeKey() (identityFile []byte, recipient string, err error) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		return nil, "", err
	}

	file := fmt.Sprintf("# created by ghcrsync-sandbox\n# public key: %s\n%s\n", id.Recipient(), id)

	return []byte(file), id.Recipient().String(), nil
}

// encryptSecretFile produces a SOPS-encrypted Kubernetes Secret manifest holding the
// dockerconfigjson under stringData.ghcr_dockerconfigjson, encrypted in-process with the sops
// library for the age recipient (only data/stringData are encrypted, as in Flux repos).
func encryptSecretFile(dockerconfigjson []byte, recipient string) ([]byte, error) {
	plain := fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata:
  name: ghcr-auth
  namespace: flux-system
type: kubernetes.io/dockerconfigjson
stringData:
  ghcr_dockerconfigjson: %s
`, mustJSONString(string(dockerconfigjson)))

	store := sopsyaml.NewStore(&sopsconfig.YAMLStoreConfig{})

	branches, err := store.LoadPlainFile([]byte(plain))
	if err != nil {
		return nil, fmt.Errorf("sandbox: load secret plaintext: %w", err)
	}

	key, err := sopsage.MasterKeyFromRecipient(recipient)
	if err != nil {
		return nil, err
	}

	tree := sops.Tree{
		Branches: branches,
		Metadata: sops.Metadata{
			KeyGroups:      []sops.KeyGroup{[]keys.MasterKey{key}},
			EncryptedRegex: "^(data|stringData)$",
			Version:        version.Version,
		},
	}

	dataKey, errs := tree.GenerateDataKey()
	if len(errs) > 0 {
		return nil, fmt.Errorf("sandbox: sops data key: %v", errs)
	}

	if err := common.EncryptTree(common.EncryptTreeOpts{DataKey: dataKey, Tree: &tree, Cipher: aes.NewCipher()}); err != nil {
		return nil, fmt.Errorf("sandbox: sops encrypt: %w", err)
	}

	return store.EmitEncryptedFile(tree)
}

func mustJSONString(s string) string {
	b, _ := json.Marshal(s)

	return string(b)
}
