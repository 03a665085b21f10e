#!/usr/bin/env bash
# build-image.sh VERSION: builds the Dockerfile's image (ghcrsync:VERSION) with the first
# container builder found (docker, podman, buildah) and checks the image runs --version.
# Without one it says so and exits 0: the image is not part of `make test`.
set -euo pipefail

version=${1:-dev}

for b in docker podman buildah; do
	if command -v "$b" >/dev/null 2>&1; then
		builder=$b
		break
	fi
done

if [ -z "${builder:-}" ]; then
	echo "build-image: SKIPPED: no container builder (docker, podman or buildah) on this machine"
	exit 0
fi

case $builder in
buildah) buildah bud --build-arg VERSION="$version" -t "ghcrsync:$version" . ;;
*) "$builder" build --build-arg VERSION="$version" -t "ghcrsync:$version" . ;;
esac

if [ "$builder" != buildah ]; then
	"$builder" run --rm "ghcrsync:$version" --version
fi
