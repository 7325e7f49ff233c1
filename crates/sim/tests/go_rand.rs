//! Checks the simulator's port of Go's `math/rand` against Go itself: the oracle program in
//! `crates/sim/tests/go-rand-oracle` prints what Go draws for a seed (in the reference simulator's order),
//! and the port must print the same, for the paper's seeds 42..51 and a few odd ones. `#[ignore]`d
//! (a plain `cargo test` counts it as ignored): it needs a Go toolchain, and `make test` runs it
//! with `--ignored` when one is installed (the end-to-end tests build Kubernetes with one).

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpu_sim::go_rand::GoRand;

const PODS: usize = 8152;
const PICKS: usize = 3000;
const NODES: usize = 1213;

fn go_command() -> Option<PathBuf> {
    let on_path = Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|out| out.status.success());
    if on_path {
        return Some(PathBuf::from("go"));
    }
    let fallback = Path::new("/usr/local/go/bin/go");
    fallback.exists().then(|| fallback.to_path_buf())
}

/// What the port draws, in the oracle's format.
fn port(seed: i64) -> String {
    let mut go = GoRand::new(seed);
    let mut out = String::new();
    let _ = write!(out, "int\n{}\nshuffle\n", go.int());
    let mut order: Vec<usize> = (0..PODS).collect();
    go.shuffle(order.len(), |i, j| order.swap(i, j));
    for value in order {
        let _ = writeln!(out, "{value}");
    }
    out.push_str("intn\n");
    for _ in 0..PICKS {
        let _ = writeln!(out, "{}", go.intn(PODS));
    }
    out.push_str("perm\n");
    for value in go.perm(NODES) {
        let _ = writeln!(out, "{value}");
    }
    out.push_str("int31n\n");
    for n in [1, 2, 3, 7, 100, 1 << 20, i32::MAX] {
        let _ = writeln!(out, "{}", go.int31n(n));
    }
    out.push_str("int63n\n");
    for n in [1, 3, 1000, 1 << 40, (1 << 62) + 12345] {
        let _ = writeln!(out, "{}", go.int63n(n));
    }
    out
}

#[test]
#[ignore = "needs a Go toolchain; make test runs it when go is there, or cargo test --test go_rand -- --ignored"]
fn the_port_draws_what_go_draws() {
    let go = go_command().expect("a Go toolchain: go on PATH or /usr/local/go/bin/go");
    let oracle = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/go-rand-oracle");
    // Cargo's scratch directory for integration tests: outside the clone, kept between runs.
    let binary = Path::new(env!("CARGO_TARGET_TMPDIR")).join("go-rand-oracle");
    let built = Command::new(&go)
        .args(["build", "-o"])
        .arg(&binary)
        .arg(".")
        .current_dir(&oracle)
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .output()
        .expect("go build runs");
    assert!(
        built.status.success(),
        "go build of the oracle failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    for seed in (42..=51).chain([0, 1, -7, 1 << 40]) {
        let expected = Command::new(&binary)
            .args([
                format!("-seed={seed}"),
                format!("-pods={PODS}"),
                format!("-picks={PICKS}"),
                format!("-nodes={NODES}"),
            ])
            .output()
            .expect("the oracle runs");
        assert!(expected.status.success(), "oracle failed for seed {seed}");
        let expected = String::from_utf8_lossy(&expected.stdout);
        let ours = port(seed);
        if let Some((line, (want, got))) = expected
            .lines()
            .zip(ours.lines())
            .enumerate()
            .find(|(_, (want, got))| want != got)
        {
            panic!("seed {seed}: line {line}: Go drew {want}, the port {got}");
        }
        assert_eq!(
            expected.lines().count(),
            ours.lines().count(),
            "seed {seed}"
        );
    }
}
