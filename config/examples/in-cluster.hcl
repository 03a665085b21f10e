# ghcrsync configuration for the in-cluster Job (docs/deploy/job.yaml): this file, the SOPS file,
# the talosconfig and the age key are the keys of the ghcrsync-inputs Secret, mounted together
# at /inputs (relative paths resolve against this file's folder).

cluster {
  in_cluster = true # the pod's service account (token and CA mount)
}

talos {
  talosconfig = "talosconfig" # an os:admin certificate (docs/rbac.md)
}

credential "ghcr" {
  registry  = "ghcr.io"
  sops_file = "secret.enc.yaml"
  key       = ["stringData", "ghcr_dockerconfigjson"]
  prove     = ["acme/private-probe:v1"]
}

nodes {
  worker_parallelism = 1

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
  backend   = "kubernetes" # a pod's filesystem does not outlive it
  namespace = "flux-system"
  secret    = "ghcrsync-state"
}

flux_root {
  namespace      = "flux-system"
  secret         = "ghcr-auth"
  oci_repository = "flux-system"
}
