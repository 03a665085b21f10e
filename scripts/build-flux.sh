#!/usr/bin/env bash
# Builds the real Flux source-controller and kustomize-controller (v1.9.6, the newest release
# the Go module proxy serves that builds with this machine's Go 1.26) from the module proxy into
# a cache OUTSIDE the clone, with their CRDs beside them, and reuses them when present. Prints
# the cache directory on its last line. The sandbox runs them against its API server
# (`ghcrsync-sandbox up --flux real`, docs/sandbox.md).
#
# How: each controller's module is downloaded and built as the main module (so its own replace
# directives hold), but for the replace of its api/ folder — a module of its own, which the
# module zip leaves out: the published api module of the same version is required instead. One
# dependency's version is not served by the proxy: source-controller's github.com/fluxcd/pkg/artifact
# v0.18.3 is built at v0.18.0, the newest v0.18 patch it serves (the same API).
#
#   FLUX_ONLY=download   download the modules and stop (a warm module cache, little CPU)
#   XDG_CACHE_HOME       default cache root (~/.cache)
set -euo pipefail

FLUX_VERSION=v1.9.6
CONTROLLERS=(source-controller kustomize-controller)

CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/ghcrsync/flux/$FLUX_VERSION

log() { printf '[flux %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

built() {
  for c in "${CONTROLLERS[@]}"; do [ -x "$CACHE/$c" ] || return 1; done
  [ -d "$CACHE/crds" ]
}

if built; then
  log "cached at $CACHE"
  echo "$CACHE"
  exit 0
fi

export GOWORK=off GOFLAGS=-mod=mod GO111MODULE=on CGO_ENABLED=0 GOTOOLCHAIN=local
mkdir -p "$CACHE/crds"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ghcrsync-flux.XXXXXX")
trap 'chmod -R u+w "$WORK" 2>/dev/null; rm -rf "$WORK"' EXIT

for c in "${CONTROLLERS[@]}"; do
  [ -x "$CACHE/$c" ] && continue
  module=github.com/fluxcd/$c
  src=$(go mod download -json "$module@$FLUX_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [ -n "$src" ] || { log "the module proxy did not serve $module@$FLUX_VERSION"; exit 1; }
  cp -r "$src" "$WORK/$c"
  chmod -R u+w "$WORK/$c"
  cp "$WORK/$c"/config/crd/bases/*.yaml "$CACHE/crds/"
  (
    cd "$WORK/$c"
    go mod edit -dropreplace "$module/api" -require "$module/api@$FLUX_VERSION"
    if [ "$c" = source-controller ]; then
      go mod edit -replace github.com/fluxcd/pkg/artifact=github.com/fluxcd/pkg/artifact@v0.18.0
    fi
    log "$c: downloading the modules it builds from"
    go list -deps . >/dev/null
    [ "${FLUX_ONLY:-}" = download ] && exit 0
    log "$c: compiling (cold: several minutes on 2 cores)"
    go build -trimpath -ldflags='-s -w' -o "$CACHE/$c.tmp" .
    mv "$CACHE/$c.tmp" "$CACHE/$c"
    log "$c: done"
  )
done

[ "${FLUX_ONLY:-}" = download ] && { log "modules downloaded"; exit 0; }
log "done: $CACHE"
echo "$CACHE"
