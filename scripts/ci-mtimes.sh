#!/usr/bin/env bash
# Gives every tracked file of a fresh clone the modification time it had in the previous CI run
# on this machine when its content is the same (the same git blob), and records this run's
# times for the next. cargo judges a workspace crate's build fresh by comparing its sources'
# modification times with the build's outputs: a fresh clone's files are all new, so without
# this every run rebuilds the workspace's crates (the library, every test target, the fuzz
# targets) even when nothing changed. A file whose content changed keeps the clone's time,
# newer than any earlier build, so what depends on it is rebuilt as before. The git files the
# build script watches for the commit it stamps (build.rs) are treated alike, by their content:
# a new commit moves them, so the library and what depends on it are rebuilt with the new stamp.
# Folders are treated alike, by the names in them (build.rs watches the `proto` folder).
#
#   scripts/ci-mtimes.sh            .ci/run calls it first, in the clone's root
#
# Safe only where nothing but these CI runs builds into the target folders (an output built
# from other content after a recorded time would look fresh): .ci/run therefore builds into
# its own $GPU_TEST_CACHE/ci-target. The record is $GPU_TEST_CACHE/ci-mtimes. Without python3
# it does nothing (every run then rebuilds, as without it).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${GPU_TEST_CACHE:-$HOME/.cache/gpu-extender}
RECORD="$CACHE/ci-mtimes"
if ! command -v python3 >/dev/null; then
    echo "ci-mtimes: no python3: the clone keeps its own times (everything is rebuilt)" >&2
    exit 0
fi
mkdir -p "$CACHE"
cd "$ROOT"
git ls-files -s -z | python3 -c '
import hashlib, os, subprocess, sys
record = sys.argv[1]
known = {}
try:
    with open(record) as f:
        for line in f:
            blob, mtime, path = line.rstrip("\n").split(" ", 2)
            known[(path, blob)] = int(mtime)
except FileNotFoundError:
    pass
# Files that differ from their blob (edited in a working tree, not a clean clone) keep their time.
edited = set(
    subprocess.run(["git", "ls-files", "-m", "-z"], check=True, capture_output=True)
    .stdout.decode().split("\0")
)
counts = {"kept": 0, "changed": 0}
lines = []
def settle(path, key, digest, same=True):
    """Gives path the time recorded for (key, digest) if any (and same), else keeps its own;
    records the time it ends with."""
    mtime = known.get((key, digest)) if same else None
    if mtime is None:
        mtime = int(os.stat(path).st_mtime)
        counts["changed"] += 1
    else:
        os.utime(path, (mtime, mtime))
        counts["kept"] += 1
    lines.append(f"{digest} {mtime} {key}\n")
tracked = []
for entry in sys.stdin.buffer.read().split(b"\0"):
    if not entry:
        continue
    meta, path = entry.split(b"\t", 1)
    path = path.decode()
    if not os.path.isfile(path) or os.path.islink(path):
        continue
    tracked.append(path)
    settle(path, path, meta.split()[1].decode(), same=path not in edited)
# Folders too, by the names in them (cargo reads the time of a folder that a build script
# watches: `proto` in build.rs); a folder that gained or lost an entry keeps the clone time.
children = {}
for path in tracked:
    parts = path.split("/")
    for depth in range(1, len(parts)):
        children.setdefault("/".join(parts[:depth]), set()).add(parts[depth])
for folder, names in children.items():
    settle(folder, "dir:" + folder, hashlib.sha1("\0".join(sorted(names)).encode()).hexdigest())
# The git files the build script watches for the commit it stamps (build.rs): HEAD, the packed
# refs and the branch refs, by their content; a new commit moves them, and the stamp with it.
def git_files():
    yield ".git/HEAD"
    yield ".git/packed-refs"
    for folder, _, names in os.walk(".git/refs"):
        for name in names:
            yield os.path.join(folder, name)
for path in git_files():
    if os.path.isfile(path):
        with open(path, "rb") as f:
            settle(path, "git:" + path, hashlib.sha1(f.read()).hexdigest())
tmp = record + ".tmp"
with open(tmp, "w") as f:
    f.writelines(lines)
os.replace(tmp, record)
kept, changed = counts["kept"], counts["changed"]
print(f"ci-mtimes: {kept} files as in the previous run, {changed} new or changed", file=sys.stderr)
' "$RECORD"
