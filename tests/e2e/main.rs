//! End-to-end scenarios: the gpu-extender binary behind a real kube-scheduler and kube-apiserver
//! (loopback control plane from `scripts/control-plane.sh`, fake GPU nodes, no kubelets).
//!
//! Each scenario gets its own control plane and runs alone (see `harness::run`). Every scenario is
//! `#[ignore]`d, so a plain `cargo test` counts them as ignored; `make test` runs them with
//! `--ignored`, and run without the Kubernetes binaries they fail saying how to get them. The list
//! of scenarios and what each proves is in `docs/testing.md`.

mod harness;
mod objects;
mod proxy;
mod record;

mod admin_auth;
mod autoscaling;
mod burst;
mod configs;
mod doors;
mod dra;
mod failover;
mod faults;
mod image;
mod karmada;
mod karmada_full;
mod lifecycle;
mod mig;
mod models;
mod modes;
mod node_agent;
mod observe;
mod preemption;
mod quota;
mod rejections;
mod replay;
mod restart;
mod state;
mod tls;
mod trust;
mod upgrade;
mod watch;
mod web_view;

use std::time::Duration;

use anyhow::Result;

use harness::{Cluster, PROFILE_CONFIG};
use objects::{GpuNode, create_nodes};

/// How long a pod that fits may take to be bound.
pub const BIND: Duration = Duration::from_secs(20);

/// The usual start: create `nodes`, start the extender (`config`: its YAML configuration, empty
/// for the defaults) and kube-scheduler with the `gpu-scheduler` profile.
pub async fn up(c: &mut Cluster, nodes: &[GpuNode], config: &str) -> Result<()> {
    up_with_scheduler_flags(c, nodes, config, &[]).await
}

/// [`up`] with extra kube-scheduler command-line flags (feature gates).
pub async fn up_with_scheduler_flags(
    c: &mut Cluster,
    nodes: &[GpuNode],
    config: &str,
    flags: &[&str],
) -> Result<()> {
    create_nodes(&c.client, nodes).await?;
    c.start_extender(config).await?;
    c.start_scheduler_with_flags(PROFILE_CONFIG, flags).await
}
