//! A built binary run as a user runs it: in a directory of its own, without the caller's
//! `GPU_EXTENDER_*`, `RUST_LOG` or `KUBECONFIG` (they would change what it prints).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

/// `binary` with `args`, in `dir`, with none of the caller's variables that change its output.
pub fn command(binary: &str, dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(binary);
    command.args(args).current_dir(dir);
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy().into_owned();
        if name.starts_with("GPU_EXTENDER_") || name == "RUST_LOG" || name == "KUBECONFIG" {
            command.env_remove(name);
        }
    }
    command
}

/// `binary` with `args` in a scratch directory of its own (tests run in parallel), removed
/// afterwards; a binary that cannot be started is an error.
pub fn run(binary: &str, args: &[&str]) -> std::io::Result<Output> {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let dir = scratch(&format!("run-{}", RUNS.fetch_add(1, Ordering::Relaxed)))?;
    let output = command(binary, &dir, args).output();
    let _ = std::fs::remove_dir_all(dir);
    output
}

/// A run's standard output, lossily decoded.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A run's standard error, lossily decoded.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// An empty directory named for this test process and `name`, under the system's temporary
/// directory.
pub fn scratch(name: &str) -> std::io::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("gpu-extender-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
