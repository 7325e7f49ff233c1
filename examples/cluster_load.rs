//! Sustained load against the real thing: a loopback control plane (etcd + kube-apiserver from
//! `scripts/control-plane.sh`, through `gpu_test_support::plane`), 5,000 GPU nodes in it, the release `gpu-extender` binary watching
//! it, and a generator playing kube-scheduler: for every pending pod one filter over 500 candidate
//! names, one prioritize over the nodes that passed, one bind of the best (a real Binding with the
//! allocation record, written to kube-apiserver). Stages at increasing pod rates, then a long
//! steady phase of filter and prioritize only; the extender's resident memory is sampled every
//! 500 ms throughout. Bounded: it stops by itself after the last phase and tears everything down.
//!
//! ```sh
//! cargo build --release && cargo run --release --example cluster_load -- \
//!     --nodes 5000 --rates 25,50,100,200 --stage-seconds 20 --steady-seconds 120
//! ```
//!
//! The Kubernetes binaries come from `$GPU_TEST_K8S_BIN`, else from `scripts/k8s-bins.sh`.

#![allow(clippy::print_stdout, reason = "a command-line report")]

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use rand::seq::IndexedRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

#[path = "support/http_load.rs"]
mod http_load;
#[path = "support/rss.rs"]
mod rss;
use gpu_test_support::plane::{ControlPlane, ExtenderLaunch, launch_extender};
use gpu_test_support::port::free_addr;
use http_load::{Latencies, Percentiles, post};
use rss::rss_kib;

#[derive(Debug, Parser)]
struct Args {
    /// GPU nodes in the cluster (8 GPUs each).
    #[arg(long, default_value_t = 5000)]
    nodes: usize,
    /// Candidate node names per filter call (kube-scheduler sends about 500 at 5,000 nodes).
    #[arg(long, default_value_t = 500)]
    candidates: usize,
    /// Pod arrival rates of the stages, pods per second.
    #[arg(long, value_delimiter = ',', default_value = "25,50,100,200")]
    rates: Vec<u32>,
    /// Length of each stage.
    #[arg(long, default_value_t = 20)]
    stage_seconds: u64,
    /// Length of the final phase of filter and prioritize only (no binds), for memory drift.
    #[arg(long, default_value_t = 120)]
    steady_seconds: u64,
    /// Concurrent binds (kube-scheduler binds in parallel goroutines).
    #[arg(long, default_value_t = 16)]
    bind_workers: usize,
    /// The extender binary (default: `gpu-extender` next to this example's target directory).
    #[arg(long)]
    extender: Option<PathBuf>,
    /// Keep the control plane's directory (logs) after the run.
    #[arg(long)]
    keep: bool,
}

const NAMESPACE: &str = "load";

fn main() -> Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let outcome = runtime.block_on(run(&args));
    drop(runtime);
    outcome
}

/// Everything started for the run: the control plane (the workspace's one driver) and the
/// extender; stopped on drop, whatever happened.
struct Plane {
    plane: ControlPlane,
    extender: Option<Child>,
}

impl Drop for Plane {
    fn drop(&mut self) {
        if let Some(mut child) = self.extender.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn extender_binary(args: &Args) -> Result<PathBuf> {
    if let Some(path) = &args.extender {
        return Ok(path.clone());
    }
    // target/<profile>/examples/cluster_load -> target/<profile>/gpu-extender
    let exe = std::env::current_exe()?;
    let path = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("gpu-extender"))
        .ok_or_else(|| anyhow!("cannot place {}", exe.display()))?;
    ensure!(
        path.is_file(),
        "{} is missing: run `cargo build --release` first, or pass --extender",
        path.display()
    );
    Ok(path)
}

async fn run(args: &Args) -> Result<()> {
    let bins = gpu_test_support::bins::k8s_bins(&root())?;
    let extender_bin = extender_binary(args)?;
    let t0 = Instant::now();
    let dir = std::env::temp_dir().join(format!("gpu-extender-load-{}", std::process::id()));
    let mut plane = Plane {
        plane: ControlPlane::start(&root(), &bins, dir, &[], args.keep)?,
        extender: None,
    };
    let kubeconfig = plane.plane.kubeconfig();
    let client = plane.plane.client().await?;
    println!(
        "control plane up in {:.1}s ({})",
        t0.elapsed().as_secs_f64(),
        plane.plane.dir().display()
    );

    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?,
        )
        .await
        .context("creating the namespace")?;

    let t0 = Instant::now();
    let nodes = create_nodes(&client, args.nodes).await?;
    println!(
        "{} nodes created in {:.1}s",
        nodes.len(),
        t0.elapsed().as_secs_f64()
    );

    // The extender, watching the plane with the admin identity.
    let listen = free_addr()?;
    let admin = free_addr()?;
    // An empty configuration file: every default.
    let config = plane.plane.dir().join("extender.yaml");
    std::fs::write(&config, "")?;
    let t0 = Instant::now();
    let child = launch_extender(&ExtenderLaunch {
        binary: &extender_bin,
        log: &plane.plane.dir().join("extender.log"),
        config: &config,
        kubeconfig: &kubeconfig,
        listen,
        admin,
        args: &[],
        env: &[("RUST_LOG", "warn")],
        start: 1,
        ready_within: Duration::from_secs(120),
    })
    .await?;
    let pid = child.id();
    plane.extender = Some(child);
    println!(
        "extender ready in {:.1}s (pid {pid}, RSS {} MiB with {} nodes)",
        t0.elapsed().as_secs_f64(),
        rss_kib(Some(pid))? / 1024,
        nodes.len()
    );

    let memory = Arc::new(MemoryLog::default());
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (memory, sampling) = (memory.clone(), sampling.clone());
        std::thread::spawn(move || {
            let start = Instant::now();
            while sampling.load(Ordering::Acquire) {
                if let Ok(kib) = rss_kib(Some(pid)) {
                    memory.sample(start.elapsed(), kib);
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };

    memory.phase("idle, nodes loaded");
    std::thread::sleep(Duration::from_secs(2));
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut report = Vec::new();
    let mut serial = 0usize;
    for &rate in &args.rates {
        let count = rate as usize * args.stage_seconds as usize;
        memory.phase(&format!("creating pods for {rate} pods/s"));
        let t0 = Instant::now();
        let pods = create_pods(&client, serial, count).await?;
        serial += count;
        println!(
            "stage {rate} pods/s: {count} pods created in {:.1}s",
            t0.elapsed().as_secs_f64()
        );
        memory.phase(&format!("{rate} pods/s"));
        let stage = tokio::task::spawn_blocking({
            let names = nodes.clone();
            let seed = rng.random();
            let (candidates, workers) = (args.candidates, args.bind_workers);
            move || schedule(listen, &names, pods, rate, candidates, workers, seed)
        })
        .await??;
        report.push((format!("{rate} pods/s"), stage));
    }

    memory.phase("steady (filter + prioritize)");
    let steady = tokio::task::spawn_blocking({
        let names = nodes.clone();
        let pod = steady_pod();
        let (candidates, seconds) = (args.candidates, args.steady_seconds);
        let seed = rng.random();
        move || steady_state(listen, &names, &pod, candidates, seconds, seed)
    })
    .await??;
    sampling.store(false, Ordering::Release);
    let _ = sampler.join();

    print_report(&report, &steady, &memory);
    Ok(())
}

/// Nodes: 8 GPUs each; half memory-sharing T4s (`cgpu`), a quarter sharing A10s, a quarter
/// exclusive A100s.
async fn create_nodes(client: &kube::Client, count: usize) -> Result<Vec<String>> {
    let api: Api<Node> = Api::all(client.clone());
    let names: Vec<String> = (0..count).map(|i| format!("gpu-{i:05}")).collect();
    futures::stream::iter(names.iter().enumerate())
        .map(|(i, name)| {
            let api = api.clone();
            async move {
                let (model, mem_gib, share) = match i % 4 {
                    0 | 1 => ("Tesla-T4", 16u64, true),
                    2 => ("NVIDIA-A10", 24, true),
                    _ => ("NVIDIA-A100-SXM4-80GB", 80, false),
                };
                let mut labels = BTreeMap::from([
                    ("kubernetes.io/hostname".to_owned(), name.clone()),
                    (
                        "aliyun.accelerator/nvidia_name".to_owned(),
                        model.to_owned(),
                    ),
                    (
                        "aliyun.accelerator/nvidia_mem".to_owned(),
                        format!("{}MiB", mem_gib * 1024),
                    ),
                    ("aliyun.accelerator/nvidia_count".to_owned(), "8".to_owned()),
                ]);
                let mut capacity = BTreeMap::from([
                    ("cpu".to_owned(), "96".to_owned()),
                    ("memory".to_owned(), "768Gi".to_owned()),
                    ("pods".to_owned(), "250".to_owned()),
                ]);
                if share {
                    labels.insert("ack.node.gpu.schedule".to_owned(), "cgpu".to_owned());
                    capacity.insert("aliyun.com/gpu-mem".to_owned(), (8 * mem_gib).to_string());
                    capacity.insert("aliyun.com/gpu-count".to_owned(), "8".to_owned());
                } else {
                    capacity.insert("nvidia.com/gpu".to_owned(), "8".to_owned());
                }
                let node: Node =
                    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))?;
                api.create(&PostParams::default(), &node)
                    .await
                    .with_context(|| format!("creating node {name}"))?;
                let status = json!({"status": {
                    "capacity": capacity, "allocatable": capacity,
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                    "message": "load-test node (no kubelet)"}],
                }});
                api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .with_context(|| format!("setting the status of node {name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(names)
}

/// Pods of a realistic mix: 4 GiB and 8 GiB shares, 1 and 2 whole GPUs.
fn pod_object(index: usize) -> Value {
    let (resource, qty) = match index % 10 {
        0..=4 => ("aliyun.com/gpu-mem", 4),
        5..=7 => ("aliyun.com/gpu-mem", 8),
        8 => ("nvidia.com/gpu", 1),
        _ => ("nvidia.com/gpu", 2),
    };
    json!({
        "metadata": {"name": format!("p-{index:06}"), "namespace": NAMESPACE},
        "spec": {
            "schedulerName": "gpu-scheduler",
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main", "image": "registry.k8s.io/pause:3.10",
                "resources": {
                    "requests": {"cpu": "1", "memory": "1Gi", resource: qty},
                    "limits": {resource: qty},
                },
            }],
        },
    })
}

/// Creates pods `first..first + count` and returns them as the API server stored them.
async fn create_pods(client: &kube::Client, first: usize, count: usize) -> Result<Vec<Pod>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    futures::stream::iter(first..first + count)
        .map(|index| {
            let api = api.clone();
            async move {
                let pod: Pod = serde_json::from_value(pod_object(index))?;
                api.create(&PostParams::default(), &pod)
                    .await
                    .with_context(|| format!("creating pod {index}"))
            }
        })
        .buffered(32)
        .try_collect()
        .await
}

/// What one stage measured.
#[derive(Debug, Default)]
struct Stage {
    pods: usize,
    seconds: f64,
    filter: Percentiles,
    prioritize: Percentiles,
    bind: Percentiles,
    /// How long binds waited for a free bind worker.
    bind_queue: Percentiles,
    /// Pods that fit no candidate (filter passed nothing).
    unplaced: usize,
    /// Transport failures and non-200 answers.
    http_errors: usize,
    /// Binds answered with an `Error`.
    bind_errors: usize,
    first_bind_error: Option<String>,
}

/// What the bind workers saw.
#[derive(Debug)]
struct BindResults {
    latencies: Latencies,
    queued: Latencies,
    http_errors: usize,
    errors: usize,
    first_error: Option<String>,
}

/// One scheduling cycle per pod, paced at `rate` pods per second (a cycle that falls behind
/// starts at once): filter and prioritize serially on one connection, as kube-scheduler's loop
/// does; the bind handed to one of `workers` threads, each with its own connection.
fn schedule(
    addr: SocketAddr,
    names: &[String],
    pods: Vec<Pod>,
    rate: u32,
    candidates: usize,
    workers: usize,
    seed: u64,
) -> Result<Stage> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut stream = connect(addr)?;
    let (jobs, queue) = mpsc::channel::<(String, Instant)>();
    let queue = Arc::new(Mutex::new(queue));
    let results = Arc::new(Mutex::new(BindResults {
        latencies: Latencies::new()?,
        queued: Latencies::new()?,
        http_errors: 0,
        errors: 0,
        first_error: None,
    }));
    let handles: Vec<_> = (0..workers)
        .map(|_| {
            let (queue, results) = (queue.clone(), results.clone());
            std::thread::spawn(move || -> Result<()> {
                let mut stream = connect(addr)?;
                loop {
                    let job = queue.lock().unwrap_or_else(PoisonError::into_inner).recv();
                    let Ok((body, queued)) = job else {
                        return Ok(());
                    };
                    let started = Instant::now();
                    let answer = post(&mut stream, "bind", &body);
                    let took = started.elapsed();
                    let mut r = results.lock().unwrap_or_else(PoisonError::into_inner);
                    r.queued.record(started.duration_since(queued));
                    match answer {
                        Ok(raw) => {
                            r.latencies.record(took);
                            let error = serde_json::from_slice::<Value>(&raw)
                                .ok()
                                .and_then(|v| v["Error"].as_str().map(str::to_owned))
                                .unwrap_or_default();
                            if !error.is_empty() {
                                r.errors += 1;
                                r.first_error.get_or_insert(error);
                            }
                        }
                        Err(_) => {
                            r.http_errors += 1;
                            drop(r);
                            stream = connect(addr)?;
                        }
                    }
                }
            })
        })
        .collect();

    let mut stage = Stage {
        pods: pods.len(),
        ..Stage::default()
    };
    let (mut filter, mut prioritize) = (Latencies::new()?, Latencies::new()?);
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let started = Instant::now();
    for (i, pod) in pods.iter().enumerate() {
        let due = started + interval * u32::try_from(i).unwrap_or(u32::MAX);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let chosen: Vec<&String> = names.sample(&mut rng, candidates).collect();
        let pod_json = serde_json::to_value(pod)?;
        let body = json!({"Pod": pod_json, "Nodes": null, "NodeNames": chosen}).to_string();
        let t = Instant::now();
        let passed = match post(&mut stream, "filter", &body) {
            Ok(raw) => {
                filter.record(t.elapsed());
                let answer: Value = serde_json::from_slice(&raw)?;
                answer["NodeNames"]
                    .as_array()
                    .map(|names| {
                        names
                            .iter()
                            .filter_map(|n| n.as_str().map(str::to_owned))
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default()
            }
            Err(_) => {
                stage.http_errors += 1;
                stream = connect(addr)?;
                continue;
            }
        };
        if passed.is_empty() {
            stage.unplaced += 1;
            continue;
        }
        let body = json!({"Pod": pod_json, "Nodes": null, "NodeNames": passed}).to_string();
        let t = Instant::now();
        let best = match post(&mut stream, "prioritize", &body) {
            Ok(raw) => {
                prioritize.record(t.elapsed());
                let scores: Value = serde_json::from_slice(&raw)?;
                scores
                    .as_array()
                    .and_then(|list| {
                        list.iter()
                            .max_by_key(|host| host["Score"].as_i64().unwrap_or(0))
                            .and_then(|host| host["Host"].as_str().map(str::to_owned))
                    })
                    .ok_or_else(|| anyhow!("prioritize answered no host"))?
            }
            Err(_) => {
                stage.http_errors += 1;
                stream = connect(addr)?;
                continue;
            }
        };
        let bind = json!({
            "PodName": pod.metadata.name, "PodNamespace": NAMESPACE,
            "PodUID": pod.metadata.uid, "Node": best,
        })
        .to_string();
        jobs.send((bind, Instant::now()))
            .map_err(|_| anyhow!("the bind workers stopped"))?;
    }
    drop(jobs);
    for handle in handles {
        handle
            .join()
            .map_err(|_| anyhow!("a bind worker panicked"))??;
    }
    stage.seconds = started.elapsed().as_secs_f64();
    let binds = results.lock().unwrap_or_else(PoisonError::into_inner);
    stage.http_errors += binds.http_errors;
    stage.bind_errors = binds.errors;
    stage.first_bind_error = binds.first_error.clone();
    stage.filter = filter.percentiles();
    stage.prioritize = prioritize.percentiles();
    stage.bind = binds.latencies.percentiles();
    stage.bind_queue = binds.queued.percentiles();
    Ok(stage)
}

/// The pod of the steady phase: never bound, so the table does not change underneath.
fn steady_pod() -> Value {
    let mut pod = pod_object(999_999);
    pod["metadata"]["uid"] = json!("steady-0");
    pod
}

/// What the steady phase measured.
#[derive(Debug, Default)]
struct Steady {
    requests: u64,
    seconds: f64,
    filter: Percentiles,
    prioritize: Percentiles,
    errors: usize,
}

/// Filter and prioritize back to back, as fast as they are answered, for `seconds`, with fresh
/// candidate lists: what memory does per request once the table stands still.
fn steady_state(
    addr: SocketAddr,
    names: &[String],
    pod: &Value,
    candidates: usize,
    seconds: u64,
    seed: u64,
) -> Result<Steady> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut stream = connect(addr)?;
    let (mut filter, mut prioritize) = (Latencies::new()?, Latencies::new()?);
    let mut errors = 0;
    let started = Instant::now();
    let end = started + Duration::from_secs(seconds);
    while Instant::now() < end {
        let chosen: Vec<&String> = names.sample(&mut rng, candidates).collect();
        let body = json!({"Pod": pod, "Nodes": null, "NodeNames": chosen}).to_string();
        for (verb, series) in [("filter", &mut filter), ("prioritize", &mut prioritize)] {
            let t = Instant::now();
            match post(&mut stream, verb, &body) {
                Ok(_) => series.record(t.elapsed()),
                Err(_) => {
                    errors += 1;
                    stream = connect(addr)?;
                }
            }
        }
    }
    let (filter, prioritize) = (filter.percentiles(), prioritize.percentiles());
    Ok(Steady {
        requests: filter.count + prioritize.count,
        seconds: started.elapsed().as_secs_f64(),
        filter,
        prioritize,
        errors,
    })
}

/// Resident memory samples, each tagged with the phase it was taken in.
#[derive(Debug, Default)]
struct MemoryLog {
    inner: Mutex<Samples>,
}

#[derive(Debug, Default)]
struct Samples {
    phase: String,
    /// (seconds since the first sample, phase, KiB)
    taken: Vec<(f64, String, u64)>,
}

/// The samples of one phase.
#[derive(Debug)]
struct PhaseMemory {
    name: String,
    first: u64,
    last: u64,
    min: u64,
    max: u64,
    /// (seconds, KiB)
    points: Vec<(f64, u64)>,
}

impl MemoryLog {
    fn phase(&self, name: &str) {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .phase = name.to_owned();
    }

    fn sample(&self, at: Duration, kib: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let phase = inner.phase.clone();
        inner.taken.push((at.as_secs_f64(), phase, kib));
    }

    /// The samples grouped by phase, in order.
    fn phases(&self) -> Vec<PhaseMemory> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<PhaseMemory> = Vec::new();
        for (at, phase, kib) in &inner.taken {
            match out.last_mut() {
                Some(last) if last.name == *phase => {
                    last.last = *kib;
                    last.min = last.min.min(*kib);
                    last.max = last.max.max(*kib);
                    last.points.push((*at, *kib));
                }
                _ => out.push(PhaseMemory {
                    name: phase.clone(),
                    first: *kib,
                    last: *kib,
                    min: *kib,
                    max: *kib,
                    points: vec![(*at, *kib)],
                }),
            }
        }
        out
    }
}

/// Least-squares slope of (x, y) points.
fn slope(points: &[(f64, u64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1 as f64).sum::<f64>() / n;
    let (mut num, mut den) = (0.0, 0.0);
    for (x, y) in points {
        num += (x - mean_x) * (*y as f64 - mean_y);
        den += (x - mean_x) * (x - mean_x);
    }
    if den == 0.0 { 0.0 } else { num / den }
}

fn print_report(stages: &[(String, Stage)], steady: &Steady, memory: &MemoryLog) {
    println!();
    println!(
        "| stage | pods | cycles/s | filter p50 / p99 / p99.9 / max (µs) | prioritize p50 / p99 / p99.9 / max (µs) | binds | bind p50 / p99 / p99.9 / max (ms) | bind queue p99 (ms) | unplaced | HTTP errors | bind errors |"
    );
    println!("|---|---:|---:|---|---|---:|---|---:|---:|---:|---:|");
    for (name, s) in stages {
        println!(
            "| {name} | {} | {:.1} | {} / {} / {} / {} | {} / {} / {} / {} | {} | {:.1} / {:.1} / {:.1} / {:.1} | {:.1} | {} | {} | {} |",
            s.pods,
            s.pods as f64 / s.seconds,
            s.filter.p50,
            s.filter.p99,
            s.filter.p999,
            s.filter.max,
            s.prioritize.p50,
            s.prioritize.p99,
            s.prioritize.p999,
            s.prioritize.max,
            s.bind.count,
            s.bind.p50 as f64 / 1000.0,
            s.bind.p99 as f64 / 1000.0,
            s.bind.p999 as f64 / 1000.0,
            s.bind.max as f64 / 1000.0,
            s.bind_queue.p99 as f64 / 1000.0,
            s.unplaced,
            s.http_errors,
            s.bind_errors,
        );
        if let Some(error) = &s.first_bind_error {
            println!("  first bind error: {error}");
        }
    }
    println!();
    println!(
        "steady phase: {} requests in {:.0}s ({:.0}/s); filter p50 / p99 / p99.9 {} / {} / {} µs; prioritize {} / {} / {} µs; {} errors",
        steady.requests,
        steady.seconds,
        steady.requests as f64 / steady.seconds.max(f64::EPSILON),
        steady.filter.p50,
        steady.filter.p99,
        steady.filter.p999,
        steady.prioritize.p50,
        steady.prioritize.p99,
        steady.prioritize.p999,
        steady.errors
    );
    println!();
    println!("| phase | RSS first (MiB) | RSS last (MiB) | min | max | drift (KiB/min) |");
    println!("|---|---:|---:|---:|---:|---:|");
    let phases = memory.phases();
    for phase in &phases {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} |",
            phase.name,
            phase.first as f64 / 1024.0,
            phase.last as f64 / 1024.0,
            phase.min as f64 / 1024.0,
            phase.max as f64 / 1024.0,
            slope(&phase.points) * 60.0
        );
    }
    let steady_points: Vec<(f64, u64)> = phases
        .into_iter()
        .filter(|p| p.name.starts_with("steady"))
        .flat_map(|p| p.points)
        .collect();
    if steady.requests > 0 {
        let per_minute = slope(&steady_points) * 60.0;
        let requests_per_minute = steady.requests as f64 / steady.seconds * 60.0;
        println!(
            "steady-phase drift: {:.0} KiB/min over {:.0} requests/min = {:.3} bytes per request",
            per_minute,
            requests_per_minute,
            per_minute * 1024.0 / requests_per_minute
        );
    }
}

fn connect(addr: SocketAddr) -> Result<TcpStream> {
    let stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}
