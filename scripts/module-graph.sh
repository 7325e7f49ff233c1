#!/usr/bin/env bash
# The library's module dependency graph has no cycles (part of `make lint`; decision 0007).
#
# cargo-modules (installed from crates.io into $GPU_EXTENDER_CACHE/tools on first use, about six
# minutes on 2 cores) draws the graph the compiler's own analysis sees: every `use` and every
# path, re-exports resolved, `#[cfg(test)]` modules left out. Its `--acyclic` flag is not used:
# 0.27 checks the item graph before it filters it to modules, so a type and its own method read
# as a cycle. The "uses" edges of the module graph are checked with `tsort` instead, which
# names the modules of any loop and fails.
#
#   scripts/module-graph.sh           check; print the module count and edge count
#   scripts/module-graph.sh --dot     print the module graph (Graphviz) instead
#
# The layer order (which room may import which) is checked by tests/architecture.rs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${GPU_EXTENDER_CACHE:-$HOME/.cache/gpu-extender}"
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
trap 'rm -f "$graph"' EXIT
PATH="$TOOLS/bin:$PATH" cargo modules dependencies --lib \
    --no-externs --no-sysroot --no-fns --no-types --no-traits --no-owns >"$graph"

if [[ "${1:-}" == "--dot" ]]; then
    cat "$graph"
    exit 0
fi

# `"a::b" -> "a::c" [label="uses", ...]` becomes `a::b a::c`; a module's use of itself is no loop.
edges="$(sed -n 's/^ *"\([^"]*\)" -> "\([^"]*\)" \[label="uses".*/\1 \2/p' "$graph" | awk '$1 != $2')"
modules="$(grep -c '// "mod" node' "$graph" || true)"
if [[ -z "$edges" || "$modules" -lt 10 ]]; then
    log "cargo-modules drew $modules modules and no edges: is its output format still the one parsed here?"
    exit 1
fi
if ! printf '%s\n' "$edges" | tsort >/dev/null 2>"$graph.loops"; then
    log "the module graph has a cycle (tsort names its modules):"
    grep -v '^tsort: -: input contains a loop:$' "$graph.loops" | sed 's/^tsort: /  /' >&2
    rm -f "$graph.loops"
    exit 1
fi
rm -f "$graph.loops"
log "$modules modules, $(printf '%s\n' "$edges" | wc -l) import edges, no cycles"
