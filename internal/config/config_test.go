package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const valid = `
cluster {
  kubeconfig = "kubeconfig"
}
talos {
  talosconfig = "talosconfig"
}
credential "ghcr" {
  registry  = "ghcr.io"
  endpoint  = "http://127.0.0.1:5000"
  sops_file = "secret.enc.yaml"
  prove     = ["org/private:v1"]
}
nodes {
  exclude            = ["prod-worker-9"]
  worker_parallelism = 2
  drain_timeout      = "5m"
}
lease {
  duration  = "15s"
  heartbeat = "5s"
}
consumer "billing" {
  namespace        = "billing"
  secret           = "ghcr-pull"
  service_accounts = ["default", "builder"]
}
consumer "web" {
  namespace = "web"
  secret    = "ghcr-pull"
}
consumers {
  selector = "ghcrsync.dev/pull-secret=ghcr"
  secret   = "ghcr-pull"
}
flux_root {
  namespace      = "flux-system"
  secret         = "ghcr-auth"
  oci_repository = "flux-system"
}
liveness "github_actions" {
  repository = "org/fleet"
}
`

const zeroDigest = "0000000000000000000000000000000000000000000000000000000000000000"

// withKeyring puts a nodes.kubelet_keyring block holding attrs into the valid configuration.
func withKeyring(s, attrs string) string {
	return strings.Replace(s, `drain_timeout      = "5m"`, `drain_timeout      = "5m"`+"\n  kubelet_keyring {\n    "+attrs+"\n  }", 1)
}

func writeDir(t *testing.T, hcl string) string {
	t.Helper()

	dir := t.TempDir()
	for _, f := range []string{"kubeconfig", "talosconfig", "secret.enc.yaml"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	path := filepath.Join(dir, "ghcrsync.hcl")
	if err := os.WriteFile(path, []byte(hcl), 0o600); err != nil {
		t.Fatal(err)
	}

	return path
}

func TestLoadValid(t *testing.T) {
	path := writeDir(t, valid)

	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}

	dir := filepath.Dir(path)
	checks := map[string]bool{
		"kubeconfig resolved":   cfg.Cluster.Kubeconfig == filepath.Join(dir, "kubeconfig"),
		"sops resolved":         cfg.Credential.SopsFile == filepath.Join(dir, "secret.enc.yaml"),
		"default key path":      strings.Join(cfg.Credential.Key, ".") == "stringData.ghcr_dockerconfigjson",
		"endpoint":              cfg.Credential.Endpoint == "http://127.0.0.1:5000",
		"parallelism":           cfg.Nodes.WorkerParallelism == 2,
		"drain":                 cfg.Nodes.DrainTimeout == 5*time.Minute,
		"ready default":         cfg.Nodes.ReadyTimeout == 10*time.Minute,
		"candidates default":    cfg.Nodes.AutoscalerCandidates == AutoscalerInclude,
		"probe default":         cfg.Nodes.Probe.Image == "ghcr.io/org/private:v1",
		"lease defaults+values": cfg.Lease.Name == "ghcr-auth-refresh" && cfg.Lease.Duration == 15*time.Second,
		"state default":         cfg.State.Backend == "local" && cfg.State.Path == filepath.Join(dir, "ghcrsync.state.json"),
		"digest":                len(cfg.Digest) == 64,
		"consumers":             len(cfg.Consumers) == 2 && cfg.Consumers[0].Name == "billing" && len(cfg.Consumers[0].ServiceAccounts) == 2,
		"consumer sa default":   len(cfg.Consumers) == 2 && cfg.Consumers[1].ServiceAccounts[0] == "default",
		"consumer selector":     cfg.ConsumerSelector != nil && cfg.ConsumerSelector.Selector == "ghcrsync.dev/pull-secret=ghcr",
		"flux root":             cfg.FluxRoot != nil && cfg.FluxRoot.OCIRepository == "flux-system",
		"liveness defaults":     cfg.Liveness != nil && cfg.Liveness.APIURL == "https://api.github.com" && cfg.Liveness.TokenEnv == "GH_TOKEN",
	}

	for name, ok := range checks {
		if !ok {
			t.Errorf("%s: %+v", name, cfg)
		}
	}
}

func TestEnvFunction(t *testing.T) {
	t.Setenv("GHCRSYNC_TEST_REGISTRY", "ghcr.io")

	path := writeDir(t, strings.Replace(valid, `registry  = "ghcr.io"`, `registry  = env("GHCRSYNC_TEST_REGISTRY")`, 1))

	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}

	if cfg.Credential.Registry != "ghcr.io" {
		t.Fatal(cfg.Credential.Registry)
	}
}

// Every bad input names the file, line and column, and says what is wrong.
// template is a node_template block; FORMAT is replaced by more attributes.
const template = `
node_template "w" {
  namespace = "kube-system"
  secret    = "tpl"
  key       = "K"
  FORMAT
}
`

func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(string) string
		want []string
	}{
		{"syntax", func(s string) string { return s + "\nnodes {\n" }, []string{"ghcrsync.hcl:", "Unclosed configuration block"}},
		{"unknown_attribute", func(s string) string {
			return strings.Replace(s, `drain_timeout      = "5m"`, `drain_timeout = "5m"`+"\n  drain_timout = \"1m\"", 1)
		},
			[]string{"ghcrsync.hcl:18:3", "Unsupported argument", "drain_timout"}},
		{"unknown_block", func(s string) string { return s + "\nfences {}\n" }, []string{"Unsupported block type", "fences"}},
		{"template_format", func(s string) string { return s + strings.Replace(template, "FORMAT", `format = "yaml"`, 1) },
			[]string{"ghcrsync.hcl:49:3", "Unsupported node template format", `not "yaml"`}},
		{"template_pools_without_cluster_config", func(s string) string {
			return s + strings.Replace(template, "FORMAT", "format = \"talos\"\n  pools = [\"a\"]", 1)
		}, []string{"ghcrsync.hcl:50:3", "Pools without a cluster config"}},
		{"template_restart_deployment", func(s string) string {
			return s + strings.Replace(template, "FORMAT", `restart_deployment = "autoscaler"`, 1)
		},
			[]string{"ghcrsync.hcl:49:3", "Invalid deployment", `"namespace/name"`}},
		{"template_twice", func(s string) string {
			return s + strings.Replace(template, "FORMAT", "", 1) + strings.Replace(template, "FORMAT", "", 1)
		},
			[]string{"Duplicate node template", "kube-system/tpl:K"}},
		{"template_missing_key", func(s string) string {
			return s + strings.Replace(strings.Replace(template, "FORMAT", "", 1), `key       = "K"`, "", 1)
		},
			[]string{"Missing required argument", "key"}},
		{"wrong_type", func(s string) string {
			return strings.Replace(s, "worker_parallelism = 2", `worker_parallelism = "many"`, 1)
		},
			[]string{"ghcrsync.hcl:16:24", "worker_parallelism"}},
		{"zero_parallelism", func(s string) string {
			return strings.Replace(s, "worker_parallelism = 2", "worker_parallelism = 0", 1)
		},
			[]string{"ghcrsync.hcl:16:24", "at least 1"}},
		{"bad_duration", func(s string) string {
			return strings.Replace(s, `drain_timeout      = "5m"`, `drain_timeout      = "5 minutes"`, 1)
		},
			[]string{"ghcrsync.hcl:17:24", "Invalid duration", `"5 minutes"`}},
		{"bad_window", func(s string) string { return s + "\nrun {\n  window = \"Mon-Fri 22:00-06:00\"\n}\n" },
			[]string{"Invalid maintenance window", "is not DAYS HH:MM-HH:MM ZONE"}},
		{"bad_window_zone", func(s string) string { return s + "\nrun {\n  window = \"Mon-Fri 22:00-06:00 Mars/Olympus\"\n}\n" },
			[]string{"Invalid maintenance window", "not an IANA time zone"}},
		{"missing_sops_file", func(s string) string { return strings.Replace(s, "secret.enc.yaml", "nope.enc.yaml", 1) },
			[]string{"ghcrsync.hcl:11:", "File not found", "nope.enc.yaml"}},
		{"missing_kubeconfig", func(s string) string { return strings.Replace(s, `kubeconfig = "kubeconfig"`, `kubeconfig = "kc"`, 1) },
			[]string{"ghcrsync.hcl:3:", "kubeconfig", "does not exist"}},
		{"no_credential", func(s string) string { return s[:strings.Index(s, "credential")] }, []string{"Missing credential block"}},
		{"bad_policy", func(s string) string {
			return strings.Replace(s, "exclude ", "autoscaler_candidates = \"sometimes\"\n  exclude ", 1)
		},
			[]string{"autoscaler_candidates", `"sometimes"`}},
		{"heartbeat_too_slow", func(s string) string { return strings.Replace(s, `heartbeat = "5s"`, `heartbeat = "10s"`, 1) },
			[]string{"ghcrsync.hcl:21:15", "at most half"}},
		{"unset_env", func(s string) string { return strings.Replace(s, `"ghcr.io"`, `env("GHCRSYNC_SURELY_UNSET")`, 1) },
			[]string{"GHCRSYNC_SURELY_UNSET is not set"}},
		{"bad_prove", func(s string) string { return strings.Replace(s, `"org/private:v1"`, `"https://ghcr.io/org/x"`, 1) },
			[]string{"Invalid image reference"}},
		{"bad_deny", func(s string) string {
			return strings.Replace(s, `prove`, `deny      = ["other team/x"]`+"\n  prove", 1)
		}, []string{"ghcrsync.hcl:", "Invalid image reference", "must not pull", `"other team/x"`}},
		{"deny_also_proved", func(s string) string {
			return strings.Replace(s, `prove`, `deny      = ["org/private:v1"]`+"\n  prove", 1)
		}, []string{"ghcrsync.hcl:", "Image both proved and denied", `"org/private:v1"`}},
		{"endpoint_over_plain_http", func(s string) string {
			return strings.Replace(s, `"http://127.0.0.1:5000"`, `"http://registry.example.com"`, 1)
		}, []string{"ghcrsync.hcl:", "Invalid endpoint", "receives the credential", "must be https", "loopback host only"}},
		{"endpoint_with_a_path", func(s string) string {
			return strings.Replace(s, `"http://127.0.0.1:5000"`, `"https://registry.example.com/v2/org"`, 1)
		}, []string{"ghcrsync.hcl:", "Invalid endpoint", "must be scheme://host[:port]"}},
		{"liveness_api_url_untrusted", func(s string) string {
			return strings.Replace(s, `repository = "org/fleet"`, `repository = "org/fleet"`+"\n  api_url = \"https://collector.example.com/api\"", 1)
		}, []string{"ghcrsync.hcl:", "Untrusted api_url", "receives the GitHub token (GH_TOKEN)", "collector.example.com is not trusted", "trusted_hosts"}},
		{"liveness_api_url_plain_http", func(s string) string {
			return strings.Replace(s, `repository = "org/fleet"`, `repository = "org/fleet"`+"\n  api_url = \"http://ghe.example.com/api/v3\"\n  trusted_hosts = [\"ghe.example.com\"]", 1)
		}, []string{"Untrusted api_url", "must be https"}},
		{"trusted_host_with_a_scheme", func(s string) string {
			return strings.Replace(s, `prove     = ["org/private:v1"]`, `prove     = ["org/private:v1"]`+"\n  trusted_hosts = [\"https://auth.example.com\"]", 1)
		}, []string{"Invalid trusted host", "no scheme, port or path"}},
		{"flux_suspend_not_namespaced", func(s string) string { return s + "\nflux {\n  suspend = [\"apps\"]\n}\n" },
			[]string{"ghcrsync.hcl:", "Invalid Kustomization", `"apps" is not`}},
		{"flux_suspend_twice", func(s string) string {
			return s + "\nflux {\n  suspend = [\"flux-system/apps\", \"flux-system/apps\"]\n}\n"
		},
			[]string{"ghcrsync.hcl:", "Duplicate Kustomization", "flux-system/apps twice"}},
		{"flux_without_suspend", func(s string) string { return s + "\nflux {\n}\n" },
			[]string{"Missing required argument", "suspend"}},
		{"keyring_image_not_pinned", func(s string) string {
			return withKeyring(s, `image = "registry.example.com/platform/ghcrsync:v0.4.0"`)
		},
			[]string{"ghcrsync.hcl:19:5", "Keyring writer image not pinned", "by digest"}},
		{"keyring_image_on_the_rotated_registry", func(s string) string {
			return withKeyring(s, `image = "ghcr.io/ghcrsync/ghcrsync@sha256:`+zeroDigest+`"`)
		},
			[]string{"ghcrsync.hcl:19:5", "Keyring writer image on the rotated registry", "could never be mended"}},
		{"keyring_namespace_shared", func(s string) string {
			return withKeyring(s, `image = "registry.example.com/p/ghcrsync@sha256:`+zeroDigest+`"`+"\n    namespace = \"kube-system\"")
		}, []string{"ghcrsync.hcl:20:5", "Keyring namespace not isolated", "kube-system"}},
		{"keyring_window_too_short", func(s string) string {
			return withKeyring(s, `image = "registry.example.com/p/ghcrsync@sha256:`+zeroDigest+`"`+"\n    window = \"30s\"")
		}, []string{"ghcrsync.hcl:20:5", "Keyring window too short", "five minutes"}},
		{"registry_with_path", func(s string) string {
			return strings.Replace(s, `registry  = "ghcr.io"`, `registry  = "ghcr.io/org"`, 1)
		},
			[]string{"Invalid registry"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(writeDir(t, tc.edit(valid)))
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

// A value read with env() never appears in a configuration error: the error names the variable.
// The negative control: the same value written literally is quoted.
func TestEnvValuesNeverInErrors(t *testing.T) {
	const token = "https://x-access-token:ghp_SECRETSECRET@collector.example.com/api"

	t.Setenv("GHCRSYNC_TEST_API", token)

	edit := func(value string) string {
		return strings.Replace(valid, `repository = "org/fleet"`, `repository = "org/fleet"`+"\n  api_url = "+value, 1)
	}

	_, err := Load(writeDir(t, edit(`env("GHCRSYNC_TEST_API")`)))
	if err == nil || strings.Contains(err.Error(), "ghp_SECRETSECRET") || strings.Contains(err.Error(), "x-access-token") {
		t.Fatalf("the error repeats the env() value: %v", err)
	}

	if !strings.Contains(err.Error(), "Untrusted api_url") {
		t.Fatalf("error: %v", err)
	}

	_, err = Load(writeDir(t, edit(`env("GHCRSYNC_TEST_API")`)+"\n  repository2 = 1"))
	if err == nil || strings.Contains(err.Error(), "ghp_SECRETSECRET") {
		t.Fatalf("another error repeats the env() value: %v", err)
	}

	t.Setenv("GHCRSYNC_TEST_ENDPOINT", "ftp://user:ghp_SECRETSECRET@registry.example.com")

	_, err = Load(writeDir(t, strings.Replace(valid, `"http://127.0.0.1:5000"`, `env("GHCRSYNC_TEST_ENDPOINT")`, 1)+"\nnodes2 {}\n"))
	if err == nil || strings.Contains(err.Error(), "ghp_SECRETSECRET") {
		t.Fatalf("the endpoint's env() value is repeated: %v", err)
	}

	// The control: messages do quote values, so hiding env() values is not vacuous.
	msg := withoutEnvValues(`endpoint must be an http(s) URL, not "ftp://user:ghp_SECRETSECRET@registry.example.com".`,
		[]envValue{{name: "GHCRSYNC_TEST_ENDPOINT", value: "ftp://user:ghp_SECRETSECRET@registry.example.com"}})
	if strings.Contains(msg, "SECRET") || !strings.Contains(msg, `the value of env("GHCRSYNC_TEST_ENDPOINT")`) {
		t.Fatalf("withoutEnvValues: %q", msg)
	}
}

func TestMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "absent.hcl"))
	if err == nil || !strings.Contains(err.Error(), "--config") {
		t.Fatalf("want a hint to pass --config: %v", err)
	}
}
