package credential

import (
	"errors"
	"fmt"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/ghcrsync/ghcrsync/internal/readlimit"
)

// CheckStructure checks a SOPS file without decrypting it: it is a SOPS document (its sops
// metadata with at least one key group and a MAC), and the value at keyPath is there and
// encrypted. It is what `ghcrsync validate` can say about the credential where no key is at hand.
func CheckStructure(path string, keyPath []string) error {
	data, err := readlimit.File(path, readlimit.SOPSFile)
	if err != nil {
		return fmt.Errorf("read SOPS file %s: %w", path, err)
	}

	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("SOPS file %s is not YAML or JSON: %w", path, err)
	}

	meta, ok := doc["sops"].(map[string]any)
	if !ok {
		return fmt.Errorf("SOPS file %s has no sops metadata: it is not encrypted with SOPS (encrypt it: sops --encrypt --in-place %s)", path, path)
	}

	keys := 0

	for _, group := range []string{"age", "pgp", "kms", "gcp_kms", "azure_kv", "hc_vault", "key_groups"} {
		if list, ok := meta[group].([]any); ok {
			keys += len(list)
		}
	}

	switch {
	case keys == 0:
		return fmt.Errorf("SOPS file %s names no key to decrypt it with (sops metadata without age, pgp or kms recipients)", path)
	case meta["mac"] == nil:
		return fmt.Errorf("SOPS file %s has no MAC in its sops metadata: it is damaged", path)
	}

	cur := any(doc)

	for i, k := range keyPath {
		m, ok := cur.(map[string]any)
		if !ok {
			return fmt.Errorf("SOPS file %s: key path %s: %s is not a map; set credential.key in the configuration", path, strings.Join(keyPath, "."), strings.Join(keyPath[:i], "."))
		}

		if cur, ok = m[k]; !ok {
			return fmt.Errorf("SOPS file %s: key path %s not found (no %q); set credential.key in the configuration", path, strings.Join(keyPath, "."), k)
		}
	}

	s, ok := cur.(string)
	if !ok || !strings.HasPrefix(s, "ENC[") {
		return errors.New("SOPS file " + path + ": the value at " + strings.Join(keyPath, ".") + " is not encrypted (a plaintext credential in Git): encrypt the file with sops")
	}

	return nil
}
