#!/usr/bin/env bash
# bench-reboot.sh [WORKERS] [CONTROL_PLANES]: wall time of a rotation that reboots every node
# (Talos 1.13: the credential loads at boot) of WORKERS workers and CONTROL_PLANES control planes
# with a 5 s reboot, for nodes.worker_parallelism k in K (default "1 3 10"), against the ideal
# (ceil(W/k) + C) x the median node's time; and where a node's seconds go (the median of each
# step over the run's nodes, from `apply --json`); and what the workloads felt: evictions per pod
# (max and mean over the demo pods' lines, from the apiserver's audit log) and the pod-seconds any
# demo pod spent unable to pull (from the kubelets). A benchmark, not a test: it prints.
set -euo pipefail
cd "$(dirname "$0")/.."

workers=${1:-6} cps=${2:-3}
read -r -a ks <<<"${K:-1 3 10}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/ghcrsync-bench-reboot.XXXXXX")
cleanup() {
  bin/ghcrsync-sandbox down --dir "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT

bin/ghcrsync-sandbox up --dir "$dir" --detach --control-planes "$cps" --workers "$workers" --autoscaled 0 \
  --talos-version 1.13 --reboot 5s >/dev/null
export SOPS_AGE_KEY_FILE="$dir/age.key"

echo "| k | nodes | wall | ideal (ceil(W/k) + C) x node | wall / ideal | median node | of which drain / reboot / ready | other steps (overhead) | evictions per pod, max / mean | pod-seconds unable to pull | Kubernetes requests per node |"
echo "|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"

for k in "${ks[@]}"; do
  sed -E "/^ *worker_parallelism *=/d; s/^nodes \{/nodes {\n  worker_parallelism = $k/" "$dir/ghcrsync.hcl" >"$dir/bench-$k.hcl"
  # shellcheck disable=SC2086 # PLAN_FLAGS: extra plan flags, e.g. --allow-pending
  bin/ghcrsync plan --config "$dir/bench-$k.hcl" --out "$dir/bench-$k.plan" ${PLAN_FLAGS:-} >/dev/null
  since=$(date -u +%Y-%m-%dT%H:%M:%S.%NZ)
  start=$(date +%s.%N)
  bin/ghcrsync apply --config "$dir/bench-$k.hcl" --log-level warn --json --verbose "$dir/bench-$k.plan" >"$dir/bench-$k.jsonl" 2>"$dir/bench-$k.err"
  end=$(date +%s.%N)
  requests=$(sed -n 's/^Requests: Kubernetes \([0-9]*\).*/\1/p' "$dir/bench-$k.err")
  grep -A30 '^Requests by step' "$dir/bench-$k.err" >&2 || true
  sleep 3 # the last evicted pods start
  bin/ghcrsync-sandbox ctl --dir "$dir" disruption "$since" >"$dir/bench-$k.disruption.json"
  tail -n 1 "$dir/bench-$k.jsonl" | python3 -c '
import json, math, os, statistics, sys
k, w, c, wall, requests = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[6])
d = json.load(open(sys.argv[5]))
nodes = [n for n in json.load(sys.stdin)["nodes"] if n["outcome"] == "done"]
if len(nodes) != w + c:
    sys.exit(f"k={k}: {len(nodes)} of {w + c} nodes rotated")
step = lambda n, s: sum(t["seconds"] for t in n["timings"] if t["step"] == s)
total = [sum(t["seconds"] for t in n["timings"]) for n in nodes]
node = statistics.median(total)
ideal = (math.ceil(w / k) + c) * node
med = {s: statistics.median(step(n, s) for n in nodes) for s in ("drain", "reboot", "ready")}
over = statistics.median(t - sum(step(n, s) for s in ("drain", "reboot", "ready")) for n, t in zip(nodes, total))
drain, reboot, ready = med["drain"], med["reboot"], med["ready"]
flags = os.environ.get("PLAN_FLAGS", "")
kcol = f"{k} ({flags})" if flags else f"{k}"
ev_max, ev_mean, unpulled = d["max_evictions_per_pod"], d["mean_evictions_per_pod"], d["pull_failure_pod_seconds"]
print(f"| {kcol} | {w}+{c} | {wall:.1f} s | {ideal:.1f} s | {wall / ideal:.2f} | {node:.1f} s | {drain:.1f} / {reboot:.1f} / {ready:.1f} s | {over:.1f} s | {ev_max} / {ev_mean:.2f} | {unpulled:.1f} | {requests / (w + c):.0f} |")
rows = os.environ.get("BENCH_ROWS")
if rows:
    with open(rows, "a") as f:
        f.write(json.dumps({"bench": "apply-reboot", "plan_flags": flags, "k": k, "workers": w, "control_planes": c, "wall_s": round(wall, 2),
            "ideal_s": round(ideal, 2), "ratio": round(wall / ideal, 2), "node_median_s": round(node, 2),
            "step_median_s": {s: round(v, 2) for s, v in med.items()}, "overhead_median_s": round(over, 2),
            "evictions_per_pod_max": ev_max, "evictions_per_pod_mean": round(ev_mean, 2), "pull_failure_pod_seconds": round(unpulled, 1),
            "kubernetes_requests": requests}) + "\n")
' "$k" "$workers" "$cps" "$(awk "BEGIN{print $end - $start}")" "$dir/bench-$k.disruption.json" "$requests"
  bin/ghcrsync-sandbox ctl --dir "$dir" rotate-secret >/dev/null
done
