package credential

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"filippo.io/age"
	"github.com/getsops/sops/v3"
	sopsage "github.com/getsops/sops/v3/age"
)

// The deploy side's key is the age identity that decrypted the SOPS file: the CI's secret
// (SOPS_AGE_KEY), which the person who encrypts a new token never holds — they encrypt to its
// public recipient, and choose the file's data key themselves. PlanKey takes the identity, so
// knowing the data key and the token seals no plan.

// ErrNoDeployKey is a SOPS file decrypted by a key ghcrsync cannot read as one of its age
// recipients' identities (an SSH key, SOPS_AGE_KEY_CMD, a cloud KMS): no plan can be sealed.
var ErrNoDeployKey = errors.New("no age identity of the SOPS file's recipients is set in SOPS_AGE_KEY, SOPS_AGE_KEY_FILE or sops' " +
	sopsage.SopsAgeKeyUserConfigPath + ": plans are sealed with the deploy side's age identity (docs/security.md)")

// deployIdentity is the secret of the age identity, among those sops reads from the environment,
// whose recipient the file lists (the first such, in the order sops reads them).
func deployIdentity(meta sops.Metadata) ([]byte, error) {
	var recipients []string

	for _, group := range meta.KeyGroups {
		for _, k := range group {
			if mk, ok := k.(*sopsage.MasterKey); ok {
				recipients = append(recipients, mk.Recipient)
			}
		}
	}

	for _, text := range identitySources() {
		for _, id := range parseIdentities(text) {
			if slices.Contains(recipients, id.Recipient().String()) {
				return []byte(id.String()), nil
			}
		}
	}

	return nil, ErrNoDeployKey
}

// identitySources are the texts sops reads age identities from: SOPS_AGE_KEY, the file
// SOPS_AGE_KEY_FILE names, and the user's sops/age/keys.txt.
func identitySources() []string {
	var out []string

	if v, ok := os.LookupEnv(sopsage.SopsAgeKeyEnv); ok {
		out = append(out, v)
	}

	if path, ok := os.LookupEnv(sopsage.SopsAgeKeyFileEnv); ok && path != "" {
		if b, err := os.ReadFile(path); err == nil {
			out = append(out, string(b))
		}
	}

	if dir, err := os.UserConfigDir(); err == nil {
		if b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(sopsage.SopsAgeKeyUserConfigPath))); err == nil {
			out = append(out, string(b))
		}
	}

	return out
}

// parseIdentities reads the X25519 identities of text: one or more a line (SOPS_AGE_KEY may hold
// several, space-separated), comments and anything else skipped.
func parseIdentities(text string) []*age.X25519Identity {
	var out []*age.X25519Identity

	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		for _, field := range strings.Fields(sc.Text()) {
			if id, err := age.ParseX25519Identity(field); err == nil {
				out = append(out, id)
			}
		}
	}

	return out
}
