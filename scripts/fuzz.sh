#!/usr/bin/env bash
# Runs every fuzz target for FUZZTIME each (default 5s: the short run `make test` does;
# `make fuzz` runs them for minutes). A failing input is written to the package's
# testdata/fuzz/ and reproduces with `go test -run FuzzName/HASH ./pkg`.
#
# Go 1.26's fuzz coordinator can fail a target with a bare "context deadline exceeded" when
# -fuzztime runs out while a worker is mid-call (golang/go#75804, fixed in Go 1.27): nothing
# was found and no input is written. That one shape — the failure text is exactly the
# deadline, and no failing input was written — is reported as the toolchain race and the
# target is fuzzed once more; anything else (a crasher, a second race) fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZTIME=${FUZZTIME:-5s}
GO=${GO:-go}
out=$(mktemp /tmp/ghcrsync-fuzz.XXXXXX)
trap 'rm -f "$out"' EXIT

targets=(
  ./internal/config:FuzzParse
  ./plan:FuzzDecode
  ./state:FuzzDecode
  ./state/kubestate:FuzzDecode
  ./internal/credential:FuzzDecrypt
  ./internal/credential:FuzzFromDocument
  ./internal/credential:FuzzParse
  ./internal/credential:FuzzProveAgainstAHostileRegistry
  ./internal/cluster:FuzzParseRecord
  ./internal/holder:FuzzParse
  ./internal/nodetemplate:FuzzRead
)

# fuzz_once PKG NAME: 0 passed, 1 failed, 2 the toolchain's deadline race (nothing found).
fuzz_once() {
  local pkg=$1 name=$2 corpus="$1/testdata/fuzz/$2" before after
  before=$(ls "$corpus" 2>/dev/null | wc -l)
  if "$GO" test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime 2s "$pkg" >"$out" 2>&1; then
    return 0
  fi
  after=$(ls "$corpus" 2>/dev/null | wc -l)
  if [ "$before" = "$after" ] && ! grep -q 'Failing input written' "$out" &&
    [ "$(grep -A1 -- "^--- FAIL: $name " "$out" | tail -n 1 | tr -d '[:space:]')" = contextdeadlineexceeded ]; then
    return 2
  fi
  return 1
}

for t in "${targets[@]}"; do
  pkg=${t%%:*} name=${t##*:}
  echo "fuzz: $pkg $name for $FUZZTIME"
  rc=0; fuzz_once "$pkg" "$name" || rc=$?
  if [ "$rc" = 2 ]; then
    echo "  $name: Go's fuzz coordinator failed at the deadline with no input found (golang/go#75804); fuzzing it again"
    rc=0; fuzz_once "$pkg" "$name" || rc=$?
  fi
  if [ "$rc" != 0 ]; then
    cat "$out"; exit 1
  fi
  tail -n 1 "$out" | sed 's/^/  /'
done
