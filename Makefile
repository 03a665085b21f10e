# ghcrsync — see README.md. Two commands do all set-up: `make demo` and `make test`.

GO       ?= go
BIN      := bin
# Control-plane binaries are cached outside the clone (CI runs in a fresh clone).
export GHCRSYNC_CONTROL_PLANE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ghcrsync/control-plane/k8s-v1.37.2-etcd-v3.6.16
# The real talosctl the sandbox's fidelity test drives (built once, outside the clone).
export GHCRSYNC_TALOSCTL ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ghcrsync/talosctl/v1.13.9/talosctl

.PHONY: all build control-plane talosctl test unit demo bench vet check-leaks clean chaos fuzz

all: build

build:
	$(GO) build -o $(BIN)/ghcrsync ./cmd/ghcrsync
	$(GO) build -o $(BIN)/ghcrsync-sandbox ./cmd/ghcrsync-sandbox

# Builds etcd, kube-apiserver, kube-controller-manager and kube-scheduler once (20-30 min
# cold on 2 cores), then reuses them.
control-plane:
	@scripts/build-control-plane.sh >/dev/null

# Builds the real talosctl v1.13.9 from the module proxy (3-8 min cold), then reuses it.
talosctl:
	@scripts/build-talosctl.sh >/dev/null

vet:
	$(GO) vet ./...

# All tests, including the sandbox ones (a real control plane per test package, and the real
# talosctl against the simulated machines), then a check that no sandbox process outlived them.
test: control-plane talosctl vet
	$(GO) test -count=1 -timeout 40m ./...
	@FUZZTIME=3s scripts/fuzz.sh
	@scripts/check-leaks.sh

# The seeded chaos campaign on the sandbox (docs/reliability.md): `make chaos SEEDS=200`,
# `make chaos SEED=N` replays one seed, `SEED_BASE=N SEEDS=K` runs K seeds from N. Without
# SEED/SEEDS it runs the fixed seeds `make test` runs. CHAOS_DIR keeps every seed's files.
chaos: control-plane
	SEED=$(SEED) SEEDS=$(SEEDS) SEED_BASE=$(SEED_BASE) CHAOS_DIR=$(CHAOS_DIR) \
		$(GO) test -count=1 -timeout 4h -run '^TestChaos$$' -v ./test/chaos
	@scripts/check-leaks.sh

# Every fuzz target for FUZZTIME (default 5m) each; `make test` runs them for 3 s each.
fuzz:
	@FUZZTIME=$(or $(FUZZTIME),5m) scripts/fuzz.sh

# Tests that need no sandbox.
unit: vet
	$(GO) test -count=1 -short ./...

# The main job on the local sandbox.
demo: control-plane build
	@scripts/demo.sh

# Benchmarks of the pure hot paths (packages with a sandbox TestMain are left out: they would
# start a control plane for nothing).
BENCH_PKGS ?= ./plan

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(BENCH_PKGS)

check-leaks:
	@scripts/check-leaks.sh

clean:
	rm -rf $(BIN)
