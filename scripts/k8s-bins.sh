#!/usr/bin/env bash
# Build (once) the real Kubernetes control-plane binaries the end-to-end tests and
# the demo run: kube-apiserver, kube-scheduler, kube-controller-manager, kubectl and etcd
# (kube-controller-manager only runs in the scenarios that ask for it, see
# scripts/control-plane.sh controller-manager).
#
# They are built from Go modules only (the module proxy), never downloaded
# prebuilt. The pins live in tests/k8s-bins/go.mod (k8s.io/kubernetes) and
# tests/k8s-bins/etcd/go.mod (go.etcd.io/etcd/server/v3).
#
# Output goes to a cache outside the source tree, keyed by Kubernetes version:
#   ${GPU_TEST_CACHE:-$HOME/.cache/gpu-extender}/k8s/<k8s-version>/bin/
# A warm run (every binary of ALL_BINS present and built from the same go.mod/go.sum; a
# binary added to the list is missing from an older cache, so that cache is rebuilt) only
# checks and returns. The last line on stdout is the bin dir; progress goes to
# stderr, so `BIN=$(scripts/k8s-bins.sh | tail -n1)` works.
#
# Environment:
#   GPU_TEST_CACHE   cache root (default $HOME/.cache/gpu-extender)
#   K8S_BINS_REBUILD=1   rebuild even if the binaries are present
#   GO                   the go command to use (default: go on PATH, else /usr/local/go/bin/go)
#   K8S_BINS_JOBS        go build -p (default 2)
#
# Exit status: 0 ok, 2 Go toolchain missing, other non-zero on build failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
K8S_MOD_DIR="$ROOT/tests/k8s-bins"
ETCD_MOD_DIR="$ROOT/tests/k8s-bins/etcd"

log() { printf 'k8s-bins: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# --- versions, from the pinned go.mod files (the single source of truth) ----
# shellcheck source=scripts/go-lib.sh
source "$ROOT/scripts/go-lib.sh"
K8S_VERSION=$(mod_version "$K8S_MOD_DIR/go.mod" k8s.io/kubernetes)
ETCD_VERSION=$(mod_version "$ETCD_MOD_DIR/go.mod" go.etcd.io/etcd/server/v3)
[[ -n "$K8S_VERSION" ]] || die "cannot read the k8s.io/kubernetes version from $K8S_MOD_DIR/go.mod"
[[ -n "$ETCD_VERSION" ]] || die "cannot read the etcd version from $ETCD_MOD_DIR/go.mod"

CACHE_ROOT=${GPU_TEST_CACHE:-$HOME/.cache/gpu-extender}
VERSION_DIR="$CACHE_ROOT/k8s/$K8S_VERSION"
BIN_DIR="$VERSION_DIR/bin"
STAMP="$BIN_DIR/.stamp"

K8S_BINS=(kube-apiserver kube-scheduler kube-controller-manager kubectl)
ALL_BINS=("${K8S_BINS[@]}" etcd)

# The stamp ties the binaries to the exact pins they were built from.
stamp_text() {
    printf 'kubernetes %s\netcd %s\n' "$K8S_VERSION" "$ETCD_VERSION"
    cat "$K8S_MOD_DIR/go.mod" "$K8S_MOD_DIR/go.sum" "$ETCD_MOD_DIR/go.mod" "$ETCD_MOD_DIR/go.sum" | sha256sum | cut -d' ' -f1
}

up_to_date() {
    [[ "${K8S_BINS_REBUILD:-0}" != 1 ]] || return 1
    stamp_current "$STAMP" "$(stamp_text)" "${ALL_BINS[@]/#/$BIN_DIR/}"
}

if up_to_date; then
    log "kubernetes $K8S_VERSION, etcd $ETCD_VERSION: cached in $BIN_DIR"
    printf '%s\n' "$BIN_DIR"
    exit 0
fi

# --- find Go (only needed to build) ----------------------------------------
find_go k8s-bins
lock_build_dir "$VERSION_DIR"
if up_to_date; then # someone else built it while we waited
    log "kubernetes $K8S_VERSION, etcd $ETCD_VERSION: cached in $BIN_DIR"
    printf '%s\n' "$BIN_DIR"
    exit 0
fi

start_go_build "$VERSION_DIR"
# -p 2: two packages at a time (the box has 2 cores; more only costs memory).
GO_BUILD=("$GO_CMD" build -p "${K8S_BINS_JOBS:-2}" -trimpath)

# Version stamps, as kubernetes' hack/lib/version.sh sets them, so the binaries
# report v1.34.x (kubectl version, /version, the emulation-version machinery)
# instead of v0.0.0-master.
k8s_minor=${K8S_VERSION#v1.}
k8s_minor=${k8s_minor%%.*}
ldx=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldx+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor -X $pkg.gitTreeState=clean"
done

log "go: $("$GO_CMD" version)"
log "building kubernetes $K8S_VERSION (${K8S_BINS[*]}) and etcd $ETCD_VERSION into $BIN_DIR"
log "(a cold build takes several minutes on 2 cores)"
start=$SECONDS

(
    cd "$ETCD_MOD_DIR"
    "${GO_BUILD[@]}" -ldflags "-s -w" -o "$STAGE/etcd" go.etcd.io/etcd/server/v3
)
log "etcd built ($((SECONDS - start))s)"

(
    cd "$K8S_MOD_DIR"
    # One invocation for all four: shared packages are compiled once.
    "${GO_BUILD[@]}" -ldflags "-s -w$ldx" -o "$STAGE/" "${K8S_BINS[@]/#/k8s.io/kubernetes/cmd/}"
)
log "kubernetes binaries built ($((SECONDS - start))s)"

for b in "${ALL_BINS[@]}"; do
    [[ -x "$STAGE/$b" ]] || die "build produced no $b"
done
mkdir -p "$BIN_DIR"
rm -f "$STAMP"
for b in "${ALL_BINS[@]}"; do
    mv -f "$STAGE/$b" "$BIN_DIR/$b"
done
stamp_text >"$STAMP"

log "done in $((SECONDS - start))s: $BIN_DIR"
printf '%s\n' "$BIN_DIR"
