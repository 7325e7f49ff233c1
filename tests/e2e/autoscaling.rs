//! GPU node pools that grow and shrink: cluster-autoscaler 1.34 with its kwok cloud provider
//! (node groups from templates; built from `../shared/third_party/cluster-autoscaler`, SKIPPED
//! where that folder is absent) and kwok (the fake kubelet that makes the added nodes Ready and
//! their pods Running) beside the extender and kube-scheduler. Node groups of A10 instance types
//! start empty, grow for GPU pods, and emptied nodes are removed while the extender's table and
//! idle-node gauge follow.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

use crate::harness::{Cluster, metric_sum};
use crate::objects::{
    GPU_MEM, GpuNode, INSTANCE_TYPE, Mode, NVIDIA_GPU, PodSpec, create_pod, delete_pod, list_pods,
    node_of, pods, wait_unschedulable,
};
use crate::record::{check_cluster, check_inspect, record_of};
use crate::{BIND, up};

/// The taint of the GPU node pool (what managed GPU node pools set), which GPU pods tolerate.
const GPU_TAINT: (&str, &str) = ("nvidia.com/gpu", "present");
/// The autoscaler's intervals: short, so a scenario takes seconds instead of minutes.
const SCAN: &str = "--scan-interval=1s";
/// How long a pending pod may take to be bound on a node added for it.
const SCALE_UP: Duration = Duration::from_secs(60);

/// The A10 node group's instance types, smallest first (the autoscaler tries them in order):
/// (instance type, GPUs, most nodes).
const A10_TYPES: [(&str, u16, u32); 3] = [
    ("ecs.gn7i-c8g1.2xlarge", 1, 2),
    ("ecs.gn7i-2x.8xlarge", 2, 1),
    ("ecs.gn7i-4x.16xlarge", 4, 1),
];

/// A node of an A10 instance type with `gpus` whole GPUs, as the extender should see it.
fn a10(name: &str, gpus: u16) -> GpuNode {
    GpuNode::new(name, Mode::Exclusive, gpus, "NVIDIA-A10", 24)
        .label("ack.node.gpu.schedule", "default")
}

/// The templates file of the A10 node group: one template per instance type.
fn a10_templates() -> Value {
    let items: Vec<Value> = A10_TYPES
        .iter()
        .map(|(instance, gpus, max)| a10("template", *gpus).template(instance, *max, &[GPU_TAINT]))
        .collect();
    json!({ "apiVersion": "v1", "kind": "List", "items": items })
}

/// A whole-GPU pod of the pool: asks `gpus` and tolerates the pool's taint.
fn whole_gpu_pod(name: &str, gpus: u64) -> PodSpec {
    PodSpec::new(name, NVIDIA_GPU, gpus).tolerate(GPU_TAINT.0, GPU_TAINT.1)
}

/// The nodes' names and instance types.
async fn node_types(c: &Cluster) -> Result<BTreeMap<String, String>> {
    let api: Api<Node> = Api::all(c.client.clone());
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|n| {
            let instance = n
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(INSTANCE_TYPE))
                .cloned();
            (
                n.metadata.name.unwrap_or_default(),
                instance.unwrap_or_default(),
            )
        })
        .collect())
}

/// The GPUs of a node of the A10 group by its instance type.
fn gpus_of(instance: &str) -> Result<u16> {
    A10_TYPES
        .iter()
        .find(|(name, _, _)| *name == instance)
        .map(|(_, gpus, _)| *gpus)
        .with_context(|| format!("{instance} is not an A10 instance type"))
}

/// When each pod was first seen on a node, and when its node first appeared, polling every
/// 100 ms for at most `limit` until every pod in `names` is bound.
struct Placement {
    node: String,
    node_seen: Duration,
    bound: Duration,
}

async fn wait_placed(
    c: &Cluster,
    names: &[&str],
    limit: Duration,
) -> Result<BTreeMap<String, Placement>> {
    let t0 = Instant::now();
    let mut node_seen: BTreeMap<String, Duration> = BTreeMap::new();
    let mut placed: BTreeMap<String, Placement> = BTreeMap::new();
    while placed.len() < names.len() {
        ensure!(
            t0.elapsed() < limit,
            "within {limit:?} only {:?} of {names:?} were bound; autoscaler scale-ups: {:?}",
            placed.keys().collect::<Vec<_>>(),
            c.autoscaler_log("Scale-up:")
        );
        for node in node_types(c).await?.into_keys() {
            node_seen.entry(node).or_insert_with(|| t0.elapsed());
        }
        for name in names {
            if placed.contains_key(*name) {
                continue;
            }
            let pod = pods(&c.client).get(name).await?;
            if let Some(node) = node_of(&pod) {
                let seen = node_seen.get(node).copied().unwrap_or_default();
                placed.insert(
                    (*name).to_owned(),
                    Placement {
                        node: node.to_owned(),
                        node_seen: seen,
                        bound: t0.elapsed(),
                    },
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(placed)
}

/// Waits (20 s at most) until kwok has made every node Ready and every pod in `names` Running,
/// as kubelets would.
async fn wait_running(c: &Cluster, names: &[&str]) -> Result<()> {
    let api: Api<Node> = Api::all(c.client.clone());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let not_ready: Vec<String> = api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|n| {
                !n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .filter_map(|n| n.metadata.name)
            .collect();
        let mut not_running = Vec::new();
        for name in names {
            let pod = pods(&c.client).get(name).await?;
            if pod.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running") {
                not_running.push(*name);
            }
        }
        if not_ready.is_empty() && not_running.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("after 20s kwok has not made {not_ready:?} Ready or {not_running:?} Running");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Scale-up from zero: three whole-GPU pods wait on an empty cluster; the autoscaler adds a
/// 1-GPU node for each 1-GPU pod and a 4-GPU node for the 4-GPU pod (the smaller types cannot
/// hold it); kube-scheduler and the extender bind each pod there, with an allocation record naming
/// as many GPUs, and the extender's table agrees; kwok makes the nodes Ready and the pods Running.
#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn a_gpu_node_group_scales_up_from_zero_for_whole_gpu_pods() {
    crate::harness::run_autoscaling("autoscale-up", async |c| {
        up(c, &[], "").await?;
        c.start_kwok().await?;
        c.start_autoscaler(&a10_templates(), &[SCAN]).await?;

        let wanted = [("one-a", 1), ("one-b", 1), ("four", 4)];
        for (name, gpus) in wanted {
            create_pod(&c.client, &whole_gpu_pod(name, gpus)).await?;
        }
        let names: Vec<&str> = wanted.iter().map(|(n, _)| *n).collect();
        let placed = wait_placed(c, &names, SCALE_UP).await?;

        let types = node_types(c).await?;
        let mut nodes = Vec::new();
        for (name, instance) in &types {
            nodes.push(a10(name, gpus_of(instance)?));
        }
        for (pod, gpus) in wanted {
            let at = &placed[pod];
            let instance = &types[&at.node];
            let want = if gpus == 4 {
                A10_TYPES[2].0
            } else {
                A10_TYPES[0].0
            };
            ensure!(
                instance == want,
                "{pod} ({gpus} GPUs) went to {} of type {instance}, not {want}",
                at.node
            );
            let record = record_of(&pods(&c.client).get(pod).await?)?;
            ensure!(
                record.all_gpus().len() == gpus as usize,
                "{pod}: the record names GPUs {:?}",
                record.all_gpus()
            );
            eprintln!(
                "  {pod}: node {} ({instance}) appeared {:.2}s after the pod, bound {:.2}s after the node appeared",
                at.node,
                at.node_seen.as_secs_f64(),
                (at.bound - at.node_seen).as_secs_f64()
            );
        }
        ensure!(
            types.len() == 3,
            "the autoscaler added {types:?}, three nodes wanted"
        );
        wait_running(c, &names).await?;
        ensure!(
            placed["one-a"].node != placed["one-b"].node,
            "both 1-GPU pods went to {}",
            placed["one-a"].node
        );
        let usage = check_cluster(&nodes, &list_pods(&c.client).await?, &BTreeMap::new())?;
        check_inspect(&c.inspect().await?, &usage)?;
        Ok(())
    });
}

/// Scale-down: of two nodes the autoscaler added, one is emptied (its pod deleted; kwok removes
/// it). The extender counts it as the one idle GPU node; the autoscaler removes exactly that node
/// once it has been unneeded for its 3 s; the extender drops it, its idle gauge goes back to 0,
/// and the other node's pod keeps its GPUs in the extender's table.
#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn an_emptied_gpu_node_is_removed_and_the_extender_follows() {
    crate::harness::run_autoscaling("autoscale-down", async |c| {
        up(c, &[], "").await?;
        c.start_kwok().await?;
        c.start_autoscaler(
            &a10_templates(),
            &[
                SCAN,
                "--scale-down-unneeded-time=3s",
                "--scale-down-delay-after-add=0s",
            ],
        )
        .await?;
        for name in ["stays", "goes"] {
            create_pod(&c.client, &whole_gpu_pod(name, 1)).await?;
        }
        let placed = wait_placed(c, &["stays", "goes"], SCALE_UP).await?;
        let (kept, emptied) = (placed["stays"].node.clone(), placed["goes"].node.clone());
        ensure!(kept != emptied, "both pods went to {kept}");

        let idle = |text: &str| metric_sum(text, "gpu_extender_idle_gpu_nodes", &[]);
        ensure!(
            idle(&c.metrics().await?) == 0.0,
            "an idle GPU node before any pod finished"
        );
        delete_pod(&c.client, "goes").await?;

        // Until the autoscaler removes the emptied node, the extender must count it idle.
        let t0 = Instant::now();
        let mut idle_seen = 0.0_f64;
        loop {
            let types = node_types(c).await?;
            if !types.contains_key(&emptied) {
                break;
            }
            idle_seen = idle_seen.max(idle(&c.metrics().await?));
            ensure!(
                t0.elapsed() < SCALE_UP,
                "{emptied} was not removed within {SCALE_UP:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let removed_after = t0.elapsed();
        let removals = c.autoscaler_log("Scale-down: removing");
        ensure!(
            removals.len() == 1 && removals[0].contains(&format!("\"{emptied}\"")),
            "the autoscaler's removals: {removals:?} (only {emptied} wanted)"
        );
        ensure!(
            idle_seen == 1.0,
            "the extender counted {idle_seen} idle GPU nodes while {emptied} waited for removal, 1 wanted"
        );
        eprintln!(
            "  {emptied}: removed {:.2}s after its pod was deleted",
            removed_after.as_secs_f64()
        );

        // The extender drops the node; the kept pod's allocation is intact.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let report = c.inspect().await?;
            let names: Vec<&str> = report["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n["name"].as_str())
                .collect();
            if names == [kept.as_str()] && idle(&c.metrics().await?) == 0.0 {
                let usage = check_cluster(
                    &[a10(&kept, 1)],
                    &list_pods(&c.client).await?,
                    &BTreeMap::new(),
                )?;
                ensure!(usage.len() == 1, "the kept pod's GPUs: {usage:?}");
                return check_inspect(&report, &usage);
            }
            if Instant::now() > deadline {
                bail!(
                    "10s after the removal the extender has nodes {names:?} and {} idle",
                    idle(&c.metrics().await?)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

/// The share node group (one A10, 24 GiB) beside a T4 node with room: memory-sharing pods.
fn a10_share_templates() -> Value {
    let share = GpuNode::new("template", Mode::Share, 1, "NVIDIA-A10", 24);
    json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [share.template(A10_TYPES[0].0, 2, &[GPU_TAINT])],
    })
}

/// The extender-only rejections against an in-tree simulation. A T4 node (2 GPUs of 16 GiB,
/// memory sharing) has room by kube-scheduler's aggregate count for both pods below, and the
/// extender rejects both; an A10 share group can hold either.
/// - `a10-only` asks 4 GiB and names its model twice: the extender's `model-include` annotation,
///   and required node affinity on the model label the nodes already carry. The affinity is what
///   the autoscaler's simulation sees: the T4 fails NodeAffinity there, the A10 template passes,
///   a node is added and the pod is bound to it.
/// - `big-share` asks 21 GiB: more than any T4 GPU (and than the A10 has left), less than the T4
///   node's 32 GiB sum. Only the extender knows per-GPU memory, so the simulation places it on
///   the T4 and adds no node: the gap docs/install.md ("Autoscaled GPU node pools") describes.
///   This check pins that behaviour so that the fix (labels of the largest free share) turns it
///   around on purpose.
#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn extender_only_rejections_need_constraints_the_autoscaler_sees() {
    crate::harness::run_autoscaling("autoscale-extender-only", async |c| {
        let t4 = GpuNode::new("t4", Mode::Share, 2, "Tesla-T4", 16);
        up(c, std::slice::from_ref(&t4), "").await?;
        c.start_kwok().await?;
        c.start_autoscaler(&a10_share_templates(), &[SCAN]).await?;

        let model_affinity = json!({ "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{ "matchExpressions": [{
                "key": "aliyun.accelerator/nvidia_name", "operator": "In", "values": ["NVIDIA-A10"],
            }]}],
        }}});
        let a10_only = PodSpec::new("a10-only", GPU_MEM, 4)
            .tolerate(GPU_TAINT.0, GPU_TAINT.1)
            .annotation("gpu-extender.io/model-include", "NVIDIA-A10")
            .affinity(model_affinity);
        create_pod(&c.client, &a10_only).await?;
        let placed = wait_placed(c, &["a10-only"], SCALE_UP).await?;
        let node = &placed["a10-only"].node;
        ensure!(node != "t4", "a10-only went to the T4 node");
        eprintln!(
            "  a10-only: node {node} appeared {:.2}s after the pod, bound {:.2}s after the node appeared",
            placed["a10-only"].node_seen.as_secs_f64(),
            (placed["a10-only"].bound - placed["a10-only"].node_seen).as_secs_f64()
        );

        create_pod(
            &c.client,
            &PodSpec::new("big-share", GPU_MEM, 21).tolerate(GPU_TAINT.0, GPU_TAINT.1),
        )
        .await?;
        wait_unschedulable(&c.client, "big-share", BIND).await?;
        let deadline = Instant::now() + Duration::from_secs(20);
        let verdict = loop {
            let lines = c.autoscaler_log("pod=\"default/big-share\"");
            if let Some(line) = lines.first() {
                break line.clone();
            }
            ensure!(
                Instant::now() < deadline,
                "the autoscaler said nothing about big-share in 20s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        ensure!(
            verdict.contains("no scale-up: pod fits an existing node")
                && verdict.contains("node=\"t4\""),
            "the autoscaler's first word on big-share: {verdict}"
        );
        let nodes = node_types(c).await?;
        ensure!(
            nodes.len() == 2,
            "nodes: {nodes:?} (t4 and the A10 added for a10-only wanted)"
        );

        let a10 = GpuNode::new(node, Mode::Share, 1, "NVIDIA-A10", 24);
        let usage = check_cluster(&[t4, a10], &list_pods(&c.client).await?, &BTreeMap::new())?;
        check_inspect(&c.inspect().await?, &usage)?;
        Ok(())
    });
}
