# The two commands a newcomer needs: `make demo` and `make test`. CI runs `.ci/run`, which runs
# `make test`. Caches (cargo target dir, Kubernetes binaries) live outside the clone.
SHELL := /bin/bash
export GPU_EXTENDER_CACHE ?= $(HOME)/.cache/gpu-extender
export CARGO_TARGET_DIR ?= $(GPU_EXTENDER_CACHE)/target
CARGO ?= cargo

.PHONY: demo test lint unit e2e k8s-bins build bench fuzz fuzz-smoke

## demo: local control plane + extender + kube-scheduler + sample GPU pods; prints placements.
demo: build k8s-bins
	scripts/demo.sh

## test: formatting, lints, unit/integration tests, the end-to-end scenarios, and a short
## bounded run of every fuzz target.
test: lint k8s-bins
	GPU_EXTENDER_K8S_BIN="$$(scripts/k8s-bins.sh | tail -n1)" GPU_EXTENDER_E2E=require \
		$(CARGO) test --locked --all-targets
	$(MAKE) fuzz-smoke

## lint: formatting, clippy, and no import cycle between the library's modules (cargo-modules,
## installed into the cache on first use; the layer order is checked by tests/architecture.rs).
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --all-targets -- -D warnings
	scripts/module-graph.sh

## unit: the tests that need no control plane (end-to-end tests skip with a message).
unit:
	$(CARGO) test --locked --all-targets

build:
	$(CARGO) build --locked --release --bin gpu-extender

k8s-bins:
	scripts/k8s-bins.sh >/dev/null

bench:
	$(CARGO) bench --locked

## fuzz: every cargo-fuzz target for FUZZ_SECONDS (default 60) each, on nightly (scripts/fuzz.sh).
fuzz:
	scripts/fuzz.sh

## fuzz-smoke: every fuzz target for 15 s on the default toolchain, no sanitizer, new inputs
## discarded (part of `make test`; the saved corpus also replays in `cargo test`).
fuzz-smoke:
	FUZZ_SANITIZER=none FUZZ_SECONDS=$${FUZZ_SECONDS:-15} FUZZ_SCRATCH=1 scripts/fuzz.sh
