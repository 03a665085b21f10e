#!/usr/bin/env bash
# check-build.sh BINARY VERSION: the shipped binary is statically linked (no ELF interpreter,
# no dynamic section) and reports the version it was built with.
set -euo pipefail

bin=$1 want=$2

if command -v file >/dev/null; then
	desc=$(file -L "$bin")
	case $desc in
	*"statically linked"*) ;;
	*) echo "check-build: $bin is not statically linked: $desc" >&2; exit 1 ;;
	esac
fi

# Independent of file(1): a dynamically linked ELF has a PT_INTERP program header.
if LC_ALL=C readelf -lW "$bin" 2>/dev/null | grep -q "INTERP"; then
	echo "check-build: $bin has an ELF interpreter (dynamically linked)" >&2
	exit 1
fi

got=$("$bin" --version)
if [ "$got" != "ghcrsync $want" ]; then
	echo "check-build: $bin --version printed \"$got\", want \"ghcrsync $want\"" >&2
	exit 1
fi

size=$(du -m "$bin" | cut -f1)
echo "check-build: $bin static, $got, ${size} MiB"
