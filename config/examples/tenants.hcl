# ghcrsync configuration for a platform that gives each tenant its own GHCR machine account
# (several credentials in one configuration, docs/config.md "Several credentials"). The block
# naming no consumers is the cluster's credential: the nodes, the node template, the root Flux
# secret and the platform's own consumers receive it. Each other block is a tenant's: it reaches
# only the pull secrets named inside it, and proves it cannot pull the other tenants' packages.
# One plan lists every credential's rotation; one apply carries them out under one Lease.

credential "platform" {
  registry  = "ghcr.io"
  sops_file = "clusters/prod/ghcr-secret.enc.yaml"
  prove     = ["acme/private-probe:v1"]
}

credential "team-a" {
  registry  = "ghcr.io"
  sops_file = "clusters/prod/team-a-ghcr.enc.yaml"
  prove     = ["acme-team-a/api:stable"]
  deny      = ["acme-team-b/web:stable"] # team-b's package: the registry must refuse it

  consumers {
    selector = "acme.dev/tenant=team-a"
    secret   = "ghcr-pull"
  }
}

credential "team-b" {
  registry  = "ghcr.io"
  sops_file = "clusters/prod/team-b-ghcr.enc.yaml"
  prove     = ["acme-team-b/web:stable"]
  deny      = ["acme-team-a/api:stable"]

  consumer "team-b-web" {
    namespace        = "team-b-web"
    secret           = "ghcr-pull"
    service_accounts = ["default", "deployer"]
  }
}

nodes {
  worker_parallelism = 2
  drain_timeout      = "30m"
  ready_timeout      = "15m"

  runtime_probe {
    image     = "ghcr.io/acme/private-probe:v1"
    namespace = "ghcrsync-probe"
  }
}

lease {
  namespace = "flux-system"
  name      = "ghcr-auth-refresh"
}

state {
  backend   = "kubernetes"
  namespace = "flux-system"
  secret    = "ghcrsync-state"
}

liveness "github_actions" {
  repository = "acme/fleet"
}

# The platform's own consumers: the cluster credential's.
consumers {
  selector = "ghcrsync.dev/pull-secret=ghcr"
  secret   = "ghcr-pull"
}

flux {
  suspend = ["flux-system/flux-system"]
}

flux_root {
  namespace      = "flux-system"
  secret         = "ghcr-auth"
  oci_repository = "flux-system"
}
