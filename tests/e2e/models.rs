//! Card model choice: the pod annotations `gpu-extender.io/model-include` / `-exclude` (the
//! extender's filter) and nodeAffinity on the model label (kube-scheduler's own filter), side by
//! side on a cluster of two models.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::ensure;
use serde_json::json;

use crate::objects::{
    GPU_MEM, GpuNode, Mode, PodSpec, create_bound, create_pod, list_pods, node_of,
    scheduled_condition, wait_failed_scheduling, wait_unschedulable,
};
use crate::record::check_cluster;
use crate::{BIND, up};

const INCLUDE: &str = "gpu-extender.io/model-include";
const EXCLUDE: &str = "gpu-extender.io/model-exclude";
const MODEL_LABEL: &str = "aliyun.accelerator/nvidia_name";

fn affinity(operator: &str, models: &[&str]) -> serde_json::Value {
    json!({
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{
                    "matchExpressions": [{
                        "key": MODEL_LABEL, "operator": operator, "values": models,
                    }]
                }]
            }
        }
    })
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn model_include_and_exclude_by_annotation_and_affinity() {
    crate::harness::run("models", async |c| {
        let nodes = vec![
            GpuNode::new("t4", Mode::Share, 2, "Tesla-T4", 16),
            GpuNode::new("a10", Mode::Share, 2, "NVIDIA-A10", 24),
            GpuNode::new("a100", Mode::Share, 2, "NVIDIA-A100-SXM4-80GB", 80),
        ];
        up(c, &nodes, "").await?;

        let cases: Vec<(&str, PodSpec, &[&str])> = vec![
            (
                "include exact name",
                PodSpec::new("inc-a10", GPU_MEM, 2).annotation(INCLUDE, "NVIDIA-A10"),
                &["a10"],
            ),
            (
                "include, case and separators ignored",
                PodSpec::new("inc-t4", GPU_MEM, 2).annotation(INCLUDE, "tesla t4"),
                &["t4"],
            ),
            (
                "include list with a prefix pattern",
                PodSpec::new("inc-list", GPU_MEM, 2).annotation(INCLUDE, "Tesla*, NVIDIA-A100*"),
                &["t4", "a100"],
            ),
            (
                "A10 never matches A100",
                PodSpec::new("inc-a10-not-a100", GPU_MEM, 20).annotation(INCLUDE, "NVIDIA-A10"),
                &["a10"],
            ),
            (
                "exclude",
                PodSpec::new("exc-t4-a100", GPU_MEM, 2)
                    .annotation(EXCLUDE, "Tesla-T4,NVIDIA-A100*"),
                &["a10"],
            ),
            (
                "include and exclude together",
                PodSpec::new("inc-exc", GPU_MEM, 2)
                    .annotation(INCLUDE, "NVIDIA-*")
                    .annotation(EXCLUDE, "NVIDIA-A10"),
                &["a100"],
            ),
            (
                "nodeAffinity In",
                PodSpec::new("aff-in", GPU_MEM, 2).affinity(affinity("In", &["Tesla-T4"])),
                &["t4"],
            ),
            (
                "nodeAffinity NotIn",
                PodSpec::new("aff-notin", GPU_MEM, 2)
                    .affinity(affinity("NotIn", &["Tesla-T4", "NVIDIA-A100-SXM4-80GB"])),
                &["a10"],
            ),
            (
                "nodeAffinity and an annotation together",
                PodSpec::new("aff-and-exc", GPU_MEM, 2)
                    .affinity(affinity("In", &["NVIDIA-A10", "NVIDIA-A100-SXM4-80GB"]))
                    .annotation(EXCLUDE, "NVIDIA-A100*"),
                &["a10"],
            ),
        ];
        for (what, spec, allowed) in &cases {
            let pod = create_bound(&c.client, spec, BIND).await?;
            let node = node_of(&pod).unwrap_or_default();
            ensure!(
                allowed.contains(&node),
                "{what}: pod {} went to {node}, allowed {allowed:?}",
                spec.name
            );
        }

        // A model no node has: unschedulable, with the extender's reason, which no preemption
        // can fix.
        create_pod(
            &c.client,
            &PodSpec::new("inc-h100", GPU_MEM, 2).annotation(INCLUDE, "H100*"),
        )
        .await?;
        let pod = wait_unschedulable(&c.client, "inc-h100", BIND).await?;
        let message = wait_failed_scheduling(
            &c.client,
            "inc-h100",
            "node has no GPU of the requested model",
            Duration::from_secs(10),
        )
        .await?;
        ensure!(
            message
                .starts_with("0/3 nodes are available: 3 node has no GPU of the requested model"),
            "inc-h100: event {message:?}"
        );
        ensure!(
            scheduled_condition(&pod).is_some_and(|(_, _, m)| m.contains("requested model")),
            "inc-h100: PodScheduled {:?}",
            scheduled_condition(&pod)
        );

        let pods = list_pods(&c.client).await?;
        check_cluster(&nodes, &pods, &BTreeMap::new())?;
        Ok(())
    });
}
