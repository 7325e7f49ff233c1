//! The Kubernetes binaries the loopback control plane runs (etcd, kube-apiserver,
//! kube-scheduler, kube-controller-manager, kubectl), found or built by the checkout's `scripts/k8s-bins.sh`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, ensure};

/// The Kubernetes binaries: `GPU_TEST_K8S_BIN`, else what the checkout's
/// `scripts/k8s-bins.sh` builds (minutes the first time).
pub fn k8s_bins(repo: &Path) -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("GPU_TEST_K8S_BIN") {
        return Ok(PathBuf::from(dir));
    }
    eprintln!(
        "building or finding the Kubernetes binaries with scripts/k8s-bins.sh (a first \
         build takes about 8 minutes)"
    );
    let output = Command::new(repo.join("scripts/k8s-bins.sh"))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}/scripts/k8s-bins.sh", repo.display()))?;
    ensure!(output.status.success(), "scripts/k8s-bins.sh failed");
    let stdout = String::from_utf8_lossy(&output.stdout);
    Ok(PathBuf::from(
        stdout.lines().last().unwrap_or_default().trim(),
    ))
}
