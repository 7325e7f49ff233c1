//! Preemption through the extender's `preempt` verb. kube-scheduler picks victims from the node's
//! aggregate GPU memory; the extender keeps a node only if evicting them frees enough on one GPU.
//! A useless eviction (memory freed, but split over two GPUs) must not happen; a useful one must,
//! and the preemptor then gets the freed GPU.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::Api;
use kube::api::PostParams;

use crate::harness::metric_sum;
use crate::objects::{
    GPU_MEM, GpuNode, Mode, PodSpec, create_bound, create_pod, list_pods, pods,
    scheduled_condition, wait_bound,
};
use crate::record::{check_cluster, record_of};
use crate::{BIND, up_with_scheduler_flags};

/// kube-scheduler flag that turns its asynchronous preemption (Beta, on by default since v1.33)
/// off; see `docs/install.md`, "Known kube-scheduler issues".
pub const SYNC_PREEMPTION: &str = "--feature-gates=SchedulerAsyncPreemption=false";

pub async fn priority_class(client: &kube::Client, name: &str, value: i32) -> Result<()> {
    let class: PriorityClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": { "name": name },
        "value": value,
    }))?;
    Api::<PriorityClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await?;
    Ok(())
}

/// A 6-16 GiB share on `node`, spread over its GPUs, at a priority.
fn share(name: &str, gib: u64, node: &str, priority: &str) -> PodSpec {
    PodSpec::new(name, GPU_MEM, gib)
        .on(node)
        .annotation("gpu-extender.io/placement", "spread")
        .priority(priority)
}

async fn preempt_calls(c: &crate::harness::Cluster) -> Result<f64> {
    Ok(metric_sum(
        &c.metrics().await?,
        "gpu_extender_requests_total",
        &[("verb", "preempt")],
    ))
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn preemption_evicts_only_victims_that_free_a_gpu() {
    crate::harness::run("preemption", async |c| {
        let nodes = vec![
            GpuNode::new("pre-useless", Mode::Share, 2, "Tesla-T4", 16),
            GpuNode::new("pre-useful", Mode::Share, 2, "Tesla-T4", 16),
        ];
        // kube-scheduler v1.34's asynchronous preemption can leave the preemptor in its
        // unschedulable pool for the 5-minute flush when a redundant second preemption finds its
        // victim already deleted (kubernetes/kubernetes#141694, seen in CI on this scenario):
        // that is kube-scheduler's race, not the extender's, so this scenario runs preemption
        // synchronously. The extender's preempt verb is called the same way in both modes.
        up_with_scheduler_flags(c, &nodes, "", &[SYNC_PREEMPTION]).await?;
        for (name, value) in [("low", 100), ("mid", 300), ("high", 1000)] {
            priority_class(&c.client, name, value).await?;
        }

        // Useless: each GPU holds a low and a mid pod of 6 GiB (spread alternates GPUs). A
        // 16 GiB pod needs 8 more GiB than is free; kube-scheduler's aggregate view picks the two
        // low pods, whose eviction frees 12 GiB but 6 on each GPU: no GPU could take it.
        for (name, priority) in [
            ("u-low-1", "low"),
            ("u-low-2", "low"),
            ("u-mid-1", "mid"),
            ("u-mid-2", "mid"),
        ] {
            create_bound(&c.client, &share(name, 6, "pre-useless", priority), BIND).await?;
        }
        let calls_before = preempt_calls(c).await?;
        create_pod(&c.client, &share("hi-useless", 16, "pre-useless", "high")).await?;
        let deadline = Instant::now() + BIND;
        while preempt_calls(c).await? <= calls_before {
            ensure!(
                Instant::now() < deadline,
                "kube-scheduler never asked the extender about preempting for hi-useless"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The eviction must not happen: watch the victims for a few seconds.
        let watch_until = Instant::now() + Duration::from_secs(4);
        while Instant::now() < watch_until {
            for name in ["u-low-1", "u-low-2"] {
                let pod = pods(&c.client).get_opt(name).await?;
                let terminating = pod
                    .as_ref()
                    .is_none_or(|p| p.metadata.deletion_timestamp.is_some());
                if terminating {
                    bail!("{name} was evicted although that frees no whole GPU for hi-useless");
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let hi = pods(&c.client).get("hi-useless").await?;
        ensure!(
            crate::objects::node_of(&hi).is_none(),
            "hi-useless was bound somehow"
        );
        eprintln!("  hi-useless: {:?}", scheduled_condition(&hi));

        // Useful: one GPU holds a mid pod of 10 GiB, the other two low pods of 8. The aggregate
        // view picks both low pods: together they free one whole GPU.
        create_bound(&c.client, &share("f-mid", 10, "pre-useful", "mid"), BIND).await?;
        let mut low_gpus = Vec::new();
        for name in ["f-low-1", "f-low-2"] {
            let pod = create_bound(&c.client, &share(name, 8, "pre-useful", "low"), BIND).await?;
            low_gpus.extend(record_of(&pod)?.all_gpus());
        }
        low_gpus.dedup();
        ensure!(
            low_gpus.len() == 1,
            "the low pods should share one GPU: {low_gpus:?}"
        );
        let t0 = Instant::now();
        create_pod(&c.client, &share("hi-useful", 16, "pre-useful", "high")).await?;
        let bound = wait_bound(&c.client, "hi-useful", Duration::from_secs(30)).await?;
        let record = record_of(&bound)?;
        ensure!(
            record.all_gpus() == low_gpus,
            "hi-useful should get the GPU its victims freed ({low_gpus:?}): {record:?}"
        );
        for name in ["f-low-1", "f-low-2"] {
            ensure!(
                pods(&c.client).get_opt(name).await?.is_none(),
                "{name} should have been evicted"
            );
        }
        ensure!(
            pods(&c.client).get_opt("f-mid").await?.is_some(),
            "f-mid was evicted although evicting it was not needed"
        );
        eprintln!(
            "  hi-useful: bound {:.1}s after creation, on GPU {low_gpus:?}",
            t0.elapsed().as_secs_f64()
        );

        let all = list_pods(&c.client).await?;
        check_cluster(&nodes, &all, &BTreeMap::new())?;
        Ok(())
    });
}
