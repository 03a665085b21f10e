#!/usr/bin/env bash
# build-image.sh IMAGE VERSION: builds the Dockerfile's image, tagged IMAGE:VERSION (make image:
# IMAGE defaults to ghcrsync), with the first container builder found (docker, podman, buildah)
# and checks the image runs --version.
# Without one it says so and exits 0: the image is not part of `make test`.
set -euo pipefail

image=${1:-ghcrsync}
version=${2:-dev}

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
buildah) buildah bud --build-arg VERSION="$version" -t "$image:$version" . ;;
*) "$builder" build --build-arg VERSION="$version" -t "$image:$version" . ;;
esac

if [ "$builder" != buildah ]; then
	"$builder" run --rm "$image:$version" --version
fi
