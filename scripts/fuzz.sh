#!/usr/bin/env bash
# Runs every fuzz target for FUZZTIME each (default 5s: the short run `make test` does;
# `make fuzz` runs them for minutes). A failing input is written to the package's
# testdata/fuzz/ and reproduces with `go test -run FuzzName/HASH ./pkg`.
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZTIME=${FUZZTIME:-5s}
GO=${GO:-go}

targets=(
  ./internal/config:FuzzParse
  ./plan:FuzzDecode
  ./state:FuzzDecode
  ./state/kubestate:FuzzDecode
  ./internal/credential:FuzzDecrypt
  ./internal/credential:FuzzFromDocument
  ./internal/credential:FuzzParse
  ./internal/credential:FuzzParseChallenge
  ./internal/cluster:FuzzParseRecord
  ./internal/holder:FuzzParse
  ./internal/nodetemplate:FuzzRead
)

for t in "${targets[@]}"; do
  pkg=${t%%:*} name=${t##*:}
  echo "fuzz: $pkg $name for $FUZZTIME"
  "$GO" test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime 2s "$pkg" >/tmp/ghcrsync-fuzz.$$ 2>&1 || {
    cat /tmp/ghcrsync-fuzz.$$; rm -f /tmp/ghcrsync-fuzz.$$; exit 1; }
  tail -n 1 /tmp/ghcrsync-fuzz.$$ | sed 's/^/  /'
done
rm -f /tmp/ghcrsync-fuzz.$$
