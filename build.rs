//! Generates Rust from `proto/` (see proto/README.md): Karmada's scheduler-estimator messages and
//! server trait, and the Pod view the protobuf watch decodes. protox parses the files in Rust, so
//! the build needs no `protoc`. Also stamps the build's identity (`src/build_info.rs`): the
//! commit it was built from and the compiler that built it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Set by a build that has no `.git` (the image build: the Dockerfile's `SOURCE_COMMIT`
/// argument, which a `RUN` sees as a variable); it wins over what `git` says. Not prefixed
/// `GPU_EXTENDER_`: the binary reads variables with that prefix as configuration, and cargo
/// passes a build's variables on to `cargo run` and `cargo test`.
const COMMIT_ENV: &str = "SOURCE_COMMIT";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    stamp_identity();
    let estimator = protox::compile(["pkg/estimator/service/service.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .include_file("estimator_protos.rs")
        .compile_fds(estimator)?;
    let pod_watch = protox::compile(["gpu_extender/pod_watch.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .include_file("pod_watch_protos.rs")
        .compile_fds(pod_watch)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}

/// `BUILD_INFO_COMMIT` (the commit, 12 hex digits, or `unknown`) and `BUILD_INFO_RUSTC`
/// (`rustc --version`) for `env!`.
fn stamp_identity() {
    println!("cargo:rerun-if-env-changed={COMMIT_ENV}");
    let commit = match std::env::var(COMMIT_ENV) {
        Ok(commit) if !commit.trim().is_empty() => commit.trim().chars().take(12).collect(),
        _ => git_commit().unwrap_or_else(|| "unknown".to_owned()),
    };
    println!("cargo:rustc-env=BUILD_INFO_COMMIT={commit}");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=BUILD_INFO_RUSTC={version}");
}

/// The checkout's commit, and the files that change with it (so that a new commit restamps the
/// build); `None` outside a git checkout, or without git.
fn git_commit() -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let output = Command::new("git").args(args).output().ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    // HEAD, the branch it names and the packed refs: a commit, checkout or pack moves one.
    let git_dir = PathBuf::from(git(&["rev-parse", "--git-dir"])?);
    let common_dir = git(&["rev-parse", "--git-common-dir"]).map_or(git_dir.clone(), PathBuf::from);
    let mut watched = vec![git_dir.join("HEAD"), common_dir.join("packed-refs")];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(common_dir.join(branch));
    }
    // A path that does not exist would make cargo rerun this script on every build.
    for path in watched.iter().filter(|path| Path::new(path).exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    Some(commit)
}
