#!/usr/bin/env bash
# bench-live.sh [WORKERS]: wall time of a live rotation (Talos 1.14 reloads registry auth: no
# cordon, no reboot) of WORKERS workers + 1 control plane, with nodes.live_parallelism 1 and
# 10, on one sandbox; and the cordons it made (must be 0). A benchmark, not a test: it prints.
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
  --talos-version 1.14 --no-workloads --heartbeat 2s --reboot 2s >/dev/null
export SOPS_AGE_KEY_FILE="$dir/age.key"

for p in 1 10; do
  sed "s/^nodes {/nodes {\n  live_parallelism = $p/" "$dir/ghcrsync.hcl" >"$dir/bench-$p.hcl"
  bin/ghcrsync plan --config "$dir/bench-$p.hcl" --out "$dir/bench-$p.plan" >/dev/null
  start=$(date +%s.%N)
  bin/ghcrsync apply --config "$dir/bench-$p.hcl" --log-level warn --json "$dir/bench-$p.plan" >"$dir/bench-$p.jsonl"
  end=$(date +%s.%N)
  cordons=$(grep -c '"reason":"GhcrsyncClaim"' "$dir/bench-$p.jsonl" || true)
  if [ -n "${BENCH_ROWS:-}" ]; then
    printf '{"bench":"apply-live","nodes":%d,"live_parallelism":%d,"wall_s":%s,"cordons":%d}\n' \
      "$((workers + 1))" "$p" "$(awk "BEGIN{printf \"%.2f\", $end - $start}")" "$cordons" >>"$BENCH_ROWS"
  fi
  printf 'live rotation of %d nodes, live_parallelism %2d: %6.1f s, %s cordons\n' "$((workers + 1))" "$p" \
    "$(awk "BEGIN{print $end - $start}")" "$cordons"
  bin/ghcrsync-sandbox ctl --dir "$dir" rotate-secret >/dev/null
done
