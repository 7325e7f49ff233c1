//! What the web view's data and a metrics scrape cost at scale: a table of `--nodes` 8-GPU nodes
//! (two NVLink islands of four, one GPU in 50 unhealthy), about half the GPUs shared by pods, and
//! 150 pending GPU pods that fit nowhere; times building `/ui/data` (the `/inspect` report, each
//! pod's shares, the capacity, `explain` for the first 25 pending pods) and encoding it as JSON,
//! and prints the size; then times a `/metrics` render (the whole of it, and apart the part that
//! holds the table's read lock: the report and the capacity) and prints its size. With
//! `--serve ADDR` it then serves the admin routes (`/ui`, `/ui/data`) on that fixed table until
//! killed, for timing the page itself in a browser (docs/benchmarks.md, "Web view" and
//! "Metrics scrape").
//!
//! ```sh
//! cargo run --release --example ui_data -- --nodes 5000 [--serve 127.0.0.1:9191]
//! ```

#![allow(clippy::print_stdout, reason = "a command-line report")]

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use gpu_engine::topology::{Link, LinkMatrix};
use gpu_engine::{
    Change, CpuMilli, Gpu, GpuDemand, GpuMode, MemMiB, NodeSpec, PodKey, PodRequest, Table, fit,
};
use gpu_extender::config::Config;
use gpu_extender::http::server::{AppState, admin_router};
use gpu_extender::http::ui;
use gpu_extender::state::ClusterState;
use gpu_extender::telemetry::Metrics;
use k8s_openapi::api::core::v1::Pod;

fn main() -> Result<()> {
    let mut nodes = 5000usize;
    let mut serve = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--nodes" => nodes = args.next().context("--nodes N")?.parse()?,
            "--serve" => serve = Some(args.next().context("--serve ADDR")?),
            other => bail!("unknown argument {other} (--nodes N, --serve ADDR)"),
        }
    }
    let config = Arc::new(Config::default());
    let policy = config.engine_policy();
    let table = build(nodes, &policy)?;
    let cluster = Arc::new(ClusterState::with_table(table));
    for i in 0..150 {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": format!("team-{}", i % 7), "name": format!("waiting-{i}"), "uid": format!("u{i}")},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"aliyun.com/gpu-mem": "60"}}}]}
        }))?;
        cluster.note_gpu_pod(
            PodKey::new(&format!("team-{}", i % 7), &format!("waiting-{i}")),
            &format!("u{i}"),
            Some(Arc::new(pod)),
        );
    }
    let waiting: Vec<ui::Waiting> = cluster
        .pending_pods(|_| true)
        .into_iter()
        .filter_map(|(key, pod)| {
            let request = gpu_extender::objects::translate::pod_request(&pod, &config).ok()??;
            Some(ui::Waiting {
                pod: key,
                request,
                scheduler: None,
            })
        })
        .collect();
    let table = cluster.read();
    for round in 0..3 {
        let start = Instant::now();
        let view = ui::view(&table, &policy, &waiting, None);
        let built = start.elapsed();
        let json = serde_json::to_vec(&view)?;
        let encoded = start.elapsed() - built;
        println!(
            "round {round}: {nodes} nodes, {} pending explained: built in {:.1} ms, encoded in {:.1} ms, {:.2} MiB of JSON",
            view.pending.len(),
            built.as_secs_f64() * 1000.0,
            encoded.as_secs_f64() * 1000.0,
            json.len() as f64 / (1024.0 * 1024.0)
        );
    }
    drop(table);
    let metrics = Metrics::new()?;
    metrics.watch_state(Arc::clone(&cluster), policy.clone().into())?;
    for round in 0..3 {
        let start = Instant::now();
        let table = cluster.read();
        let report = gpu_extender::inspect::report(&table);
        let reported = start.elapsed();
        let capacity = gpu_extender::inspect::capacity(&table, &policy.typical);
        let locked = start.elapsed();
        drop(table);
        std::hint::black_box((&report, &capacity));
        let start = Instant::now();
        let text = metrics.render()?;
        let rendered = start.elapsed();
        println!(
            "round {round}: /metrics: report {:.1} ms, capacity {:.1} ms (under the read lock), whole render {:.1} ms, {:.2} MiB, {} series",
            reported.as_secs_f64() * 1000.0,
            (locked - reported).as_secs_f64() * 1000.0,
            rendered.as_secs_f64() * 1000.0,
            text.len() as f64 / (1024.0 * 1024.0),
            text.lines().filter(|line| !line.starts_with('#')).count()
        );
    }
    if let Some(addr) = serve {
        let state = AppState::new(cluster, config, Metrics::new()?)
            .with_policy(policy.into())
            .with_body_limit(1 << 20);
        let runtime = tokio::runtime::Runtime::new()?;
        runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind(&addr).await?;
            println!("serving http://{addr}/ui");
            axum::serve(listener, admin_router(state)).await?;
            anyhow::Ok(())
        })?;
    }
    Ok(())
}

/// `count` nodes of eight 80 GiB GPUs in two NVLink islands; GPUs shared by pods of 10..40 GiB.
fn build(count: usize, policy: &gpu_engine::Policy) -> Result<Table> {
    let mut table = Table::new(20);
    let links = LinkMatrix::from_fn(8, |a, b| {
        if a / 4 == b / 4 {
            Link::NvLink(12)
        } else {
            Link::HostBridge
        }
    });
    let mut pods = 0u64;
    for n in 0..count {
        let name = format!("gpu-node-{n:05}");
        let gpus = (0..8u16)
            .map(|i| {
                let mut gpu = Gpu::new(
                    i,
                    if n % 3 == 0 {
                        "NVIDIA-H100"
                    } else {
                        "NVIDIA-A100"
                    },
                    MemMiB(80 * 1024),
                );
                gpu.healthy = (n * 8 + usize::from(i)) % 50 != 7;
                gpu
            })
            .collect();
        let spec = NodeSpec::with_gpus(&name, GpuMode::ShareMemory, gpus, links.clone()).with_host(
            CpuMilli(128_000),
            MemMiB(1 << 20),
            110,
        );
        table.apply(Change::UpsertNode(spec));
        for p in 0..(n % 9) {
            let request = PodRequest::single(
                CpuMilli(1000),
                MemMiB(1024),
                GpuDemand::share(10 + (p as u64 * 7) % 31, 1, None)?,
            );
            let Some(node) = table.node_by_str(&name) else {
                continue;
            };
            if let Ok(allocation) = fit(node, &request, policy) {
                pods += 1;
                table.apply(Change::PodBound {
                    pod: PodKey::new(&format!("team-{}", p % 7), &format!("job-{n}-{p}")),
                    allocation,
                });
            }
        }
    }
    println!("{count} nodes, {pods} pods bound");
    Ok(table)
}
