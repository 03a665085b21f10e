# ghcrsync configuration for the local sandbox.
#
# `ghcrsync-sandbox up --dir DIR` writes a filled-in copy to DIR/ghcrsync.hcl: relative paths
# resolve against that folder, where the sandbox also writes kubeconfig, talosconfig,
# age.key and secret.enc.yaml. The blocks are described in docs/config.md.

cluster {
  kubeconfig = "kubeconfig"
}

talos {
  talosconfig = "talosconfig"
}

credential "ghcr" {
  registry = "ghcr.io"
  # Where ghcr.io is served in the sandbox (the credential is still keyed by "ghcr.io").
  endpoint  = "http://127.0.0.1:5000"
  sops_file = "secret.enc.yaml"
  key       = ["stringData", "ghcr_dockerconfigjson"]
  prove     = ["ghcrsync/private-probe:v1"]
  # How long the registry's passing trouble is waited out: 429 and 5xx for retry_window, a
  # denial until it has lasted denied_window. Short here so a revoked credential fails fast in
  # the sandbox; the defaults (2m, 45s) fit ghcr.io's incidents.
  retry_window  = "40s"
  denied_window = "6s"
}

nodes {
  autoscaler_candidates = "include" # the default: a candidate is rotated, guarded by scale-down-disabled
  worker_parallelism    = 1
  drain_timeout         = "2m"
  ready_timeout         = "2m"

  runtime_probe {
    image     = "ghcr.io/ghcrsync/private-probe:v1"
    namespace = "ghcrsync-probe"
  }
}

lease {
  namespace = "flux-system"
  name      = "ghcr-auth-refresh"
  duration  = "120s"
  heartbeat = "30s"
}

state {
  backend = "local"
  path    = "ghcrsync.state.json"
}

# Whether a Lease holder's CI run is over: the GitHub Actions run-attempt API
# (the sandbox serves a fake of it).
liveness "github_actions" {
  repository    = "ghcrsync/fleet"
  api_url       = "http://127.0.0.1:8080"
  trusted_hosts = ["127.0.0.1"] # api_url is not api.github.com: its host must be listed
  token_env     = "GH_TOKEN"
}

# Pull secrets: every namespace labelled ghcrsync.dev/pull-secret=ghcr gets ghcr-pull, referenced
# from its default service account; the root Flux secret is switched last.
consumers {
  selector         = "ghcrsync.dev/pull-secret=ghcr"
  secret           = "ghcr-pull"
  service_accounts = ["default"]
}

flux_root {
  namespace      = "flux-system"
  secret         = "ghcr-auth"
  oci_repository = "flux-system"
}

# The Flux Kustomization that applies this cluster from Git: suspended for the run (a recorded
# fence, resumed at the end and by `ghcrsync release`), so the SOPS file's merge cannot switch a
# pull secret before the nodes hold the new credential.
flux {
  suspend = ["flux-system/flux-system"]
}

# The machine template the cluster autoscaler boots new workers from (the Hetzner autoscaler's
# HCLOUD_CLUSTER_CONFIG): rewritten after the consumer secrets, before the root Flux secret, so
# machines that join later carry the new credential too. The autoscaler reads it once, when it
# starts: its Deployment is restarted after the write (the sandbox restarts it on that signal).
node_template "hcloud-workers" {
  namespace          = "kube-system"
  secret             = "hcloud-cluster-config"
  key                = "HCLOUD_CLUSTER_CONFIG"
  format             = "hcloud-cluster-config"
  pools              = ["autoscale-cx43"]
  restart_deployment = "kube-system/cluster-autoscaler"
}
