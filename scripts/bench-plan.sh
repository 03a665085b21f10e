#!/usr/bin/env bash
# bench-plan.sh [SIZES...]: `ghcrsync plan` against sandboxes of 1 control plane + N workers
# (default 10 100 1000), each with every round-trip in LATENCIES (default "0 25ms") added between
# ghcrsync and the Talos API endpoint (the sandbox's --talos-latency delay line): median wall of 5
# runs, peak RSS, and the requests it made (Kubernetes by verb, Talos by method); and, without
# added latency, the same reads done one process per question (scripts/bench-predecessor.sh:
# kubectl + jq, talosctl, per node) and how many times faster plan is. PREDECESSOR=0 skips that.
# A benchmark, not a test: it prints a Markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."

sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(10 100 1000)

read -r -a latencies <<<"${LATENCIES:-0 25ms}"

echo "| nodes | Talos round-trip added | plan wall (median of 5) | ghcrsync CPU (user + system) | peak Go heap | peak RSS | Kubernetes requests | Talos requests | one process per question | plan is faster |"
echo "|---:|---:|---:|---:|---:|---:|---|---|---:|---:|"

for n in "${sizes[@]}"; do
for lat in "${latencies[@]}"; do
  dir=$(mktemp -d "${TMPDIR:-/tmp}/ghcrsync-bench-plan.XXXXXX")
  bin/ghcrsync-sandbox up --dir "$dir" --detach --control-planes 1 --workers "$n" --autoscaled 0 \
    --no-workloads --heartbeat 10s --talos-latency "$lat" >/dev/null
  export SOPS_AGE_KEY_FILE="$dir/age.key"

  walls=()
  for i in 1 2 3 4 5; do
    start=$(date +%s.%N)
    GHCRSYNC_RESOURCES="$dir/resources.$i.json" bin/ghcrsync plan --config "$dir/ghcrsync.hcl" --output plain --verbose >/dev/null 2>"$dir/plan.err"
    end=$(date +%s.%N)
    walls+=("$(awk "BEGIN{printf \"%.2f\", $end - $start}")")
  done

  median=$(printf '%s\n' "${walls[@]}" | sort -n | sed -n 3p)
  read -r cpu heap < <(scripts/bench-resources.py "$dir"/resources.*.json)
  rss=unknown
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -v bin/ghcrsync plan --config "$dir/ghcrsync.hcl" --output plain >/dev/null 2>"$dir/time.err" || true
    rss="$(awk -F': ' '/Maximum resident/ {printf "%d MiB", $2/1024}' "$dir/time.err")"
  fi
  kube=$(sed -n 's/^Requests: Kubernetes \(.*\); Talos .*/\1/p' "$dir/plan.err")
  talos=$(sed -n 's/^Requests: .*; Talos \(.*\)\.$/\1/p' "$dir/plan.err")

  pred=null ratio=null
  if [ "$lat" = 0 ] && [ "${PREDECESSOR:-1}" != 0 ]; then
    pred=$(scripts/bench-predecessor.sh "$dir")
    ratio=$(awk "BEGIN{printf \"%.0f\", $pred / $median}")
  fi
  if [ "$pred" = null ]; then
    echo "| $((n + 1)) | $lat | ${median} s | ${cpu} s | ${heap} MiB | $rss | $kube | $talos | — | — |"
  else
    echo "| $((n + 1)) | $lat | ${median} s | ${cpu} s | ${heap} MiB | $rss | $kube | $talos | ${pred} s | ${ratio}× |"
  fi
  if [ -n "${BENCH_ROWS:-}" ]; then
    printf '{"bench":"plan","nodes":%d,"talos_rtt":"%s","wall_median_s":%s,"cpu_s":%s,"peak_heap_mib":%s,"peak_rss":"%s","kubernetes_requests":"%s","talos_requests":"%s","one_process_per_question_s":%s,"speedup":%s}\n' \
      "$((n + 1))" "$lat" "$median" "$cpu" "$heap" "$rss" "$kube" "$talos" "$pred" "$ratio" >>"$BENCH_ROWS"
  fi

  bin/ghcrsync-sandbox down --dir "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
done
done
