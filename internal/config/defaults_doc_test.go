package config

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// docs/config.md's table states each setting's default; the decoder applies them. Each row
// whose default is a literal (the first back-quoted word of its default column) is checked
// against what Load gives for a configuration that sets none of them: a default changed on one
// side only fails here, naming the row.
func TestDocumentedDefaultsAreTheDecoders(t *testing.T) {
	const minimal = `
cluster {}
credential "ghcr" {
  registry  = "ghcr.io"
  sops_file = "secret.enc.yaml"
  prove     = ["org/private:v1"]
}
credential "tenant-a" {
  registry  = "ghcr.io"
  sops_file = "secret.enc.yaml"
  consumer "a" {
    namespace = "a"
    secret    = "tenant-pull"
  }
  consumers {
    selector = "tenant=a"
    secret   = "tenant-pull"
  }
}
consumer "web" {
  namespace = "web"
  secret    = "ghcr-pull"
}
consumers {
  selector = "a=b"
  secret   = "ghcr-pull"
}
flux_root {
  namespace      = "flux-system"
  secret         = "ghcr-auth"
  oci_repository = "flux-system"
}
flux {
  suspend = ["flux-system/flux-system"]
}
node_template "t" {
  namespace = "kube-system"
  secret    = "s"
  key       = "HCLOUD_CLUSTER_CONFIG"
}
liveness "github_actions" {
  repository = "org/fleet"
}
nodes {
  kubelet_keyring {
    image = "registry.example.com/platform/ghcrsync@sha256:0000000000000000000000000000000000000000000000000000000000000000"
  }
}
`

	cfg, err := Load(writeDir(t, minimal))
	if err != nil {
		t.Fatal(err)
	}

	dir := filepath.Dir(cfg.Path)
	list := func(v []string) string { return `["` + strings.Join(v, `", "`) + `"]` }

	// What the decoder gave, by the table's key. A row is checked only where its default is a
	// value the decoder applies; the others are named with why they are not.
	got := map[string]string{
		"cluster.timeout":                       fmt.Sprint(cfg.Cluster.Timeout),
		"cluster.in_cluster":                    fmt.Sprint(cfg.Cluster.InCluster),
		"cluster.service_account_dir":           cfg.Cluster.ServiceAccountDir,
		"talos.timeout":                         fmt.Sprint(cfg.Talos.Timeout),
		"talos.concurrency":                     fmt.Sprint(cfg.Talos.Concurrency),
		"credential.endpoint":                   strings.Replace(cfg.Credential.Endpoint, cfg.Credential.Registry, "REGISTRY", 1),
		"credential.key":                        list(cfg.Credential.Key),
		"credential.retry_window":               fmt.Sprint(cfg.Credential.RetryWindow),
		"credential.denied_window":              fmt.Sprint(cfg.Credential.DeniedWindow),
		"nodes.autoscaler_candidates":           cfg.Nodes.AutoscalerCandidates,
		"nodes.worker_parallelism":              fmt.Sprint(cfg.Nodes.WorkerParallelism),
		"nodes.live_parallelism":                fmt.Sprint(cfg.Nodes.LiveParallelism),
		"nodes.max_failures":                    fmt.Sprint(cfg.Nodes.MaxFailures),
		"nodes.drain_timeout":                   fmt.Sprint(cfg.Nodes.DrainTimeout),
		"nodes.ready_timeout":                   fmt.Sprint(cfg.Nodes.ReadyTimeout),
		"nodes.allow_quorum_loss":               fmt.Sprint(cfg.Nodes.AllowQuorumLoss),
		"nodes.verdict":                         `"` + cfg.Nodes.Verdict + `"`,
		"nodes.expected_node_time":              fmt.Sprint(cfg.Nodes.ExpectedNodeTime),
		"nodes.expected_live_time":              fmt.Sprint(cfg.Nodes.ExpectedLiveTime),
		"nodes.runtime_probe.namespace":         cfg.Nodes.Probe.Namespace,
		"nodes.runtime_probe.service_account":   cfg.Nodes.Probe.ServiceAccount,
		"nodes.kubelet_keyring.namespace":       cfg.Nodes.Keyring.Namespace,
		"nodes.kubelet_keyring.secret":          cfg.Nodes.Keyring.Secret,
		"nodes.kubelet_keyring.window":          cfg.Nodes.Keyring.Window.String(),
		"nodes.kubelet_keyring.root_dirs":       list(cfg.Nodes.Keyring.RootDirs),
		"consumer.service_accounts":             list(cfg.Consumers[0].ServiceAccounts),
		"consumers.service_accounts":            list(cfg.ConsumerSelector.ServiceAccounts),
		"credential.consumer.service_accounts":  list(cfg.Tenants[0].Consumers[0].ServiceAccounts),
		"credential.consumers.service_accounts": list(cfg.Tenants[0].ConsumerSelector.ServiceAccounts),
		"node_template.format":                  cfg.NodeTemplates[0].Format,
		"lease.namespace":                       cfg.Lease.Namespace,
		"lease.name":                            cfg.Lease.Name,
		"lease.duration":                        fmt.Sprint(cfg.Lease.Duration),
		"lease.heartbeat":                       fmt.Sprint(cfg.Lease.Heartbeat),
		"state.backend":                         cfg.State.Backend,
		"state.path":                            strings.TrimPrefix(cfg.State.Path, dir+string(filepath.Separator)),
		"state.namespace":                       cfg.State.Namespace,
		"state.secret":                          cfg.State.Secret,
		"liveness.api_url":                      cfg.Liveness.APIURL,
		"liveness.token_env":                    cfg.Liveness.TokenEnv,
		"run.reserve":                           fmt.Sprint(cfg.Run.Reserve),
		"maintenance.kured":                     cfg.Others.Kured.String(),
		"maintenance.held_drain":                cfg.Others.HeldDrain,
		"flux_root.prove":                       fmt.Sprint(cfg.FluxRoot.Prove),
		"flux_root.proof_timeout":               fmt.Sprint(cfg.FluxRoot.ProofTimeout),
		"flux.quiesce":                          fmt.Sprint(cfg.FluxQuiesce > 0),
		"flux.quiesce_timeout":                  fmt.Sprint(cfg.FluxQuiesce),
	}
	notLiteral := map[string]string{
		"cluster.kubeconfig":         "the kubeconfig loading rules decide, not the decoder",
		"talos.talosconfig":          "TALOSCONFIG decides, not the decoder",
		"credential.trusted_hosts":   "a description",
		"nodes.runtime_probe.image":  "derived from credential.prove",
		"nodes.runtime_probe.images": "derived from image",
		"node_template.pools":        "a description",
		"liveness.trusted_hosts":     "a description",
	}

	b, err := os.ReadFile("../../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}

	row := regexp.MustCompile("^\\| `([a-z_.<>]+)`[^|]*\\|[^|]*\\| ([^|]*)\\|")
	literal := regexp.MustCompile("^`([^`]*)`")
	checked := 0

	for _, line := range strings.Split(string(b), "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}

		key, def := m[1], strings.TrimSpace(m[2])
		lit := literal.FindStringSubmatch(def)

		switch v, ok := got[key]; {
		case ok && lit == nil:
			t.Errorf("docs/config.md: %s's default is %q, the decoder's is %q", key, def, v)
		case ok:
			if !sameValue(lit[1], v) {
				t.Errorf("docs/config.md: %s's default is %s, the decoder's is %q: make them one", key, lit[1], v)
			}

			checked++
		case lit != nil && notLiteral[key] == "":
			t.Errorf("docs/config.md: %s documents the default %s, which this test does not check: add it to got", key, lit[1])
		}
	}

	if checked < len(got) {
		t.Errorf("checked %d of the %d defaults: a row is missing from docs/config.md's table", checked, len(got))
	}
}

// sameValue compares a documented value with the decoder's: durations as durations (the docs
// write 120s or 2m, Go prints 2m0s), anything else as written.
func sameValue(doc, decoded string) bool {
	a, errA := time.ParseDuration(doc)
	b, errB := time.ParseDuration(decoded)

	if errA == nil && errB == nil {
		return a == b
	}

	return doc == decoded
}
