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
	"github.com/siderolabs/talos/pkg/machinery/constants"

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
    crt: {{ .TalosCA }}
    key: {{ printf "%q" .TalosCAKey }}
  certSANs: []
  kubelet:
    image: ghcr.io/siderolabs/kubelet:v{{ .Kubernetes }}
{{- if .RootDir }}
    extraArgs:
      root-dir: {{ .RootDir }}
{{- end }}
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
    crt: {{ .KubeCA }}
    key: {{ printf "%q" .KubeCAKey }}
---
apiVersion: v1alpha1
kind: RegistryAuthConfig
name: {{ .Registry }}
username: {{ printf "%q" .Username }}
password: {{ printf "%q" .Password }}
`))

// machineCAs are the certificate authorities a machine config names: Talos's (machine.ca) and
// Kubernetes' (cluster.ca). A control plane's config carries their keys; a worker's does not.
type machineCAs struct {
	talos, kube *authority
}

// renderMachineConfig builds a Talos multi-document machine config whose registry
// credential is a RegistryAuthConfig document, as Talos 1.13+ writes it. The config is valid for
// Talos (validated as machined validates it).
// rootDir, when set, is the kubelet's --root-dir (machine.kubelet.extraArgs): a real node's
// kubelet keeps its root directory in the node's own folder.
func renderMachineConfig(machineType, hostname, tag, endpoint string, cas machineCAs, cred Credential, rootDir string) ([]byte, error) {
	var buf bytes.Buffer

	key := func(a *authority) string {
		if machineType != string(RoleControlPlane) {
			return ""
		}

		return base64.StdEncoding.EncodeToString(a.ca.KeyPEM)
	}

	err := machineConfigTemplate.Execute(&buf, map[string]string{
		"Type":       machineType,
		"Token":      "sandbox.machinetoken0",
		"TalosCA":    base64.StdEncoding.EncodeToString(cas.talos.certPEM()),
		"TalosCAKey": key(cas.talos),
		"KubeCA":     base64.StdEncoding.EncodeToString(cas.kube.certPEM()),
		"KubeCAKey":  key(cas.kube),
		"Hostname":   hostname,
		"Tag":        tag,
		"Endpoint":   endpoint,
		"Registry":   registry.RegistryHost,
		"Username":   cred.Username,
		"Password":   cred.Password,
		// The kubelet a Talos 1.13 node runs (Talos validates it against its supported range).
		"Kubernetes": constants.DefaultKubernetesVersion,
		"RootDir":    rootDir,
	})
	if err != nil {
		return nil, err
	}

	provider, err := configloader.NewFromBytes(buf.Bytes())
	if err != nil {
		return nil, fmt.Errorf("sandbox: generated machine config does not load: %w", err)
	}

	if _, err := provider.Validate(metalInstalled{}); err != nil {
		return nil, fmt.Errorf("sandbox: generated machine config is not valid for Talos: %w", err)
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
