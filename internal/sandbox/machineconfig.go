package sandbox

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
	"text/template"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"

	"github.com/ghcrsync/ghcrsync/internal/sandbox/registry"
	"github.com/ghcrsync/ghcrsync/internal/sandbox/secretfile"
)

// RegistryHost is the host name credentials are keyed by (see registry.RegistryHost).
const RegistryHost = registry.RegistryHost

// Credential is a registry username/password pair.
type Credential struct {
	Username string
	Password string
	source   string // where a kubelet found it: "node" or "secret NS/NAME"
}

// IsZero reports whether no credential is set.
func (c Credential) IsZero() bool { return c.Username == "" && c.Password == "" }

var machineConfigTemplate = template.Must(template.New("mc").Parse(`version: v1alpha1
debug: false
persist: true
machine:
  type: {{ .Type }}
  token: {{ .Token }}
  ca:
    crt: {{ .CA }}
    key: ""
  certSANs: []
  kubelet:
    image: ghcr.io/siderolabs/kubelet:v1.37.2
  network:
    hostname: {{ .Hostname }}
  install:
    disk: /dev/sda
    image: ghcr.io/siderolabs/installer:{{ .Tag }}
cluster:
  controlPlane:
    endpoint: {{ .Endpoint }}
  clusterName: prod
  network:
    dnsDomain: cluster.local
    podSubnets:
      - 10.244.0.0/16
    serviceSubnets:
      - 10.96.0.0/16
  token: wlzjyw.bei2zfylhs2by0wd
  ca:
    crt: {{ .CA }}
    key: ""
---
apiVersion: v1alpha1
kind: RegistryAuthConfig
name: {{ .Registry }}
username: {{ printf "%q" .Username }}
password: {{ printf "%q" .Password }}
`))

// renderMachineConfig builds a Talos multi-document machine config whose registry
// credential is a RegistryAuthConfig document, as Talos 1.13+ writes it.
func renderMachineConfig(machineType, hostname, tag, endpoint string, caPEM []byte, cred Credential) ([]byte, error) {
	var buf bytes.Buffer

	err := machineConfigTemplate.Execute(&buf, map[string]string{
		"Type":     machineType,
		"Token":    "sandbox.machinetoken0",
		"CA":       base64.StdEncoding.EncodeToString(caPEM),
		"Hostname": hostname,
		"Tag":      tag,
		"Endpoint": endpoint,
		"Registry": registry.RegistryHost,
		"Username": cred.Username,
		"Password": cred.Password,
	})
	if err != nil {
		return nil, err
	}

	if _, err := configloader.NewFromBytes(buf.Bytes()); err != nil {
		return nil, fmt.Errorf("sandbox: generated machine config does not load: %w", err)
	}

	return buf.Bytes(), nil
}

// registryCredential is the credential a config gives the registry: Talos merges the
// RegistryAuthConfig documents with the legacy machine.registries.config section.
func registryCredential(cfg config.Config) Credential {
	auth, ok := cfg.RegistryAuthConfigs()[registry.RegistryHost]
	if !ok || auth == nil {
		return Credential{}
	}

	if auth.Username() != "" || auth.Password() != "" {
		return Credential{Username: auth.Username(), Password: auth.Password()}
	}

	if raw, err := base64.StdEncoding.DecodeString(auth.Auth()); err == nil {
		if user, pass, ok := strings.Cut(string(raw), ":"); ok {
			return Credential{Username: user, Password: pass}
		}
	}

	return Credential{}
}

// newCredential makes a random credential for the named user.
func newCredential(user string) Credential {
	b := make([]byte, 18)
	_, _ = rand.Read(b)

	return Credential{Username: user, Password: "ghp_" + hex.EncodeToString(b)}
}

// DockerConfigJSON renders the credential as a .dockerconfigjson for registry.RegistryHost.
func DockerConfigJSON(c Credential) []byte {
	return secretfile.DockerConfigJSON(registry.RegistryHost, c.Username, c.Password)
}
