package fleet

import (
	"slices"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/config"
)

// Every credential's consumers become targets carrying its name (the cluster credential's ""),
// each marked with the configuration; a pull secret two credentials' selectors reach is one target, contested by both.
func TestTargetsOfSeveralCredentials(t *testing.T) {
	cfg := &config.Config{
		Credential:       config.Credential{Name: "ghcr"},
		Consumers:        []config.Consumer{{Namespace: "apps", Secret: "ghcr-pull"}},
		ConsumerSelector: &config.ConsumerSelector{Selector: "platform=yes", Secret: "ghcr-pull"},
		Tenants: []config.Tenant{
			{Credential: config.Credential{Name: "tenant-a"}, ConsumerSelector: &config.ConsumerSelector{Selector: "tenant=a", Secret: "ghcr-pull"}},
			{Credential: config.Credential{Name: "tenant-b"}, Consumers: []config.Consumer{{Namespace: "b1", Secret: "b-pull"}}},
		},
		FluxRoot: &config.FluxRoot{Namespace: "flux-system", Secret: "ghcr-auth"},
		Lease:    config.Lease{Namespace: "flux-system", Name: "ghcr-auth-refresh"},
	}

	for _, tc := range []struct {
		name      string
		selected  map[string][]string
		want      map[string]string   // namespace/secret -> credential
		contested map[string][]string // namespace/secret -> the credentials naming it
	}{
		{"each_credential_its_own", map[string][]string{"platform=yes": {"web"}, "tenant=a": {"a1", "a2"}},
			map[string]string{"apps/ghcr-pull": "", "web/ghcr-pull": "", "a1/ghcr-pull": "tenant-a", "a2/ghcr-pull": "tenant-a", "b1/b-pull": "tenant-b",
				"flux-system/ghcr-auth": ""}, nil},
		// Contested: one target, neither read nor written, naming both; the rest as before.
		{"a_namespace_two_selectors_match", map[string][]string{"platform=yes": {"a1", "web"}, "tenant=a": {"a1", "a2"}},
			map[string]string{"apps/ghcr-pull": "", "web/ghcr-pull": "", "a1/ghcr-pull": "", "a2/ghcr-pull": "tenant-a", "b1/b-pull": "tenant-b",
				"flux-system/ghcr-auth": ""}, map[string][]string{"a1/ghcr-pull": {"", "tenant-a"}}},
		// The control: the same namespace under two secret names is two pull secrets.
		{"one_namespace_two_secret_names", map[string][]string{"tenant=a": {"b1"}},
			map[string]string{"apps/ghcr-pull": "", "b1/ghcr-pull": "tenant-a", "b1/b-pull": "tenant-b", "flux-system/ghcr-auth": ""}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			targets := PullSecrets(cfg, tc.selected)

			got := map[string]string{}
			for _, x := range targets {
				key := x.Namespace + "/" + x.Name
				got[key] = x.Credential

				if x.Configuration != "flux-system/ghcr-auth-refresh" {
					t.Errorf("%s marked with configuration %q", key, x.Configuration)
				}

				if !slices.Equal(x.Marks, []string{"ghcr", "tenant-a", "tenant-b"}) {
					t.Errorf("%s: marks %q", key, x.Marks)
				}

				if !slices.Equal(x.Contested, tc.contested[key]) {
					t.Errorf("%s: contested by %q, want %q", key, x.Contested, tc.contested[key])
				}
			}

			if len(got) != len(tc.want) {
				t.Fatalf("targets %v, want %v", got, tc.want)
			}

			for k, v := range tc.want {
				if c, ok := got[k]; !ok || c != v {
					t.Errorf("%s: credential %q (present %v), want %q", k, c, ok, v)
				}
			}

			if last := targets[len(targets)-1]; last.Name != "ghcr-auth" {
				t.Errorf("the root is not last: %+v", last)
			}
		})
	}
}
