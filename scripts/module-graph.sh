#!/usr/bin/env bash
# Each library crate's module dependency graph has no cycles (part of `make lint`; decision 0007):
# the service (gpu-extender), the engine, the simulator and the lab. Between crates cargo itself
# refuses cycles.
#
# cargo-modules (installed from crates.io into $GPU_TEST_CACHE/tools on first use, about six
# minutes on 2 cores) draws the graph the compiler's own analysis sees: every `use` and every
# path, re-exports resolved, `#[cfg(test)]` modules left out. Its `--acyclic` flag is not used:
# 0.27 checks the item graph before it filters it to modules, so a type and its own method read
# as a cycle. The "uses" edges of the module graph are checked with `tsort` instead, which
# names the modules of any loop and fails.
#
#   scripts/module-graph.sh               check every crate; print its module and edge counts
#   scripts/module-graph.sh --dot [PKG]   print one crate's module graph (Graphviz; default the
#                                         service, gpu-extender) instead
#
# The layer order (which room may import which) is checked by tests/architecture.rs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${GPU_TEST_CACHE:-$HOME/.cache/gpu-extender}"
TOOLS="$CACHE/tools"
# 0.28 needs a newer rustc than the project's toolchain.
CARGO_MODULES_VERSION=0.27.0

log() { echo "module-graph: $*" >&2; }

if ! "$TOOLS/bin/cargo-modules" --version 2>/dev/null | grep -qF "$CARGO_MODULES_VERSION"; then
    log "installing cargo-modules $CARGO_MODULES_VERSION from crates.io into $TOOLS"
    cargo install --locked --quiet --root "$TOOLS" cargo-modules --version "$CARGO_MODULES_VERSION"
fi

cd "$ROOT"
graph="$(mktemp)"
trap 'rm -f "$graph" "$graph.loops"' EXIT

# Draws the module graph of package $1 into $graph.
draw() {
    PATH="$TOOLS/bin:$PATH" cargo modules dependencies --package "$1" --lib \
        --no-externs --no-sysroot --no-fns --no-types --no-traits --no-owns >"$graph"
}

if [[ "${1:-}" == "--dot" ]]; then
    draw "${2:-gpu-extender}"
    cat "$graph"
    exit 0
fi

# package:fewest-modules (a crate drawn with fewer has likely changed the output format).
for entry in gpu-extender:10 gpu-engine:5 gpu-sim:5 gpu-lab:3; do
    package="${entry%%:*}"
    least="${entry##*:}"
    draw "$package"
    # `"a::b" -> "a::c" [label="uses", ...]` becomes `a::b a::c`; a module's use of itself is no
    # loop.
    edges="$(sed -n 's/^ *"\([^"]*\)" -> "\([^"]*\)" \[label="uses".*/\1 \2/p' "$graph" | awk '$1 != $2')"
    modules="$(grep -c '// "mod" node' "$graph" || true)"
    if [[ -z "$edges" || "$modules" -lt "$least" ]]; then
        log "$package: cargo-modules drew $modules modules and no edges: is its output format still the one parsed here?"
        exit 1
    fi
    if ! printf '%s\n' "$edges" | tsort >/dev/null 2>"$graph.loops"; then
        log "$package: the module graph has a cycle (tsort names its modules):"
        grep -v '^tsort: -: input contains a loop:$' "$graph.loops" | sed 's/^tsort: /  /' >&2
        exit 1
    fi
    log "$package: $modules modules, $(printf '%s\n' "$edges" | wc -l) import edges, no cycles"
done
