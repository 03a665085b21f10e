package config

import (
	"strings"
	"testing"
)

// tenantBlock is a tenant credential: its consumers are inside it.
func tenantBlock(name, inside string) string {
	return `
credential "` + name + `" {
  registry  = "ghcr.io"
  sops_file = "secret.enc.yaml"
  prove     = ["` + name + `/app:v1"]
  deny      = ["other/app:v1"]
` + inside + `
}
`
}

const tenantSelector = `  consumers {
    selector = "ghcrsync.dev/tenant=TENANT"
    secret   = "ghcr-pull"
  }`

// Several credential blocks: the one naming no consumers is the cluster's; the others are
// tenants, each with its own consumers, proofs and isolation.
func TestSeveralCredentials(t *testing.T) {
	hcl := valid + tenantBlock("tenant-a", strings.ReplaceAll(tenantSelector, "TENANT", "a")) +
		tenantBlock("tenant-b", `  consumer "b" {
    namespace = "b-apps"
    secret    = "b-pull"
  }`)

	cfg, err := Load(writeDir(t, hcl))
	if err != nil {
		t.Fatal(err)
	}

	if cfg.Credential.Name != "ghcr" || len(cfg.Tenants) != 2 {
		t.Fatalf("cluster credential %q and %d tenants, want ghcr and 2", cfg.Credential.Name, len(cfg.Tenants))
	}

	a, b := cfg.Tenant("tenant-a"), cfg.Tenant("tenant-b")
	if a == nil || b == nil || a.ConsumerSelector == nil || a.ConsumerSelector.Selector != "ghcrsync.dev/tenant=a" ||
		len(b.Consumers) != 1 || b.Consumers[0].Namespace != "b-apps" || b.Credential.Deny[0] != "other/app:v1" {
		t.Fatalf("tenants decoded as %+v", cfg.Tenants)
	}

	sets := cfg.PullSecretSets()
	if len(sets) != 3 || sets[0].Credential != "" || len(sets[0].Consumers) != 2 || sets[1].Credential != "tenant-a" || sets[2].Credential != "tenant-b" {
		t.Fatalf("pull secret sets %+v: want the cluster's first, then each tenant's", sets)
	}

	if got := cfg.Selectors(); len(got) != 2 || got[1] != "ghcrsync.dev/tenant=a" {
		t.Fatalf("selectors %v", got)
	}

	// The negative control: one credential, as every configuration before, has no tenants.
	one, err := Load(writeDir(t, valid))
	if err != nil || len(one.Tenants) != 0 || len(one.PullSecretSets()) != 1 {
		t.Fatalf("one credential: %v, tenants %v", err, one.Tenants)
	}
}

func TestSeveralCredentialsErrors(t *testing.T) {
	tenantA := tenantBlock("tenant-a", strings.ReplaceAll(tenantSelector, "TENANT", "a"))

	for _, tc := range []struct {
		name, hcl string
		want      []string
	}{
		{"two_cluster_credentials", valid + tenantBlock("ghcr-2", ""),
			[]string{"Which credential is the cluster's?", "2 name none (ghcr, ghcr-2)"}},
		{"no_cluster_credential", strings.Replace(valid, `  prove     = ["org/private:v1"]`, `  prove     = ["org/private:v1"]`+"\n"+
			strings.ReplaceAll(tenantSelector, "TENANT", "x"), 1) + tenantA,
			[]string{"Which credential is the cluster's?", "0 name none"}},
		{"consumers_in_the_only_block", strings.Replace(valid, `  prove     = ["org/private:v1"]`, `  prove     = ["org/private:v1"]`+"\n"+
			strings.ReplaceAll(tenantSelector, "TENANT", "x"), 1),
			[]string{"ghcrsync.hcl:", "Consumers inside the only credential block", "write them at the top level"}},
		{"same_name_twice", valid + tenantA + tenantA, []string{"Duplicate credential block", `"tenant-a"`}},
		{"bad_name", valid + tenantBlock("Tenant_A", strings.ReplaceAll(tenantSelector, "TENANT", "a")), []string{"Invalid credential name", "Tenant_A"}},
		{"a_pull_secret_of_two_credentials", valid + tenantBlock("tenant-a", `  consumer "web" {
    namespace = "web"
    secret    = "ghcr-pull"
  }`), []string{"Pull secret of two credentials", "web/ghcr-pull", `"ghcr"`, `"tenant-a"`}},
		{"tenant_bad_selector", valid + tenantBlock("tenant-a", strings.ReplaceAll(tenantSelector, "ghcrsync.dev/tenant=TENANT", "a b")),
			[]string{"Invalid selector", `credential "tenant-a": consumers.selector`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(writeDir(t, tc.hcl))
			if err == nil {
				t.Fatal("accepted")
			}

			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}
