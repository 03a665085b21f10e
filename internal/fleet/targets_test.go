package fleet

import (
	"strings"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/config"
)

// Every credential's consumers become targets carrying its name (the cluster credential's ""),
// each marked with the configuration; a pull secret two credentials' selectors reach is refused.
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
		name     string
		selected map[string][]string
		want     map[string]string // namespace/secret -> credential
		err      string
	}{
		{"each_credential_its_own", map[string][]string{"platform=yes": {"web"}, "tenant=a": {"a1", "a2"}},
			map[string]string{"apps/ghcr-pull": "", "web/ghcr-pull": "", "a1/ghcr-pull": "tenant-a", "a2/ghcr-pull": "tenant-a", "b1/b-pull": "tenant-b",
				"flux-system/ghcr-auth": ""}, ""},
		{"a_namespace_two_selectors_match", map[string][]string{"platform=yes": {"a1"}, "tenant=a": {"a1"}}, nil,
			`pull secret a1/ghcr-pull is a consumer of credential "ghcr" and of credential "tenant-a"`},
		// The control: the same namespace under two secret names is two pull secrets.
		{"one_namespace_two_secret_names", map[string][]string{"tenant=a": {"b1"}},
			map[string]string{"apps/ghcr-pull": "", "b1/ghcr-pull": "tenant-a", "b1/b-pull": "tenant-b", "flux-system/ghcr-auth": ""}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			targets, err := PullSecrets(cfg, tc.selected)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}

				return
			}

			if err != nil {
				t.Fatal(err)
			}

			got := map[string]string{}
			for _, x := range targets {
				got[x.Namespace+"/"+x.Name] = x.Credential

				if x.Configuration != "flux-system/ghcr-auth-refresh" {
					t.Errorf("%s/%s marked with configuration %q", x.Namespace, x.Name, x.Configuration)
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
