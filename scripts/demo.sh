#!/usr/bin/env bash
# `make demo`: bring the sandbox up, show the fleet, and shut it down cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d "${TMPDIR:-/tmp}/ghcrsync-demo.XXXXXX")
cleanup() {
  bin/ghcrsync-sandbox down --dir "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT

# REAL_NODES=N: the first N workers run a real kubelet and containerd (make runtime kubelet).
real_nodes=${REAL_NODES:-0}
echo "==> Starting the sandbox (3 control planes, 3 workers ($real_nodes real), 2 autoscaled; Talos 1.13)"
bin/ghcrsync-sandbox up --dir "$dir" --detach --heartbeat 1s --reboot 2s --autoscaler-interval 3s --autoscaler-scale-rate 0 \
  --real-nodes "$real_nodes"
# shellcheck disable=SC1091
source "$dir/env"
echo
echo "==> ghcrsync plan (read-only) against the sandbox"
bin/ghcrsync plan --config "$dir/ghcrsync.hcl" --out "$dir/rotation.plan"
echo
echo "==> ghcrsync apply: fence, reboot and prove each node (the autoscaler keeps churning meanwhile)"
bin/ghcrsync apply --config "$dir/ghcrsync.hcl" --log-level warn "$dir/rotation.plan"
echo
echo "==> The autoscaler adds a machine: it boots from the node template apply rotated"
bin/ghcrsync-sandbox ctl --dir "$dir" scale-up
echo
echo "==> ghcrsync plan again (the new machine included: no changes)"
bin/ghcrsync plan --config "$dir/ghcrsync.hcl" --detailed-exitcode
echo
echo "==> The fleet after the rotation"
bin/ghcrsync-sandbox status --dir "$dir"
echo
echo "==> Safety counters (unsafe_writes must be 0)"
bin/ghcrsync-sandbox ctl --dir "$dir" stats
echo
echo "==> Stopping the sandbox"
bin/ghcrsync-sandbox down --dir "$dir"
trap - EXIT
rm -rf "$dir"
scripts/check-leaks.sh
