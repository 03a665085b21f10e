# ghcrsync configuration for a production fleet rotated from GitHub Actions
# (docs/workflows/apply.yml): the repository root holds this file and the SOPS-encrypted
# credential; the workflow passes --kubeconfig and --talosconfig (files it writes from secrets),
# and --template-kubeconfig for the node_template below (the ghcrsync-template identity, the only
# one that may write it: docs/rbac.md), so none is named here. The blocks are described in docs/config.md; `ghcrsync validate`
# checks this file in a pull request without contacting the cluster.

credential "ghcr" {
  registry  = "ghcr.io"
  sops_file = "clusters/prod/ghcr-secret.enc.yaml"
  key       = ["stringData", "ghcr_dockerconfigjson"]
  prove     = ["acme/private-probe:v1"] # a private package the credential must pull
}

nodes {
  autoscaler_candidates = "include"
  worker_parallelism    = 2
  max_failures          = 1
  drain_timeout         = "30m"
  ready_timeout         = "15m"

  runtime_probe {
    image     = "ghcr.io/acme/private-probe:v1"
    namespace = "ghcrsync-probe"
  }

  # Talos 1.13 loads registry auth only at boot, so each of its nodes is drained and rebooted.
  # With this block its kubelet's node keyring (/var/lib/kubelet/config.json) takes the credential
  # instead, written by a short pod on the node: no cordon, drain, reboot or restart, the node
  # proved as before (docs/apply.md, "The kubelet keyring"). It is opt-in: proved on the real
  # kubelet and containerd of ghcrsync's test fleet, not yet on a real Talos machine
  # (docs/troubleshooting.md says what is unproven). The image is ghcrsync's own, by digest, from
  # a registry whose pulls never need this credential (docs/release.md).
  #
  # kubelet_keyring {
  #   image = "registry.acme.example/platform/ghcrsync@sha256:<the digest `make image` pushed>"
  # }
}

lease {
  namespace = "flux-system"
  name      = "ghcr-auth-refresh"
}

# A CI runner's filesystem does not outlive the job: the state lives in a Secret.
state {
  backend   = "kubernetes"
  namespace = "flux-system"
  secret    = "ghcrsync-state"
}

# Whether a Lease holder's run is over: the GitHub Actions API, read with the job's token
# (GH_TOKEN, permissions: actions: read).
liveness "github_actions" {
  repository = "acme/fleet"
}

consumers {
  selector         = "ghcrsync.dev/pull-secret=ghcr"
  secret           = "ghcr-pull"
  service_accounts = ["default"]
}

# The Flux Kustomization that applies this cluster from Git: suspended for the run (a recorded
# fence, resumed at the end and by `ghcrsync release`), so that a Flux reconcile in the middle
# of the rotation cannot put a pull secret back before the nodes hold the new credential.
flux {
  suspend = ["flux-system/flux-system"]
}

flux_root {
  namespace      = "flux-system"
  secret         = "ghcr-auth"
  oci_repository = "flux-system"
}

# The Hetzner cluster autoscaler's node template (HCLOUD_CLUSTER_CONFIG): machines it creates
# during and after the rotation boot with the new credential.
node_template "hcloud-workers" {
  namespace = "kube-system"
  secret    = "hcloud-cluster-config"
  key       = "HCLOUD_CLUSTER_CONFIG"
  format    = "hcloud-cluster-config"
  pools     = ["workers"]
  # The autoscaler reads HCLOUD_CLUSTER_CONFIG once, when it starts: restart it after the write.
  # The official chart (kubernetes.github.io/autoscaler, cloudProvider=hetzner) names its
  # Deployment RELEASE-hetzner-cluster-autoscaler: here the release "cluster-autoscaler". Check
  # yours: kubectl -n kube-system get deploy -l app.kubernetes.io/name=hetzner-cluster-autoscaler
  restart_deployment = "kube-system/cluster-autoscaler-hetzner-cluster-autoscaler"
}

# The other tools that drain and reboot nodes (docs/config.md, "Other maintenance tools"): a node
# kured, the system-upgrade-controller or a Talos upgrade holds is deferred to the next run;
# ghcrsync takes kured's lock for each reboot of its own.
maintenance {
  kured         = "kube-system/kured"
  upgrade_plans = "system-upgrade"
  held_drain    = "defer"
}
