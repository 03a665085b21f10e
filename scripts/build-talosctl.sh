#!/usr/bin/env bash
# Builds the real talosctl (the operator's Talos client, which nobody here wrote) from the Go
# module proxy into a cache OUTSIDE the clone, and reuses it when present. The sandbox's
# fidelity tests drive the simulated machines with it. Prints the binary's path last.
#
# talos v1.13.9's go.mod names two module versions the proxy no longer serves and a fork the
# client does not need, so the throw-away copy substitutes them: siderolabs/go-kubernetes
# v0.2.39 (for v0.2.38), go.etcd.io/etcd v3.6.14 (for v3.6.12), the published
# pkg/machinery v1.13.9 (for the nested ./pkg/machinery, which the module zip leaves out), and no
# containerd fork replace. The siderolabs/wgctrl-go replace has no go.sum line yet: GONOSUMDB.
#
#   GHCRSYNC_TALOSCTL  override the output path
#   XDG_CACHE_HOME     default cache root (~/.cache)
set -euo pipefail

TALOS_VERSION=${TALOS_VERSION:-v1.13.9}
CACHE_ROOT=${XDG_CACHE_HOME:-$HOME/.cache}/ghcrsync/talosctl
OUT=${GHCRSYNC_TALOSCTL:-$CACHE_ROOT/$TALOS_VERSION/talosctl}

log() { printf '[talosctl %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ -x "$OUT" ]; then
  log "cached in $OUT"
  echo "$OUT"
  exit 0
fi

log "building talosctl $TALOS_VERSION into $OUT (about 3-8 min cold on 2 cores)"
mkdir -p "$(dirname "$OUT")"

export GOWORK=off GOFLAGS=-mod=mod GO111MODULE=on CGO_ENABLED=0 GONOSUMDB=github.com/siderolabs/wgctrl-go
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ghcrsync-talosctl.XXXXXX")
trap 'chmod -R u+w "$WORK" 2>/dev/null; rm -rf "$WORK"' EXIT

log "downloading github.com/siderolabs/talos@$TALOS_VERSION"
src=$(cd "$WORK" && go mod download -json "github.com/siderolabs/talos@$TALOS_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
cp -r "$src" "$WORK/talos"
chmod -R u+w "$WORK/talos"
cd "$WORK/talos"
rm -f go.work

go mod edit -dropreplace github.com/siderolabs/talos/pkg/machinery \
  -require "github.com/siderolabs/talos/pkg/machinery@$TALOS_VERSION" \
  -dropreplace github.com/containerd/containerd/v2 \
  -require github.com/siderolabs/go-kubernetes@v0.2.39 \
  -require go.etcd.io/etcd/etcdutl/v3@v3.6.14

log "compiling"
go build -trimpath -ldflags='-s -w' -o "$OUT.tmp" ./cmd/talosctl
mv "$OUT.tmp" "$OUT"
log "done: $("$OUT" version --client --short 2>/dev/null | tail -1)"
echo "$OUT"
