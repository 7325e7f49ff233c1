//! Capacity coming and going: a pending pod is bound within seconds once a fitting node appears
//! (what a cluster-autoscaler scale-up looks like), and a pod that finishes or is deleted frees
//! its GPUs for a waiting pod.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::ensure;

use crate::objects::{
    GPU_MEM, GpuNode, Mode, NVIDIA_GPU, PodSpec, create_bound, create_node, create_pod, delete_pod,
    list_pods, node_of, set_phase, wait_bound, wait_unschedulable,
};
use crate::record::{check_cluster, check_inspect, record_of};
use crate::{BIND, up};

/// How soon a waiting pod must be bound once capacity appears.
const PROMPT: Duration = Duration::from_secs(10);

#[test]
fn a_pending_pod_is_bound_soon_after_a_fitting_node_is_added() {
    crate::harness::run("scale-up", async |c| {
        let mut nodes = vec![GpuNode::new("t4", Mode::Share, 2, "Tesla-T4", 16)];
        up(c, &nodes, "").await?;

        // Rejected by the extender (per-GPU memory), not by kube-scheduler's aggregate check.
        create_pod(&c.client, &PodSpec::new("big-share", GPU_MEM, 20)).await?;
        // Rejected by kube-scheduler itself: no node advertises whole GPUs.
        create_pod(&c.client, &PodSpec::new("whole", NVIDIA_GPU, 2)).await?;
        wait_unschedulable(&c.client, "big-share", BIND).await?;
        wait_unschedulable(&c.client, "whole", BIND).await?;

        let added = [
            GpuNode::new("a10-new", Mode::Share, 2, "NVIDIA-A10", 24),
            GpuNode::new("l4-new", Mode::Exclusive, 2, "NVIDIA-L4", 24),
        ];
        for (node, pod) in added.iter().zip(["big-share", "whole"]) {
            let t0 = Instant::now();
            create_node(&c.client, node).await?;
            let bound = wait_bound(&c.client, pod, PROMPT).await?;
            ensure!(
                node_of(&bound) == Some(node.name.as_str()),
                "{pod} went to {:?}",
                node_of(&bound)
            );
            eprintln!(
                "  {pod}: bound {:.2}s after node {} was added",
                t0.elapsed().as_secs_f64(),
                node.name
            );
            nodes.push(node.clone());
        }
        let pods = list_pods(&c.client).await?;
        check_cluster(&nodes, &pods, &BTreeMap::new())?;
        Ok(())
    });
}

#[test]
fn finished_or_deleted_pods_free_their_gpus_for_waiting_pods() {
    crate::harness::run("free-on-exit", async |c| {
        let nodes = vec![
            GpuNode::new("excl-1", Mode::Exclusive, 1, "NVIDIA-A100-PCIE-40GB", 40),
            GpuNode::new("t4x2", Mode::Share, 2, "Tesla-T4", 16),
        ];
        up(c, &nodes, "").await?;

        // Whole GPU: a Succeeded pod frees it, then a deleted one.
        create_bound(&c.client, &PodSpec::new("w-1", NVIDIA_GPU, 1), BIND).await?;
        create_pod(&c.client, &PodSpec::new("w-2", NVIDIA_GPU, 1)).await?;
        wait_unschedulable(&c.client, "w-2", BIND).await?;
        let t0 = Instant::now();
        set_phase(&c.client, "w-1", "Succeeded").await?;
        wait_bound(&c.client, "w-2", PROMPT).await?;
        eprintln!(
            "  w-2: bound {:.2}s after w-1 succeeded",
            t0.elapsed().as_secs_f64()
        );
        create_pod(&c.client, &PodSpec::new("w-3", NVIDIA_GPU, 1)).await?;
        wait_unschedulable(&c.client, "w-3", BIND).await?;
        let t0 = Instant::now();
        delete_pod(&c.client, "w-2").await?;
        wait_bound(&c.client, "w-3", PROMPT).await?;
        eprintln!(
            "  w-3: bound {:.2}s after w-2 was deleted",
            t0.elapsed().as_secs_f64()
        );

        let pods = list_pods(&c.client).await?;
        let usage = check_cluster(&nodes, &pods, &BTreeMap::new())?;
        check_inspect(&c.inspect().await?, &usage)?;
        Ok(())
    });
}

/// Known gap, kept as a runnable scenario (it fails intermittently: about one run in three here).
/// When only the extender holds a shared-GPU pod back (kube-scheduler's aggregate
/// `aliyun.com/gpu-mem` fit passes) and a share frees up, kube-scheduler does requeue the waiting
/// pod at once, on the very pod event that frees the share (seen 13 ms after the phase change),
/// but the extender's own pod watch may not have applied that event yet: filter answers from the
/// older table ("insufficient GPU memory on any single GPU"), the pod goes back to the
/// unschedulable pods, and no later event requeues it, so it waits for kube-scheduler's periodic
/// flush (`podMaxInUnschedulablePodsDuration`, 5 minutes). The extender's table is right a moment
/// later (`/inspect` shows the share free while the pod waits). Not seen for whole GPUs in 12
/// rounds. A fix must come from the extender (make kube-scheduler retry pods it rejected once its
/// table frees capacity, or not answer a rejection from a table that lags the scheduler); run with
/// `--ignored` to check one.
#[test]
#[ignore = "known gap: the extender's watch can lag the requeue that a freed share triggers; the pod then waits minutes"]
fn finished_or_deleted_shares_free_their_gpu_for_waiting_pods() {
    crate::harness::run("free-shares-on-exit", async |c| {
        let nodes = vec![GpuNode::new("t4x2", Mode::Share, 2, "Tesla-T4", 16)];
        up(c, &nodes, "").await?;

        // Shares: 10 GiB on each T4 leaves 6 + 6 GiB; an 8 GiB pod passes kube-scheduler's
        // aggregate check but fits no single GPU, so only the extender holds it back.
        let a = create_bound(&c.client, &PodSpec::new("s-1", GPU_MEM, 10), BIND).await?;
        create_bound(&c.client, &PodSpec::new("s-2", GPU_MEM, 10), BIND).await?;
        create_pod(&c.client, &PodSpec::new("s-3", GPU_MEM, 8)).await?;
        wait_unschedulable(&c.client, "s-3", BIND).await?;
        let t0 = Instant::now();
        set_phase(&c.client, "s-1", "Failed").await?;
        let s3 = wait_bound(&c.client, "s-3", PROMPT).await?;
        eprintln!(
            "  s-3: bound {:.2}s after s-1 failed",
            t0.elapsed().as_secs_f64()
        );
        ensure!(
            record_of(&s3)?.all_gpus() == record_of(&a)?.all_gpus(),
            "s-3 should take the GPU s-1 freed"
        );
        // 8 + 6 GiB free now; 10 fits neither until s-2 is deleted.
        create_pod(&c.client, &PodSpec::new("s-4", GPU_MEM, 10)).await?;
        wait_unschedulable(&c.client, "s-4", BIND).await?;
        let t0 = Instant::now();
        delete_pod(&c.client, "s-2").await?;
        wait_bound(&c.client, "s-4", PROMPT).await?;
        eprintln!(
            "  s-4: bound {:.2}s after s-2 was deleted",
            t0.elapsed().as_secs_f64()
        );

        let pods = list_pods(&c.client).await?;
        let usage = check_cluster(&nodes, &pods, &BTreeMap::new())?;
        check_inspect(&c.inspect().await?, &usage)?;
        Ok(())
    });
}
