#!/usr/bin/env bash
# Build (once) tests/karmada-client: the program that calls gpu-extender's scheduler-estimator
# with Karmada's own estimator client (tests/e2e/karmada.rs). Built from Go modules only (the
# module proxy); the pin is github.com/karmada-io/karmada in tests/karmada-client/go.mod.
#
# Output goes to a cache outside the source tree, keyed by Karmada version:
#   ${GPU_TEST_CACHE:-$HOME/.cache/gpu-extender}/karmada-client/<karmada-version>/karmada-client
# A warm run (the binary present and built from the same go.mod/go.sum/main.go) only checks and
# returns. After a build it checks that proto/ matches the pinned Karmada's files
# (`karmada-client check-protos proto`). The last line on stdout is the binary's path; progress
# goes to stderr, so `BIN=$(scripts/karmada-client.sh | tail -n1)` works.
#
# Environment:
#   GPU_TEST_CACHE   cache root (default $HOME/.cache/gpu-extender)
#   GO                   the go command to use (default: go on PATH, else /usr/local/go/bin/go)
#
# Exit status: 0 ok, 2 Go toolchain missing, other non-zero on build or check failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MOD_DIR="$ROOT/tests/karmada-client"

log() { printf 'karmada-client: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# shellcheck source=scripts/go-lib.sh
source "$ROOT/scripts/go-lib.sh"
VERSION=$(mod_version "$MOD_DIR/go.mod" github.com/karmada-io/karmada)
[[ -n "$VERSION" ]] || die "cannot read the karmada version from $MOD_DIR/go.mod"

CACHE_ROOT=${GPU_TEST_CACHE:-$HOME/.cache/gpu-extender}
OUT_DIR="$CACHE_ROOT/karmada-client/$VERSION"
BIN="$OUT_DIR/karmada-client"
STAMP="$OUT_DIR/.stamp"

stamp_text() {
    printf 'karmada %s\n' "$VERSION"
    cat "$MOD_DIR/go.mod" "$MOD_DIR/go.sum" "$MOD_DIR/main.go" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1
}
up_to_date() { stamp_current "$STAMP" "$(stamp_text)" "$BIN"; }

if up_to_date; then
    log "karmada $VERSION: cached in $BIN"
    printf '%s\n' "$BIN"
    exit 0
fi

find_go karmada-client
lock_build_dir "$OUT_DIR"
if up_to_date; then
    log "karmada $VERSION: cached in $BIN"
    printf '%s\n' "$BIN"
    exit 0
fi

start_go_build "$OUT_DIR"
log "go: $("$GO_CMD" version)"
log "building against karmada $VERSION into $OUT_DIR (a cold build takes a few minutes)"
start=$SECONDS
# The build tag Karmada's own hack/build.sh sets: k8s.io/api v0.35 keeps its types' ProtoMessage
# methods (which the v1.18 estimator protos still embed) only under it.
(cd "$MOD_DIR" && "$GO_CMD" build -p "${K8S_BINS_JOBS:-2}" -trimpath -ldflags "-s -w" \
    -tags kubernetes_protomessage_one_more_release -o "$STAGE/karmada-client" .)
GOMODCACHE=$("$GO_CMD" env GOMODCACHE) "$STAGE/karmada-client" check-protos "$ROOT/proto" >&2 \
    || die "proto/ does not match karmada $VERSION (see proto/README.md)"
mv -f "$STAGE/karmada-client" "$BIN"
stamp_text >"$STAMP"
log "done in $((SECONDS - start))s: $BIN"
printf '%s\n' "$BIN"
