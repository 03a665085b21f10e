#!/usr/bin/env bash
# bench-estimate.sh [WORKERS] [RUNS]: how good plan's estimate is. On a sandbox of WORKERS
# workers and 1 control plane (Talos 1.13, each reboot drawn between 3 and 6 s), RUNS rotations
# in a row, each `plan --json` (its estimate: the configured default before any rotation, then
# the median of the recorded ones) then `apply` (its wall time). Prints one row per rotation:
# the estimate, the wall time, and the error. A benchmark, not a test: it prints.
set -euo pipefail
cd "$(dirname "$0")/.."

workers=${1:-6} runs=${2:-3}
dir=$(mktemp -d "${TMPDIR:-/tmp}/ghcrsync-bench-estimate.XXXXXX")
cleanup() {
  bin/ghcrsync-sandbox down --dir "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT

bin/ghcrsync-sandbox up --dir "$dir" --detach --control-planes 1 --workers "$workers" --autoscaled 0 \
  --talos-version 1.13 --reboot 3s..6s >/dev/null
export SOPS_AGE_KEY_FILE="$dir/age.key"

# Before any rotation the estimate is nodes.expected_node_time: set at the sandbox's scale.
sed -E 's/^nodes \{/nodes {\n  expected_node_time = "6s"/' "$dir/ghcrsync.hcl" >"$dir/bench.hcl"

echo "| rotation | estimate from | estimate | apply wall | error |"
echo "|---:|---|---:|---:|---:|"

for i in $(seq 1 "$runs"); do
  bin/ghcrsync plan --config "$dir/bench.hcl" --out "$dir/bench-$i.plan" --json >"$dir/bench-$i.plan.json"
  start=$(date +%s.%N)
  bin/ghcrsync apply --config "$dir/bench.hcl" --log-level warn --json "$dir/bench-$i.plan" >"$dir/bench-$i.jsonl" 2>"$dir/bench-$i.log"
  end=$(date +%s.%N)
  python3 - "$i" "$(awk "BEGIN{print $end - $start}")" "$dir/bench-$i.plan.json" <<'PY'
import json, os, sys
i, wall = int(sys.argv[1]), float(sys.argv[2])
e = json.load(open(sys.argv[3]))["estimate"]
est = e["wall_seconds"]
basis = "recorded rotations" if any(c["samples"] > 0 for c in e["classes"]) else "the configured default"
err = (est - wall) / wall
print(f"| {i} | {basis} | {est:.1f} s | {wall:.1f} s | {err * 100:+.0f}% |")
rows = os.environ.get("BENCH_ROWS")
if rows:
    with open(rows, "a") as f:
        f.write(json.dumps({"bench": "estimate", "rotation": i, "basis": basis, "estimate_s": round(est, 1), "wall_s": round(wall, 1),
            "error": round(err, 3)}) + "\n")
PY
  bin/ghcrsync-sandbox ctl --dir "$dir" rotate-secret >/dev/null
done
