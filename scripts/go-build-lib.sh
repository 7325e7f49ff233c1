# Shared by the scripts that build test tooling from Go modules (scripts/k8s-bins.sh,
# scripts/autoscaler-bins.sh); sourced, not run. Each defines log() before sourcing.

# Sets GO_CMD to a working go command ($GO, else go on PATH, else /usr/local/go/bin/go), or
# explains how to install Go and exits 2. <what> names what needs it, for the message.
find_go() { # <what>
    GO_CMD=${GO:-}
    if [[ -z "$GO_CMD" ]]; then
        if command -v go >/dev/null 2>&1; then
            GO_CMD=$(command -v go)
        elif [[ -x /usr/local/go/bin/go ]]; then
            GO_CMD=/usr/local/go/bin/go
        fi
    fi
    if [[ -z "$GO_CMD" ]] || ! "$GO_CMD" version >/dev/null 2>&1; then
        local why
        if [[ -n "${GO:-}" ]]; then why="GO=$GO does not run"; else why="no go on PATH, none at /usr/local/go/bin/go"; fi
        log "error: the Go toolchain is missing ($why)."
        cat >&2 <<EOM
  $1 built from source, which needs Go >= 1.24
  (Kubernetes v1.34's minimum). Install it from https://go.dev/dl/ , e.g.
    curl -fsSL https://go.dev/dl/go<version>.linux-amd64.tar.gz | tar -C /usr/local -xz
    export PATH=\$PATH:/usr/local/go/bin
  or your distribution's golang package if it is >= 1.24, or set GO=/path/to/go.
  Only the Go module proxy (GOPROXY) is needed to fetch the sources; no binaries are downloaded.
EOM
        exit 2
    fi
}

# Takes <dir>/.lock on file descriptor 9 (one builder at a time: parallel test runs may all
# build), waiting for a builder that holds it.
lock_build_dir() { # <dir>
    mkdir -p "$1"
    exec 9>"$1/.lock"
    if ! flock -n 9; then
        log "waiting for another build of these binaries to finish (it holds $1/.lock)"
        flock 9
    fi
}
