#!/usr/bin/env bash
# bench-keyring.sh [WORKERS] [K]: a rotation of 1 control plane + WORKERS workers on Talos 1.13 by
# the reboot path (no keyring block) at nodes.worker_parallelism K (default 10), 5 s reboots, then
# the next rotation of the same fleet through the kubelet keyring (nodes.kubelet_keyring: no
# cordon, drain, reboot or restart). For each: the wall time, reboots,
# evictions per pod (max / mean), pod-seconds unable to pull, and for the keyring path the time
# from each node's keyring write to its proof (median and max). The simulated kubelets keep their
# keyring KEYRING_CACHE (default 30s; the real kubelet's is 5m, and its wait scales with it:
# internal/sandbox/containerd/keyring_test.go measures it on the real one). A benchmark, not a
# test: it prints.
set -euo pipefail
cd "$(dirname "$0")/.."

workers=${1:-99} k=${2:-10}
cache=${KEYRING_CACHE:-30s}
dir=$(mktemp -d "${TMPDIR:-/tmp}/ghcrsync-bench-keyring.XXXXXX")
cleanup() {
  bin/ghcrsync-sandbox down --dir "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT

bin/ghcrsync-sandbox up --dir "$dir" --detach --control-planes 1 --workers "$workers" --autoscaled 0 --talos-version 1.13 \
  --reboot 5s --keyring-writer bin/ghcrsync --keyring-cache "$cache" >/dev/null
export SOPS_AGE_KEY_FILE="$dir/age.key"

echo "| path | nodes | wall | reboots | evictions per pod, max / mean | pod-seconds unable to pull | keyring write → proof, median / max |"
echo "|---|---:|---:|---:|---:|---:|---:|"

run() { # NAME CONFIG
  local name=$1 cfg=$2
  bin/ghcrsync plan --config "$cfg" --out "$dir/$name.plan" >/dev/null
  local since start end
  since=$(date -u +%Y-%m-%dT%H:%M:%S.%NZ)
  start=$(date +%s.%N)
  bin/ghcrsync apply --config "$cfg" --log-level warn --json "$dir/$name.plan" >"$dir/$name.jsonl" 2>"$dir/$name.err" || {
    cat "$dir/$name.err" >&2
    exit 1
  }
  end=$(date +%s.%N)
  sleep 3 # the last evicted pods start
  bin/ghcrsync-sandbox ctl --dir "$dir" disruption "$since" >"$dir/$name.disruption.json"
  tail -n 1 "$dir/$name.jsonl" | python3 -c '
import json, os, statistics, sys
name, wall, nodes_total = sys.argv[1], float(sys.argv[2]), int(sys.argv[4])
d = json.load(open(sys.argv[3]))
res = json.load(sys.stdin)
nodes = [n for n in res["nodes"] if n["outcome"] == "done"]
safe = res["verdict"]["safe_to_revoke"]
if len(nodes) != nodes_total or not safe:
    sys.exit(f"{name}: {len(nodes)} of {nodes_total} nodes rotated, safe to revoke {safe}")
reboots = sum(1 for n in nodes for t in n["timings"] if t["step"] == "reboot")
prove = [t["seconds"] for n in nodes if n["action"] == "kubelet-keyring" for t in n["timings"] if t["step"] == "prove"]
kr = f"{statistics.median(prove):.1f} / {max(prove):.1f} s" if prove else "—"
ev_max, ev_mean, unpulled = d["max_evictions_per_pod"], d["mean_evictions_per_pod"], d["pull_failure_pod_seconds"]
print(f"| {name} | {nodes_total} | {wall:.1f} s | {reboots} | {ev_max} / {ev_mean:.2f} | {unpulled:.1f} | {kr} |")
rows = os.environ.get("BENCH_ROWS")
if rows:
    with open(rows, "a") as f:
        f.write(json.dumps({"bench": "apply-keyring", "path": name, "nodes": nodes_total, "wall_s": round(wall, 2), "reboots": reboots,
            "evictions_per_pod_max": ev_max, "evictions_per_pod_mean": round(ev_mean, 2), "pull_failure_pod_seconds": round(unpulled, 1),
            "keyring_write_to_proof_s": {"median": round(statistics.median(prove), 2), "max": round(max(prove), 2)} if prove else None,
            "keyring_cache": os.environ.get("KEYRING_CACHE", "30s")}) + "\n")
' "$name" "$(awk "BEGIN{print $end - $start}")" "$dir/$name.disruption.json" "$((workers + 1))"
}

# The reboot path first (a fleet whose kubelets hold no keyring): no keyring block, k workers at
# a time; then the next rotation of the same fleet through the keyring.
python3 - "$dir/ghcrsync.hcl" "$dir/reboot.hcl" "$k" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
text = re.sub(r"\n  kubelet_keyring \{.*?\n  \}", "", text, flags=re.S)
text = re.sub(r"^nodes \{", f"nodes {{\n  worker_parallelism = {sys.argv[3]}", re.sub(r"\n *worker_parallelism *=.*", "", text), flags=re.M)
open(sys.argv[2], "w").write(text)
PY
run "reboot (k=$k)" "$dir/reboot.hcl"

bin/ghcrsync-sandbox ctl --dir "$dir" rotate-secret >/dev/null
run kubelet-keyring "$dir/ghcrsync.hcl"
