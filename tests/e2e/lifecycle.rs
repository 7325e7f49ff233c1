//! Capacity coming and going: a pending pod is bound within seconds once a fitting node appears
//! (what a cluster-autoscaler scale-up looks like), and a pod that finishes or is deleted frees
//! its GPUs for a waiting pod.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::ensure;

use crate::harness::{DEPLOYED_USER, PROFILE_CONFIG, metric_sum};
use crate::objects::{
    GPU_MEM, GpuNode, Mode, NVIDIA_GPU, PodSpec, create_bound, create_node, create_nodes,
    create_pod, delete_pod, list_pods, node_of, pods, set_phase, wait_bound,
    wait_failed_scheduling, wait_unschedulable,
};
use crate::record::{check_cluster, check_inspect, record_of};
use crate::{BIND, up};

/// How soon a waiting pod must be bound once capacity appears.
const PROMPT: Duration = Duration::from_secs(10);

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
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
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
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

/// Shares freed while a pod waits that only the extender holds back (kube-scheduler's aggregate
/// `aliyun.com/gpu-mem` fit passes). kube-scheduler requeues the waiting pod on the very event
/// that frees the share, and the extender's own watch may apply that event a few milliseconds
/// later; the retry is then answered from the older table. Before the requeue task
/// (`src/k8s/requeue.rs`) that left the pod waiting for kube-scheduler's 5-minute flush in about
/// one round in three; now the extender touches the pod once its table has freed the share. Four
/// rounds, alternating a pod that fails and one that is deleted. Whether a touch is needed in a
/// round is timing (on an idle machine kube-scheduler binds the pod before the touch is due), so
/// the touch itself is checked in a last step with kube-scheduler stopped: the waiting pod then
/// stays unschedulable, and the extender must annotate it once the share is freed. The extender
/// runs as deploy/ runs it (its ServiceAccount's token, `rbac-extender.yaml`'s rights), under the
/// pod-write policy that holds that account's pod updates to the requeue annotation.
#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn finished_or_deleted_shares_free_their_gpu_for_waiting_pods() {
    crate::harness::run("free-shares-on-exit", async |c| {
        let nodes = vec![GpuNode::new("t4x2", Mode::Share, 2, "Tesla-T4", 16)];
        c.run_extender_as_deployed().await?;
        up(c, &nodes, "").await?;
        let touched = |text: &str| {
            metric_sum(
                text,
                "gpu_extender_requeue_touches_total",
                &[("result", "touched")],
            )
        };
        let touched_before = touched(&c.metrics().await?);
        for round in 0..4 {
            // 10 GiB on each T4 leaves 6 + 6 GiB: an 8 GiB pod passes kube-scheduler's
            // aggregate check but fits no single GPU, so only the extender holds it back.
            let holder = format!("s-{round}-a");
            let other = format!("s-{round}-b");
            let waiting = format!("s-{round}-w");
            let a = create_bound(&c.client, &PodSpec::new(&holder, GPU_MEM, 10), BIND).await?;
            create_bound(&c.client, &PodSpec::new(&other, GPU_MEM, 10), BIND).await?;
            create_pod(&c.client, &PodSpec::new(&waiting, GPU_MEM, 8)).await?;
            wait_unschedulable(&c.client, &waiting, BIND).await?;
            let t0 = Instant::now();
            let how = if round % 2 == 0 {
                set_phase(&c.client, &holder, "Failed").await?;
                "failed"
            } else {
                delete_pod(&c.client, &holder).await?;
                "was deleted"
            };
            let bound = wait_bound(&c.client, &waiting, PROMPT).await?;
            eprintln!(
                "  round {round}: {waiting} bound {:.2}s after {holder} {how}",
                t0.elapsed().as_secs_f64()
            );
            ensure!(
                record_of(&bound)?.all_gpus() == record_of(&a)?.all_gpus(),
                "{waiting} should take the GPU {holder} freed"
            );
            let pods = list_pods(&c.client).await?;
            let usage = check_cluster(&nodes, &pods, &BTreeMap::new())?;
            check_inspect(&c.inspect().await?, &usage)?;
            // Empty the node for the next round (a deleted holder is gone already).
            let failed_holder = (round % 2 == 0).then_some(&holder);
            for name in failed_holder.into_iter().chain([&other, &waiting]) {
                delete_pod(&c.client, name).await?;
            }
        }
        let touches = touched(&c.metrics().await?) - touched_before;
        eprintln!("  requeue touches in the four rounds: {touches}");

        // The touch itself, through the real API server: with kube-scheduler stopped nothing
        // else can bind the waiting pod, so the annotation must appear once the share is freed.
        create_bound(&c.client, &PodSpec::new("t-a", GPU_MEM, 10), BIND).await?;
        create_bound(&c.client, &PodSpec::new("t-b", GPU_MEM, 10), BIND).await?;
        create_pod(&c.client, &PodSpec::new("t-w", GPU_MEM, 8)).await?;
        wait_unschedulable(&c.client, "t-w", BIND).await?;
        c.stop_scheduler().await?;
        delete_pod(&c.client, "t-a").await?;
        let deadline = Instant::now() + PROMPT;
        loop {
            let pod = pods(&c.client).get("t-w").await?;
            let stamp = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("gpu-extender.io/requeue").cloned());
            if let Some(stamp) = stamp {
                eprintln!("  t-w touched (gpu-extender.io/requeue: {stamp})");
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "the extender did not touch t-w within {PROMPT:?} of freeing its share"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        ensure!(
            touched(&c.metrics().await?) - touched_before > touches,
            "gpu_extender_requeue_touches_total did not count the touch"
        );
        c.start_scheduler(PROFILE_CONFIG).await?;
        wait_bound(&c.client, "t-w", PROMPT).await?;
        // The extender bound it, as the account deploy/ runs it as.
        let binders = c.audited_binders("t-w")?;
        ensure!(
            binders.iter().all(|user| user == DEPLOYED_USER) && !binders.is_empty(),
            "t-w was bound by {binders:?}, not by {DEPLOYED_USER}"
        );
        Ok(())
    });
}

/// A pod turned away by kube-scheduler's `percentageOfNodesToScore` window, not by a full
/// cluster: 599 one-GPU T4 nodes and one 8-GPU A100 node, pods that accept only the A100 (the
/// model annotation, which kube-scheduler does not read, so every node passes its own filter).
/// With `percentageOfNodesToScore: 1` kube-scheduler sends the extender 100 of the 600 nodes,
/// starting each cycle about where the last one stopped, so most pods' first windows miss the
/// A100. Nothing in the cluster changes meanwhile, so without the extender's touch
/// (`src/k8s/requeue.rs`) kube-scheduler would retry a missed pod only at its 5-minute flush;
/// with it, each miss is retried after kube-scheduler's backoff and the pod reaches the A100
/// within seconds. Pods are created one after another until two misses were counted (at most
/// the A100's eight).
#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn a_pod_kube_schedulers_window_hid_the_only_fitting_node_from_is_retried() {
    crate::harness::run("window-miss-retry", async |c| {
        const INCLUDE: &str = "gpu-extender.io/model-include";
        const A100: &str = "NVIDIA-A100-SXM4-80GB";
        let mut nodes: Vec<GpuNode> = (0..599)
            .map(|i| GpuNode::new(&format!("t4-{i:03}"), Mode::Exclusive, 1, "Tesla-T4", 16))
            .collect();
        nodes.push(GpuNode::new("a100", Mode::Exclusive, 8, A100, 80));
        crate::objects::create_nodes(&c.client, &nodes).await?;
        c.start_extender("requeue:\n  minIntervalSeconds: 1\n")
            .await?;
        let rendered = c.rendered_scheduler_config(PROFILE_CONFIG, &c.extender_url())?;
        let header = "kind: KubeSchedulerConfiguration\n";
        ensure!(rendered.contains(header), "no {header:?} in:\n{rendered}");
        let narrowed =
            rendered.replacen(header, &format!("{header}percentageOfNodesToScore: 1\n"), 1);
        c.start_scheduler_rendered(PROFILE_CONFIG, &narrowed, &[])
            .await?;
        let misses = |text: &str| metric_sum(text, "gpu_extender_filter_window_misses_total", &[]);
        let touched = |text: &str| {
            metric_sum(
                text,
                "gpu_extender_requeue_touches_total",
                &[("result", "touched")],
            )
        };
        // Measured: 2.4-10.3 s for a pod whose windows missed; without the touch such a pod was
        // still pending after 90 s. The limit leaves kube-scheduler's whole backoff (up to 10 s
        // a retry) and stays far below the 5-minute flush.
        let limit = Duration::from_secs(90);
        let mut text = c.metrics().await?;
        for i in 0..8 {
            let name = format!("a100-only-{i}");
            let t0 = Instant::now();
            create_pod(
                &c.client,
                &PodSpec::new(&name, NVIDIA_GPU, 1).annotation(INCLUDE, "NVIDIA-A100*"),
            )
            .await?;
            let bound = wait_bound(&c.client, &name, limit).await?;
            ensure!(
                node_of(&bound) == Some("a100"),
                "{name} went to {:?}",
                node_of(&bound)
            );
            text = c.metrics().await?;
            eprintln!(
                "  {name}: bound {:.1}s after it was created ({} window misses so far)",
                t0.elapsed().as_secs_f64(),
                misses(&text)
            );
            if misses(&text) >= 2.0 {
                break;
            }
        }
        // Every miss was followed by a touch, or its pod would still be waiting.
        ensure!(
            misses(&text) >= 1.0 && touched(&text) >= 1.0,
            "window misses {} and touches {}: no window missed the A100, the scenario tested nothing",
            misses(&text),
            touched(&text)
        );
        Ok(())
    });
}

/// FGD+'s hold (`policy.fgdPlus.holdHostForGpus`, on by default) in a real loop: the dedicated GPU
/// scheduler sends the extender a pod that asks for no GPU; on a 4-GPU node whose 64 cores are
/// what its free GPUs need at the typical pod's 16 cores per GPU, the pod waits with the hold's
/// reason in its event, and once a GPU pod takes the GPUs the CPU is spare and the waiting pod
/// is bound there, without anything freed (kube-scheduler retries a pod the extender turned
/// away when a pod is bound).
#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn a_cpu_only_pod_waits_for_cpu_its_node_s_gpus_do_not_need() {
    crate::harness::run("host-held", async |c| {
        let nodes = [GpuNode::new("t4x4", Mode::Exclusive, 4, "Tesla-T4", 16)];
        create_nodes(&c.client, &nodes).await?;
        c.start_extender(
            "policy:\n  scoring: fgd-plus\n  filterBestOnly: true\n  typicalPods:\n    pods:\n      \
             - {cpuMilli: 16000, gpus: 1, gpuMilli: 1000, weight: 1}\n",
        )
        .await?;
        c.start_scheduler("scheduler-config/gpu-scheduler-dedicated.yaml")
            .await?;
        create_pod(
            &c.client,
            &PodSpec::empty("cpu-only").container("main", &[("cpu", 4)]),
        )
        .await?;
        let message =
            wait_failed_scheduling(&c.client, "cpu-only", "held for its free GPUs", BIND).await?;
        eprintln!("  cpu-only waits: {message}");
        let t0 = Instant::now();
        create_bound(&c.client, &PodSpec::new("four-gpus", NVIDIA_GPU, 4), BIND).await?;
        let bound = wait_bound(&c.client, "cpu-only", Duration::from_secs(60)).await?;
        ensure!(
            node_of(&bound) == Some("t4x4"),
            "cpu-only went to {:?}",
            node_of(&bound)
        );
        eprintln!(
            "  cpu-only: bound {:.1}s after the GPU pod was created",
            t0.elapsed().as_secs_f64()
        );
        Ok(())
    });
}
