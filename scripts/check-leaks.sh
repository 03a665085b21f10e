#!/usr/bin/env bash
# Fails if any sandbox process is still running: a control-plane binary from the cache, or a
# ghcrsync-sandbox / test binary that owns a sandbox.
set -uo pipefail
cp_dir=${GHCRSYNC_CONTROL_PLANE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ghcrsync/control-plane}
cp_root=$(dirname "$cp_dir")
leaks=()
for p in /proc/[0-9]*; do
  pid=${p#/proc/}
  [ "$pid" = "$$" ] && continue
  exe=$(readlink "$p/exe" 2>/dev/null) || continue
  state=$(awk '{print $3}' "$p/stat" 2>/dev/null)
  [ "$state" = "Z" ] && continue
  case "$exe" in
    "$cp_root"/*|*/ghcrsync-sandbox|*/ghcrsync/cluster-autoscaler/*|*/ghcrsync/kubelet/*) leaks+=("$pid $exe") ;;
    # A sandbox node's real containerd runs with a config under a test's temporary folder.
    */containerd)
      case "$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null)" in *"--config /tmp/"*) leaks+=("$pid $exe") ;; esac ;;
  esac
done
if [ ${#leaks[@]} -gt 0 ]; then
  echo "check-leaks: sandbox processes still running:" >&2
  printf '  %s\n' "${leaks[@]}" >&2
  exit 1
fi
echo "check-leaks: no sandbox process left running"
