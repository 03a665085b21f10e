#!/usr/bin/env bash
# Builds the real control-plane binaries the sandbox runs (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler) from Go modules, into a cache OUTSIDE the clone,
# and reuses them when present. Prints the binary directory on its last line.
#
#   GHCRSYNC_CONTROL_PLANE_DIR  override the output directory
#   XDG_CACHE_HOME              default cache root (~/.cache)
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
STAGING_VERSION=${STAGING_VERSION:-v0.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
K8S_MINOR=$(echo "$K8S_VERSION" | cut -d. -f2)

CACHE_ROOT=${XDG_CACHE_HOME:-$HOME/.cache}/ghcrsync/control-plane
OUT=${GHCRSYNC_CONTROL_PLANE_DIR:-$CACHE_ROOT/k8s-$K8S_VERSION-etcd-$ETCD_VERSION}
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler)

log() { printf '[control-plane %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

missing=()
for b in "${BINARIES[@]}"; do [ -x "$OUT/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then
  log "cached in $OUT"
  echo "$OUT"
  exit 0
fi
log "building ${missing[*]} into $OUT (cold build: 20-30 min on 2 cores)"
mkdir -p "$OUT"

# The throw-away modules live beside the cache, never in the clone, and ignore the
# project's workspace and flags.
export GOWORK=off GOFLAGS=-mod=mod GO111MODULE=on CGO_ENABLED=0
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ghcrsync-cp.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

need() { for b in "${missing[@]}"; do [ "$b" = "$1" ] && return 0; done; return 1; }

if need etcd; then
  log "etcd $ETCD_VERSION: resolving modules"
  mkdir -p "$WORK/etcd" && cd "$WORK/etcd"
  cat > main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  go mod init ghcrsync.local/etcd >/dev/null 2>&1
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null 2>&1
  go mod tidy >/dev/null 2>&1
  log "etcd: compiling"
  go build -trimpath -ldflags='-s -w' -o "$OUT/etcd.tmp" . && mv "$OUT/etcd.tmp" "$OUT/etcd"
  log "etcd: done"
fi

k8s=()
for b in kube-apiserver kube-controller-manager kube-scheduler; do need "$b" && k8s+=("$b"); done
if [ ${#k8s[@]} -gt 0 ]; then
  log "kubernetes $K8S_VERSION: resolving modules"
  mkdir -p "$WORK/k8s" && cd "$WORK/k8s"
  go mod init ghcrsync.local/k8s >/dev/null 2>&1
  modfile=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  # Every staging module k8s.io/kubernetes replaces with ./staging/... is pinned to its release.
  {
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo "replace ("
    sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\t\1 => \1 '"$STAGING_VERSION"'#p' "$modfile"
    echo ")"
  } >> go.mod
  grep -m1 '^godebug' "$modfile" >> go.mod || true
  for b in "${k8s[@]}"; do
    mkdir -p "$b"
    cat > "$b/main.go" <<GO
package main

import _ "k8s.io/kubernetes/cmd/$b/app"

func main() {}
GO
  done
  # Resolve with placeholder importers, then write the real mains.
  go mod tidy >/dev/null 2>&1 || go mod tidy
  for b in "${k8s[@]}"; do
    case $b in
      kube-apiserver) ctor='app.NewAPIServerCommand()' ;;
      kube-controller-manager) ctor='app.NewControllerManagerCommand()' ;;
      kube-scheduler) ctor='app.NewSchedulerCommand()' ;;
    esac
    cat > "$b/main.go" <<GO
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/$b/app"
)

func main() { os.Exit(cli.Run($ctor)) }
GO
  done
  go mod tidy >/dev/null 2>&1 || go mod tidy
  ver="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$K8S_MINOR -X k8s.io/component-base/version.gitTreeState=clean"
  for b in "${k8s[@]}"; do
    log "$b: compiling"
    go build -trimpath -ldflags="-s -w $ver" -o "$OUT/$b.tmp" "./$b" && mv "$OUT/$b.tmp" "$OUT/$b"
    log "$b: done"
  done
fi
log "all binaries in $OUT"
echo "$OUT"
