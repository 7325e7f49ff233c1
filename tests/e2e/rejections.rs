//! What a user sees when a GPU pod cannot be placed: a FailedScheduling event with the extender's
//! reason, and `PodScheduled` reason `Unschedulable` (the pods cluster-autoscaler simulates for a
//! scale-up), never `SchedulerError`. Malformed requests get a message that says what is wrong,
//! and the extender keeps serving.

use std::time::Duration;

use std::collections::BTreeMap;

use anyhow::{Result, ensure};

use crate::harness::metric_sum;
use crate::objects::{
    GPU_CORE, GPU_COUNT, GPU_MEM, GpuNode, Mode, PodSpec, create_bound, create_node, create_pod,
    delete_pod, list_pods, node_of, scheduled_condition, wait_failed_scheduling, wait_settled,
    wait_unschedulable,
};
use crate::record::check_cluster;
use crate::{BIND, up};

const EVENT: Duration = Duration::from_secs(15);

/// Creates the pod and checks it ends Unschedulable with a FailedScheduling event containing
/// `needle`; returns the event message.
async fn rejected(c: &crate::harness::Cluster, spec: PodSpec, needle: &str) -> Result<String> {
    create_pod(&c.client, &spec).await?;
    let pod = wait_unschedulable(&c.client, &spec.name, BIND).await?;
    let message = wait_failed_scheduling(&c.client, &spec.name, needle, EVENT).await?;
    let condition = scheduled_condition(&pod);
    ensure!(
        condition
            .as_ref()
            .is_some_and(|(_, reason, m)| reason == "Unschedulable" && m.contains(needle)),
        "pod {}: PodScheduled {condition:?}, expected Unschedulable with {needle:?}",
        spec.name
    );
    eprintln!("  {}: {message}", spec.name);
    Ok(message)
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn a_pod_that_fits_nowhere_is_unschedulable_with_our_reason() {
    crate::harness::run("fits-nowhere", async |c| {
        let mut nodes = vec![
            GpuNode::new("t4-a", Mode::Share, 2, "Tesla-T4", 16),
            GpuNode::new("t4-b", Mode::Share, 2, "Tesla-T4", 16),
        ];
        up(c, &nodes, "").await?;
        let before = c.metrics().await?;

        // Never fits: 20 GiB on one GPU of 16 (the nodes' 32 GiB in total pass kube-scheduler's
        // own aggregate check, so only the extender can tell).
        let message = rejected(
            c,
            PodSpec::new("too-big", GPU_MEM, 20),
            "node GPUs have too little memory for the request",
        )
        .await?;
        ensure!(
            message.starts_with(
                "0/2 nodes are available: 2 node GPUs have too little memory for the request."
            ),
            "too-big: {message:?}"
        );

        // Full now: 10 GiB on every GPU leaves 6 free on each, 24 in all; 8 fits no single GPU.
        for i in 0..4 {
            create_bound(
                &c.client,
                &PodSpec::new(&format!("fill-{i}"), GPU_MEM, 10),
                BIND,
            )
            .await?;
        }
        rejected(
            c,
            PodSpec::new("no-room", GPU_MEM, 8),
            "insufficient GPU memory on any single GPU",
        )
        .await?;

        // The two waiting pods would take the capacity added next.
        delete_pod(&c.client, "too-big").await?;
        delete_pod(&c.client, "no-room").await?;

        // Compute: 60 % of the only compute-sharing GPU taken, 50 % asked, memory to spare.
        let v100 = GpuNode::new("v100", Mode::CoreMem, 1, "Tesla-V100-SXM2-32GB", 32);
        create_node(&c.client, &v100).await?;
        nodes.push(v100);
        create_bound(
            &c.client,
            &PodSpec::new("cm-60", GPU_MEM, 4).with(GPU_CORE, 60),
            BIND,
        )
        .await?;
        rejected(
            c,
            PodSpec::new("cm-50", GPU_MEM, 4).with(GPU_CORE, 50),
            "insufficient GPU compute on any single GPU",
        )
        .await?;

        // At most 20 pods on one shared GPU, however small they are.
        let a100 = GpuNode::new("a100", Mode::Share, 1, "NVIDIA-A100-SXM4-80GB", 80);
        create_node(&c.client, &a100).await?;
        nodes.push(a100);
        let names: Vec<String> = (0..20).map(|i| format!("tiny-{i:02}")).collect();
        for name in &names {
            create_pod(&c.client, &PodSpec::new(name, GPU_MEM, 1).on("a100")).await?;
        }
        let settled = wait_settled(&c.client, &names, BIND).await?;
        ensure!(
            settled.iter().all(|p| node_of(p).is_some()),
            "20 pods of 1 GiB should all fit one 80 GiB GPU"
        );
        rejected(
            c,
            PodSpec::new("tiny-20", GPU_MEM, 1).on("a100"),
            "shared GPUs are at their pod limit",
        )
        .await?;

        let pods = list_pods(&c.client).await?;
        check_cluster(&nodes, &pods, &BTreeMap::new())?;
        let after = c.metrics().await?;
        for reason in [
            "gpu_memory_too_small",
            "insufficient_gpu_memory",
            "insufficient_gpu_compute",
            "shared_gpu_pod_limit",
        ] {
            let labels = [("reason", reason)];
            let moved = metric_sum(&after, "gpu_extender_rejections_total", &labels)
                - metric_sum(&before, "gpu_extender_rejections_total", &labels);
            ensure!(
                moved >= 1.0,
                "gpu_extender_rejections_total{{reason={reason}}} did not move"
            );
        }
        Ok(())
    });
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn malformed_requests_get_a_clear_event() {
    crate::harness::run("malformed", async |c| {
        let nodes = vec![
            GpuNode::new("t4", Mode::Share, 4, "Tesla-T4", 16),
            GpuNode::new("v100", Mode::CoreMem, 2, "Tesla-V100-SXM2-32GB", 32),
        ];
        up(c, &nodes, "").await?;
        let cases = [
            (
                PodSpec::new("uneven-split", GPU_MEM, 15).label(GPU_COUNT, "2"),
                "GPU memory 15 GiB cannot be split evenly over 2 GPUs",
            ),
            (
                PodSpec::new("bad-core", GPU_MEM, 4).with(GPU_CORE, 33),
                "GPU core percentage 33 must be a multiple of 5",
            ),
            (
                PodSpec::new("core-only", GPU_CORE, 50),
                "GPU core percentage needs a GPU memory request as well",
            ),
            (
                PodSpec::new("bad-model", GPU_MEM, 4)
                    .annotation("gpu-extender.io/model-include", "A100|H100"),
                "\"A100|H100\" is not valid",
            ),
            (
                PodSpec::new("bad-count", GPU_MEM, 4).label(GPU_COUNT, "two"),
                GPU_COUNT,
            ),
            (
                PodSpec::new("bad-min-mem", GPU_MEM, 4)
                    .annotation("gpu-extender.io/min-gpu-memory", "40"),
                "needs a unit",
            ),
        ];
        for (spec, needle) in cases {
            rejected(c, spec, needle).await?;
        }
        // The extender is still up and still places pods.
        c.admin_get("/readyz").await?;
        create_bound(&c.client, &PodSpec::new("fine", GPU_MEM, 4), BIND).await?;
        Ok(())
    });
}
