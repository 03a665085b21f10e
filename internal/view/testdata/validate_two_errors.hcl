# Two mistakes of a first configuration: a misspelt argument in one block, an unknown one in another.
credential "ghcr" {
  registry  = "ghcr.io"
  sops_file = "ghcr-secret.enc.yaml"
  key       = ["stringData", "ghcr_dockerconfigjson"]
  provee    = ["acme/private-probe:v1"]
}

nodes {
  drain_timeout = "30m"
  parallelism   = 2
}
