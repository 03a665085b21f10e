#!/usr/bin/env bash
# Builds the real Kubernetes cluster-autoscaler (1.33.0, Hetzner provider only) from the Go
# module proxy into a cache OUTSIDE the clone, and reuses it when present. Prints the binary's
# path on its last line. The sandbox runs it against a fake Hetzner Cloud API
# (`ghcrsync-sandbox up --autoscaler real`, docs/sandbox.md).
#
# Why these pins (the proxy serves only this release of the module, as a pseudo-version):
#   cluster-autoscaler 1.33.0 = v0.0.0-20250613073258-1959f5f61f6c (no checksum-database record:
#     its two go.sum lines are pinned below, checked against the upstream tree);
#   its apis module: the served pseudo-version whose sources equal 1.33.0's apis/;
#   k8s.io/kubernetes v1.33.1 with every staging module pinned to v0.33.1.
# No `go mod tidy`: tidy considers every provider's build tag and one of them is not resolvable.
#
#   GHCRSYNC_CLUSTER_AUTOSCALER  override the binary's path
#   XDG_CACHE_HOME               default cache root (~/.cache)
set -euo pipefail

CA_VERSION=1.33.0
CA_MODULE=k8s.io/autoscaler/cluster-autoscaler
CA_PSEUDO=v0.0.0-20250613073258-1959f5f61f6c
CA_APIS=v0.0.0-20240830133931-adfbe7e45277
K8S_VERSION=v1.33.1
STAGING_VERSION=v0.33.1

CACHE_ROOT=${XDG_CACHE_HOME:-$HOME/.cache}/ghcrsync/cluster-autoscaler
BIN=${GHCRSYNC_CLUSTER_AUTOSCALER:-$CACHE_ROOT/ca-$CA_VERSION-hetzner/cluster-autoscaler}

log() { printf '[cluster-autoscaler %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ -x "$BIN" ]; then
  log "cached at $BIN"
  echo "$BIN"
  exit 0
fi
log "building $CA_VERSION (-tags hetzner) into $BIN (cold build: 5-7 min on 2 cores)"
mkdir -p "$(dirname "$BIN")"

export GOWORK=off GOFLAGS=-mod=mod GO111MODULE=on CGO_ENABLED=0
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ghcrsync-ca.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
go mod init ghcrsync.local/cluster-autoscaler >/dev/null 2>&1
modfile=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
{
  echo "require ("
  echo "	$CA_MODULE $CA_PSEUDO"
  echo "	$CA_MODULE/apis $CA_APIS"
  echo "	k8s.io/kubernetes $K8S_VERSION"
  echo ")"
  echo "replace ("
  sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\t\1 => \1 '"$STAGING_VERSION"'#p' "$modfile"
  echo ")"
} >> go.mod
cat > go.sum <<SUM
$CA_MODULE $CA_PSEUDO h1:gGUthCoel/TlD1fh33foTFCs1n75w8sqmpD3qf2zqk4=
$CA_MODULE $CA_PSEUDO/go.mod h1:/1vry++ARaSAifwfBxWxGejNkgroz+/N8HyI0Xo7F8U=
SUM
log "compiling"
go build -tags hetzner -trimpath -ldflags='-s -w' -o "$BIN.tmp" "$CA_MODULE"
mv "$BIN.tmp" "$BIN"
log "done: $BIN"
echo "$BIN"
