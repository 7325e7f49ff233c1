#!/usr/bin/env bash
# Run the cargo-fuzz targets in fuzz/ for a bounded time each.
#
#   scripts/fuzz.sh                 every target, FUZZ_SECONDS each (default 60)
#   scripts/fuzz.sh pod node        only these targets
#   FUZZ_SECONDS=600 scripts/fuzz.sh
#   FUZZ_SANITIZER=none FUZZ_SECONDS=15 FUZZ_SCRATCH=1 scripts/fuzz.sh    what `make test` runs
#   FUZZ_SANITIZER=none FUZZ_BUILD_ONLY=1 scripts/fuzz.sh    build only (scripts/test-tooling.sh)
#
# FUZZ_SANITIZER: `address` (default; nightly Rust, AddressSanitizer) or `none` (the default
# toolchain, stable works: coverage-guided, panics and broken promises are still caught, memory
# errors are not; what CI can build without nightly). FUZZ_SCRATCH=1: new inputs go to a
# temporary directory instead of fuzz/corpus/, so a run leaves the clone untouched.
#
# Each run starts from fuzz/corpus/<target>/ (the seeds and earlier finds) and adds what it
# finds there; minimise before committing (`cargo +nightly fuzz cmin <target>`). A crash leaves
# its input in fuzz/artifacts/<target>/ and fails the script: copy the input into the corpus
# once fixed, so tests/fuzz_corpus.rs replays it on stable in every test run.
#
# Needs cargo-fuzz (installed from crates.io into ~/.cargo/bin when missing) and, for the
# address sanitizer, the nightly toolchain (rustup). Builds go beside the run's target folder,
# <CARGO_TARGET_DIR>-fuzz (address) or <CARGO_TARGET_DIR>-fuzz-plain (none); without
# CARGO_TARGET_DIR, $GPU_TEST_CACHE/target-fuzz(-plain), outside the clone. Exit status: 0 no crash, 1 a crash
# or a failed build, 2 no nightly toolchain for the address sanitizer.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${GPU_TEST_CACHE:-$HOME/.cache/gpu-extender}
SECONDS_EACH=${FUZZ_SECONDS:-60}
SANITIZER=${FUZZ_SANITIZER:-address}
CARGO_FUZZ_VERSION=0.13.2
log() { printf 'fuzz: %s\n' "$*" >&2; }

case "$SANITIZER" in
    address)
        TOOLCHAIN=(+nightly)
        TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}-fuzz"
        if ! rustup run nightly rustc --version >/dev/null 2>&1; then
            log "the nightly toolchain is not installed (rustup toolchain install nightly); the address sanitizer needs it (FUZZ_SANITIZER=none runs without)"
            exit 2
        fi
        ;;
    none)
        TOOLCHAIN=()
        TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}-fuzz-plain"
        ;;
    *)
        log "FUZZ_SANITIZER must be address or none, not $SANITIZER"
        exit 2
        ;;
esac
# One installer at a time: scripts/test-tooling.sh may be installing it in the background.
mkdir -p "$CACHE"
exec 8>"$CACHE/.cargo-fuzz-install.lock"
flock 8
if ! cargo fuzz --version >/dev/null 2>&1; then
    log "installing cargo-fuzz $CARGO_FUZZ_VERSION from crates.io"
    cargo install --locked cargo-fuzz --version "$CARGO_FUZZ_VERSION" >&2
fi
flock -u 8

cd "$ROOT/fuzz"
export CARGO_TARGET_DIR="$TARGET_DIR"
# Incremental release builds: `make test` rebuilds the fuzz targets after every change to the
# crate, and with the sancov instrumentation a full release build of it took 10.4 min here (a
# one-line change: 6.7 min incremental; docs/testing.md). Only the crate itself is built
# incrementally (Cargo never does so for registry dependencies).
export CARGO_PROFILE_RELEASE_INCREMENTAL=${CARGO_PROFILE_RELEASE_INCREMENTAL:-true}
mapfile -t all < <(cargo "${TOOLCHAIN[@]}" fuzz list)
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=("${all[@]}")
log "building the fuzz targets (release, debug assertions, sanitizer: $SANITIZER)"
cargo "${TOOLCHAIN[@]}" fuzz build -O -s "$SANITIZER" >&2
if [[ "${FUZZ_BUILD_ONLY:-0}" == 1 ]]; then
    log "built; FUZZ_BUILD_ONLY=1: not running"
    exit 0
fi
mkdir -p "$CACHE/fuzz-logs"
scratch=""
if [[ "${FUZZ_SCRATCH:-0}" == 1 ]]; then
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
fi
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target"
    log "$target: ${SECONDS_EACH}s from $(find "corpus/$target" -type f | wc -l) corpus inputs"
    run_log="$CACHE/fuzz-logs/$target-$SANITIZER.log"
    # libFuzzer writes new inputs into the first corpus directory it is given.
    corpora=("corpus/$target")
    if [[ -n "$scratch" ]]; then
        mkdir -p "$scratch/$target"
        corpora=("$scratch/$target" "corpus/$target")
    fi
    # -rss_limit_mb: a decoder that allocates gigabytes on hostile input is a finding too.
    status=0
    cargo "${TOOLCHAIN[@]}" fuzz run -O -s "$SANITIZER" "$target" "${corpora[@]}" -- \
        -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
        >"$run_log" 2>&1 || status=$?
    grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ +DONE)' "$run_log" >&2 || true
    if [[ $status -ne 0 ]]; then
        tail -n 40 "$run_log" >&2
        log "$target: failed (exit $status); crash inputs, if any, in fuzz/artifacts/$target/"
        exit 1
    fi
done
log "no crash in ${targets[*]}"
