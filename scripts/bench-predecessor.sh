#!/usr/bin/env bash
# bench-predecessor.sh DIR: the reads `ghcrsync plan` makes, done the way the bash tool it
# replaces did them — one process per question per node: `kubectl get node` + jq (cordon,
# taints, owner annotation, address), `talosctl get machineconfig` (the credential in the
# active config) and `talosctl version` — against the sandbox in DIR. Prints the wall seconds.
# Needs kubectl and jq on PATH and the talosctl `make talosctl` builds.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=$1
talosctl=$(scripts/build-talosctl.sh 2>/dev/null | tail -n 1)
for tool in kubectl jq; do
  command -v "$tool" >/dev/null || { echo "bench-predecessor: $tool is not installed" >&2; exit 2; }
done
export KUBECONFIG="$dir/kubeconfig" TALOSCONFIG="$dir/talosconfig"

start=$(date +%s.%N)
for node in $(kubectl get nodes -o jsonpath='{.items[*].metadata.name}'); do
  facts=$(kubectl get node "$node" -o json | jq -r '[.spec.unschedulable // false, (.spec.taints // [] | length),
    (.metadata.annotations["ghcrsync.dev/owner"] // "-"), (.status.addresses[] | select(.type == "InternalIP") | .address)] | @tsv')
  ip=${facts##*$'\t'}
  "$talosctl" -n "$ip" get machineconfig v1alpha1 -o yaml | grep -c 'auth' >/dev/null || true
  "$talosctl" -n "$ip" version --short >/dev/null
done
end=$(date +%s.%N)
awk "BEGIN{printf \"%.1f\n\", $end - $start}"
