#!/usr/bin/env bash
# Run the cargo-fuzz targets in fuzz/ for a bounded time each, on nightly Rust.
#
#   scripts/fuzz.sh                 every target, FUZZ_SECONDS each (default 60)
#   scripts/fuzz.sh pod node        only these targets
#   FUZZ_SECONDS=600 scripts/fuzz.sh
#
# Each run starts from fuzz/corpus/<target>/ (the seeds and earlier finds) and adds what it
# finds there; minimise before committing (`cargo +nightly fuzz cmin <target>`). A crash leaves
# its input in fuzz/artifacts/<target>/ and fails the script: copy the input into the corpus
# once fixed, so tests/fuzz_corpus.rs replays it on stable in every test run.
#
# Needs the nightly toolchain (rustup) and cargo-fuzz; installs cargo-fuzz from crates.io into
# ~/.cargo/bin when it is missing. Builds go to $GPU_EXTENDER_CACHE/target-fuzz, outside the
# clone. Exit status: 0 no crash, 1 a crash or a failed build, 2 no nightly toolchain.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${GPU_EXTENDER_CACHE:-$HOME/.cache/gpu-extender}
SECONDS_EACH=${FUZZ_SECONDS:-60}
CARGO_FUZZ_VERSION=0.13.2
log() { printf 'fuzz: %s\n' "$*" >&2; }

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    log "the nightly toolchain is not installed (rustup toolchain install nightly); cargo-fuzz needs it"
    exit 2
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    log "installing cargo-fuzz $CARGO_FUZZ_VERSION from crates.io"
    cargo install --locked cargo-fuzz --version "$CARGO_FUZZ_VERSION" >&2
fi

cd "$ROOT/fuzz"
export CARGO_TARGET_DIR="$CACHE/target-fuzz"
mapfile -t all < <(cargo +nightly fuzz list)
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=("${all[@]}")
log "building the fuzz targets (release, debug assertions, address sanitizer)"
cargo +nightly fuzz build -O >&2
mkdir -p "$CACHE/fuzz-logs"
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target"
    log "$target: ${SECONDS_EACH}s from $(find "corpus/$target" -type f | wc -l) corpus inputs"
    run_log="$CACHE/fuzz-logs/$target.log"
    # -rss_limit_mb: a decoder that allocates gigabytes on hostile input is a finding too.
    status=0
    cargo +nightly fuzz run -O "$target" -- \
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
