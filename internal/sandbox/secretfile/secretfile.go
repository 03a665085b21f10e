// Package secretfile makes SOPS fixtures: an age identity and a SOPS-encrypted Kubernetes
// Secret manifest holding a dockerconfigjson, encrypted in-process with the sops library.
package secretfile

import (
	"encoding/base64"
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

// KeyPath is where the dockerconfigjson sits in the file, as Flux repos keep it.
var KeyPath = []string{"stringData", "ghcr_dockerconfigjson"}

// DockerConfigJSON renders a username/password as a .dockerconfigjson for host.
func DockerConfigJSON(host, username, password string) []byte {
	b, _ := json.Marshal(map[string]any{"auths": map[string]any{host: map[string]string{
		"username": username,
		"password": password,
		"auth":     base64.StdEncoding.EncodeToString([]byte(username + ":" + password)),
	}}})

	return b
}

// NewAgeKey generates an age identity file's content and its recipient.
func NewAgeKey() (identityFile []byte, recipient string, err error) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		return nil, "", err
	}

	file := fmt.Sprintf("# created by ghcrsync-sandbox\n# public key: %s\n%s\n", id.Recipient(), id)

	return []byte(file), id.Recipient().String(), nil
}

// Encrypt produces a SOPS-encrypted Kubernetes Secret manifest holding dockerconfigjson under
// stringData.ghcr_dockerconfigjson, encrypted for the age recipient (only data/stringData are
// encrypted, as in Flux repos).
func Encrypt(dockerconfigjson []byte, recipient string, more ...string) ([]byte, error) {
	plain := fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata:
  name: ghcr-auth
  namespace: flux-system
type: kubernetes.io/dockerconfigjson
stringData:
  ghcr_dockerconfigjson: %s
`, mustJSONString(string(dockerconfigjson)))

	return EncryptYAML([]byte(plain), recipient, more...)
}

// EncryptYAML encrypts an arbitrary YAML document's data/stringData for the age recipient (and
// more recipients: any one of their identities decrypts it).
func EncryptYAML(plain []byte, recipient string, more ...string) ([]byte, error) {
	store := sopsyaml.NewStore(&sopsconfig.YAMLStoreConfig{})

	branches, err := store.LoadPlainFile(plain)
	if err != nil {
		return nil, fmt.Errorf("secretfile: load secret plaintext: %w", err)
	}

	var keyGroup []keys.MasterKey

	for _, r := range append([]string{recipient}, more...) {
		key, err := sopsage.MasterKeyFromRecipient(r)
		if err != nil {
			return nil, err
		}

		keyGroup = append(keyGroup, key)
	}

	tree := sops.Tree{
		Branches: branches,
		Metadata: sops.Metadata{
			KeyGroups:      []sops.KeyGroup{keyGroup},
			EncryptedRegex: "^(data|stringData)$",
			Version:        version.Version,
		},
	}

	dataKey, errs := tree.GenerateDataKey()
	if len(errs) > 0 {
		return nil, fmt.Errorf("secretfile: sops data key: %v", errs)
	}

	if err := common.EncryptTree(common.EncryptTreeOpts{DataKey: dataKey, Tree: &tree, Cipher: aes.NewCipher()}); err != nil {
		return nil, fmt.Errorf("secretfile: sops encrypt: %w", err)
	}

	return store.EmitEncryptedFile(tree)
}

func mustJSONString(s string) string {
	b, _ := json.Marshal(s)

	return string(b)
}
