//! The allocation table against a real API server, on the paths the other scenarios do not take:
//! GPU pods bound by someone else (no allocation record) or carrying a corrupt record, a crash
//! and restart with such pods in the cluster, a node relabelled and resized, a node removed, and
//! bind calls that must fail cleanly (a pod that does not exist, a node that does not exist).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

use crate::harness::{Cluster, http_post_json, metric_sum};
use crate::objects::{
    GPU_MEM, GpuNode, Mode, NVIDIA_GPU, PodSpec, create_bound, create_pod, pods, update_node,
};
use crate::record::record_of;
use crate::{BIND, up};

/// How long the extender's watch may take to show a change.
const WATCH: Duration = Duration::from_secs(10);

/// Creates a pod already bound to `node` (`spec.nodeName` set by its author), as another
/// scheduler or a user bypassing scheduling would: the extender never saw it.
pub async fn create_prebound(client: &kube::Client, spec: &PodSpec, node: &str) -> Result<()> {
    let mut pod = spec.to_pod()?;
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = Some(node.to_owned());
    }
    pods(client)
        .create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("creating pod {} bound to {node}", spec.name))?;
    Ok(())
}

/// Polls `check` on the extender's `/inspect` report until it returns `Ok(true)`.
pub async fn wait_inspect(
    c: &Cluster,
    what: &str,
    check: impl Fn(&Value) -> Result<bool>,
) -> Result<Value> {
    let deadline = Instant::now() + WATCH;
    loop {
        let report = c.inspect().await?;
        if check(&report)? {
            return Ok(report);
        }
        if Instant::now() > deadline {
            bail!("{what} not seen in /inspect within {WATCH:?}: {report}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls a metric until it has `value`.
pub async fn wait_metric(c: &Cluster, name: &str, value: f64) -> Result<()> {
    let deadline = Instant::now() + WATCH;
    loop {
        let now = metric_sum(&c.metrics().await?, name, &[]);
        if now == value {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{name} is {now}, expected {value}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn node<'a>(report: &'a Value, name: &str) -> Option<&'a Value> {
    report["nodes"]
        .as_array()?
        .iter()
        .find(|node| node["name"] == name)
}

/// The GPU indices on `node` that `pod` holds, by the extender's report.
pub fn held_by(report: &Value, node_name: &str, pod: &str) -> Vec<u64> {
    let holder = format!("default/{pod}");
    node(report, node_name)
        .and_then(|n| n["gpus"].as_array())
        .into_iter()
        .flatten()
        .filter(|gpu| {
            gpu["pods"]
                .as_array()
                .is_some_and(|pods| pods.iter().any(|p| p == holder.as_str()))
        })
        .filter_map(|gpu| gpu["index"].as_u64())
        .collect()
}

/// Waits until no reservation is outstanding, then checks that `pod` holds nothing on `node`:
/// what every failed bind must leave behind.
pub async fn ensure_nothing_held(
    c: &Cluster,
    node_name: &str,
    pod: &str,
    what: &str,
) -> Result<()> {
    wait_metric(c, "gpu_extender_reservations_outstanding", 0.0).await?;
    ensure!(
        held_by(&c.inspect().await?, node_name, pod).is_empty(),
        "{what} left capacity held"
    );
    Ok(())
}

/// Posts a bind for `pod` to `node` in a task of its own, the way kube-scheduler would: for a
/// bind whose answer a fault holds back. The task gives the HTTP status and body.
pub fn spawn_bind(
    c: &Cluster,
    pod: &str,
    uid: &str,
    node: &str,
) -> tokio::task::JoinHandle<Result<(u16, String)>> {
    let extender = c.extender_addr;
    let body = json!({"PodName": pod, "PodNamespace": "default", "PodUID": uid, "Node": node});
    tokio::spawn(async move { http_post_json(extender, "/scheduler/bind", &body).await })
}

/// Posts a bind for `pod` to `node` the way kube-scheduler would; returns the `Error` field.
pub async fn bind_error(c: &Cluster, pod: &str, uid: &str, node: &str) -> Result<String> {
    let (status, body) = http_post_json(
        c.extender_addr,
        "/scheduler/bind",
        &json!({"PodName": pod, "PodNamespace": "default", "PodUID": uid, "Node": node}),
    )
    .await?;
    ensure!(status == 200, "bind answered HTTP {status}: {body}");
    let answer: Value = serde_json::from_str(&body).context("bind answer")?;
    Ok(answer["Error"].as_str().unwrap_or_default().to_owned())
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn the_table_follows_pods_bound_by_others_node_changes_and_failed_binds() {
    crate::harness::run("cluster-state", async |c| {
        let nodes = vec![
            GpuNode::new("st-share", Mode::Share, 2, "Tesla-T4", 16),
            GpuNode::new("st-excl", Mode::Exclusive, 2, "NVIDIA-A100-PCIE-40GB", 40),
        ];
        up(c, &nodes, "").await?;

        // Bound by someone else, no record: counted from its request, on a GPU of its node.
        create_prebound(
            &c.client,
            &PodSpec::new("bypass-whole", NVIDIA_GPU, 1),
            "st-excl",
        )
        .await?;
        // Bound with a record that is not JSON: counted from its request too.
        create_prebound(
            &c.client,
            &PodSpec::new("bypass-corrupt", GPU_MEM, 4)
                .annotation("gpu-extender.io/allocation", "{not a record"),
            "st-share",
        )
        .await?;
        wait_metric(c, "gpu_extender_records_missing", 1.0).await?;
        wait_metric(c, "gpu_extender_records_corrupt", 1.0).await?;
        let before = wait_inspect(c, "both pods held", |r| {
            Ok(held_by(r, "st-excl", "bypass-whole").len() == 1
                && held_by(r, "st-share", "bypass-corrupt").len() == 1)
        })
        .await?;
        let inferred = held_by(&before, "st-excl", "bypass-whole");

        // A crash: the restarted extender rebuilds the same table, the same counts.
        c.kill_extender()?;
        c.restart_extender().await?;
        wait_metric(c, "gpu_extender_records_missing", 1.0).await?;
        wait_metric(c, "gpu_extender_records_corrupt", 1.0).await?;
        let after = c.inspect().await?;
        for name in ["st-share", "st-excl"] {
            ensure!(
                node(&before, name) == node(&after, name),
                "{name} differs after the restart: {:?} then {:?}",
                node(&before, name),
                node(&after, name)
            );
        }

        // The capacity the record-less pod holds is not handed out again.
        let whole = create_bound(&c.client, &PodSpec::new("whole", NVIDIA_GPU, 1), BIND).await?;
        let got: Vec<u64> = record_of(&whole)?
            .all_gpus()
            .into_iter()
            .map(u64::from)
            .collect();
        ensure!(
            got.iter().all(|gpu| !inferred.contains(gpu)),
            "whole got GPU {got:?}, which bypass-whole is counted on ({inferred:?})"
        );

        // Relabelled (spread) and resized (4 GPUs): the table follows, keeping what is held.
        let resized = GpuNode::new("st-share", Mode::Share, 4, "Tesla-T4", 16).placement("spread");
        update_node(&c.client, &resized).await?;
        wait_inspect(c, "st-share with 4 GPUs, spread", |r| {
            let Some(n) = node(r, "st-share") else {
                return Ok(false);
            };
            Ok(n["gpus"].as_array().map_or(0, Vec::len) == 4
                && n["placement"] == "spread"
                && held_by(r, "st-share", "bypass-corrupt").len() == 1)
        })
        .await?;

        // Binds that must fail, cleanly and without holding anything.
        let error = bind_error(c, "ghost", "", "st-share").await?;
        ensure!(
            error.contains("no longer exists"),
            "bind of a pod that does not exist: {error:?}"
        );
        let lost = create_pod(
            &c.client,
            &PodSpec::new("lost", GPU_MEM, 2).on("no-such-node"),
        )
        .await?;
        let uid = lost.metadata.uid.clone().unwrap_or_default();
        let error = bind_error(c, "lost", &uid, "st-nowhere").await?;
        ensure!(
            error.contains("not known"),
            "bind to a node that does not exist: {error:?}"
        );
        let error = bind_error(c, "lost", "not-its-uid", "st-share").await?;
        ensure!(
            error.contains("recreated"),
            "bind with another pod's UID: {error:?}"
        );
        ensure_nothing_held(c, "st-share", "lost", "a failed bind").await?;

        // Removed: the node leaves the table.
        kube::Api::<k8s_openapi::api::core::v1::Node>::all(c.client.clone())
            .delete("st-excl", &DeleteParams::default())
            .await
            .context("deleting node st-excl")?;
        wait_inspect(c, "st-excl gone", |r| Ok(node(r, "st-excl").is_none())).await?;
        eprintln!(
            "  record-less and corrupt pods counted, kept across a crash; node relabelled, resized and removed; failed binds held nothing"
        );
        Ok(())
    });
}
