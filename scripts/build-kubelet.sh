#!/usr/bin/env bash
# Builds the real kubelet the sandbox's real nodes run, from Go modules, into a cache OUTSIDE
# the clone, and reuses it when present. Prints the binary's path on its last line.
#
# The version: 1.35, not the control plane's 1.37. This machine has Debian's containerd 1.6 and
# cgroup v1; Kubernetes 1.35 is the last release whose kubelet supports containerd 1.x, and it
# runs on cgroup v1 when told to (failCgroupV1: false; 1.36+ drop containerd 1.x). A 1.35 kubelet
# against a 1.37 API server is within the version skew policy (the kubelet may be up to three
# minor versions older).
#
#   GHCRSYNC_KUBELET   override the output path
set -euo pipefail

K8S_VERSION=${KUBELET_VERSION:-v1.35.4}
STAGING_VERSION=${KUBELET_STAGING_VERSION:-v0.35.4}
K8S_MINOR=$(echo "$K8S_VERSION" | cut -d. -f2)
OUT=${GHCRSYNC_KUBELET:-${XDG_CACHE_HOME:-$HOME/.cache}/ghcrsync/kubelet/$K8S_VERSION/kubelet}

log() { printf '[kubelet %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ -x "$OUT" ]; then
	log "cached: $OUT"
	echo "$OUT"
	exit 0
fi

log "building kubelet $K8S_VERSION into $OUT (cold build: 8-15 min on 2 cores)"
mkdir -p "$(dirname "$OUT")"
export GOWORK=off GOFLAGS=-mod=mod GO111MODULE=on CGO_ENABLED=0
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ghcrsync-kubelet.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"

go mod init ghcrsync.local/kubelet >/dev/null 2>&1
modfile=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
{
	echo "require k8s.io/kubernetes $K8S_VERSION"
	echo "replace ("
	sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\t\1 => \1 '"$STAGING_VERSION"'#p' "$modfile"
	echo ")"
} >>go.mod
grep -m1 '^godebug' "$modfile" >>go.mod || true

cat >main.go <<'GO'
package main

import _ "k8s.io/kubernetes/cmd/kubelet/app"

func main() {}
GO
go mod tidy >/dev/null 2>&1 || go mod tidy

cat >main.go <<'GO'
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() { os.Exit(cli.Run(app.NewKubeletCommand(context.Background()))) }
GO
go mod tidy >/dev/null 2>&1 || go mod tidy

ver="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$K8S_MINOR -X k8s.io/component-base/version.gitTreeState=clean"
log "compiling"
go build -trimpath -ldflags="-s -w $ver" -o "$OUT.tmp" . && mv "$OUT.tmp" "$OUT"
log "done"
echo "$OUT"
