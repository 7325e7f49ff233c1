//! What the extender holds for Dynamic Resource Allocation: a watch feed (the production `Feed`
//! and `ClusterState`) given `--nodes` nodes that only a DRA driver serves, each with one
//! ResourceSlice of `--gpus` whole GPUs as NVIDIA's driver publishes them (the list, as the
//! ResourceSlice watch delivers it), then `--claims` allocated ResourceClaims of one or two GPUs
//! with their pods; prints the growth of the resident set for the slices and for the claims. No
//! API server: the objects are built here, in the shape kube-apiserver sends.
//!
//! ```sh
//! cargo run --release --example dra_memory -- --nodes 5000 --gpus 8 --claims 20000
//! ```

#![allow(clippy::print_stdout, reason = "a command-line report")]

use std::sync::Arc;

use anyhow::Result;
use clap::Parser;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::runtime::watcher::Event;
use serde_json::json;

use gpu_extender::config::Config;
use gpu_extender::k8s::dra::DraEvent;
use gpu_extender::k8s::watch::Feed;
use gpu_extender::state::{ClusterState, TableWriter};

#[path = "support/rss.rs"]
mod rss;
use rss::rss_kib;

#[derive(Debug, Parser)]
struct Args {
    /// Nodes, each served by the DRA driver alone (no GPU capacity of their own).
    #[arg(long, default_value_t = 5000)]
    nodes: usize,
    /// Whole GPUs in each node's ResourceSlice.
    #[arg(long, default_value_t = 8)]
    gpus: usize,
    /// Allocated claims, one or two GPUs each (alternately), filling the nodes in order.
    #[arg(long, default_value_t = 20_000)]
    claims: usize,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let cfg = Arc::new(Config::default());
    let state = TableWriter::new(ClusterState::for_config(&cfg));
    let mut feed = Feed::new(state.clone(), cfg.clone(), Arc::new(cfg.engine_policy()));
    feed.watch_dra();
    feed.apply_node_event(&Event::Init);
    for i in 0..args.nodes {
        let capacity = json!({"cpu": "96", "memory": "768Gi", "pods": "250"});
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": node_name(i), "labels": {"kubernetes.io/hostname": node_name(i)}},
            "status": {"capacity": capacity, "allocatable": capacity},
        }))?;
        feed.apply_node_event(&Event::InitApply(node));
    }
    feed.apply_node_event(&Event::InitDone);
    feed.apply_pod_event(&Event::Init);
    feed.apply_pod_event(&Event::InitDone);

    let before = rss_kib(None)?;
    feed.apply_dra_event(DraEvent::Slice(Ok(Event::Init)));
    for i in 0..args.nodes {
        feed.apply_dra_event(DraEvent::Slice(Ok(Event::InitApply(slice(i, args.gpus)?))));
    }
    feed.apply_dra_event(DraEvent::Slice(Ok(Event::InitDone)));
    let with_slices = rss_kib(None)?;

    feed.apply_dra_event(DraEvent::Claim(Ok(Event::Init)));
    feed.apply_dra_event(DraEvent::Claim(Ok(Event::InitDone)));
    let (mut node, mut gpu) = (0, 0);
    let mut allocated = 0;
    for i in 0..args.claims {
        let want = 1 + i % 2;
        if gpu + want > args.gpus {
            node += 1;
            gpu = 0;
        }
        if node >= args.nodes {
            break;
        }
        let devices: Vec<usize> = (gpu..gpu + want).collect();
        gpu += want;
        feed.apply_dra_event(DraEvent::Claim(Ok(Event::Apply(claim(i, node, &devices)?))));
        allocated += 1;
    }
    let with_claims = rss_kib(None)?;
    let table = state.read();
    let counts = state.dra_read().book.counts();
    println!(
        "{} nodes, {} ResourceSlices of {} GPUs ({} GPUs read): resident set +{} KiB, {} bytes per GPU",
        args.nodes,
        counts.slices,
        args.gpus,
        counts.gpus,
        with_slices.saturating_sub(before),
        with_slices.saturating_sub(before) * 1024 / (args.nodes * args.gpus).max(1) as u64
    );
    println!(
        "{allocated} claims allocated ({} in the table's count): resident set +{} KiB, {} bytes per claim; {} nodes in the table",
        counts.claims_allocated,
        with_claims.saturating_sub(with_slices),
        with_claims.saturating_sub(with_slices) * 1024 / allocated.max(1) as u64,
        table.node_count(),
    );
    Ok(())
}

fn node_name(i: usize) -> String {
    format!("dra-{i:05}")
}

/// Node `i`'s ResourceSlice: `gpus` whole GPUs with NVIDIA's attributes.
fn slice(i: usize, gpus: usize) -> Result<ResourceSlice> {
    let node = node_name(i);
    let devices: Vec<_> = (0..gpus)
        .map(|g| {
            json!({
                "name": format!("gpu-{g}"),
                "attributes": {
                    "type": {"string": "gpu"},
                    "uuid": {"string": format!("GPU-{i:05}-{g}-7c1f0d2e-5a4b-4e3f-9d8c")},
                    "index": {"int": g},
                    "minor": {"int": g},
                    "productName": {"string": "NVIDIA H100 80GB HBM3"},
                    "brand": {"string": "Nvidia"},
                    "architecture": {"string": "Hopper"},
                    "cudaComputeCapability": {"version": "9.0.0"},
                    "driverVersion": {"version": "570.124.6"},
                    "cudaDriverVersion": {"version": "12.8.0"},
                },
                "capacity": {"memory": {"value": "80Gi"}},
            })
        })
        .collect();
    Ok(serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-gpu.nvidia.com-x7k2p"), "uid": format!("0d9e5a3c-{i:028}")},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }))?)
}

/// Claim `i`: GPUs `devices` of node `node`, allocated by kube-scheduler, reserved for one pod.
fn claim(i: usize, node: usize, devices: &[usize]) -> Result<ResourceClaim> {
    let node = node_name(node);
    let results: Vec<_> = devices
        .iter()
        .map(|g| json!({"request": "gpus", "driver": "gpu.nvidia.com", "pool": node, "device": format!("gpu-{g}")}))
        .collect();
    Ok(serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": format!("train-{i:06}-gpus-x7k2p"), "namespace": "load",
                     "uid": format!("6a1b2c3d-{i:028}")},
        "spec": {"devices": {"requests": [
            {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": devices.len()}},
        ]}},
        "status": {
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]},
                ]}]},
            },
            "reservedFor": [{"resource": "pods", "name": format!("train-{i:06}"), "uid": format!("7b2c3d4e-{i:028}")}],
        },
    }))?)
}
