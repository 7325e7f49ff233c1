#!/usr/bin/env bash
# Build (once) the autoscaling components of the end-to-end tests: kwok (the fake kubelet that
# makes added nodes Ready and their pods Running) and test-autoscaler (the node-group
# autoscaler, tests/autoscaler/main.go, whose scale-up simulation is kube-scheduler's in-tree
# plugins, as cluster-autoscaler's is).
#
# Both are built from Go modules only (the module proxy), never downloaded prebuilt. The pins
# live in tests/autoscaler/kwok/go.mod (sigs.k8s.io/kwok) and tests/autoscaler/go.mod
# (k8s.io/kubernetes, the same version as tests/k8s-bins/go.mod). cluster-autoscaler itself
# (k8s.io/autoscaler/cluster-autoscaler) is not on the module proxy; see docs/testing.md.
#
# Output goes to a cache outside the source tree, keyed by a hash of those go.mod/go.sum files
# and the autoscaler's source:
#   ${GPU_TEST_CACHE:-$HOME/.cache/gpu-extender}/autoscaler/<hash>/bin/
# A warm run only checks and returns. The last line on stdout is the bin dir; progress goes to
# stderr, so `BIN=$(scripts/autoscaler-bins.sh | tail -n1)` works.
#
# Environment:
#   GPU_TEST_CACHE        cache root (default $HOME/.cache/gpu-extender)
#   AUTOSCALER_BINS_REBUILD=1 rebuild even if the binaries are present
#   GO                        the go command to use (default: go on PATH, else /usr/local/go/bin/go)
#   K8S_BINS_JOBS             go build -p (default 2), as for scripts/k8s-bins.sh
#
# Exit status: 0 ok, 2 Go toolchain missing, other non-zero on build failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MOD_DIR="$ROOT/tests/autoscaler"
KWOK_DIR="$ROOT/tests/autoscaler/kwok"

log() { printf 'autoscaler-bins: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

stamp_text() {
    cat "$MOD_DIR/go.mod" "$MOD_DIR/go.sum" "$MOD_DIR"/*.go "$KWOK_DIR/go.mod" "$KWOK_DIR/go.sum" |
        sha256sum | cut -d' ' -f1
}
STAMP_HASH=$(stamp_text)
CACHE_ROOT=${GPU_TEST_CACHE:-$HOME/.cache/gpu-extender}
VERSION_DIR="$CACHE_ROOT/autoscaler/${STAMP_HASH:0:16}"
BIN_DIR="$VERSION_DIR/bin"
BINS=(kwok test-autoscaler)

# shellcheck source=scripts/go-lib.sh
source "$ROOT/scripts/go-lib.sh"
up_to_date() {
    [[ "${AUTOSCALER_BINS_REBUILD:-0}" != 1 ]] || return 1
    stamp_current "$BIN_DIR/.stamp" "$STAMP_HASH" "${BINS[@]/#/$BIN_DIR/}"
}

if up_to_date; then
    log "cached in $BIN_DIR"
    printf '%s\n' "$BIN_DIR"
    exit 0
fi

find_go autoscaler-bins
lock_build_dir "$VERSION_DIR"
if up_to_date; then
    log "cached in $BIN_DIR"
    printf '%s\n' "$BIN_DIR"
    exit 0
fi

start_go_build "$VERSION_DIR"
GO_BUILD=("$GO_CMD" build -p "${K8S_BINS_JOBS:-2}" -trimpath -ldflags "-s -w")

log "go: $("$GO_CMD" version)"
log "building kwok and test-autoscaler into $BIN_DIR (a cold build takes a few minutes on 2 cores)"
start=$SECONDS
(cd "$KWOK_DIR" && "${GO_BUILD[@]}" -o "$STAGE/kwok" sigs.k8s.io/kwok/cmd/kwok)
log "kwok built ($((SECONDS - start))s)"
(cd "$MOD_DIR" && "${GO_BUILD[@]}" -o "$STAGE/test-autoscaler" .)
log "test-autoscaler built ($((SECONDS - start))s)"

mkdir -p "$BIN_DIR"
for b in "${BINS[@]}"; do
    [[ -x "$STAGE/$b" ]] || die "build produced no $b"
    mv -f "$STAGE/$b" "$BIN_DIR/$b"
done
printf '%s\n' "$STAMP_HASH" >"$BIN_DIR/.stamp"
log "done in $((SECONDS - start))s: $BIN_DIR"
printf '%s\n' "$BIN_DIR"
