//! The fuzz corpus as regression tests, on stable Rust: every saved input of every cargo-fuzz
//! target (`fuzz/corpus/<target>/`, seeds and what fuzzing found) goes through the same checks
//! the fuzzer applies (`fuzz/harness.rs`). A crash the fuzzer once found stays fixed once its
//! input is saved here (`fuzz/artifacts/` → `fuzz/corpus/`, see docs/reliability.md).

#[path = "../fuzz/harness.rs"]
mod harness;

use std::path::{Path, PathBuf};

use harness::Verb;

fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} holds no inputs", dir.display());
    files
}

fn replay(target: &str, check: impl Fn(&[u8])) {
    let files = corpus(target);
    for file in &files {
        let data =
            std::fs::read(file).unwrap_or_else(|error| panic!("{}: {error}", file.display()));
        // The path in the panic message names the input that broke.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&data)));
        if outcome.is_err() {
            panic!(
                "{target}: {} fails its checks (message above)",
                file.display()
            );
        }
    }
    eprintln!("{target}: {} inputs replayed", files.len());
}

#[test]
fn extender_filter_corpus() {
    replay("extender_filter", |data| {
        harness::extender_verb(Verb::Filter, data)
    });
}

#[test]
fn extender_prioritize_corpus() {
    replay("extender_prioritize", |data| {
        harness::extender_verb(Verb::Prioritize, data)
    });
}

#[test]
fn extender_bind_corpus() {
    replay("extender_bind", |data| {
        harness::extender_verb(Verb::Bind, data)
    });
}

#[test]
fn extender_preempt_corpus() {
    replay("extender_preempt", |data| {
        harness::extender_verb(Verb::Preempt, data)
    });
}

#[test]
fn node_corpus() {
    replay("node", harness::node);
}

#[test]
fn pod_corpus() {
    replay("pod", harness::pod);
}
