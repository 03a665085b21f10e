package keyring

import (
	"slices"

	"github.com/siderolabs/talos/pkg/machinery/config"
)

// RootDir is where a Talos node's kubelet keeps its root directory, and so its keyring: its
// machine.kubelet.extraArgs root-dir when set (Talos passes it on: only a few flags are denied,
// kubelet_spec.go's merge policies), else the kubelet's default, which Talos mounts read-write
// into the kubelet's container (services/kubelet.go: /var/lib/kubelet, rbind, rw).
func RootDir(c config.Config) string {
	if m := c.Machine(); m != nil {
		if v := m.Kubelet().ExtraArgs()["root-dir"]; len(v) > 0 && v[len(v)-1] != "" {
			return v[len(v)-1]
		}
	}

	return DefaultRootDir
}

// Mirrors are the endpoints a node's containerd pulls the registry's images from instead of (or
// before) the registry itself: machine.registries.mirrors or a RegistryMirrorConfig for its host.
// The kubelet's keyring credential comes with each pull without a server address, so containerd
// hands it to every one of them (ParseAuth in its CRI plugin checks a request's server address
// only when it has one): a mirror would receive the GHCR credential, and a pull through it
// proves nothing of the credential.
func Mirrors(c config.Config, registry string) []string {
	m, ok := c.RegistryMirrorConfigs()[registry]
	if !ok || m == nil {
		return nil
	}

	var out []string

	for _, e := range m.Endpoints() {
		out = append(out, e.Endpoint())
	}

	return slices.Compact(out)
}
