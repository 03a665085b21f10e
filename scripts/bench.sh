#!/usr/bin/env bash
# bench.sh: every benchmark in one go (`make bench`). Prints each table, writes the rows to
# bench/results.json, and replaces the measured tables in docs/performance.md (between its
# `bench:begin` and `bench:end` markers; the analysis around them is written by hand).
#   PLAN_SIZES (default "10 100 1000"), LIVE_WORKERS (99: 100 nodes, live_parallelism 1 and 10),
#   LIVE_LARGE_WORKERS (999: 1,000 nodes) at LIVE_LARGE_PARALLELISM ("10 50"), DRAIN_WORKERS
#   (499) and DRAIN_HOLD (60 s), REBOOT_WORKERS (6),
#   REBOOT_CPS (3), K (the worker_parallelism values, "1 3 10"), KEYRING_WORKERS (99) and
#   KEYRING_K (10: the reboot path's worker_parallelism beside the keyring's), KEYRING_CACHE (30s).
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
BENCH_PKGS=${BENCH_PKGS:-./plan}
mkdir -p bench
# The commit measured, read before this run writes its own results.
rev=$(git describe --always --dirty 2>/dev/null || echo unknown)
export BENCH_ROWS=bench/rows.jsonl
rm -f "$BENCH_ROWS"
tables=$(mktemp)
trap 'rm -f "$tables" "$BENCH_ROWS"' EXIT

section() { printf '\n### %s\n\n' "$1" | tee -a "$tables"; }

section "Pure parts (go test -bench)"
{
  echo "| benchmark | ns/op | B/op | allocs/op |"
  echo "|---|---:|---:|---:|"
  # shellcheck disable=SC2086
  "$GO" test -run '^$' -bench . -benchmem $BENCH_PKGS | awk -v rows="$BENCH_ROWS" '
    /^Benchmark/ {
      name = $1; sub(/-[0-9]+$/, "", name)
      printf "| %s | %s | %s | %s |\n", name, $3, $5, $7
      printf "{\"bench\":\"go\",\"name\":\"%s\",\"ns_per_op\":%s,\"bytes_per_op\":%s,\"allocs_per_op\":%s}\n", name, $3, $5, $7 >> rows
    }'
} | tee -a "$tables"

section "plan (1 control plane + N workers, Talos 1.13)"
read -r -a sizes <<<"${PLAN_SIZES:-10 100 1000}"
scripts/bench-plan.sh "${sizes[@]}" | tee -a "$tables"

section "apply, live (Talos 1.14: no cordon, no reboot)"
scripts/bench-live.sh "${LIVE_WORKERS:-99}" >&2
LIVE_PARALLELISM=${LIVE_LARGE_PARALLELISM:-10 50} scripts/bench-live.sh "${LIVE_LARGE_WORKERS:-999}" >&2
python3 - "$BENCH_ROWS" <<'PY' | tee -a "$tables"
import json, sys
print("| nodes | live_parallelism | wall | floor at 50 QPS | wall / floor | ghcrsync CPU | peak Go heap | Kubernetes requests | per node | Talos calls | per node | cordons | then in sync, plan + apply again: Talos / Kubernetes writes |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["bench"] == "apply-live":
        req = r.get("kubernetes_requests", 0)
        floor = req / 50
        ratio = f"{r['wall_s'] / floor:.2f}" if floor else "—"
        talos = r.get("talos_requests", 0)
        print(f"| {r['nodes']} | {r['live_parallelism']} | {r['wall_s']:.1f} s | {floor:.1f} s | {ratio} | {r.get('cpu_s')} s | {r.get('peak_heap_mib')} MiB | {req} | {req / r['nodes']:.2f} | {talos} | {talos / r['nodes']:.2f} | {r['cordons']} | {r['in_sync_talos_writes']} / {r['in_sync_kubernetes_writes']} |")
PY

section "a drain a budget holds (one worker fenced, its only pod held by a PodDisruptionBudget)"
scripts/bench-drain.sh "${DRAIN_WORKERS:-499}" "${DRAIN_HOLD:-60}" | tee -a "$tables"

section "apply with reboots (Talos 1.13, 5 s reboot)"
scripts/bench-reboot.sh "${REBOOT_WORKERS:-6}" "${REBOOT_CPS:-3}" | tee -a "$tables"

section "Talos 1.13 with no reboot: the kubelet keyring beside the reboot path (1 control plane + ${KEYRING_WORKERS:-99} workers)"
scripts/bench-keyring.sh "${KEYRING_WORKERS:-99}" "${KEYRING_K:-10}" | tee -a "$tables"

section "the kubelet keyring on real nodes (kubelet 1.35.4, containerd 1.6): from each keyring write to its proof"
evidence=$(mktemp)
if [ "$(id -u)" = 0 ] && command -v containerd >/dev/null &&
  GHCRSYNC_REAL_RUNTIME=required GHCRSYNC_KEYRING_EVIDENCE="$evidence" "$GO" test -count=1 -timeout 30m \
    -run '^TestRotationThroughTheKubeletKeyringOnRealNodes$' ./test/realnode >&2; then
  python3 - "$evidence" <<'PY' | tee -a "$tables"
import json, os, sys
rounds = json.load(open(sys.argv[1]))
print("| rotation | node | write → proof |")
print("|---|---|---:|")
for rnd, nodes in rounds.items():
    for node, s in sorted(nodes.items()):
        print(f"| {rnd} | {node} | {s:.1f} s |")
with open(os.environ["BENCH_ROWS"], "a") as f:
    f.write(json.dumps({"bench": "keyring-real-nodes", "write_to_proof_s": rounds}) + "\n")
PY
else
  echo "(not measured: real nodes need root and containerd: make runtime kubelet)" | tee -a "$tables"
fi
rm -f "$evidence"

section "disruption per pod: 3 workers, worker_parallelism 1, ordinary and with --allow-pending"
K=1 scripts/bench-reboot.sh 3 1 | tee -a "$tables"
K=1 PLAN_FLAGS=--allow-pending scripts/bench-reboot.sh 3 1 | tail -n 1 | tee -a "$tables"

section "the estimate against the wall time (6 workers + 1 control plane, reboots 3–6 s)"
scripts/bench-estimate.sh 6 3 | tee -a "$tables"

{ echo '['; paste -sd, "$BENCH_ROWS"; echo ']'; } >bench/results.json

python3 - "$tables" docs/performance.md "$rev" <<'PY'
import datetime, sys
tables, doc, rev = open(sys.argv[1]).read().strip(), sys.argv[2], sys.argv[3]
text = open(doc).read()
begin, end = "<!-- bench:begin -->", "<!-- bench:end -->"
if begin not in text or end not in text:
    sys.exit(f"{doc} has no {begin} ... {end} section")
head, rest = text.split(begin, 1)
_, tail = rest.split(end, 1)
stamp = f"Measured by `make bench` on {datetime.date.today()} at {rev}."
open(doc, "w").write(f"{head}{begin}\n{stamp}\n{tables}\n{end}{tail}")
PY
echo "bench: wrote bench/results.json and the tables in docs/performance.md"
