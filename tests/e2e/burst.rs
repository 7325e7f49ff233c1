//! A burst of GPU pods, more than the cluster holds, created as fast as the API server takes
//! them: kube-scheduler binds in parallel goroutines while it filters the next pods, and no GPU
//! may ever be over-committed. Checked from the pods' allocation records, then against the
//! extender's own table.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use futures::TryStreamExt;

use crate::harness::metric_sum;
use crate::objects::{
    GPU_CORE, GPU_COUNT, GPU_MEM, GpuNode, Mode, NVIDIA_GPU, PodSpec, TOPOLOGY_GPU, create_pod,
    list_pods, node_of, wait_settled,
};
use crate::record::{check_cluster, check_inspect, gpus_annotation};
use crate::up;

const PODS: usize = 220;

fn cluster() -> Vec<GpuNode> {
    let mut nodes = Vec::new();
    for i in 0..10 {
        nodes.push(GpuNode::new(
            &format!("t4-{i:02}"),
            Mode::Share,
            4,
            "Tesla-T4",
            16,
        ));
    }
    for i in 0..4 {
        nodes.push(
            GpuNode::new(&format!("a10-{i:02}"), Mode::Share, 4, "NVIDIA-A10", 24)
                .placement("spread"),
        );
    }
    for i in 0..2 {
        nodes.push(GpuNode::new(
            &format!("v100-{i:02}"),
            Mode::CoreMem,
            2,
            "Tesla-V100-SXM2-32GB",
            32,
        ));
    }
    for i in 0..3 {
        nodes.push(GpuNode::new(
            &format!("l4-{i:02}"),
            Mode::Exclusive,
            4,
            "NVIDIA-L4",
            24,
        ));
    }
    nodes.push(
        GpuNode::new("topo-00", Mode::Topology, 8, "NVIDIA-A100-SXM4-80GB", 80).annotation(
            "gpu-extender.io/gpus",
            &gpus_annotation(8, 4, "NVIDIA-A100-SXM4-80GB", 81920, &[]),
        ),
    );
    nodes
}

/// The burst: mostly memory shares (some split over two GPUs), compute shares, whole GPUs and
/// topology groups: about 1200 GiB of GPU memory asked of 1152, about 60 whole GPUs of 12 and
/// 46 topology GPUs of 8.
fn pod(i: usize) -> PodSpec {
    let name = format!("burst-{i:03}");
    match i % 11 {
        0..=6 => {
            let gib = [4, 8, 8, 10, 12, 8, 6][(i / 11) % 7];
            let spec = PodSpec::new(&name, GPU_MEM, gib);
            if i.is_multiple_of(5) {
                spec.label(GPU_COUNT, "2")
            } else {
                spec
            }
        }
        7 => PodSpec::new(&name, GPU_MEM, 4).with(GPU_CORE, [20, 30, 50][i % 3]),
        8 | 9 => PodSpec::new(&name, NVIDIA_GPU, 1 + (i % 2) as u64),
        _ => PodSpec::new(&name, TOPOLOGY_GPU, [1, 2, 4][(i / 11) % 3]),
    }
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn a_burst_of_pods_onto_a_crowded_cluster_never_overcommits_a_gpu() {
    crate::harness::run("burst", async |c| {
        let nodes = cluster();
        // Learning the typical-pod distribution (every second here) runs beside the burst;
        // binpack, the scoring in force, does not read it, so placements are unchanged.
        up(
            c,
            &nodes,
            "policy:\n  typicalPods:\n    learn: true\n    learnIntervalSeconds: 1\n",
        )
        .await?;

        let t0 = Instant::now();
        let specs: Vec<PodSpec> = (0..PODS).map(pod).collect();
        let client = c.client.clone();
        futures::stream::iter(specs.iter().map(Ok))
            .try_for_each_concurrent(8, |spec| {
                let client = client.clone();
                async move { create_pod(&client, spec).await.map(|_| ()) }
            })
            .await?;
        let created = t0.elapsed();
        let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
        let settled = wait_settled(&c.client, &names, Duration::from_secs(240)).await?;
        let bound = settled.iter().filter(|p| node_of(p).is_some()).count();
        let last_bind = t0.elapsed();
        eprintln!(
            "  {PODS} pods created in {:.1}s; {bound} bound, {} unschedulable, settled after \
             {:.1}s ({:.0} pods/s bound)",
            created.as_secs_f64(),
            PODS - bound,
            last_bind.as_secs_f64(),
            bound as f64 / last_bind.as_secs_f64()
        );

        let metrics = c.metrics().await?;
        for verb in ["filter", "prioritize", "bind"] {
            let labels = [("verb", verb)];
            let sum = metric_sum(
                &metrics,
                "gpu_extender_request_duration_seconds_sum",
                &labels,
            );
            let count = metric_sum(
                &metrics,
                "gpu_extender_request_duration_seconds_count",
                &labels,
            );
            eprintln!(
                "  extender {verb}: {count} calls, mean {:.2} ms",
                1000.0 * sum / count.max(1.0)
            );
        }

        // The records, and the extender's table, at one quiet moment: list, ask the extender,
        // list again, and retry if a binding happened in between.
        let mut attempt = 0;
        let (usage, report) = loop {
            attempt += 1;
            let pods = list_pods(&c.client).await?;
            let report = c.inspect().await?;
            let again = list_pods(&c.client).await?;
            let bound_set = |pods: &[k8s_openapi::api::core::v1::Pod]| {
                pods.iter()
                    .filter(|p| node_of(p).is_some())
                    .filter_map(|p| p.metadata.name.clone())
                    .collect::<BTreeSet<_>>()
            };
            if bound_set(&pods) == bound_set(&again) {
                let usage = check_cluster(&nodes, &pods, &BTreeMap::new())?;
                break (usage, report);
            }
            if attempt >= 20 {
                bail!("the set of bound pods kept changing");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        check_inspect(&report, &usage)?;

        // Crowded for real, and still packed: most capacity handed out.
        let whole_gpus_used = usage.values().filter(|u| !u.whole.is_empty()).count();
        ensure!(
            whole_gpus_used >= 18,
            "only {whole_gpus_used} of 20 whole/topology GPUs used with more asked"
        );
        let share_mem: u64 = usage.values().map(|u| u.mem).sum();
        let share_capacity: u64 = nodes
            .iter()
            .filter(|n| matches!(n.mode, Mode::Share | Mode::CoreMem))
            .map(|n| u64::from(n.gpus) * n.mem_mib())
            .sum();
        eprintln!(
            "  GPU memory shared out: {share_mem} of {share_capacity} MiB ({:.0}%); whole GPUs \
             used: {whole_gpus_used} of 20",
            100.0 * share_mem as f64 / share_capacity as f64
        );
        ensure!(
            share_mem * 10 >= share_capacity * 7,
            "only {share_mem} of {share_capacity} MiB of GPU memory handed out"
        );

        // The distribution was learned from the pods the table holds, once a second.
        let held = report["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|n| n["gpus"].as_array().into_iter().flatten())
            .flat_map(|g| g["pods"].as_array().into_iter().flatten())
            .filter_map(|p| p.as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .len() as f64;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let metrics = c.metrics().await?;
            let learned = metric_sum(&metrics, "gpu_extender_typical_pods_learned_from", &[]);
            let classes = metric_sum(&metrics, "gpu_extender_typical_pod_classes", &[]);
            if learned >= held && classes >= 1.0 {
                eprintln!(
                    "  typical pods learned from {learned} pods ({held} on GPUs): {classes} classes"
                );
                break;
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "typical pods learned from {learned} pods ({classes} classes); {held} pods hold GPUs"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    });
}
