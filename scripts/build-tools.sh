#!/usr/bin/env bash
# Builds the operator's command-line tools the quickstart test (test/quickstart) runs as a
# reader would — the real kubectl and the real sops CLI — from the Go module proxy into a cache
# OUTSIDE the clone, and reuses them when present. Prints the tools' directory last.
#
#   GHCRSYNC_TOOLS   override the output directory
#   XDG_CACHE_HOME   default cache root (~/.cache)
set -euo pipefail

KUBECTL_VERSION=${KUBECTL_VERSION:-v1.37.2}   # the control plane's release
KUBECTL_MODULE=${KUBECTL_MODULE:-v0.37.2}      # k8s.io/kubectl's tag of that release
SOPS_VERSION=${SOPS_VERSION:-v3.13.3}          # the sops library go.mod pins
CACHE_ROOT=${XDG_CACHE_HOME:-$HOME/.cache}/ghcrsync/tools
OUT=${GHCRSYNC_TOOLS:-$CACHE_ROOT/operator-kubectl-$KUBECTL_VERSION-sops-$SOPS_VERSION}

log() { printf '[tools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ -x "$OUT/kubectl" ] && [ -x "$OUT/sops" ]; then
  log "cached in $OUT"
  echo "$OUT"
  exit 0
fi

mkdir -p "$OUT"
export GOWORK=off GOFLAGS=-mod=mod GO111MODULE=on CGO_ENABLED=0
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ghcrsync-tools.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

if [ ! -x "$OUT/sops" ]; then
  log "sops $SOPS_VERSION: compiling (about 2-4 min cold on 2 cores)"
  GOBIN="$WORK/bin" go install -trimpath -ldflags='-s -w' "github.com/getsops/sops/v3/cmd/sops@$SOPS_VERSION"
  mv "$WORK/bin/sops" "$OUT/sops"
fi

if [ ! -x "$OUT/kubectl" ]; then
  log "kubectl $KUBECTL_VERSION: resolving modules"
  mkdir -p "$WORK/kubectl" && cd "$WORK/kubectl"
  cat > main.go <<'GO'
// kubectl as k8s.io/kubernetes/cmd/kubectl builds it, from the k8s.io/kubectl module.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		util.CheckErr(err)
	}
}
GO
  go mod init ghcrsync.local/kubectl >/dev/null 2>&1
  go get "k8s.io/kubectl@$KUBECTL_MODULE" >/dev/null 2>&1
  go mod tidy >/dev/null 2>&1 || go mod tidy
  minor=$(echo "$KUBECTL_VERSION" | cut -d. -f2)
  ver="-X k8s.io/component-base/version.gitVersion=$KUBECTL_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  ver="$ver -X k8s.io/client-go/pkg/version.gitVersion=$KUBECTL_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  log "kubectl: compiling (about 3-5 min cold on 2 cores)"
  go build -trimpath -ldflags="-s -w $ver" -o "$OUT/kubectl.tmp" . && mv "$OUT/kubectl.tmp" "$OUT/kubectl"
fi
log "kubectl and sops in $OUT"
echo "$OUT"
