package containerd

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
)

// A machine config's registry documents, as Talos reads them (configloader), become
// containerd's hosts.toml files and auth sections: mirrors in order, skipFallback honoured,
// the credential under its registry and each mirror endpoint's host, from the fields or the
// base64 auth, the legacy machine.registries section merged in.
func TestFromTalosRendersAsTalos(t *testing.T) {
	const v1alpha1 = "version: v1alpha1\nmachine:\n  type: worker\n  token: t\n  ca: {crt: \"\"}\ncluster:\n  controlPlane: {endpoint: https://1.2.3.4:6443}\n"

	for _, tc := range []struct {
		name        string
		docs        string
		hosts, auth []string // the hosts.toml files' contents and the auth lines, in part
		noAuth      []string
	}{
		{
			name: "auth_document_and_mirror_without_fallback",
			docs: "---\napiVersion: v1alpha1\nkind: RegistryMirrorConfig\nname: ghcr.io\nendpoints:\n  - url: http://127.0.0.1:5000\nskipFallback: true\n" +
				"---\napiVersion: v1alpha1\nkind: RegistryAuthConfig\nname: ghcr.io\nusername: fleet\npassword: pw\n",
			hosts: []string{`hosts/ghcr.io/hosts.toml:server = "http://127.0.0.1:5000"`, `[host."http://127.0.0.1:5000"]`},
			auth:  []string{`configs."127.0.0.1:5000".auth]`, `configs."ghcr.io".auth]`, `username = "fleet"`, `password = "pw"`},
		},
		{
			name: "mirror_with_fallback_and_base64_auth",
			docs: "---\napiVersion: v1alpha1\nkind: RegistryMirrorConfig\nname: ghcr.io\nendpoints:\n  - url: https://cache.local\n  - url: https://cache2.local\n" +
				"---\napiVersion: v1alpha1\nkind: RegistryAuthConfig\nname: ghcr.io\nauth: ZmxlZXQ6cHc=\n",
			hosts: []string{`hosts/ghcr.io/hosts.toml:server = "https://ghcr.io"`, `[host."https://cache.local"]`, `[host."https://cache2.local"]`},
			auth:  []string{`configs."cache.local".auth]`, `configs."cache2.local".auth]`, `username = "fleet"`},
		},
		{
			name:   "no_credential",
			docs:   "---\napiVersion: v1alpha1\nkind: RegistryMirrorConfig\nname: ghcr.io\nendpoints:\n  - url: http://127.0.0.1:5000\n",
			noAuth: []string{"auth]"},
		},
		{
			name:  "legacy_section",
			docs:  "",
			hosts: nil,
			auth:  []string{`configs."legacy.example".auth]`, `username = "old"`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := v1alpha1
			if tc.name == "legacy_section" {
				base = strings.Replace(base, "  token: t\n", "  token: t\n  registries:\n    config:\n      legacy.example:\n        auth: {username: old, password: pw}\n", 1)
			}

			provider, err := configloader.NewFromBytes([]byte(base + tc.docs))
			if err != nil {
				t.Fatal(err)
			}

			n := &Node{spec: Spec{Dir: t.TempDir()}}
			files := n.files(FromTalos(provider))

			var all strings.Builder
			for _, rel := range slices.Sorted(maps.Keys(files)) {
				all.WriteString(rel + ":" + files[rel] + "\n")
			}

			for _, want := range append(tc.hosts, tc.auth...) {
				if !strings.Contains(all.String(), want) {
					t.Errorf("missing %q in\n%s", want, all.String())
				}
			}

			for _, not := range tc.noAuth {
				if strings.Contains(files["config.toml"], not) {
					t.Errorf("unexpected %q in\n%s", not, files["config.toml"])
				}
			}

			// Written, the files are the config a reload compares.
			if err := n.write(files); err != nil {
				t.Fatal(err)
			}

			if b, err := os.ReadFile(filepath.Join(n.spec.Dir, "config.toml")); err != nil || string(b) != files["config.toml"] {
				t.Fatalf("config.toml not written: %v", err)
			}
		})
	}
}
