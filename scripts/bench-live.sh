#!/usr/bin/env bash
# bench-live.sh [WORKERS]: wall time of a live rotation (Talos 1.14 reloads registry auth: no
# cordon, no reboot) of WORKERS workers + 1 control plane, with each nodes.live_parallelism of
# LIVE_PARALLELISM (default "1 10"), on one sandbox; the Kubernetes requests it made (apply
# --verbose's tally), per node and against the floor of a client at 50 QPS; the cordons it made
# (must be 0); and, every node then in sync, the writes a fresh plan + apply makes (must be 0).
# A benchmark, not a test: it prints.
set -euo pipefail
cd "$(dirname "$0")/.."

workers=${1:-20}
dir=$(mktemp -d "${TMPDIR:-/tmp}/ghcrsync-bench-live.XXXXXX")
cleanup() {
  bin/ghcrsync-sandbox down --dir "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT

bin/ghcrsync-sandbox up --dir "$dir" --detach --control-planes 1 --workers "$workers" --autoscaled 0 \
  --talos-version 1.14 --no-workloads --heartbeat 10s --reboot 2s >/dev/null
export SOPS_AGE_KEY_FILE="$dir/age.key"

talos_writes() {
  bin/ghcrsync-sandbox ctl --dir "$dir" stats | python3 -c 'import json, sys; print(sum(json.load(sys.stdin)["talos_writes"].values()))'
}

read -r -a parallelism <<<"${LIVE_PARALLELISM:-1 10}"
for p in "${parallelism[@]}"; do
  sed "s/^nodes {/nodes {\n  live_parallelism = $p/" "$dir/ghcrsync.hcl" >"$dir/bench-$p.hcl"
  bin/ghcrsync plan --config "$dir/bench-$p.hcl" --out "$dir/bench-$p.plan" >/dev/null
  start=$(date +%s.%N)
  GHCRSYNC_RESOURCES="$dir/resources-$p.json" bin/ghcrsync apply --config "$dir/bench-$p.hcl" --log-level warn --json --verbose "$dir/bench-$p.plan" >"$dir/bench-$p.jsonl" 2>"$dir/bench-$p.err"
  end=$(date +%s.%N)
  cordons=$(grep -c '"reason":"GhcrsyncClaim"' "$dir/bench-$p.jsonl" || true)
  requests=$(sed -n 's/^Requests: Kubernetes \([0-9]*\).*/\1/p' "$dir/bench-$p.err")
  talos_calls=$(sed -n 's/^Requests: .*; Talos \([0-9]*\).*/\1/p' "$dir/bench-$p.err")
  read -r cpu heap < <(scripts/bench-resources.py "$dir/resources-$p.json")

  # Now every node is in sync: a fresh plan and apply must write nothing (Talos writes from the
  # sandbox's witness, Kubernetes writes from apply --verbose's request count).
  before=$(talos_writes)
  bin/ghcrsync plan --config "$dir/bench-$p.hcl" --out "$dir/again-$p.plan" >/dev/null
  bin/ghcrsync apply --config "$dir/bench-$p.hcl" --log-level warn --verbose "$dir/again-$p.plan" >/dev/null 2>"$dir/again-$p.err"
  talos=$(($(talos_writes) - before))
  kube=$(sed -n 's/^Requests: Kubernetes [0-9]* (\(.*\)); Talos.*/\1/p' "$dir/again-$p.err" | tr ',' '\n' |
    awk '$1 ~ /^(PATCH|PUT|DELETE)$/ {n += $2} END {print n + 0}')

  if [ -n "${BENCH_ROWS:-}" ]; then
    printf '{"bench":"apply-live","nodes":%d,"live_parallelism":%d,"wall_s":%s,"cpu_s":%s,"peak_heap_mib":%s,"cordons":%d,"kubernetes_requests":%d,"talos_requests":%d,"in_sync_talos_writes":%d,"in_sync_kubernetes_writes":%d}\n' \
      "$((workers + 1))" "$p" "$(awk "BEGIN{printf \"%.2f\", $end - $start}")" "$cpu" "$heap" "$cordons" "$requests" "${talos_calls:-0}" "$talos" "$kube" >>"$BENCH_ROWS"
  fi
  echo "then, every node in sync, plan + apply again: $talos Talos writes, $kube Kubernetes writes (PATCH/PUT/DELETE)"
  printf 'live rotation of %d nodes, live_parallelism %2d: %6.1f s, %s cordons, %s Kubernetes requests (%.2f a node)\n' "$((workers + 1))" "$p" \
    "$(awk "BEGIN{print $end - $start}")" "$cordons" "$requests" "$(awk "BEGIN{print $requests / ($workers + 1)}")"
  grep -A30 '^Requests by step' "$dir/bench-$p.err" || true
  bin/ghcrsync-sandbox ctl --dir "$dir" rotate-secret >/dev/null
done
