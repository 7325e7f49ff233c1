# The two commands a newcomer needs: `make demo` and `make test`. CI runs `.ci/run`, which runs
# `make test`. Caches (cargo target dir, Kubernetes binaries) live outside the clone.
SHELL := /bin/bash
export GPU_TEST_CACHE ?= $(HOME)/.cache/gpu-extender
export CARGO_TARGET_DIR ?= $(GPU_TEST_CACHE)/target
CARGO ?= cargo

.PHONY: demo image test test-e2e test-karmada test-traces test-go lint unit e2e k8s-bins autoscaler-bins karmada-bins build bench fuzz fuzz-smoke

## demo: local control plane + extender + kube-scheduler + sample GPU pods; prints placements and
## what each pod shows. scripts/demo.sh builds the extender and the Kubernetes binaries itself.
demo:
	scripts/demo.sh

## test: formatting, lints, the unit and integration tests, the doc tests, the tiers that need
## something outside the clone (run with --ignored: a plain `cargo test` counts them as ignored,
## never as passed), and a short bounded run of every fuzz target. The end-to-end tier is
## required (GPU_TEST_E2E=require, the default here): its binaries are built first, and a
## scenario that cannot run fails. The trace tier runs when the openb traces are at
## ../shared/traces/openb and the Go tier when Go is installed; otherwise each says SKIPPED, which fails
## `make test` under GPU_TEST_TRACES=require or GPU_TEST_GO=require.
export GPU_TEST_E2E ?= require
TRACES := ../shared/traces/openb
GO ?= $(shell command -v go || { test -x /usr/local/go/bin/go && echo /usr/local/go/bin/go; })
## The test tooling (scripts/test-tooling.sh: the Go-built binaries, cargo-fuzz and the fuzz
## targets) builds in the background from the start, in a process group of its own that is
## stopped if a step fails; its log is in the cache.
test:
	@set -euo pipefail; \
	mkdir -p "$(GPU_TEST_CACHE)"; \
	tooling=; \
	if [[ "$$GPU_TEST_E2E" != skip ]]; then \
		echo "make: building the test tooling in the background (log: $(GPU_TEST_CACHE)/test-tooling.log)"; \
		setsid scripts/test-tooling.sh >"$(GPU_TEST_CACHE)/test-tooling.log" 2>&1 & tooling=$$!; \
		trap 'kill -- -$$tooling 2>/dev/null || true' EXIT; \
	fi; \
	$(MAKE) lint; \
	$(CARGO) test --locked --workspace --all-targets; \
	$(CARGO) test --locked --workspace --doc; \
	$(MAKE) test-e2e test-traces test-go; \
	$(MAKE) fuzz-smoke; \
	if [[ -n "$$tooling" ]]; then wait $$tooling || true; cat "$(GPU_TEST_CACHE)/test-tooling.log"; fi

## test-e2e: the end-to-end scenarios and the deployment tests against real Kubernetes binaries
## (and headless Chromium for the web view, installed by scripts/chromium.sh when missing; helm
## for the chart's tests, built by scripts/helm.sh; Karmada's estimator client, built by
## scripts/karmada-client.sh; umoci for the image scenario, installed by scripts/umoci.sh when
## missing; not the failover measurement,
## failover::failover_takeover_distribution: 30 control planes; not the full Karmada scenario,
## karmada_full::, which `make test-karmada` runs).
test-e2e:
	@if [[ "$$GPU_TEST_E2E" == skip ]]; then \
		echo "make: end-to-end tier SKIPPED (GPU_TEST_E2E=skip)"; \
	else \
		set -x; $(CARGO) build --locked -p gpu-lab --bin gpu-lab && \
		GPU_TEST_K8S_BIN="$${GPU_TEST_K8S_BIN:-$$(scripts/k8s-bins.sh | tail -n1)}" \
			GPU_TEST_AUTOSCALER_BIN="$${GPU_TEST_AUTOSCALER_BIN:-$$(scripts/autoscaler-bins.sh | tail -n1)}" \
			GPU_TEST_CHROMIUM="$${GPU_TEST_CHROMIUM:-$$(scripts/chromium.sh | tail -n1)}" \
			GPU_TEST_HELM="$${GPU_TEST_HELM:-$$(scripts/helm.sh | tail -n1)/helm}" \
			GPU_TEST_KARMADA_CLIENT="$${GPU_TEST_KARMADA_CLIENT:-$$(scripts/karmada-client.sh | tail -n1)}" \
			GPU_TEST_UMOCI="$${GPU_TEST_UMOCI:-$$(scripts/umoci.sh | tail -n1)}" \
			$(CARGO) test --locked -p gpu-extender --test e2e --test deploy_manifests -- --ignored \
			--skip failover::failover_takeover_distribution --skip karmada_full:: \
			--skip autoscaling::trace_burst_measurement; \
	fi

## test-karmada: the full Karmada scenario (tests/e2e/karmada_full.rs): a karmada-apiserver with
## Karmada's aggregated apiserver, controller-manager and schedulers, and two member clusters
## each with its extender as scheduler-estimator. Too heavy for `make test` (three control
## planes, a cold build of Karmada's binaries of about 8 minutes); builds what it needs first.
test-karmada: k8s-bins karmada-bins
	GPU_TEST_K8S_BIN="$${GPU_TEST_K8S_BIN:-$$(scripts/k8s-bins.sh | tail -n1)}" \
		GPU_TEST_KARMADA_BIN="$${GPU_TEST_KARMADA_BIN:-$$(scripts/karmada-bins.sh | tail -n1)}" \
		$(CARGO) test --locked -p gpu-extender --test e2e -- --ignored karmada_full::

## test-traces: the tests on Alibaba's openb traces (cluster-trace-gpu-v2023), when present.
test-traces:
	@if [[ -f "$(TRACES)/openb_node_list_gpu_node.csv" ]]; then \
		set -x; $(CARGO) test --locked -p gpu-sim --test sim -- --ignored && \
			$(CARGO) test --locked -p gpu-lab --lib -- --ignored; \
	else \
		echo "make: trace tier SKIPPED: no openb traces at $(TRACES). They are Alibaba's public" \
			"cluster-trace-gpu-v2023 (https://github.com/alibaba/clusterdata, folder" \
			"cluster-trace-gpu-v2023); put its CSVs there (a symbolic link works)."; \
		if [[ "$${GPU_TEST_TRACES:-}" == require ]]; then \
			echo "make: GPU_TEST_TRACES=require: failing"; exit 1; fi; \
	fi

## test-go: the simulator's port of Go's math/rand against Go itself, when Go is installed.
test-go:
	@if [[ -n "$(GO)" ]]; then \
		set -x; PATH="$$(dirname "$(GO)"):$$PATH" $(CARGO) test --locked -p gpu-sim --test go_rand -- --ignored; \
	else \
		echo "make: Go tier SKIPPED: no Go toolchain (go on PATH or /usr/local/go/bin/go)"; \
		if [[ "$${GPU_TEST_GO:-}" == require ]]; then \
			echo "make: GPU_TEST_GO=require: failing"; exit 1; fi; \
	fi

## lint: formatting, clippy, and no import cycle between the library's modules (cargo-modules,
## installed into the cache on first use; the layer order is checked by tests/architecture.rs).
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --workspace --all-targets -- -D warnings
	scripts/module-graph.sh

## unit: the tests that need nothing outside the clone, and the doc tests (the other tiers are
## listed as ignored).
unit:
	$(CARGO) test --locked --workspace --all-targets
	$(CARGO) test --locked --workspace --doc

build:
	$(CARGO) build --locked --release -p gpu-extender --bin gpu-extender

## image: the container image from the Dockerfile, with Docker or else Podman, tagged
## gpu-extender:<Cargo.toml's version> and stamped with the checkout's commit. Not part of
## `make test` (no daemon, no base images here); what CI checks of the image is in
## docs/install.md, "Build the image".
image:
	@set -euo pipefail; \
	tool=$$(command -v docker || command -v podman || true); \
	if [[ -z "$$tool" ]]; then echo "make image: neither docker nor podman is installed" >&2; exit 1; fi; \
	version=$$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1); \
	"$$tool" build --build-arg SOURCE_COMMIT="$$(git rev-parse HEAD 2>/dev/null || true)" \
		-t "gpu-extender:$$version" .

k8s-bins:
	scripts/k8s-bins.sh >/dev/null

## autoscaler-bins: kwok and cluster-autoscaler (from ../shared/third_party/cluster-autoscaler) for the autoscaling scenarios
autoscaler-bins:
	scripts/autoscaler-bins.sh >/dev/null

## karmada-bins: Karmada's scheduler, controller-manager and aggregated apiserver, and its CRDs,
## for `make test-karmada` (tests/karmada-bins/)
karmada-bins:
	scripts/karmada-bins.sh >/dev/null

bench:
	$(CARGO) bench --locked

## fuzz: every cargo-fuzz target for FUZZ_SECONDS (default 60) each, on nightly (scripts/fuzz.sh).
fuzz:
	scripts/fuzz.sh

## fuzz-smoke: every fuzz target for 15 s on the default toolchain, no sanitizer, new inputs
## discarded (part of `make test`; the saved corpus also replays in `cargo test`).
fuzz-smoke:
	FUZZ_SANITIZER=none FUZZ_SECONDS=$${FUZZ_SECONDS:-15} FUZZ_SCRATCH=1 scripts/fuzz.sh
