#!/usr/bin/env bash
# Makes sure headless Chromium is there for the web-view end-to-end scenario
# (tests/e2e/web_view.rs): Debian's `chromium` package, installed with apt-get when missing
# (root, or sudo); once per machine, the package then stays installed (docs/testing.md gives the
# cold cost). GPU_TEST_CHROMIUM, when set, names the browser instead. Prints its path last.
set -euo pipefail
if [[ -n "${GPU_TEST_CHROMIUM:-}" ]]; then echo "$GPU_TEST_CHROMIUM"; exit 0; fi
if ! command -v chromium >/dev/null 2>&1; then
    SUDO=""
    if [[ $(id -u) != 0 ]]; then SUDO="sudo"; fi
    echo "chromium.sh: installing Debian's chromium package" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        chromium fonts-dejavu-core >&2
fi
command -v chromium
