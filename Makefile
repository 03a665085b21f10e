# ghcrsync — see README.md. Two commands do all set-up: `make demo` and `make test`.

GO       ?= go
BIN      := bin
# make test: packages at a time, and the processes the apply package's sandbox tests split over
# (1: none; scripts/test.sh says why more does not pay on 2 cores).
TEST_P       ?= 2
APPLY_SHARDS ?= 1
# Control-plane binaries are cached outside the clone (CI runs in a fresh clone).
export GHCRSYNC_CONTROL_PLANE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ghcrsync/control-plane/k8s-v1.37.2-etcd-v3.6.16
# The real talosctl the sandbox's fidelity test drives (built once, outside the clone).
export GHCRSYNC_TALOSCTL ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ghcrsync/talosctl/v1.13.9/talosctl
# The real cluster-autoscaler (Hetzner provider) of `--autoscaler real` (built once, outside the clone).
export GHCRSYNC_CLUSTER_AUTOSCALER ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ghcrsync/cluster-autoscaler/ca-1.33.0-hetzner/cluster-autoscaler
# The static binary of the images a sandbox's real nodes run (pause, and the probe's entrypoint).
export GHCRSYNC_PAUSE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ghcrsync/pause/pause

.PHONY: all build release control-plane talosctl cluster-autoscaler flux runtime kubelet tools test unit demo bench vet check-leaks check-build clean chaos fuzz

all: build

# The version: the VCS tag (or commit) the binary is built from.
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo unknown)
# Static (no cgo), reproducible paths, stripped, with the version stamped in.
GOBUILD  := CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)"
PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64

build:
	$(GOBUILD) -o $(BIN)/ghcrsync ./cmd/ghcrsync
	$(GOBUILD) -o $(BIN)/ghcrsync-sandbox ./cmd/ghcrsync-sandbox

# dist/: a reproducible .tar.gz per platform, the multi-platform image of the linux ones (an
# OCI archive: no base image, no builder needed), a CycloneDX SBOM, an in-toto SLSA provenance
# statement and SHA256SUMS (scripts/release.sh; docs/release.md publishes them).
release:
	@PLATFORMS="$(PLATFORMS)" GO="$(GO)" scripts/release.sh $(VERSION)

# The shipped binary is static and reports its version.
check-build: build
	@scripts/check-build.sh $(BIN)/ghcrsync $(VERSION)

# Builds etcd, kube-apiserver, kube-controller-manager and kube-scheduler once (20-30 min
# cold on 2 cores), then reuses them.
control-plane:
	@scripts/build-control-plane.sh >/dev/null

# Builds the real talosctl v1.13.9 from the module proxy (3-8 min cold), then reuses it.
talosctl:
	@scripts/build-talosctl.sh >/dev/null

# Builds the real cluster-autoscaler 1.33.0 with only its Hetzner provider (3-7 min cold), then
# reuses it: the sandbox's `--autoscaler real` and test/autoscaler run it.
cluster-autoscaler:
	@scripts/build-cluster-autoscaler.sh >/dev/null

# Flux's source-controller and kustomize-controller v1.9.6 with their CRDs (the sandbox's `--flux
# real`, test/flux), built once from the module proxy into ~/.cache/ghcrsync/flux, then reused.
flux:
	@scripts/build-flux.sh >/dev/null

# The operator's tools the quickstart test runs as a reader does: the real kubectl and sops CLI
# (1-6 min cold), into ~/.cache/ghcrsync/tools, then reused.
export GHCRSYNC_TOOLS ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ghcrsync/tools/operator-kubectl-v1.37.2-sops-v3.13.3
tools:
	@scripts/build-tools.sh >/dev/null

# A real container runtime for the sandbox's real-runtime tests: Debian's containerd and runc,
# installed with apt-get when missing (as root). Without root or apt it says so; the tests that
# need it then skip, saying why.
runtime:
	@scripts/install-runtime.sh

# The real kubelet of the sandbox's real nodes: 1.35, the last release that runs on containerd
# 1.x (scripts/build-kubelet.sh says why), built once into ~/.cache/ghcrsync/kubelet; and the
# static binary of the images they run (seconds: rebuilt every time, so never stale).
kubelet:
	@scripts/build-kubelet.sh >/dev/null
	@CGO_ENABLED=0 $(GO) build -trimpath -o $(GHCRSYNC_PAUSE) ./internal/sandbox/containerd/pause

vet:
	$(GO) vet ./...

# All tests, including the sandbox ones (a real control plane per test package, and the real
# talosctl against the simulated machines), then a check that no sandbox process outlived them.
# scripts/test.sh runs TEST_P packages at a time; APPLY_SHARDS=n > 1 splits the apply package's
# sandbox tests over n processes beside them, for a machine with more cores.
test: control-plane talosctl cluster-autoscaler flux runtime kubelet tools vet check-build
	GHCRSYNC_REAL_RUNTIME=$$(command -v containerd >/dev/null && [ "$$(id -u)" = 0 ] && echo required) \
		GO=$(GO) TEST_P=$(TEST_P) APPLY_SHARDS=$(APPLY_SHARDS) scripts/test.sh
	@FUZZTIME=3s scripts/fuzz.sh
	@scripts/check-leaks.sh

# The seeded chaos campaign on the sandbox (docs/reliability.md): `make chaos SEEDS=200`,
# `make chaos SEED=N` replays one seed, `SEED_BASE=N SEEDS=K` runs K seeds from N. Without
# SEED/SEEDS it runs the fixed seeds `make test` runs. CHAOS_DIR keeps every seed's files.
# AUTOSCALER=real runs the campaign against the real cluster-autoscaler.
chaos: control-plane cluster-autoscaler
	SEED=$(SEED) SEEDS=$(SEEDS) SEED_BASE=$(SEED_BASE) CHAOS_DIR=$(CHAOS_DIR) AUTOSCALER=$(AUTOSCALER) \
		$(GO) test -count=1 -timeout 4h -run '^TestChaos$$' -v ./test/chaos
	@scripts/check-leaks.sh

# Every fuzz target for FUZZTIME (default 5m) each; `make test` runs them for 3 s each.
fuzz:
	@FUZZTIME=$(or $(FUZZTIME),5m) scripts/fuzz.sh

# Tests that need no sandbox.
unit: vet
	$(GO) test -count=1 -short ./...

# The main job on the local sandbox.
demo: control-plane build $(if $(filter-out 0,$(REAL_NODES)),runtime kubelet)
	@REAL_NODES=$(REAL_NODES) scripts/demo.sh

# Every benchmark in one go (scripts/bench.sh): the pure hot paths (BENCH_PKGS; packages with a
# sandbox TestMain are left out: they would start a control plane for nothing), plan at 10 / 100
# / 1,000 nodes with 0 and 25 ms Talos latency beside the one-process-per-question way, live
# apply at 100 nodes, apply with reboots at k = 1, 3, 10. Writes bench/results.json and the
# tables in docs/performance.md.
BENCH_PKGS ?= ./plan

bench: control-plane talosctl build
	@BENCH_PKGS="$(BENCH_PKGS)" GO=$(GO) scripts/bench.sh

check-leaks:
	@scripts/check-leaks.sh

clean:
	rm -rf $(BIN) dist
