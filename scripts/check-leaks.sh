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
    "$cp_root"/*|*/ghcrsync-sandbox|*/ghcrsync/cluster-autoscaler/*|*/ghcrsync/kubelet/*|*/ghcrsync/flux/*) leaks+=("$pid $exe") ;;
    # A sandbox node's real containerd runs with a config under a test's temporary folder.
    */containerd)
      case "$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null)" in *"--config /tmp/"*) leaks+=("$pid $exe") ;; esac ;;
  esac
done
# A real node's address on lo, its pod bridge, its files (internal/sandbox/realnode.go).
if command -v ip >/dev/null; then
  while read -r a; do leaks+=("address $a on lo (a real node's)"); done < <(ip -o -4 addr show dev lo 2>/dev/null | awk '$4 ~ /^198\.18\./ {print $4}')
  while read -r b; do leaks+=("bridge $b (a real node's pod network)"); done < <(ip -o link show 2>/dev/null | awk -F': ' '$2 ~ /^ghcrsync[0-9]+(@|$)/ {print $2}')
fi
for d in "${TMPDIR:-/tmp}"/ghcrsync-node-*; do [ -e "$d" ] && leaks+=("folder $d (a real node's)"); done
# A test package's ghcrsync binary (sandboxtest.Binary): 140 MB each, kept they fill the disk.
for d in "${TMPDIR:-/tmp}"/ghcrsync-bin-*; do [ -e "$d" ] && leaks+=("folder $d (a test package's ghcrsync binary)"); done
if [ ${#leaks[@]} -gt 0 ]; then
  echo "check-leaks: sandbox processes still running:" >&2
  printf '  %s\n' "${leaks[@]}" >&2
  exit 1
fi
echo "check-leaks: no sandbox process left running"
