#!/usr/bin/env bash
# Each library crate's module dependency graph has no cycles (part of `make lint`; decision 0007):
# the service (gpu-extender), the engine, the simulator and the lab. Between crates cargo itself
# refuses cycles.
#
# cargo-modules (installed from crates.io into $GPU_TEST_CACHE/tools on first use, about six
# minutes on 2 cores) draws the graph the compiler's own analysis sees: every `use` and every
# path, re-exports resolved, `#[cfg(test)]` modules left out. It is drawn with its items, and
# scripts/module-edges.awk moves each end of an edge to the module that owns it, so importing
# one type of a module counts as importing the module (drawn without items, such imports were
# lost, and loops made of them went unseen). A parent's use of its own descendants is dropped
# there: a parent re-exporting its children is a facade, not a dependency. Its `--acyclic` flag is not used:
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

# Draws the item graph of package $1 into $graph.
draw() {
    PATH="$TOOLS/bin:$PATH" cargo modules dependencies --package "$1" --lib \
        --no-externs --no-sysroot --no-owns >"$graph"
}

# The module edges of the graph in $1, one "from to" pair a line.
module_edges() { awk -f "$ROOT/scripts/module-edges.awk" "$1" | sort -u; }

# The check must see a loop made only of item imports between siblings (a::x uses a::y's type,
# a::y uses a::x's function) and must not see one in a parent re-exporting its child.
cat >"$graph" <<'DOT'
    "c" [label="crate|c"]; // "crate" node
    "c::a" [label="mod|c::a"]; // "mod" node
    "c::a::x" [label="mod|c::a::x"]; // "mod" node
    "c::a::y" [label="mod|c::a::y"]; // "mod" node
    "c::a" -> "c::a::x::f" [label="uses"]; // "uses" edge
    "c::a::x::f" -> "c::a::y::T" [label="uses"]; // "uses" edge
    "c::a::y::T::new" -> "c::a::x::f" [label="uses"]; // "uses" edge
DOT
if module_edges "$graph" | tsort >/dev/null 2>&1 \
    || [[ "$(module_edges "$graph" | tr '\n' ';')" != "c::a::x c::a::y;c::a::y c::a::x;" ]]; then
    log "scripts/module-edges.awk no longer reads item imports as module edges: fix it first"
    exit 1
fi

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
    edges="$(module_edges "$graph")"
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
