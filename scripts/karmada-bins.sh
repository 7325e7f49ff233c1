#!/usr/bin/env bash
# Build (once) the Karmada control-plane binaries the full multi-cluster scenario runs
# (tests/e2e/karmada_full.rs, `make test-karmada`): karmada-scheduler,
# karmada-controller-manager and karmada-aggregated-apiserver. Built from Go modules only (the
# module proxy); the pin is github.com/karmada-io/karmada in tests/karmada-bins/go.mod, whose
# `tool` lines name the three commands. The karmada-apiserver is the kube-apiserver that
# scripts/k8s-bins.sh builds, so it is not built here.
#
# Output goes to a cache outside the source tree, keyed by Karmada version:
#   ${GPU_TEST_CACHE:-$HOME/.cache/gpu-extender}/karmada-bins/<karmada-version>/
#     karmada-scheduler  karmada-controller-manager  karmada-aggregated-apiserver
#     crds/  Karmada's CRDs (charts/karmada/_crds/bases of the same module), for the scenario
# A warm run (the binaries present and built from the same go.mod/go.sum) only checks and
# returns. The last line on stdout is the folder; progress goes to stderr, so
# `KARMADA_BIN=$(scripts/karmada-bins.sh | tail -n1)` works.
#
# Environment:
#   GPU_TEST_CACHE   cache root (default $HOME/.cache/gpu-extender)
#   GO                   the go command to use (default: go on PATH, else /usr/local/go/bin/go)
#   K8S_BINS_JOBS        go build -p (default 2)
#
# Exit status: 0 ok, 2 Go toolchain missing, other non-zero on build failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MOD_DIR="$ROOT/tests/karmada-bins"
MODULE=github.com/karmada-io/karmada
# The cache names of the binaries, and the `tool` packages they are built from.
declare -A COMMANDS=(
    [karmada-scheduler]=cmd/scheduler
    [karmada-controller-manager]=cmd/controller-manager
    [karmada-aggregated-apiserver]=cmd/aggregated-apiserver
)

log() { printf 'karmada-bins: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# shellcheck source=scripts/go-lib.sh
source "$ROOT/scripts/go-lib.sh"
VERSION=$(mod_version "$MOD_DIR/go.mod" "$MODULE")
[[ -n "$VERSION" ]] || die "cannot read the karmada version from $MOD_DIR/go.mod"

CACHE_ROOT=${GPU_TEST_CACHE:-$HOME/.cache/gpu-extender}
OUT_DIR="$CACHE_ROOT/karmada-bins/$VERSION"
STAMP="$OUT_DIR/.stamp"

stamp_text() {
    printf 'karmada %s\n' "$VERSION"
    cat "$MOD_DIR/go.mod" "$MOD_DIR/go.sum" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1
}
up_to_date() {
    local name bins=()
    for name in "${!COMMANDS[@]}"; do bins+=("$OUT_DIR/$name"); done
    [[ -d "$OUT_DIR/crds" ]] && stamp_current "$STAMP" "$(stamp_text)" "${bins[@]}"
}
cached() {
    log "karmada $VERSION: cached in $OUT_DIR"
    printf '%s\n' "$OUT_DIR"
    exit 0
}

if up_to_date; then cached; fi
find_go karmada-bins
lock_build_dir "$OUT_DIR"
if up_to_date; then cached; fi

start_go_build "$OUT_DIR"
log "go: $("$GO_CMD" version)"
log "building karmada $VERSION's ${!COMMANDS[*]} into $OUT_DIR (a cold build takes several minutes)"
start=$SECONDS
for name in "${!COMMANDS[@]}"; do
    # The build tag Karmada's own hack/build.sh sets (see scripts/karmada-client.sh).
    (cd "$MOD_DIR" && "$GO_CMD" build -p "${K8S_BINS_JOBS:-2}" -trimpath -ldflags "-s -w" \
        -tags kubernetes_protomessage_one_more_release -o "$STAGE/$name" "$MODULE/${COMMANDS[$name]}")
    log "$name built ($((SECONDS - start))s so far)"
done
# The CRDs come from the module the binaries were built from, so they always match.
SRC=$(cd "$MOD_DIR" && "$GO_CMD" list -m -f '{{.Dir}}' "$MODULE")
[[ -d "$SRC/charts/karmada/_crds/bases" ]] || die "no charts/karmada/_crds/bases in $SRC"
mkdir -p "$STAGE/crds"
find "$SRC/charts/karmada/_crds/bases" -name '*.yaml' -exec cp {} "$STAGE/crds/" \;
chmod -R u+w "$STAGE/crds"
rm -rf "$OUT_DIR/crds"
mv -f "$STAGE"/karmada-* "$STAGE/crds" "$OUT_DIR/"
stamp_text >"$STAMP"
log "done in $((SECONDS - start))s: $OUT_DIR"
printf '%s\n' "$OUT_DIR"
