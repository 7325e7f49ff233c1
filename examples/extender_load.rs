//! Load run for the extender's HTTP surface on loopback: a server on one core (a single-threaded
//! runtime) answering filter and prioritize for a synthetic cluster, and a client on another
//! thread replaying kube-scheduler's serial loop (one request at a time, keep-alive), for a fixed
//! number of requests. Prints p50/p99/p99.9 latency and requests per second per verb, and the
//! CPU time the server spent per request (the process's CPU time less the client thread's).
//!
//! ```sh
//! cargo run --release --example extender_load -- --nodes 500 --candidates 500 --requests 20000
//! ```

#![allow(clippy::print_stdout, reason = "a command-line report")]

use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rustix::time::{ClockId, clock_gettime};
use serde_json::json;

use gpu_extender::config::Config;
use gpu_extender::engine::{
    CpuMilli, GpuDemand, GpuMode, GpuPlacement, MemMiB, NodeSpec, PodKey, PodRequest, Table, fit,
};
use gpu_extender::http::server::{AppState, router};
use gpu_extender::state::ClusterState;
use gpu_extender::telemetry::Metrics;

#[path = "support/http_load.rs"]
mod http_load;
use http_load::{Latencies, post};

#[derive(Debug, Parser)]
struct Args {
    /// Nodes in the synthetic cluster (8 GPUs each).
    #[arg(long, default_value_t = 500)]
    nodes: usize,
    /// Candidate node names per request (kube-scheduler sends at most ~500 at 5,000 nodes).
    #[arg(long, default_value_t = 500)]
    candidates: usize,
    /// Requests per verb.
    #[arg(long, default_value_t = 10_000)]
    requests: usize,
    /// Node scoring policy: binpack, spread or fgd.
    #[arg(long, default_value = "binpack")]
    scoring: String,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mut config = Config::default();
    config = config.with_override("policy.scoring", &args.scoring, "--scoring")?;
    let config = Arc::new(config);
    let table = synthetic_table(&config, args.nodes)?;
    let state = AppState {
        cluster: Arc::new(ClusterState::with_table(table)),
        policy: config.engine_policy().into(),
        config: config.clone(),
        binder: None,
        metrics: Metrics::new()?,
        body_limit: 64 << 20,
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let app = router(state, "/scheduler");
    // One core for the server: a current-thread runtime on its own OS thread.
    std::thread::spawn(move || -> Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            axum::serve(listener, app).await?;
            Ok(())
        })
    });

    let names: Vec<String> = (0..args.candidates.min(args.nodes))
        .map(node_name)
        .collect();
    let mut stream = TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_nodelay(true)?;
    println!(
        "extender load: {} nodes x 8 GPUs, {} candidates per request, {} requests per verb, policy {}",
        args.nodes,
        names.len(),
        args.requests,
        args.scoring
    );
    println!(
        "| verb | pod | requests | req/s | p50 (us) | p99 (us) | p99.9 (us) | max (us) | server CPU/req (us) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (label, pod) in sample_pods() {
        let body = json!({"Pod": pod, "Nodes": null, "NodeNames": names}).to_string();
        for verb in ["filter", "prioritize"] {
            // Warm up the connection and caches.
            for _ in 0..200 {
                post(&mut stream, verb, &body)?;
            }
            let mut latencies = Latencies::new()?;
            let started = Instant::now();
            let cpu_started = server_cpu_ns();
            for _ in 0..args.requests {
                let start = Instant::now();
                post(&mut stream, verb, &body)?;
                latencies.record(start.elapsed());
            }
            let server_cpu = server_cpu_ns().saturating_sub(cpu_started);
            let elapsed = started.elapsed();
            let p = latencies.percentiles();
            println!(
                "| {verb} | {label} | {} | {:.0} | {} | {} | {} | {} | {:.0} |",
                p.count,
                p.count as f64 / elapsed.as_secs_f64(),
                p.p50,
                p.p99,
                p.p999,
                p.max,
                server_cpu as f64 / 1000.0 / p.count as f64,
            );
        }
    }
    Ok(())
}

/// CPU time the server has used so far, in nanoseconds: the process's CPU time less this (the
/// client's) thread's. On a machine shared with other work, latency tails measure the scheduler
/// as much as the server; the CPU the server spends per request does not depend on that.
fn server_cpu_ns() -> u64 {
    let ns = |clock| {
        let t = clock_gettime(clock);
        t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
    };
    ns(ClockId::ProcessCPUTime).saturating_sub(ns(ClockId::ThreadCPUTime))
}

fn node_name(index: usize) -> String {
    format!("gpu-node-{index:05}")
}

/// A cluster of 8-GPU nodes in every mode, about half full, deterministic.
fn synthetic_table(config: &Config, nodes: usize) -> Result<Table> {
    let policy = config.engine_policy();
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let specs: Vec<NodeSpec> = (0..nodes)
        .map(|index| {
            let mode = match index % 4 {
                0 => GpuMode::ShareMemory,
                1 => GpuMode::CoreMem,
                2 => GpuMode::Exclusive,
                _ => GpuMode::Topology,
            };
            NodeSpec::uniform(
                &node_name(index),
                mode,
                8,
                "Tesla-V100-SXM2-32GB",
                MemMiB(32 * 1024),
            )
            .with_host(CpuMilli(96_000), MemMiB(768 * 1024), 110)
            .with_placement(if index % 8 < 4 {
                GpuPlacement::Binpack
            } else {
                GpuPlacement::Spread
            })
        })
        .collect();
    let mut table = Table::rebuild(policy.max_shares_per_gpu, specs.clone(), []);
    let mut placed = 0;
    for (index, spec) in specs.iter().enumerate() {
        for slot in 0..rng.random_range(0..12) {
            let demand = match spec.mode {
                GpuMode::ShareMemory => GpuDemand::share(rng.random_range(1..=16), 1, None)?,
                GpuMode::CoreMem => GpuDemand::share(
                    rng.random_range(1..=8),
                    1,
                    Some(5 * rng.random_range(1..=10)),
                )?,
                GpuMode::Exclusive => GpuDemand::whole(rng.random_range(1..=2))?,
                GpuMode::Topology => GpuDemand::topology(rng.random_range(1..=2))?,
            };
            let pod = PodRequest::single(CpuMilli(1000), MemMiB(4096), demand);
            let Some(node) = table.node(&spec.name) else {
                bail!("node vanished")
            };
            if let Ok(allocation) = fit(node, &pod, &policy) {
                table
                    .reserve(
                        PodKey::new("load", &format!("pod-{index}-{slot}")),
                        allocation,
                        u64::MAX,
                    )
                    .context("reserve")?;
                placed += 1;
            }
        }
    }
    println!("synthetic cluster: {nodes} nodes, {placed} pods placed");
    Ok(table)
}

/// Pods as kube-scheduler sends them: whole GPUs, a memory share, a memory + compute share.
fn sample_pods() -> Vec<(&'static str, serde_json::Value)> {
    let pod = |name: &str, limits: serde_json::Value| {
        json!({
            "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                         "creationTimestamp": "2026-11-01T10:00:00Z"},
            "spec": {"containers": [{"name": "c", "image": "img",
                     "resources": {"limits": limits, "requests": {"cpu": "2", "memory": "8Gi"}}}],
                     "schedulerName": "gpu-scheduler"},
            "status": {"phase": "Pending"}
        })
    };
    vec![
        ("2 whole GPUs", pod("train", json!({"nvidia.com/gpu": "2"}))),
        (
            "8 GiB share",
            pod("infer", json!({"aliyun.com/gpu-mem": "8"})),
        ),
        (
            "4 GiB + 30%",
            pod(
                "notebook",
                json!({"aliyun.com/gpu-mem": "4", "aliyun.com/gpu-core.percentage": "30"}),
            ),
        ),
    ]
}
