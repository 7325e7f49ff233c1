//! What a user sees when a GPU pod cannot be placed: a FailedScheduling event with the extender's
//! reason, and `PodScheduled` reason `Unschedulable` (what cluster-autoscaler acts on), never
//! `SchedulerError`. Malformed requests get a message that says what is wrong, and the extender
//! keeps serving.

use std::time::Duration;

use anyhow::{Result, ensure};

use crate::harness::metric_sum;
use crate::objects::{
    GPU_CORE, GPU_COUNT, GPU_MEM, GpuNode, Mode, PodSpec, create_bound, create_pod,
    scheduled_condition, wait_failed_scheduling, wait_unschedulable,
};
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
fn a_pod_that_fits_nowhere_is_unschedulable_with_our_reason() {
    crate::harness::run("fits-nowhere", async |c| {
        let nodes = vec![
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

        let after = c.metrics().await?;
        for reason in ["gpu_memory_too_small", "insufficient_gpu_memory"] {
            let labels = [("reason", reason)];
            let moved = metric_sum(&after, "gpu_extender_rejections_total", &labels)
                - metric_sum(&before, "gpu_extender_rejections_total", &labels);
            ensure!(
                moved >= 2.0,
                "rejections_total{{reason={reason}}} moved by {moved}"
            );
        }
        Ok(())
    });
}

#[test]
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
