# Reads a cargo-modules dependency graph drawn with its items (types, functions, traits) and
# prints its "uses" edges as "from to" pairs of modules: each end is moved to the module that
# owns it, so an import of one item counts as an import of its module. Dropped: a module's use
# of itself, and a module's use of its own descendants (a parent owns its children and re-exports
# them: that is a facade, not a dependency; a child using its parent's items is kept, so a
# child that a sibling and the parent both lean on still shows up in any sibling loop).
/\/\/ "(mod|crate)" node/ {
    match($0, /"[^"]*"/)
    modules[substr($0, RSTART + 1, RLENGTH - 2)] = 1
    next
}
/\[label="uses"/ {
    split($0, quoted, "\"")
    edges[++count] = quoted[2] SUBSEP quoted[4]
}
function owner(path) {
    while (!(path in modules) && index(path, "::") > 0) sub(/::[^:]*$/, "", path)
    return path
}
END {
    for (i = 1; i <= count; i++) {
        split(edges[i], ends, SUBSEP)
        from = owner(ends[1])
        to = owner(ends[2])
        if (from != to && index(to, from "::") != 1) print from, to
    }
}
