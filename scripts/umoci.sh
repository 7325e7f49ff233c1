#!/usr/bin/env bash
# Makes sure umoci is there for the image scenario (tests/e2e/image.rs), which assembles an OCI
# image as the Dockerfile describes it and runs the binary from its unpacked root filesystem:
# Debian's `umoci` package, installed with apt-get when missing (root, or sudo); once per
# machine (about 5 s with the package lists fresh). GPU_TEST_UMOCI, when set, names the binary
# instead. Prints its path last.
set -euo pipefail
if [[ -n "${GPU_TEST_UMOCI:-}" ]]; then echo "$GPU_TEST_UMOCI"; exit 0; fi
if ! command -v umoci >/dev/null 2>&1; then
    SUDO=""
    if [[ $(id -u) != 0 ]]; then SUDO="sudo"; fi
    echo "umoci.sh: installing Debian's umoci package" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends umoci >&2
fi
command -v umoci
