#!/usr/bin/env bash
# Runs every test package, as `make test` does: by default one `go test -p TEST_P ./...`
# (TEST_P=2, as many as the cores of the CI machine).
#
# With APPLY_SHARDS=n > 1 the apply package — the longest, about 15 minutes alone — runs in n
# processes beside the other packages, each running every n-th of its sandbox tests
# (sandboxtest.ShardEnv); for a machine with cores to spare. On the 2-core machine it does not
# pay: a sandbox test waits more than it computes, but five sandboxes at once (TEST_P=3,
# APPLY_SHARDS=2) held the load at 20-27, the apply shards took 1041 and 1084 s (about 950 s as
# one process), cmd/ghcrsync 2080 s (about 400 s), and a 4-second test Lease expired under it.
# Every process's output is prefixed with its name; the exit status is non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
P=${TEST_P:-2}
SHARDS=${APPLY_SHARDS:-1}
TIMEOUT=${TEST_TIMEOUT:-40m}

# The longest packages first (seconds measured on the 2-core machine, clean clone, warm cache:
# test/realnode 1050, apply 973, cmd/ghcrsync 445, internal/sandbox/containerd 369, test/budget
# 334): go test starts the runs in the order it is given the packages, and the suite can end no
# sooner than its longest package — started last, realnode alone added its 17 minutes to the end.
first=(./test/realnode ./apply ./cmd/ghcrsync ./internal/sandbox/containerd ./test/budget)

ordered() {
  local module
  module=$("$GO" list -m)
  printf '%s\n' "${first[@]}"
  "$GO" list ./... | sed "s|^$module|.|" | grep -vxF -f <(printf '%s\n' "${first[@]}")
}

pids=()
names=()

run() { # NAME CMD...: the command's output, each line prefixed with [NAME]
  local name=$1; shift
  ( "$@" 2>&1 | sed -u "s|^|[$name] |"; exit "${PIPESTATUS[0]}" ) &
  pids+=($!)
  names+=("$name")
}

finish() { # waits for every run: non-zero if any failed
  local rc=0
  for k in "${!pids[@]}"; do
    if ! wait "${pids[$k]}"; then
      echo "FAILED: ${names[$k]}" >&2
      rc=1
    fi
  done
  exit $rc
}

# TEST_BESIDE (default ./test/realnode): packages that mostly wait — test/realnode waits out the
# real kubelet's five-minute keyring cache in each rotation, most of its 18 minutes, its sandbox
# idle — run in a process of their own beside the -p TEST_P run of the others, instead of
# holding one of its two slots while they wait. TEST_BESIDE= runs everything in one process.
read -ra beside <<<"${TEST_BESIDE-./test/realnode}"

if [ "$SHARDS" -le 1 ]; then
  mapfile -t pkgs < <(ordered | grep -vxF -f <(printf '%s\n' "${beside[@]}" /))
  if [ "${#beside[@]}" -eq 0 ]; then
    exec "$GO" test -count=1 -timeout "$TIMEOUT" -p "$P" "${pkgs[@]}"
  fi

  run beside "$GO" test -count=1 -timeout "$TIMEOUT" "${beside[@]}"
  run rest "$GO" test -count=1 -timeout "$TIMEOUT" -p "$P" "${pkgs[@]}"
  finish
fi

module=$("$GO" list -m)

rest=()
while IFS= read -r pkg; do
  [ "$pkg" = "$module/apply" ] || rest+=("$pkg")
done < <("$GO" list ./...)

# Compile every test binary once before the processes start, so they do not compile side by side.
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
"$GO" test -c -o "$bin/" ./... >/dev/null || exit 1


for ((i = 0; i < SHARDS; i++)); do
  run "apply $i/$SHARDS" env GHCRSYNC_SANDBOX_SHARD="$i/$SHARDS" "$GO" test -count=1 -timeout "$TIMEOUT" ./apply
done
run rest "$GO" test -count=1 -timeout "$TIMEOUT" -p "$P" "${rest[@]}"

finish
