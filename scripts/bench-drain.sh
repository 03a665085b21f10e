#!/usr/bin/env bash
# bench-drain.sh [WORKERS] [HOLD]: the Kubernetes requests of a fenced rotation of one worker of
# a WORKERS-worker sandbox (default 499: 500 nodes with the control plane) whose only pod a
# PodDisruptionBudget holds for HOLD seconds (default 60), against the same rotation with no
# budget: what waiting on a budget costs the API server. Needs kubectl. A benchmark, not a
# test: it prints.
set -euo pipefail
cd "$(dirname "$0")/.."

workers=${1:-499}
hold=${2:-60}
dir=$(mktemp -d "${TMPDIR:-/tmp}/ghcrsync-bench-drain.XXXXXX")
cleanup() {
  bin/ghcrsync-sandbox down --dir "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT

bin/ghcrsync-sandbox up --dir "$dir" --detach --control-planes 1 --workers "$workers" --autoscaled 0 \
  --talos-version 1.13 --no-workloads --reboot 2s >/dev/null
export SOPS_AGE_KEY_FILE="$dir/age.key" KUBECONFIG="$dir/kubeconfig"

kubectl create namespace held >/dev/null
kubectl apply -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: held, namespace: held}
spec:
  replicas: 1
  selector: {matchLabels: {app: held}}
  template:
    metadata: {labels: {app: held}}
    spec:
      nodeSelector: {kubernetes.io/hostname: prod-worker-1}
      terminationGracePeriodSeconds: 0
      containers: [{name: c, image: registry.k8s.io/pause:3.10}]
YAML

sed 's/^nodes {/nodes {\n  selector = "kubernetes.io\/hostname=prod-worker-1"\n  verdict  = "selected"/' "$dir/ghcrsync.hcl" >"$dir/drain.hcl"

echo "| nodes | budget holds the pod | apply wall | Kubernetes requests | of which LIST / WATCH |"
echo "|---:|---:|---:|---:|---|"

for h in 0 "$hold"; do
  bin/ghcrsync-sandbox ctl --dir "$dir" rotate-secret >/dev/null
  kubectl -n held wait pod -l app=held --for=condition=Ready --timeout=180s >/dev/null

  relax=""
  if [ "$h" -gt 0 ]; then
    kubectl apply -f - >/dev/null <<YAML
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: held, namespace: held}
spec: {minAvailable: 1, selector: {matchLabels: {app: held}}}
YAML
    (sleep "$h"; kubectl -n held delete pdb held >/dev/null 2>&1) &
    relax=$!
  fi

  start=$(date +%s.%N)
  bin/ghcrsync apply --auto-approve --config "$dir/drain.hcl" --log-level warn --verbose >/dev/null 2>"$dir/drain-$h.err"
  end=$(date +%s.%N)
  [ -z "$relax" ] || wait "$relax"

  line=$(grep '^Requests: Kubernetes' "$dir/drain-$h.err")
  total=$(sed -n 's/^Requests: Kubernetes \([0-9]*\).*/\1/p' <<<"$line")
  lists=$( (grep -o 'LIST [0-9]*' <<<"$line" || echo "LIST 0") | head -1 | cut -d' ' -f2)
  watches=$( (grep -o 'WATCH [0-9]*' <<<"$line" || echo "WATCH 0") | head -1 | cut -d' ' -f2)
  wall=$(awk "BEGIN{printf \"%.1f\", $end - $start}")
  printf '| %d | %d s | %s s | %d | %d / %d |\n' "$((workers + 1))" "$h" "$wall" "$total" "$lists" "$watches"

  if [ -n "${BENCH_ROWS:-}" ]; then
    printf '{"bench":"drain-held","nodes":%d,"hold_s":%d,"wall_s":%s,"kubernetes_requests":%d,"lists":%d,"watches":%d}\n' \
      "$((workers + 1))" "$h" "$wall" "$total" "$lists" "$watches" >>"$BENCH_ROWS"
  fi
done
