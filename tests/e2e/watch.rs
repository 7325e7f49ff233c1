//! The protobuf Pod watch (`watch.protobuf`, on by default) against a real kube-apiserver: the
//! same pods read through it and through JSON must give the extender the same view (every field
//! `slim_pod` keeps, the priority and the resourceVersion), listed, modified and deleted. Every
//! other scenario runs the extender with the protobuf watch too; this one checks the decoding
//! field by field, where a wrong field number would otherwise show only as a wrong decision.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use futures::StreamExt;
use gpu_extender::config::Config;
use gpu_extender::k8s::watch::{pod_watch, slim_pod};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::Event;
use serde_json::json;

use crate::harness::table_holdings;
use crate::objects::{
    GPU_MEM, GpuNode, Mode, NVIDIA_GPU, PodSpec, delete_pod, pods, wait_unschedulable,
};
use crate::{BIND, up};

/// The Pod selection the extender watches.
const SELECTOR: &str = "status.phase!=Succeeded,status.phase!=Failed";

/// What the extender reads of a pod, for comparison.
fn view(pod: &Pod, cfg: &Config) -> Result<String> {
    let priority = pod.spec.as_ref().and_then(|s| s.priority);
    let version = pod.metadata.resource_version.clone();
    serde_json::to_string_pretty(&json!({
        "slim": slim_pod(pod, cfg),
        "priority": priority,
        "resourceVersion": version,
    }))
    .context("rendering a pod's view")
}

fn name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

/// Compares the pods as JSON lists them with `protobuf` (the protobuf watch's), name by name.
async fn same_as_json(c: &crate::harness::Cluster, protobuf: &[Pod], cfg: &Config) -> Result<()> {
    let listed = kube::Api::<Pod>::all(c.client.clone())
        .list(&ListParams::default().fields(SELECTOR))
        .await
        .context("listing pods in JSON")?;
    let json: BTreeMap<String, &Pod> = listed.items.iter().map(|p| (name(p), p)).collect();
    let binary: BTreeMap<String, &Pod> = protobuf.iter().map(|p| (name(p), p)).collect();
    ensure!(
        json.keys().eq(binary.keys()),
        "JSON lists {:?}, protobuf {:?}",
        json.keys(),
        binary.keys()
    );
    for (pod, from_json) in &json {
        let (a, b) = (view(from_json, cfg)?, view(binary[pod], cfg)?);
        ensure!(a == b, "pod {pod} differs:\nJSON: {a}\nprotobuf: {b}");
    }
    Ok(())
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn the_protobuf_pod_watch_reads_what_the_json_watch_reads() {
    crate::harness::run("pod-watch", async |c| {
        let cfg = Config::default();
        let nodes = vec![
            GpuNode::new("pw-share", Mode::Share, 2, "Tesla-T4", 16),
            GpuNode::new("pw-excl", Mode::Exclusive, 2, "NVIDIA-A100-PCIE-40GB", 40),
        ];
        up(c, &nodes, "").await?;

        // Bound through the extender: the allocation record, a sidecar init container, labels
        // and annotations the view keeps and drops.
        let mut sidecar = PodSpec::new("pw-bound", GPU_MEM, 4)
            .init_container("setup", &[("cpu", 1)])
            .label(&cfg.resources.gpu_count, "1")
            .label("team", "vision")
            .annotation(&cfg.annotations.model_include, "Tesla-T4")
            .annotation("example.com/note", "dropped by the view")
            .to_pod()?;
        if let Some(init) = sidecar
            .spec
            .as_mut()
            .and_then(|s| s.init_containers.as_mut())
            .and_then(|list| list.first_mut())
        {
            init.restart_policy = Some("Always".into());
        }
        sidecar.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: "pw".into(),
            uid: "0f6b3e1c-8e8a-4a51-9a3b-5f9d7c1e2a10".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }]);
        pods(&c.client)
            .create(&PostParams::default(), &sidecar)
            .await
            .context("creating pw-bound")?;
        crate::objects::wait_bound(&c.client, "pw-bound", BIND).await?;
        // Pod-level resources, and an overhead the RuntimeClass admission plugin sets.
        let runtime_class: RuntimeClass = serde_json::from_value(json!({
            "metadata": {"name": "pw-kata"},
            "handler": "kata",
            "overhead": {"podFixed": {"cpu": "250m", "memory": "120Mi"}},
        }))?;
        kube::Api::<RuntimeClass>::all(c.client.clone())
            .create(&PostParams::default(), &runtime_class)
            .await
            .context("creating the RuntimeClass")?;
        let mut whole = PodSpec::new("pw-whole", NVIDIA_GPU, 2).to_pod()?;
        if let Some(spec) = whole.spec.as_mut() {
            spec.runtime_class_name = Some("pw-kata".into());
            spec.resources = Some(serde_json::from_value(
                json!({"requests": {"cpu": "100m", "memory": "64Mi"}}),
            )?);
        }
        pods(&c.client)
            .create(&PostParams::default(), &whole)
            .await
            .context("creating pw-whole")?;
        let whole = crate::objects::wait_bound(&c.client, "pw-whole", BIND).await?;
        ensure!(
            whole
                .spec
                .as_ref()
                .is_some_and(|s| s.overhead.is_some() && s.resources.is_some()),
            "pw-whole lacks its overhead or pod-level resources: {:?}",
            whole.spec
        );
        // Turned away: kube-scheduler's PodScheduled=False condition, with its reason and time.
        crate::objects::create_pod(&c.client, &PodSpec::new("pw-waiting", NVIDIA_GPU, 8)).await?;
        wait_unschedulable(&c.client, "pw-waiting", BIND).await?;

        // The list: Init, InitApply per pod, InitDone.
        let mut stream = std::pin::pin!(pod_watch(c.client.clone(), SELECTOR));
        let mut listed = Vec::new();
        loop {
            let event = tokio::time::timeout(Duration::from_secs(10), stream.next())
                .await
                .context("the protobuf list did not finish")?;
            match event {
                Some(Ok(Event::Init)) => listed.clear(),
                Some(Ok(Event::InitApply(pod))) => listed.push(pod),
                Some(Ok(Event::InitDone)) => break,
                other => bail!("unexpected item while listing: {other:?}"),
            }
        }
        ensure!(listed.len() == 3, "listed {} pods", listed.len());
        same_as_json(c, &listed, &cfg).await?;

        // The watch: a change, then a delete, as JSON reads them.
        pods(&c.client)
            .patch(
                "pw-whole",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"labels": {cfg.resources.gpu_count.clone(): "2"}}}),
                ),
            )
            .await
            .context("labelling pw-whole")?;
        let changed = next_event_of(&mut stream, "pw-whole").await?;
        let Event::Apply(changed) = changed else {
            bail!("expected the label change, got {changed:?}");
        };
        let from_json = pods(&c.client).get("pw-whole").await?;
        ensure!(
            view(&changed, &cfg)? == view(&from_json, &cfg)?,
            "the change differs:\nprotobuf: {}\nJSON: {}",
            view(&changed, &cfg)?,
            view(&from_json, &cfg)?
        );
        delete_pod(&c.client, "pw-waiting").await?;
        // kube-scheduler may still update it before the delete lands.
        while let Event::Apply(_) = next_event_of(&mut stream, "pw-waiting").await? {}

        // The extender on the JSON watch (`watch.protobuf: false`) builds the same table.
        let on_protobuf = table_holdings(&c.inspect().await?);
        ensure!(on_protobuf.len() >= 3, "the table holds {on_protobuf:?}");
        c.stop_extender();
        c.start_extender("watch:\n  protobuf: false\n").await?;
        let on_json = table_holdings(&c.inspect().await?);
        ensure!(
            on_json == on_protobuf,
            "on the JSON watch the table holds {on_json:?}, on protobuf {on_protobuf:?}"
        );
        Ok(())
    });
}

/// The next event the watch yields for pod `pod` (kube-scheduler may update the others
/// meanwhile); a failed watch fails the scenario.
async fn next_event_of(
    stream: &mut (
             impl futures::Stream<Item = Result<Event<Pod>, kube::runtime::watcher::Error>> + Unpin
         ),
    pod: &str,
) -> Result<Event<Pod>> {
    loop {
        let event = match tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
            Ok(Some(Ok(event))) => event,
            Ok(Some(Err(error))) => bail!("the protobuf watch failed: {error}"),
            Ok(None) => bail!("the protobuf watch ended"),
            Err(_) => bail!("no watch event for {pod} within 10 s"),
        };
        if let Event::Apply(p) | Event::Delete(p) = &event
            && name(p) == pod
        {
            return Ok(event);
        }
    }
}
