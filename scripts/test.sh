#!/usr/bin/env bash
# Runs every test package, as `make test` does. A sandbox package spends most of its time waiting
# on its control plane and machines (reboots, watches, timeouts), not computing: on 2 cores one
# uses about a fifth of the CPU. So the packages run TEST_P at a time (default 3), and the apply
# package — the longest, about 15 minutes alone — runs beside them in APPLY_SHARDS processes
# (default 2), each running every APPLY_SHARDS-th of its sandbox tests (sandboxtest.ShardEnv).
# Every process's output is prefixed with its name; the exit status is non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
P=${TEST_P:-3}
SHARDS=${APPLY_SHARDS:-2}
TIMEOUT=${TEST_TIMEOUT:-40m}
module=$("$GO" list -m)

rest=()
while IFS= read -r pkg; do
  [ "$pkg" = "$module/apply" ] || rest+=("$pkg")
done < <("$GO" list ./...)

# Compile every test binary once before the processes start, so they do not compile side by side.
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
"$GO" test -c -o "$bin/" ./... >/dev/null || exit 1

pids=()
names=()

run() { # NAME CMD...: the command's output, each line prefixed with [NAME]
  local name=$1; shift
  ( "$@" 2>&1 | sed -u "s|^|[$name] |"; exit "${PIPESTATUS[0]}" ) &
  pids+=($!)
  names+=("$name")
}

for ((i = 0; i < SHARDS; i++)); do
  run "apply $i/$SHARDS" env GHCRSYNC_SANDBOX_SHARD="$i/$SHARDS" "$GO" test -count=1 -timeout "$TIMEOUT" ./apply
done
run rest "$GO" test -count=1 -timeout "$TIMEOUT" -p "$P" "${rest[@]}"

rc=0
for k in "${!pids[@]}"; do
  if ! wait "${pids[$k]}"; then
    echo "FAILED: ${names[$k]}" >&2
    rc=1
  fi
done

exit $rc
