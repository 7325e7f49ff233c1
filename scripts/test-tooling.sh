#!/usr/bin/env bash
# Builds the test tooling `make test` needs besides the Rust test targets, one after another:
# the Kubernetes binaries, kwok and cluster-autoscaler, helm, Karmada's estimator client (all from
# Go modules), then cargo-fuzz and the fuzz targets. `make test` starts this in the background
# at its beginning, so that on a cold machine the downloads and these builds overlap the Rust
# build and the tests instead of following them (docs/testing.md gives the times). Each step
# locks its own cache folder and keeps a stamp (cargo its target dir), so the foreground calls
# that come later wait for a build in progress and then find it done; a step that failed here
# is simply run again there, where its error is shown. Output goes to stderr.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
status=0
# step NAME COMMAND...: runs one build, output to stderr, and says how long it took.
step() {
    local name=$1 start
    shift
    start=$(date +%s)
    if "$@" >/dev/null; then
        printf 'test-tooling: %s ready after %ss\n' "$name" "$(( $(date +%s) - start ))" >&2
    else
        printf 'test-tooling: %s failed (exit %s); make test builds it again in the foreground\n' \
            "$name" "$?" >&2
        status=1
    fi
}
for script in k8s-bins autoscaler-bins helm karmada-client; do
    step "$script" "$ROOT/scripts/$script.sh"
done
step fuzz_build env FUZZ_SANITIZER=none FUZZ_BUILD_ONLY=1 "$ROOT/scripts/fuzz.sh"
exit "$status"
