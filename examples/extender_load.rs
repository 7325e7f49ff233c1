//! Load run for the extender's HTTP surface on loopback: a server on one core (a single-threaded
//! runtime) answering filter and prioritize for a synthetic cluster, and a client on another
//! thread replaying kube-scheduler's serial loop (one request at a time, keep-alive), for a fixed
//! number of requests. Prints p50/p99/p99.9 latency and requests per second per verb, and the
//! CPU time the server spent per request (the process's CPU time less the client thread's).
//!
//! With `--binders N`, a bind phase follows: N client threads bind one-GPU pods concurrently
//! (`POST /bind`, each pod to its own node, round-robin over the exclusive-mode nodes) through
//! the real binder over an in-memory API that answers every Binding after `--api-latency-ms`,
//! while one more thread keeps kube-scheduler's serial filter loop going. The pods reach the
//! state the way the watch delivers them (the feed). Prints binds/s and the latency of binds and
//! of the filters made meanwhile: what the shared state's locks cost when binds and reads meet.
//!
//! With `--filter-best-only`, filter answers as in the recommended dedicated-scheduler setup
//! (`policy.filterBestOnly`): it scores every candidate and passes only the best one.
//!
//! ```sh
//! cargo run --release --example extender_load -- --nodes 500 --candidates 500 --requests 20000
//! cargo run --release --example extender_load -- --nodes 1000 --candidates 420 --filter-best-only
//! cargo run --release --example extender_load -- --nodes 5000 --requests 1000 --binders 16 --server-threads 2
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

use gpu_engine::{
    CpuMilli, GpuDemand, GpuMode, GpuPlacement, MemMiB, NodeName, NodeSpec, PodKey, PodRequest,
    Table, fit,
};
use gpu_extender::config::Config;
use gpu_extender::http::server::{AppState, router};
use gpu_extender::k8s::api::{BindingWrite, PodApi};
use gpu_extender::k8s::bind::{Binder, MeteredBinder};
use gpu_extender::k8s::watch::Feed;
use gpu_extender::state::{ApiError, ClusterState, PolicyCell, TableWriter};
use gpu_extender::telemetry::Metrics;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;

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
    /// Concurrent bind clients in the bind phase (0: no bind phase).
    #[arg(long, default_value_t = 0)]
    binders: usize,
    /// Pods bound in the bind phase (the synthetic cluster has about two free GPUs on each
    /// exclusive-mode node, every fourth node: at most about `--nodes / 2`).
    #[arg(long, default_value_t = 2000)]
    bind_pods: usize,
    /// How long the in-memory API takes to answer a Binding, in milliseconds.
    #[arg(long, default_value_t = 0)]
    api_latency_ms: u64,
    /// Worker threads of the server's runtime (1: a current-thread runtime).
    #[arg(long, default_value_t = 1)]
    server_threads: usize,
    /// Filter passes only the policy's best node (`policy.filterBestOnly`, the recommended
    /// dedicated-scheduler setup), so filter does what prioritize would and answers one name.
    #[arg(long)]
    filter_best_only: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mut config = Config::default();
    config = config.with_override("policy.scoring", &args.scoring, "--scoring")?;
    if args.filter_best_only {
        config = config.with_override("policy.filterBestOnly", "true", "--filter-best-only")?;
    }
    let config = Arc::new(config);
    let table = synthetic_table(&config, args.nodes)?;
    let writer = TableWriter::new(ClusterState::with_table(table));
    let cluster = Arc::clone(writer.reader());
    let policy: PolicyCell = config.engine_policy().into();
    let metrics = Metrics::new()?;
    let binder = Binder::new(
        writer.clone(),
        Arc::clone(&config),
        policy.clone(),
        InstantApi {
            latency: Duration::from_millis(args.api_latency_ms),
        },
    );
    let binder = MeteredBinder::new(
        binder,
        metrics.clone(),
        Instant::now(),
        Duration::from_secs(30),
    );
    let state = AppState::new(Arc::clone(&cluster), config.clone(), metrics)
        .with_policy(policy)
        .with_binder(Arc::new(binder))
        .with_body_limit(64 << 20);
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let app = router(state, "/scheduler");
    // The server on its own OS thread: by default one core (a current-thread runtime).
    let server_threads = args.server_threads;
    std::thread::spawn(move || -> Result<()> {
        let runtime = if server_threads <= 1 {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
        } else {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(server_threads)
                .enable_all()
                .build()?
        };
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
    if args.binders > 0 {
        bind_phase(&args, &config, &writer, address, &names)?;
    }
    Ok(())
}

/// The in-memory API of the bind phase: every Binding succeeds after `latency`.
#[derive(Clone, Copy, Debug)]
struct InstantApi {
    latency: Duration,
}

impl PodApi for InstantApi {
    async fn create_binding(&self, _binding: &BindingWrite) -> Result<(), ApiError> {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        Ok(())
    }

    async fn get_pod(&self, _namespace: &str, _name: &str) -> Result<Option<Pod>, ApiError> {
        Ok(None)
    }
}

/// `--binders` clients bind `--bind-pods` one-GPU pods concurrently while one more client keeps
/// filtering; prints the bind rate and both latency distributions.
fn bind_phase(
    args: &Args,
    config: &Arc<Config>,
    cluster: &TableWriter,
    address: std::net::SocketAddr,
    names: &[String],
) -> Result<()> {
    // The pods arrive as the watch delivers them: pending, through the feed.
    let mut feed = Feed::new(
        cluster.clone(),
        Arc::clone(config),
        Arc::new(config.engine_policy()),
    );
    // Each pod goes to an exclusive-mode node with a GPU free for it, planned on a copy of the
    // table, round-robin: every bind should succeed, and consecutive binds hit different nodes.
    let policy = config.engine_policy();
    let mut plan = cluster.read().clone();
    let one_gpu = PodRequest::single(CpuMilli(1000), MemMiB(4096), GpuDemand::whole(1)?);
    let exclusive: Vec<String> = (0..args.nodes)
        .filter(|index| index % 4 == 2)
        .map(node_name)
        .collect();
    let mut targets = Vec::with_capacity(args.bind_pods);
    let mut cursor = 0;
    while targets.len() < args.bind_pods && cursor < exclusive.len() * 8 {
        let node = &exclusive[cursor % exclusive.len()];
        cursor += 1;
        let Some(state) = plan.node(&NodeName::new(node)) else {
            continue;
        };
        if let Ok(allocation) = fit(state, &one_gpu, &policy) {
            let key = PodKey::new("plan", &format!("p-{}", targets.len()));
            plan.reserve(key, allocation, u64::MAX).context("plan")?;
            targets.push(node.clone());
        }
    }
    if targets.len() < args.bind_pods {
        bail!(
            "only {} free GPUs on exclusive-mode nodes for --bind-pods {}: more --nodes",
            targets.len(),
            args.bind_pods
        );
    }
    let mut binds = Vec::with_capacity(args.bind_pods);
    for (index, node) in targets.iter().enumerate() {
        let name = format!("bind-{index}");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}")},
            "spec": {"containers": [{"name": "c", "image": "img",
                     "resources": {"limits": {"nvidia.com/gpu": "1"},
                                   "requests": {"cpu": "1", "memory": "4Gi"}}}],
                     "schedulerName": "gpu-scheduler"},
            "status": {"phase": "Pending"}
        }))?;
        feed.apply_pod_event(&Event::Apply(pod));
        binds.push(
            json!({"PodName": name, "PodNamespace": "ml", "PodUID": format!("uid-{name}"),
                   "Node": node})
            .to_string(),
        );
    }
    let filter_body =
        json!({"Pod": sample_pods()[0].1, "Nodes": null, "NodeNames": names}).to_string();
    let binds = Arc::new(binds);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let connect = || -> Result<TcpStream> {
        let stream = TcpStream::connect(address)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        stream.set_nodelay(true)?;
        Ok(stream)
    };
    let filterer = {
        let mut stream = connect()?;
        let done = Arc::clone(&done);
        std::thread::spawn(move || -> Result<Latencies> {
            let mut latencies = Latencies::new()?;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let start = Instant::now();
                post(&mut stream, "filter", &filter_body)?;
                latencies.record(start.elapsed());
            }
            Ok(latencies)
        })
    };
    let started = Instant::now();
    let clients: Vec<_> = (0..args.binders)
        .map(|_| {
            let mut stream = connect()?;
            let (binds, next) = (Arc::clone(&binds), Arc::clone(&next));
            Ok(std::thread::spawn(move || -> Result<(Latencies, usize)> {
                let mut latencies = Latencies::new()?;
                let mut refused = 0;
                loop {
                    let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(body) = binds.get(index) else {
                        break;
                    };
                    let start = Instant::now();
                    let answer = post(&mut stream, "bind", body)?;
                    latencies.record(start.elapsed());
                    let answer: serde_json::Value = serde_json::from_slice(&answer)?;
                    if let Some(error) = answer["Error"].as_str().filter(|e| !e.is_empty()) {
                        if refused == 0 {
                            println!("first refused bind: {error}");
                        }
                        refused += 1;
                    }
                }
                Ok((latencies, refused))
            }))
        })
        .collect::<Result<_>>()?;
    let mut bind_latencies = Latencies::new()?;
    let mut refused = 0;
    for client in clients {
        let (latencies, client_refused) = client
            .join()
            .map_err(|_| anyhow::anyhow!("a bind client panicked"))??;
        bind_latencies.add(&latencies)?;
        refused += client_refused;
    }
    let elapsed = started.elapsed();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let filters = filterer
        .join()
        .map_err(|_| anyhow::anyhow!("the filter client panicked"))??;
    let (b, f) = (bind_latencies.percentiles(), filters.percentiles());
    println!();
    println!(
        "bind phase: {} binds by {} clients ({} refused), API latency {} ms, server threads {}",
        b.count, args.binders, refused, args.api_latency_ms, args.server_threads
    );
    println!("| series | requests | req/s | p50 (us) | p99 (us) | p99.9 (us) | max (us) |");
    println!("|---|---|---|---|---|---|---|");
    for (label, p) in [("bind", &b), ("filter during binds", &f)] {
        println!(
            "| {label} | {} | {:.0} | {} | {} | {} | {} |",
            p.count,
            p.count as f64 / elapsed.as_secs_f64(),
            p.p50,
            p.p99,
            p.p999,
            p.max
        );
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
