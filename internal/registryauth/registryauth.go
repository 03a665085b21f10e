// Package registryauth is the one set of rules for the registry credential inside a Talos
// machine config: which credential a config gives a registry (in either form Talos merges:
// RegistryAuthConfig documents over the legacy machine.registries.config auth), the config with
// a new credential, and the config without it. Pure: no Talos API; the node client
// (internal/talos), the node templates (internal/nodetemplate) and the planner's inputs use it.
package registryauth

import (
	"github.com/siderolabs/talos/pkg/machinery/config"
	configconfig "github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/types/cri"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"

	"github.com/ghcrsync/ghcrsync/internal/authdigest"
	"github.com/ghcrsync/ghcrsync/internal/credential"
)

// lookup is the registry's merged auth in c (ok false when it gives none).
func lookup(c config.Config, registry string) (configconfig.RegistryAuthConfig, bool) {
	auth, ok := c.RegistryAuthConfigs()[registry]

	return auth, ok && auth != nil
}

// Digest is the digest (authdigest) of the credential c gives the registry; "" when none.
func Digest(c config.Config, registry string) string {
	auth, ok := lookup(c, registry)
	if !ok {
		return ""
	}

	return authdigest.FromFields(auth.Username(), auth.Password(), auth.Auth())
}

// Credential is the registry's username and password in c (nil if none, or unreadable). Kept
// in memory only: never in a plan or a state.
func Credential(c config.Config, registry string) *credential.Credential {
	auth, ok := lookup(c, registry)
	if !ok {
		return nil
	}

	cred, err := credential.FromFields(registry, auth.Username(), auth.Password(), auth.Auth())
	if err != nil {
		return nil
	}

	return cred
}

// With is the config with the registry's credential replaced by a RegistryAuthConfig document
// (Talos merges it over any legacy machine.registries.config auth), everything else kept.
func With(cfg config.Provider, registry, username, password string) ([]byte, error) {
	docs := OtherDocuments(cfg, registry)

	auth := cri.NewRegistryAuthConfigV1Alpha1(registry)
	auth.RegistryUsername, auth.RegistryPassword = username, password
	docs = append(docs, auth)

	return encode(docs)
}

// OtherDocuments are a config's documents but the registry's RegistryAuthConfig.
func OtherDocuments(cfg config.Provider, registry string) []configconfig.Document {
	docs := make([]configconfig.Document, 0, len(cfg.Documents())+1)

	for _, d := range cfg.Documents() {
		if ra, ok := d.(*cri.RegistryAuthConfigV1Alpha1); ok && ra.Name() == registry {
			continue
		}

		docs = append(docs, d)
	}

	return docs
}

// WithoutDocument encodes a config without the registry's RegistryAuthConfig document: two
// configs equal this way differ at most in the document ghcrsync writes (a staged config of a
// run that stopped before its reboot is not an operator's change).
func WithoutDocument(cfg config.Provider, registry string) ([]byte, error) {
	return encode(OtherDocuments(cfg, registry))
}

// WithoutCredential encodes a config without the registry's credential in either form (the
// document, and the legacy machine.registries.config auth): two configs equal this way differ at
// most in the credential, whichever form carries it.
func WithoutCredential(cfg config.Provider, registry string) ([]byte, error) {
	docs := OtherDocuments(cfg, registry)

	for i, d := range docs {
		if c, ok := d.(*v1alpha1.Config); ok && c.MachineConfig != nil && c.MachineConfig.MachineRegistries.RegistryConfig[registry] != nil {
			c = c.Clone().(*v1alpha1.Config) //nolint:forcetypeassert // Clone keeps the type
			c.MachineConfig.MachineRegistries.RegistryConfig[registry].RegistryAuth = nil
			docs[i] = c
		}
	}

	return encode(docs)
}

func encode(docs []configconfig.Document) ([]byte, error) {
	c, err := container.New(docs...)
	if err != nil {
		return nil, err
	}

	return c.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
}
