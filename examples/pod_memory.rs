//! What the extender holds per bound pod: a watch feed (the production `Feed` and
//! `ClusterState`) given `--nodes` sharing nodes and then `--pods` bound GPU pods with their
//! allocation records, as the pod watch delivers them; prints the growth of the resident set
//! per pod. No API server: the events are built here, in the shape kube-apiserver sends.
//!
//! ```sh
//! cargo run --release --example pod_memory -- --nodes 5000 --pods 150000
//! ```

#![allow(clippy::print_stdout, reason = "a command-line report")]

use std::sync::Arc;

use anyhow::Result;
use clap::Parser;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher::Event;
use serde_json::json;

use gpu_extender::config::Config;
use gpu_extender::k8s::watch::Feed;
use gpu_extender::state::{ClusterState, TableWriter};

#[path = "support/rss.rs"]
mod rss;
use rss::rss_kib;

#[derive(Debug, Parser)]
struct Args {
    /// Sharing nodes of 8 T4s each.
    #[arg(long, default_value_t = 5000)]
    nodes: usize,
    /// Bound pods of 1 GiB each, spread over the nodes' GPUs.
    #[arg(long, default_value_t = 150_000)]
    pods: usize,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let cfg = Arc::new(Config::default());
    let state = TableWriter::new(ClusterState::for_config(&cfg));
    let mut feed = Feed::new(state.clone(), cfg.clone(), Arc::new(cfg.engine_policy()));
    feed.apply_node_event(&Event::Init);
    for i in 0..args.nodes {
        let capacity = json!({"cpu": "96", "memory": "768Gi", "aliyun.com/gpu-mem": "128",
                              "aliyun.com/gpu-count": "8", "pods": "250"});
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": node_name(i), "labels": {
                "ack.node.gpu.schedule": "cgpu",
                "aliyun.accelerator/nvidia_name": "Tesla-T4",
                "aliyun.accelerator/nvidia_mem": "16384MiB",
                "aliyun.accelerator/nvidia_count": "8"}},
            "status": {"capacity": capacity, "allocatable": capacity},
        }))?;
        feed.apply_node_event(&Event::InitApply(node));
    }
    feed.apply_node_event(&Event::InitDone);
    feed.apply_pod_event(&Event::Init);
    feed.apply_pod_event(&Event::InitDone);

    let before = rss_kib(None)?;
    for i in 0..args.pods {
        let node = node_name(i % args.nodes.max(1));
        let gpu = (i / args.nodes.max(1)) % 8;
        let uid = format!("5f0c3d1e-8a2b-4c5d-9e6f-{i:012}");
        let record = json!({"version": 1, "node": node, "podUid": uid,
            "containers": [{"name": "main", "gpus": [{"index": gpu, "memoryMiB": 1024}]}]});
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("p-{i:06}"), "namespace": "load", "uid": uid,
                         "creationTimestamp": "2026-11-23T03:48:40Z",
                         "annotations": {"gpu-extender.io/allocation": record.to_string()}},
            "spec": {"nodeName": node, "schedulerName": "gpu-scheduler", "containers": [{
                "name": "main", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": "100m", "memory": "1Gi", "aliyun.com/gpu-mem": "1"},
                              "limits": {"aliyun.com/gpu-mem": "1"}}}]},
            "status": {"phase": "Running"},
        }))?;
        feed.apply_pod_event(&Event::Apply(pod));
    }
    let after = rss_kib(None)?;
    let stats = state.stats();
    println!(
        "{} nodes, {} bound pods in the table (records missing {}, corrupt {}): resident set +{} KiB, {} bytes per pod",
        args.nodes,
        state.read().pod_count(),
        stats.records_missing,
        stats.records_corrupt,
        after.saturating_sub(before),
        after.saturating_sub(before) * 1024 / args.pods.max(1) as u64
    );
    Ok(())
}

fn node_name(i: usize) -> String {
    format!("gpu-{i:05}")
}
