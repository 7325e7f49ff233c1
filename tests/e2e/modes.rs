//! Every sharing mode and request kind of product.md, on a heterogeneous cluster, with the GPUs
//! each pod got (read from its allocation record) checked against the policy.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Pod;

use crate::objects::{
    GPU_CORE, GPU_COUNT, GPU_MEM, GpuNode, Mode, NVIDIA_GPU, PodSpec, TOPOLOGY_GPU, create_bound,
    list_pods,
};
use crate::record::{Record, check_cluster, check_inspect, gpus_annotation, record_of};
use crate::{BIND, up};

const NODE_GPUS: &str = "gpu-extender.io/gpus";

fn cluster() -> Vec<GpuNode> {
    vec![
        GpuNode::new("topo-a100", Mode::Topology, 8, "NVIDIA-A100-SXM4-80GB", 80).annotation(
            NODE_GPUS,
            &gpus_annotation(8, 4, "NVIDIA-A100-SXM4-80GB", 81920, &[]),
        ),
        GpuNode::new("t4-binpack", Mode::Share, 4, "Tesla-T4", 16).placement("binpack"),
        GpuNode::new("t4-idle", Mode::Share, 4, "Tesla-T4", 16).placement("binpack"),
        // GPU 3 is unhealthy: it must never be chosen.
        GpuNode::new("a10-spread", Mode::Share, 4, "NVIDIA-A10", 24)
            .placement("spread")
            .annotation(NODE_GPUS, &gpus_annotation(4, 4, "NVIDIA-A10", 24576, &[3])),
        GpuNode::new("v100-coremem", Mode::CoreMem, 2, "Tesla-V100-SXM2-32GB", 32),
        GpuNode::new("a100-excl", Mode::Exclusive, 1, "NVIDIA-A100-PCIE-40GB", 40),
        GpuNode::new("l4-excl", Mode::Exclusive, 4, "NVIDIA-L4", 24),
    ]
}

/// Creates the pod, waits until it is bound, and returns its node and record.
async fn place(c: &crate::harness::Cluster, spec: PodSpec) -> Result<(String, Record)> {
    let pod = create_bound(&c.client, &spec, BIND).await?;
    let record = record_of(&pod)?;
    Ok((record.node.clone(), record))
}

fn one_gpu(record: &Record) -> Result<u16> {
    let gpus = record.all_gpus();
    ensure!(gpus.len() == 1, "expected one GPU, record has {gpus:?}");
    Ok(gpus[0])
}

/// The annotations the Alibaba gpushare device plugin reads, for a one-GPU share of `gib` GiB on
/// GPU `gpu` of `dev_gib` GiB.
fn check_gpushare(pod: &Pod, gpu: u16, gib: u64, dev_gib: u64) -> Result<()> {
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let get = |key: &str| {
        annotations
            .get(key)
            .map(String::as_str)
            .unwrap_or("(absent)")
    };
    let want = [
        ("ALIYUN_COM_GPU_MEM_IDX", gpu.to_string()),
        ("ALIYUN_COM_GPU_MEM_POD", gib.to_string()),
        ("ALIYUN_COM_GPU_MEM_DEV", dev_gib.to_string()),
        ("ALIYUN_COM_GPU_MEM_ASSIGNED", "false".to_owned()),
    ];
    for (key, value) in want {
        ensure!(
            get(key) == value,
            "{key} is {:?}, expected {value:?}",
            get(key)
        );
    }
    let assumed = get("ALIYUN_COM_GPU_MEM_ASSUME_TIME");
    ensure!(
        assumed.len() >= 18 && assumed.bytes().all(|b| b.is_ascii_digit()),
        "ALIYUN_COM_GPU_MEM_ASSUME_TIME {assumed:?} is not nanoseconds since the epoch"
    );
    Ok(())
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn every_mode_and_request_kind() {
    crate::harness::run("modes", async |c| {
        let nodes = cluster();
        // With the gpushare device plugin's annotations, as a cluster migrating from gpushare runs.
        up(c, &nodes, "gpushare:\n  enabled: true\n").await?;

        // Exclusive: whole GPUs, never two pods on one.
        let (node, r) = place(c, PodSpec::new("whole-1", NVIDIA_GPU, 1).on("a100-excl")).await?;
        ensure!(
            node == "a100-excl" && r.gpus_of("main") == [0],
            "whole-1: {r:?}"
        );
        let (_, a) = place(c, PodSpec::new("whole-2a", NVIDIA_GPU, 2).on("l4-excl")).await?;
        let (_, b) = place(c, PodSpec::new("whole-2b", NVIDIA_GPU, 2).on("l4-excl")).await?;
        let both: BTreeSet<u16> = a.all_gpus().into_iter().chain(b.all_gpus()).collect();
        ensure!(both.len() == 4, "whole-2a {a:?} and whole-2b {b:?} overlap");

        // Memory shares, binpack: fill one GPU before the next.
        let pod = create_bound(
            &c.client,
            &PodSpec::new("bp-4a", GPU_MEM, 4).on("t4-binpack"),
            BIND,
        )
        .await?;
        let g = one_gpu(&record_of(&pod)?)?;
        check_gpushare(&pod, g, 4, 16)?;
        for (name, gib) in [("bp-4b", 4), ("bp-8", 8)] {
            let (_, r) = place(c, PodSpec::new(name, GPU_MEM, gib).on("t4-binpack")).await?;
            ensure!(
                one_gpu(&r)? == g,
                "{name}: binpack should stay on GPU {g} until it is full, got {r:?}"
            );
        }
        let (_, r) = place(c, PodSpec::new("bp-4c", GPU_MEM, 4).on("t4-binpack")).await?;
        let h = one_gpu(&r)?;
        ensure!(
            h != g,
            "bp-4c: GPU {g} is full (16 of 16 GiB), got it anyway"
        );
        // The pod's placement annotation overrides the node's binpack: an empty GPU.
        let (_, r) = place(
            c,
            PodSpec::new("bp-spread", GPU_MEM, 2)
                .on("t4-binpack")
                .annotation("gpu-extender.io/placement", "spread"),
        )
        .await?;
        let s = one_gpu(&r)?;
        ensure!(
            s != g && s != h,
            "bp-spread: spread should pick an empty GPU, not {g} or {h}; got {s}"
        );

        // Memory shares, spread: one pod per GPU, never the unhealthy GPU 3.
        let mut spread = BTreeSet::new();
        for name in ["sp-1", "sp-2", "sp-3"] {
            let (_, r) = place(c, PodSpec::new(name, GPU_MEM, 2).on("a10-spread")).await?;
            spread.insert(one_gpu(&r)?);
        }
        ensure!(
            spread == BTreeSet::from([0, 1, 2]),
            "spread should use each healthy GPU once: {spread:?}"
        );
        // Multi-GPU share: 8 GiB split over 2 GPUs (the record check verifies 4 GiB on each).
        let (_, r) = place(
            c,
            PodSpec::new("sp-multi", GPU_MEM, 8)
                .on("a10-spread")
                .label(GPU_COUNT, "2"),
        )
        .await?;
        ensure!(r.all_gpus().len() == 2, "sp-multi: {r:?}");
        // Init containers: allocated on their own; two app containers each get their share.
        let (_, r) = place(
            c,
            PodSpec::empty("sp-init")
                .init_container("warmup", &[(GPU_MEM, 8)])
                .container("a", &[(GPU_MEM, 2)])
                .container("b", &[(GPU_MEM, 2)])
                .on("a10-spread"),
        )
        .await?;
        ensure!(
            r.init_containers.len() == 1 && r.containers.len() == 2,
            "sp-init: {r:?}"
        );

        // Memory and compute shares: compute never over 100 % of a GPU.
        let (_, r) = place(
            c,
            PodSpec::new("cm-50a", GPU_MEM, 4)
                .with(GPU_CORE, 50)
                .on("v100-coremem"),
        )
        .await?;
        let g = one_gpu(&r)?;
        let (_, r) = place(
            c,
            PodSpec::new("cm-50b", GPU_MEM, 4)
                .with(GPU_CORE, 50)
                .on("v100-coremem"),
        )
        .await?;
        ensure!(
            one_gpu(&r)? == g,
            "cm-50b: binpack should share GPU {g}: {r:?}"
        );
        let (_, r) = place(
            c,
            PodSpec::new("cm-30", GPU_MEM, 4)
                .with(GPU_CORE, 30)
                .on("v100-coremem"),
        )
        .await?;
        ensure!(
            one_gpu(&r)? != g,
            "cm-30: GPU {g} has no compute left: {r:?}"
        );

        // Topology: groups inside one NVLink island, keeping the largest intact island free.
        let island = |gpus: &[u16]| gpus.iter().map(|i| i / 4).collect::<BTreeSet<_>>();
        let (_, r2) = place(c, PodSpec::new("topo-2a", TOPOLOGY_GPU, 2)).await?;
        let first = r2.all_gpus();
        ensure!(
            first.len() == 2 && island(&first).len() == 1,
            "topo-2a: 2 GPUs of one island, got {first:?}"
        );
        let (_, r4) = place(c, PodSpec::new("topo-4", TOPOLOGY_GPU, 4)).await?;
        let four = r4.all_gpus();
        ensure!(
            four.len() == 4 && island(&four).len() == 1 && island(&four) != island(&first),
            "topo-4: the intact island, got {four:?} (topo-2a has {first:?})"
        );
        let (_, r) = place(c, PodSpec::new("topo-2b", TOPOLOGY_GPU, 2)).await?;
        let last = r.all_gpus();
        ensure!(
            island(&last) == island(&first),
            "topo-2b: the rest of topo-2a's island, got {last:?}"
        );
        let uuids: BTreeSet<String> = r4
            .containers
            .iter()
            .flat_map(|c| c.gpus.iter().filter_map(|g| g.uuid.clone()))
            .collect();
        ensure!(
            uuids.len() == 4 && uuids.iter().all(|u| u.starts_with("GPU-e2e-")),
            "topo-4: UUIDs from the node's gpus annotation expected: {r4:?}"
        );

        // Minimum GPU memory: T4s (16 GiB) are too small.
        let (node, _) = place(
            c,
            PodSpec::new("min-20g", GPU_MEM, 2)
                .annotation("gpu-extender.io/min-gpu-memory", "20Gi"),
        )
        .await?;
        ensure!(
            node == "a10-spread" || node == "v100-coremem",
            "min-20g: needs a GPU of at least 20 GiB, went to {node}"
        );

        // Node scoring (binpack): a T4 pod goes to the T4 node already in use, not the idle one.
        let (node, _) = place(
            c,
            PodSpec::new("t4-any", GPU_MEM, 1)
                .annotation("gpu-extender.io/model-include", "Tesla-T4"),
        )
        .await?;
        ensure!(
            node == "t4-binpack",
            "t4-any: binpack prefers the busy T4 node, got {node}"
        );

        let unhealthy = BTreeMap::from([("a10-spread".to_owned(), vec![3])]);
        let pods = list_pods(&c.client).await?;
        let usage = check_cluster(&nodes, &pods, &unhealthy)?;
        check_inspect(&c.inspect().await?, &usage)?;
        Ok(())
    });
}
