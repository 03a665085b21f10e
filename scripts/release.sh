#!/usr/bin/env bash
# release.sh VERSION: `make release`. Builds ghcrsync for each of PLATFORMS (static, -trimpath,
# the version stamped in), then in dist/: a reproducible .tar.gz per platform (the binary,
# LICENSE, README.md), a CycloneDX SBOM of the modules compiled in (cyclonedx-gomod, built once
# from the module proxy into ~/.cache/ghcrsync/tools), an in-toto SLSA provenance statement
# (cmd/ghcrsync-release), and SHA256SUMS over all of them. It publishes nothing:
# docs/workflows/release.yml does, from a team's fork.
set -euo pipefail

version=${1:?usage: release.sh VERSION}
platforms=${PLATFORMS:-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64}
go=${GO:-go}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/ghcrsync/tools
cyclonedx_version=v1.10.0
cyclonedx=$cache/cyclonedx-gomod-$cyclonedx_version/cyclonedx-gomod
started=$(date +%s)

commit=$(git rev-parse HEAD)
# The archives' dates: the commit's, so that the same commit gives the same bytes.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}

# Where the source is, never with the credentials a remote URL may carry.
if [ -n "${GITHUB_REPOSITORY:-}" ]; then
	repository="git+${GITHUB_SERVER_URL:-https://github.com}/$GITHUB_REPOSITORY"
else
	repository="git+$(git remote get-url origin 2>/dev/null | sed -E 's#://[^/@]*@#://#' || true)"
fi

rm -rf dist && mkdir -p dist/bin

for p in $platforms; do
	os=${p%/*} arch=${p#*/}
	out=dist/bin/ghcrsync_${version}_${os}_${arch}
	echo "release: build $out"
	GOOS=$os GOARCH=$arch CGO_ENABLED=0 "$go" build -trimpath -ldflags "-s -w -X main.version=$version" -o "$out" ./cmd/ghcrsync
done

if [ ! -x "$cyclonedx" ]; then
	echo "release: building cyclonedx-gomod $cyclonedx_version once into $(dirname "$cyclonedx")"
	GOBIN=$(dirname "$cyclonedx") "$go" install "github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@$cyclonedx_version"
fi

# One SBOM for the modules of every platform: ghcrsync compiles the same modules on each (no
# platform-specific dependency); -std names the Go release, whose fixes a scanner looks for.
CGO_ENABLED=0 "$cyclonedx" app -json -noserial -std -main cmd/ghcrsync -output "dist/ghcrsync_${version}.cdx.json" . 2>&1 |
	grep -v '^$' | sed 's/^/release: cyclonedx-gomod: /' >&2 || true
if [ ! -s "dist/ghcrsync_${version}.cdx.json" ]; then
	echo "release: the SBOM was not written (cyclonedx-gomod needs a git clone, not a worktree or a tarball)" >&2
	exit 1
fi

"$go" run ./cmd/ghcrsync-release --version "$version" --commit "$commit" --repository "$repository" \
	--started "$started" --dist dist --binaries dist/bin
rm -rf dist/bin
(cd dist && sha256sum --check --quiet SHA256SUMS)
cat dist/SHA256SUMS
