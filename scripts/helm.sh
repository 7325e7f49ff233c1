#!/usr/bin/env bash
# Build (once) the helm CLI the chart tests run (tests/deploy_manifests.rs: helm lint, helm
# template, then a server-side dry run of what it renders against the loopback kube-apiserver).
#
# Built from its Go module only (the module proxy), never downloaded prebuilt. The pin lives in
# tests/helm-bin/go.mod (helm.sh/helm/v3).
#
# Output goes to a cache outside the source tree, keyed by helm version:
#   ${GPU_TEST_CACHE:-$HOME/.cache/gpu-extender}/helm/<helm-version>/bin/helm
# A warm run (the binary present and built from the same go.mod/go.sum) only checks and returns.
# The last line on stdout is the bin dir; progress goes to stderr, so
# `BIN=$(scripts/helm.sh | tail -n1)` works.
#
# Environment:
#   GPU_TEST_CACHE   cache root (default $HOME/.cache/gpu-extender)
#   HELM_BIN_REBUILD=1   rebuild even if the binary is present
#   GO                   the go command to use (default: go on PATH, else /usr/local/go/bin/go)
#   K8S_BINS_JOBS        go build -p (default 2), shared with scripts/k8s-bins.sh
#
# Exit status: 0 ok, 2 Go toolchain missing, other non-zero on build failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MOD_DIR="$ROOT/tests/helm-bin"

log() { printf 'helm-bin: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# shellcheck source=scripts/go-lib.sh
source "$ROOT/scripts/go-lib.sh"
HELM_VERSION=$(mod_version "$MOD_DIR/go.mod" helm.sh/helm/v3)
[[ -n "$HELM_VERSION" ]] || die "cannot read the helm.sh/helm/v3 version from $MOD_DIR/go.mod"

# helm's Makefile stamps the Kubernetes version `helm template` and `helm lint` assume (the
# chart's kubeVersion is checked against it) from its client-go: v0.34.x is Kubernetes 1.34.
CLIENT_GO=$(mod_version "$MOD_DIR/go.mod" k8s.io/client-go)
[[ "$CLIENT_GO" =~ ^v0\.([0-9]+)\. ]] || die "cannot read the k8s.io/client-go version from $MOD_DIR/go.mod"
K8S_MINOR=${BASH_REMATCH[1]}
LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    LDFLAGS+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$K8S_MINOR"
done

CACHE_ROOT=${GPU_TEST_CACHE:-$HOME/.cache/gpu-extender}
VERSION_DIR="$CACHE_ROOT/helm/$HELM_VERSION"
BIN_DIR="$VERSION_DIR/bin"
STAMP="$BIN_DIR/.stamp"

# The stamp ties the binary to the exact pins and link flags it was built from.
stamp_text() {
    printf 'helm %s\n%s\n' "$HELM_VERSION" "$LDFLAGS"
    cat "$MOD_DIR/go.mod" "$MOD_DIR/go.sum" | sha256sum | cut -d' ' -f1
}

up_to_date() {
    [[ "${HELM_BIN_REBUILD:-0}" != 1 ]] || return 1
    stamp_current "$STAMP" "$(stamp_text)" "$BIN_DIR/helm"
}

cached() {
    log "helm $HELM_VERSION: cached in $BIN_DIR"
    printf '%s\n' "$BIN_DIR"
    exit 0
}

if up_to_date; then cached; fi

find_go helm-bin

lock_build_dir "$VERSION_DIR"
if up_to_date; then cached; fi # someone else built it while we waited

start_go_build "$VERSION_DIR"

log "go: $("$GO_CMD" version)"
log "building helm $HELM_VERSION into $BIN_DIR (a cold build takes a few minutes on 2 cores)"
start=$SECONDS
(
    cd "$MOD_DIR"
    # The version stamps, as helm's Makefile sets them, so `helm version` reports the pin.
    "$GO_CMD" build -p "${K8S_BINS_JOBS:-2}" -trimpath -ldflags "$LDFLAGS" \
        -o "$STAGE/helm" helm.sh/helm/v3/cmd/helm
)
[[ -x "$STAGE/helm" ]] || die "build produced no helm"
mkdir -p "$BIN_DIR"
rm -f "$STAMP"
mv -f "$STAGE/helm" "$BIN_DIR/helm"
stamp_text >"$STAMP"

log "done in $((SECONDS - start))s: $BIN_DIR"
printf '%s\n' "$BIN_DIR"
