# Shared by the scripts that build test tooling from pinned Go modules (k8s-bins.sh, helm.sh,
# autoscaler-bins.sh); sourced, not run. Defines:
#   mod_version <go.mod> <module path>   the version a go.mod requires
#   find_go <tool name>                  sets GO_CMD to a working go, or explains and exits 2
#   lock_build_dir <dir>                 takes <dir>/.lock on fd 9, waiting for another builder
#   stamp_current <stamp> <text> <bin>...  the stamp file holds <text> and every <bin> runs
#   start_go_build <dir>                 sets STAGE to a scratch folder in <dir> (removed on exit)
#                                        and the Go environment every build here uses
# The caller sets `log` (progress to stderr) before calling find_go or lock_build_dir.

mod_version() {
    awk -v m="$2" '($1 == "require" && $2 == m) { print $3; exit } ($1 == m && $2 ~ /^v/) { print $2; exit }' "$1"
}

find_go() {
    local what=$1 why
    GO_CMD=${GO:-}
    if [[ -z "$GO_CMD" ]]; then
        if command -v go >/dev/null 2>&1; then
            GO_CMD=$(command -v go)
        elif [[ -x /usr/local/go/bin/go ]]; then
            GO_CMD=/usr/local/go/bin/go
        fi
    fi
    if [[ -n "$GO_CMD" ]] && "$GO_CMD" version >/dev/null 2>&1; then return 0; fi
    if [[ -n "${GO:-}" ]]; then why="GO=$GO does not run"; else why="no go on PATH, none at /usr/local/go/bin/go"; fi
    cat >&2 <<MSG
$what: error: the Go toolchain is missing ($why).
  The test tooling is built from source, which needs Go >= 1.24 (Kubernetes v1.34's minimum).
  Install it from https://go.dev/dl/ , e.g.
    curl -fsSL https://go.dev/dl/go<version>.linux-amd64.tar.gz | tar -C /usr/local -xz
    export PATH=\$PATH:/usr/local/go/bin
  or your distribution's golang package if it is >= 1.24, or set GO=/path/to/go.
  Only the Go module proxy (GOPROXY) is needed to fetch the sources; no binaries are downloaded.
MSG
    exit 2
}

# Whether a build is still current: its stamp holds exactly what the pins make of it now, and
# every binary it made is there and executable.
stamp_current() {
    local stamp=$1 text=$2 bin
    shift 2
    [[ -f "$stamp" && "$(cat "$stamp")" == "$text" ]] || return 1
    for bin in "$@"; do [[ -x "$bin" ]] || return 1; done
}

# One builder at a time per cache folder: parallel test runs may all call the build scripts.
lock_build_dir() {
    mkdir -p "$1"
    exec 9>"$1/.lock"
    if ! flock -n 9; then
        log "waiting for another build of these binaries to finish (it holds $1/.lock)"
        flock 9
    fi
}

# The scratch folder the binaries are built into before they are moved into place, and the
# environment of every build: -mod=mod lets go.sum be completed from the proxy instead of failing;
# -buildvcs=false because this is the gpu-extender repository, not the built module's; no cgo.
start_go_build() {
    STAGE=$(mktemp -d "$1/.build.XXXXXX")
    trap 'rm -rf "$STAGE"' EXIT
    export GOFLAGS="-mod=mod -buildvcs=false"
    export GOWORK=off
    export CGO_ENABLED=0
}
