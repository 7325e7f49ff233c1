#!/usr/bin/env bash
# Build (once) the autoscaling components of the end-to-end tests: kwok (the fake kubelet that
# makes added nodes Ready and their pods Running) and cluster-autoscaler itself, with its kwok
# cloud provider (node groups from templates, created as Node objects that kwok then runs).
#
# kwok comes from Go modules (the module proxy; pin in tests/autoscaler/kwok/go.mod).
# cluster-autoscaler does not: the module proxy refuses k8s.io/autoscaler/cluster-autoscaler, so
# it is built from its source beside the checkout, ../shared/third_party/cluster-autoscaler
# (cluster-autoscaler 1.34.2 cut down to the kwok provider; its PROVENANCE.md says what was cut),
# copied to a writable folder in the cache first; its dependencies come from the module proxy.
# Where that folder is absent (a newcomer's clone), only kwok is built and the autoscaling
# scenarios say SKIPPED.
#
# Output goes to a cache outside the source tree, keyed by a hash of kwok's go.mod/go.sum and of
# the autoscaler's source (when present):
#   ${GPU_TEST_CACHE:-$HOME/.cache/gpu-extender}/autoscaler/<hash>/bin/{kwok,cluster-autoscaler}
# A warm run only checks and returns. The last line on stdout is the bin dir; progress goes to
# stderr, so `BIN=$(scripts/autoscaler-bins.sh | tail -n1)` works.
#
# Environment:
#   GPU_TEST_CACHE        cache root (default $HOME/.cache/gpu-extender)
#   GPU_TEST_AUTOSCALER_SRC  the autoscaler's source (default ../shared/third_party/cluster-autoscaler
#                         beside the checkout)
#   AUTOSCALER_BINS_REBUILD=1 rebuild even if the binaries are present
#   GO                    the go command to use (default: go on PATH, else /usr/local/go/bin/go)
#   K8S_BINS_JOBS         go build -p (default 2), as for scripts/k8s-bins.sh
#
# Exit status: 0 ok, 2 Go toolchain missing, other non-zero on build failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KWOK_DIR="$ROOT/tests/autoscaler/kwok"
CA_SRC=${GPU_TEST_AUTOSCALER_SRC:-$ROOT/../shared/third_party/cluster-autoscaler}

log() { printf 'autoscaler-bins: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

BINS=(kwok)
CA_HASH=
if [[ -f "$CA_SRC/go.mod" ]]; then
    BINS+=(cluster-autoscaler)
    # Every file's path and content: a changed or added file rebuilds.
    CA_HASH=$(cd "$CA_SRC" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
else
    log "no cluster-autoscaler source at $CA_SRC: building kwok only (the autoscaling scenarios will say SKIPPED)"
fi
STAMP_HASH=$(cat "$KWOK_DIR/go.mod" "$KWOK_DIR/go.sum" <(printf '%s\n' "$CA_HASH") | sha256sum | cut -d' ' -f1)
CACHE_ROOT=${GPU_TEST_CACHE:-$HOME/.cache/gpu-extender}
VERSION_DIR="$CACHE_ROOT/autoscaler/${STAMP_HASH:0:16}"
BIN_DIR="$VERSION_DIR/bin"

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
log "building ${BINS[*]} into $BIN_DIR (a cold build of cluster-autoscaler takes about 7 minutes on 2 cores)"
start=$SECONDS
(cd "$KWOK_DIR" && "${GO_BUILD[@]}" -o "$STAGE/kwok" sigs.k8s.io/kwok/cmd/kwok)
log "kwok built ($((SECONDS - start))s)"
if [[ -n "$CA_HASH" ]]; then
    # The shared folder is read-only: build from a copy (8 MiB), removed with the stage.
    cp -R "$CA_SRC" "$STAGE/cluster-autoscaler-src"
    chmod -R u+w "$STAGE/cluster-autoscaler-src"
    (cd "$STAGE/cluster-autoscaler-src" && "${GO_BUILD[@]}" -tags kwok -o "$STAGE/cluster-autoscaler" .)
    log "cluster-autoscaler built ($((SECONDS - start))s)"
fi

mkdir -p "$BIN_DIR"
for b in "${BINS[@]}"; do
    [[ -x "$STAGE/$b" ]] || die "build produced no $b"
    mv -f "$STAGE/$b" "$BIN_DIR/$b"
done
printf '%s\n' "$STAMP_HASH" >"$BIN_DIR/.stamp"
log "done in $((SECONDS - start))s: $BIN_DIR"
printf '%s\n' "$BIN_DIR"
