//! A process's resident set, read from `/proc` (Linux): what the memory figures of the load
//! examples are.

use anyhow::{Context, Result};

/// The resident set (`VmRSS`) of process `pid`, or of this process for `None`, in KiB.
pub fn rss_kib(pid: Option<u32>) -> Result<u64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_owned(),
    };
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .with_context(|| format!("no VmRSS in {path}"))
}
