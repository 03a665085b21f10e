package containerd

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"strings"

	talosconfig "github.com/siderolabs/talos/pkg/machinery/config/config"
)

// Registries is what a machine's Talos config gives containerd about registries: the mirrors
// of each registry (one hosts.toml each) and the credentials, keyed by the host containerd
// contacts.
type Registries struct {
	Mirrors map[string][]string // registry name → endpoint URLs, in order
	// NoFallback names the registries whose mirror's skipFallback is set: containerd never
	// contacts the registry itself.
	NoFallback map[string]bool
	Auths      map[string]Auth // host → credential
}

// FromTalos renders a machine config's registry documents (RegistryMirrorConfig,
// RegistryAuthConfig, or the legacy machine.registries section, which Talos merges into the
// same views) as Talos's GenerateCRIConfig and GenerateHosts do: a mirror list per registry,
// and each RegistryAuthConfig's credential (username and password, else its base64 auth)
// under its registry's name. The sandbox adds one key Talos does not: the same credential
// under each mirror endpoint's host, because containerd looks a credential up by the host it
// contacts and the sandbox's mirror of ghcr.io is the sandbox registry on loopback, where a
// real node reaches ghcr.io itself (see the package doc).
func FromTalos(cfg talosconfig.Config) Registries {
	r := Registries{Mirrors: map[string][]string{}, NoFallback: map[string]bool{}, Auths: map[string]Auth{}}

	for name, m := range cfg.RegistryMirrorConfigs() {
		for _, e := range m.Endpoints() {
			r.Mirrors[name] = append(r.Mirrors[name], e.Endpoint())
		}

		if m.SkipFallback() {
			r.NoFallback[name] = true
		}
	}

	for name, a := range cfg.RegistryAuthConfigs() {
		auth, ok := authOf(a)
		if !ok {
			continue
		}

		for _, host := range r.hostsOf(name) {
			r.Auths[host] = auth
		}
	}

	return r
}

// authOf is a RegistryAuthConfig's username and password: the fields, or its base64 auth.
func authOf(a talosconfig.RegistryAuthConfig) (Auth, bool) {
	if a == nil {
		return Auth{}, false
	}

	if a.Username() != "" || a.Password() != "" {
		return Auth{Username: a.Username(), Password: a.Password()}, true
	}

	raw, err := base64.StdEncoding.DecodeString(a.Auth())
	if err != nil {
		return Auth{}, false
	}

	user, pass, ok := strings.Cut(string(raw), ":")

	return Auth{Username: user, Password: pass}, ok
}

// Mirrored is registries served by the endpoint (an http:// or https:// URL) only, as a
// machine config's RegistryMirrorConfig with skipFallback: for a test without a Talos config.
func Mirrored(endpoint string, registries ...string) Registries {
	r := Registries{Mirrors: map[string][]string{}, NoFallback: map[string]bool{}, Auths: map[string]Auth{}}
	for _, name := range registries {
		r.Mirrors[name] = []string{endpoint}
		r.NoFallback[name] = true
	}

	return r
}

// WithAuth is r with auth for registry (and for its mirrors' hosts, as FromTalos keys it);
// nil auth removes it.
func (r Registries) WithAuth(registry string, auth *Auth) Registries {
	out := Registries{Mirrors: r.Mirrors, NoFallback: r.NoFallback, Auths: map[string]Auth{}}

	for host, a := range r.Auths {
		out.Auths[host] = a
	}

	for _, h := range r.hostsOf(registry) {
		if auth == nil {
			delete(out.Auths, h)
		} else {
			out.Auths[h] = *auth
		}
	}

	return out
}

// hostsOf are the hosts containerd may contact for registry, whose credential they carry: the
// registry itself and each of its mirror endpoints' hosts.
func (r Registries) hostsOf(registry string) []string {
	hosts := []string{registry}

	for _, endpoint := range r.Mirrors[registry] {
		if u, err := url.Parse(endpoint); err == nil && u.Host != "" {
			hosts = append(hosts, u.Host)
		}
	}

	return hosts
}

// hostsToml is one registry's hosts.toml: its mirrors in order, each able to pull and resolve,
// then the registry itself unless noFallback.
func hostsToml(registry string, endpoints []string, noFallback bool) string {
	var b strings.Builder

	server := "https://" + registry
	if noFallback {
		server = endpoints[0]
	}

	fmt.Fprintf(&b, "server = %q\n", server)

	for _, e := range endpoints {
		fmt.Fprintf(&b, "\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", e)
	}

	return b.String()
}
