#!/usr/bin/env bash
# install-runtime.sh: Debian's containerd, runc and CNI plugins for the sandbox's real nodes
# (internal/sandbox/containerd), installed once with apt-get. It never fails the build: where it
# cannot install (not root, no apt-get), it says so and the tests that need them skip, saying why.
set -uo pipefail

if command -v containerd >/dev/null && command -v runc >/dev/null && [ -x /usr/lib/cni/bridge ]; then
	echo "runtime: $(containerd --version | awk '{print $1, $3}'), $(runc --version | head -1)"
	exit 0
fi

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
	echo "runtime: SKIPPED: containerd and runc are not installed and this is not a root Debian machine (apt-get install containerd runc); the real-runtime tests will skip"
	exit 0
fi

echo "runtime: installing Debian's containerd, runc and CNI plugins (apt-get, once)"
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y --no-install-recommends containerd runc containernetworking-plugins >/tmp/ghcrsync-install-runtime.log 2>&1; then
	apt-get update >>/tmp/ghcrsync-install-runtime.log 2>&1
	apt-get install -y --no-install-recommends containerd runc containernetworking-plugins >>/tmp/ghcrsync-install-runtime.log 2>&1 ||
		{ echo "runtime: apt-get install containerd runc failed (/tmp/ghcrsync-install-runtime.log); the real-runtime tests will skip"; exit 0; }
fi

# The package enables a system containerd; the sandbox runs its own, one per node.
echo "runtime: $(containerd --version | awk '{print $1, $3}'), $(runc --version | head -1)"
