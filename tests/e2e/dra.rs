//! GPUs handed out by Dynamic Resource Allocation (issue 63): the test acts as NVIDIA's DRA
//! driver, publishing ResourceSlices for fake GPU nodes, and creates ResourceClaims directly;
//! kube-scheduler's DRA plugin allocates them and binds their pods. The extender accounts the
//! claims' GPUs next to the GPUs it places itself: a node offered both ways never double-books,
//! `inspect` lists every claim's GPUs and pods, a released claim frees its GPUs, and bad or
//! partial slices are said, not guessed around. With the DRA prioritize stanza (docs/dra.md),
//! claim pods are packed as the policy says; so are they in the dedicated scheduler as shipped,
//! whose profile sends every pod to the extender's own stanza. With kube-controller-manager's
//! resourceclaim controller, claims made from ResourceClaimTemplates are packed the same way,
//! and deleting a pod releases its claim's GPUs in the table. Claims for MIG devices of one
//! profile hold their node's slices and are packed onto the node whose slices are in use.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::harness::{Cluster, PROFILE_CONFIG, metric_sum};
use crate::mig::node;
use crate::objects::{
    GpuNode, Mode, NS, NVIDIA_GPU, PodSpec, create_bound, create_pod, delete_pod, node_of, pods,
    wait_bound, wait_unschedulable,
};
use crate::web_view::{drawn_page, node_row};
use crate::{BIND, up};

const DRIVER: &str = "gpu.nvidia.com";

/// A whole GPU as NVIDIA's driver publishes it; without `memory` when `memory` is `None`.
fn gpu(index: u16, uuid: &str, memory: Option<&str>) -> Value {
    let mut device = json!({
        "name": format!("gpu-{index}"),
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": uuid},
            "index": {"int": index},
            "productName": {"string": "NVIDIA A100-SXM4-80GB"},
        },
    });
    if let Some(memory) = memory {
        device["capacity"] = json!({"memory": {"value": memory}});
    }
    device
}

/// Publishes one ResourceSlice of `driver` for `node`, in pool `pool` of `count` slices.
async fn publish(
    client: &kube::Client,
    name: &str,
    driver: &str,
    node: &str,
    pool: &str,
    count: u32,
    devices: Vec<Value>,
) -> Result<()> {
    let slice: ResourceSlice = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": count},
            "devices": devices,
        },
    }))?;
    Api::<ResourceSlice>::all(client.clone())
        .create(&PostParams::default(), &slice)
        .await
        .with_context(|| format!("publishing ResourceSlice {name}"))?;
    Ok(())
}

/// A node only a DRA driver serves: no GPU capacity, no GPU labels.
async fn dra_node(client: &kube::Client, name: &str) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
    }))?;
    api.create(&PostParams::default(), &node).await?;
    let capacity = json!({"cpu": "64", "memory": "256Gi", "pods": "250"});
    let status = json!({"status": {
        "capacity": capacity, "allocatable": capacity,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake node (no kubelet)"}],
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("setting the status of node {name}"))?;
    Ok(())
}

/// A DRA-only node with `count` whole GPUs in one ResourceSlice (`<node>-gpus`, pool `<node>`).
async fn dra_node_with_gpus(client: &kube::Client, node: &str, count: u16) -> Result<()> {
    dra_node(client, node).await?;
    let gpus = (0..count)
        .map(|i| gpu(i, &format!("GPU-{node}-{i}"), Some("80Gi")))
        .collect();
    publish(client, &format!("{node}-gpus"), DRIVER, node, node, 1, gpus).await
}

/// The `gpu.nvidia.com` DeviceClass NVIDIA's driver installs: every device of the driver.
async fn create_device_class(client: &kube::Client) -> Result<()> {
    let device_class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER}'")}}]},
    }))?;
    Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &device_class)
        .await
        .context("creating the DeviceClass")?;
    Ok(())
}

/// A claim for `count` GPUs of the `gpu.nvidia.com` DeviceClass.
async fn create_claim(client: &kube::Client, name: &str, count: u32) -> Result<()> {
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [
            {"name": "gpus", "exactly": {"deviceClassName": DRIVER, "count": count}},
        ]}},
    }))?;
    Api::<ResourceClaim>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &claim)
        .await
        .with_context(|| format!("creating ResourceClaim {name}"))?;
    Ok(())
}

/// A pod using claim `claim`, kept to `node` where one is named.
async fn create_claim_pod(
    client: &kube::Client,
    name: &str,
    claim: &str,
    node: Option<&str>,
) -> Result<()> {
    let claim = json!({"resourceClaimName": claim});
    create_pod_claiming(client, name, claim, "default-scheduler", node).await
}

/// A pod of the `gpu-scheduler` profile whose claim comes from `template`
/// (kube-controller-manager's resourceclaim controller makes it), kept to `node` where one is
/// named.
async fn create_template_pod(
    client: &kube::Client,
    name: &str,
    template: &str,
    node: Option<&str>,
) -> Result<()> {
    create_pod_claiming(
        client,
        name,
        json!({"resourceClaimTemplateName": template}),
        "gpu-scheduler",
        node,
    )
    .await
}

/// A pod of profile `scheduler` with one claim `gpus` from `source` (`resourceClaimName` or
/// `resourceClaimTemplateName`), kept to `node` where one is named.
async fn create_pod_claiming(
    client: &kube::Client,
    name: &str,
    source: Value,
    scheduler: &str,
    node: Option<&str>,
) -> Result<()> {
    let mut claim = source;
    claim["name"] = json!("gpus");
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [claim],
            "containers": [{
                "name": "c",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"claims": [{"name": "gpus"}], "requests": {"cpu": "10m", "memory": "16Mi"}},
            }],
        },
    });
    if let Some(node) = node {
        pod["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    }
    let pod: Pod = serde_json::from_value(pod)?;
    pods(client)
        .create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("creating pod {name}"))?;
    Ok(())
}

/// The devices kube-scheduler allocated to a claim.
async fn allocated(client: &kube::Client, claim: &str) -> Result<Vec<String>> {
    let claim = Api::<ResourceClaim>::namespaced(client.clone(), NS)
        .get(claim)
        .await?;
    Ok(claim
        .status
        .and_then(|s| s.allocation)
        .and_then(|a| a.devices)
        .and_then(|d| d.results)
        .unwrap_or_default()
        .into_iter()
        .map(|r| r.device)
        .collect())
}

/// The GPU indices of `node` the extender's `inspect` shows held by `claim`.
fn claim_gpus(report: &Value, node: &str, claim: &str) -> Vec<u64> {
    report["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["name"] == node)
        .flat_map(|n| n["gpus"].as_array().cloned().unwrap_or_default())
        .filter(|g| {
            g["claims"]
                .as_array()
                .is_some_and(|claims| claims.iter().any(|c| c["claim"] == claim))
        })
        .filter_map(|g| g["index"].as_u64())
        .collect()
}

/// Polls `inspect` until `done` holds, for at most `limit`.
async fn wait_inspect(
    c: &Cluster,
    what: &str,
    limit: Duration,
    done: impl Fn(&Value) -> bool,
) -> Result<Value> {
    let deadline = Instant::now() + limit;
    loop {
        let report = c.inspect().await?;
        if done(&report) {
            return Ok(report);
        }
        if Instant::now() > deadline {
            bail!(
                "inspect never showed {what} within {limit:?}: {:#}",
                report["dra"]
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn dra_claims_are_accounted_next_to_the_extenders_pods() {
    crate::harness::run("dra", async |c| {
        let client = c.client.clone();
        // "both": 2 GPUs from the device plugin (with the node agent's UUIDs) and the same
        // 2 from the DRA driver; "dra-a": 4 GPUs from the DRA driver alone.
        let agent = json!({"version": 1, "gpus": [
            {"index": 0, "uuid": "GPU-b0", "model": "A100", "memoryMiB": 81920},
            {"index": 1, "uuid": "GPU-b1", "model": "A100", "memoryMiB": 81920},
        ]});
        let both = GpuNode::new("both", Mode::Exclusive, 2, "A100", 80)
            .annotation("gpu-extender.io/gpus", &agent.to_string());
        dra_node(&client, "dra-a").await?;
        create_device_class(&client).await?;
        publish(
            &client,
            "both-gpus",
            DRIVER,
            "both",
            "both",
            1,
            vec![
                gpu(0, "GPU-b0", Some("80Gi")),
                gpu(1, "GPU-b1", Some("80Gi")),
            ],
        )
        .await?;
        let four = (0..4)
            .map(|i| gpu(i, &format!("GPU-a{i}"), Some("80Gi")))
            .collect();
        publish(&client, "dra-a-gpus", DRIVER, "dra-a", "dra-a", 1, four).await?;
        // Bad and partial slices, on a node no pod can go to ("ghost" has no Node): another
        // driver, a pool of two slices with one published, a device without its memory.
        publish(
            &client,
            "both-tpus",
            "tpu.example.com",
            "both",
            "both-tpu",
            1,
            vec![gpu(0, "TPU-0", Some("16Gi"))],
        )
        .await?;
        publish(
            &client,
            "ghost-extra-1",
            DRIVER,
            "ghost",
            "ghost-extra",
            2,
            vec![gpu(8, "GPU-x8", Some("80Gi"))],
        )
        .await?;
        publish(
            &client,
            "ghost-gpus",
            DRIVER,
            "ghost",
            "ghost",
            1,
            vec![gpu(0, "GPU-g0", None)],
        )
        .await?;
        up(c, &[both], "").await?;

        // A claim pod on "both": kube-scheduler allocates one of its GPUs and binds it.
        create_claim(&client, "c-both", 1).await?;
        create_claim_pod(&client, "dra-both", "c-both", Some("both")).await?;
        wait_bound(&client, "dra-both", BIND).await?;
        let devices = allocated(&client, "c-both").await?;
        ensure!(devices.len() == 1, "c-both allocated {devices:?}");
        let claimed: u64 = devices[0].trim_start_matches("gpu-").parse()?;
        let report = wait_inspect(c, "c-both's GPU", BIND, |r| {
            claim_gpus(r, "both", "default/c-both") == vec![claimed]
        })
        .await?;
        eprintln!("  c-both holds GPU {claimed} of node both");
        ensure!(
            report["dra"]["nodesOfferedBothWays"] == json!(["both"]),
            "both not said to be offered both ways: {:#}",
            report["dra"]
        );

        // The device-plugin side never double-books: 2 whole GPUs do not fit beside the claim,
        // 1 does, on the other GPU.
        create_pod(&client, &PodSpec::new("plugin-2", NVIDIA_GPU, 2)).await?;
        wait_unschedulable(&client, "plugin-2", BIND).await?;
        delete_pod(&client, "plugin-2").await?;
        let one = create_bound(&client, &PodSpec::new("plugin-1", NVIDIA_GPU, 1), BIND).await?;
        ensure!(
            node_of(&one) == Some("both"),
            "plugin-1 on {:?}",
            node_of(&one)
        );
        let report = wait_inspect(c, "plugin-1 beside the claim", BIND, |r| {
            r["nodes"].as_array().into_iter().flatten().any(|n| {
                n["name"] == "both"
                    && n["gpus"].as_array().into_iter().flatten().any(|g| {
                        g["pods"]
                            .as_array()
                            .is_some_and(|p| p.contains(&json!("default/plugin-1")))
                    })
            })
        })
        .await?;
        for node in report["nodes"].as_array().into_iter().flatten() {
            for gpu in node["gpus"].as_array().into_iter().flatten() {
                let pods = gpu["pods"].as_array().map_or(0, Vec::len);
                let claims = gpu["claims"].as_array().map_or(0, Vec::len);
                ensure!(
                    pods + claims <= 1,
                    "{} GPU {} held twice: {gpu:#}",
                    node["name"],
                    gpu["index"]
                );
            }
        }

        // A DRA-only node: its GPUs come from the slice, and a 2-GPU claim's show with its pod.
        create_claim(&client, "c-two", 2).await?;
        create_claim_pod(&client, "dra-two", "c-two", Some("dra-a")).await?;
        wait_bound(&client, "dra-two", BIND).await?;
        let report = wait_inspect(c, "c-two's GPUs", BIND, |r| {
            claim_gpus(r, "dra-a", "default/c-two").len() == 2
        })
        .await?;
        let dra_a = node(&report, "dra-a")?;
        ensure!(
            dra_a["gpus"].as_array().map_or(0, Vec::len) == 4,
            "dra-a: {dra_a:#}"
        );
        let claims = report["dra"]["claims"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let two = claims
            .iter()
            .find(|claim| claim["claim"] == "default/c-two")
            .context("c-two in inspect's claims")?;
        ensure!(two["pods"] == json!(["default/dra-two"]), "c-two: {two:#}");
        ensure!(two["node"] == "dra-a", "c-two: {two:#}");
        ensure!(claims.len() == 2, "every claim listed: {claims:#?}");

        // Bad and partial slices are said.
        let problems = report["dra"]["problems"].to_string();
        for needle in [
            "driver tpu.example.com, which dra.drivers does not list",
            "pool gpu.nvidia.com/ghost-extra: 1 of 2 ResourceSlices of generation 1 seen",
            "ResourceSlice ghost-gpus: device gpu-0: no capacity \\\"memory\\\"",
        ] {
            ensure!(problems.contains(needle), "{needle} not in {problems}");
        }
        let metrics = c.metrics().await?;
        for (name, labels, value) in [
            ("gpu_extender_dra_served", &[][..], 1.0),
            ("gpu_extender_dra_nodes_offered_both_ways", &[], 1.0),
            ("gpu_extender_dra_gpus_held", &[], 3.0),
            ("gpu_extender_dra_claims_allocated", &[], 2.0),
            ("gpu_extender_dra_devices", &[("type", "gpu")], 6.0),
            (
                "gpu_extender_dra_slice_problems",
                &[("kind", "unknown_driver")],
                1.0,
            ),
            (
                "gpu_extender_dra_slice_problems",
                &[("kind", "pool_waiting")],
                1.0,
            ),
            (
                "gpu_extender_dra_slice_problems",
                &[("kind", "device_unreadable")],
                1.0,
            ),
        ] {
            let got = metric_sum(&metrics, name, labels);
            ensure!(got == value, "{name}{labels:?} = {got}, expected {value}");
        }

        // The web view draws every claim on its GPUs, lists the claims, the node offered both
        // ways and the problems.
        let dom = drawn_page(c)?;
        let dra_a = node_row(&dom, "dra-a")?;
        ensure!(
            dra_a.matches("data-claims=\"default/c-two\"").count() == 2,
            "dra-a's row: {dra_a}"
        );
        let both_row = node_row(&dom, "both")?;
        ensure!(
            both_row.contains(&format!(
                "data-gpu=\"{claimed}\" data-healthy=\"true\" data-island=\"\" data-pods=\"\" data-claims=\"default/c-both\""
            )),
            "both's row: {both_row}"
        );
        for needle in [
            "data-claim=\"default/c-two\"",
            "data-claim=\"default/c-both\"",
            "data-both-ways=\"both\"",
            "data-total=\"claimed\"><b>3</b>",
            "driver tpu.example.com, which dra.drivers does not list",
        ] {
            ensure!(dom.contains(needle), "the page lacks {needle}");
        }

        // Released: the pod is deleted and the claim deallocated (what kube-controller-manager
        // does once its pods are gone); the extender frees the GPUs.
        delete_pod(&client, "dra-two").await?;
        let cleared = json!({"status": {"reservedFor": null, "allocation": null}});
        Api::<ResourceClaim>::namespaced(client.clone(), NS)
            .patch_status("c-two", &PatchParams::default(), &Patch::Merge(&cleared))
            .await
            .context("deallocating c-two")?;
        let report = wait_inspect(c, "c-two released", BIND, |r| {
            claim_gpus(r, "dra-a", "default/c-two").is_empty()
        })
        .await?;
        let idle = report["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["name"] == "dra-a")
            .and_then(|n| n["gpus"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter(|g| g["claims"].as_array().is_none_or(Vec::is_empty))
            .count();
        ensure!(idle == 4, "dra-a GPUs free after the release: {idle}");
        Ok(())
    });
}

/// The `gpu-scheduler` profile configuration with the DRA stanza of docs/dra.md added: the
/// extender's `/dra/prioritize`, no managed resources, so kube-scheduler calls it for every pod.
fn with_dra_stanza(c: &Cluster) -> Result<String> {
    let url = c.extender_url();
    let rendered = c.rendered_scheduler_config(PROFILE_CONFIG, &url)?;
    let stanza = format!(
        "extenders:\n  - urlPrefix: {url}/dra\n    prioritizeVerb: prioritize\n    weight: 5\n    nodeCacheCapable: true\n    httpTimeout: 5s\n    ignorable: true\n"
    );
    ensure!(
        rendered.contains("\nextenders:\n"),
        "no extenders list in {PROFILE_CONFIG}"
    );
    Ok(rendered.replacen("extenders:\n", &stanza, 1))
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn dra_pods_are_packed_by_the_policy() {
    crate::harness::run("dra-packing", async |c| {
        let client = c.client.clone();
        for node in ["pack-a", "pack-b"] {
            dra_node_with_gpus(&client, node, 4).await?;
        }
        create_device_class(&client).await?;
        // Binpack (the default policy).
        c.start_extender("").await?;
        let rendered = with_dra_stanza(c)?;
        c.start_scheduler_rendered(PROFILE_CONFIG, &rendered, &[])
            .await?;

        // One claim already on pack-b.
        create_claim(&client, "first", 1).await?;
        create_claim_pod(&client, "first", "first", Some("pack-b")).await?;
        wait_bound(&client, "first", BIND).await?;
        wait_inspect(c, "first's GPU", BIND, |r| {
            claim_gpus(r, "pack-b", "default/first").len() == 1
        })
        .await?;
        // Three more, free to go anywhere: binpack fills pack-b. Without the DRA stanza,
        // kube-scheduler alone sent the second of them to the emptier pack-a (checked with
        // v1.34.4, 2026-12-02).
        for name in ["next-1", "next-2", "next-3"] {
            create_claim(&client, name, 1).await?;
            create_claim_pod(&client, name, name, None).await?;
            let bound = wait_bound(&client, name, BIND).await?;
            let node = node_of(&bound).unwrap_or_default().to_owned();
            let claim = format!("default/{name}");
            wait_inspect(c, &format!("{name}'s GPU"), BIND, |r| {
                claim_gpus(r, &node, &claim).len() == 1
            })
            .await?;
            eprintln!("  {name}: {node}");
            ensure!(
                node == "pack-b",
                "{name} went to {node}, not the busier pack-b"
            );
        }
        let metrics = c.metrics().await?;
        let ranked = metric_sum(
            &metrics,
            "gpu_extender_requests_total",
            &[("verb", "prioritize")],
        );
        ensure!(ranked >= 3.0, "the DRA stanza's prioritize calls: {ranked}");
        Ok(())
    });
}

/// A ResourceClaimTemplate `name` for `count` GPUs of the `gpu.nvidia.com` DeviceClass.
async fn create_template(client: &kube::Client, name: &str, count: u32) -> Result<()> {
    let template: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpus", "exactly": {"deviceClassName": DRIVER, "count": count}},
        ]}}},
    }))?;
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &template)
        .await
        .with_context(|| format!("creating ResourceClaimTemplate {name}"))?;
    Ok(())
}

/// The claim kube-controller-manager made from a template for `pod`'s claim `gpus`.
async fn generated_claim(client: &kube::Client, pod: &str) -> Result<String> {
    let found = pods(client).get(pod).await?;
    found
        .status
        .and_then(|s| s.resource_claim_statuses)
        .unwrap_or_default()
        .into_iter()
        .find(|status| status.name == "gpus")
        .and_then(|status| status.resource_claim_name)
        .with_context(|| format!("{pod} has no claim made from a template"))
}

/// Creates pod `pod` claiming from `template`, waits until it is bound, and checks that it went
/// to `expected`.
async fn place_from_template(
    client: &kube::Client,
    pod: &str,
    template: &str,
    expected: &str,
) -> Result<()> {
    create_template_pod(client, pod, template, None).await?;
    let bound = wait_bound(client, pod, BIND).await?;
    ensure!(
        node_of(&bound) == Some(expected),
        "{pod} went to {:?}, not {expected}",
        node_of(&bound)
    );
    Ok(())
}

/// The claims `inspect` shows holding GPUs of `node`, sorted.
fn held_claims(report: &Value, node: &str) -> Vec<String> {
    let mut claims: Vec<String> = report["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["name"] == node)
        .flat_map(|n| n["gpus"].as_array().cloned().unwrap_or_default())
        .flat_map(|g| g["claims"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["claim"].as_str().map(str::to_owned))
        .collect();
    claims.sort();
    claims.dedup();
    claims
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn dra_template_claims_are_made_packed_and_released() {
    crate::harness::run("dra-templates", async |c| {
        let client = c.client.clone();
        for node in ["tmpl-a", "tmpl-b"] {
            dra_node_with_gpus(&client, node, 4).await?;
        }
        create_device_class(&client).await?;
        create_template(&client, "two-gpus", 2).await?;
        // kube-controller-manager's resourceclaim controller makes each pod's claim from the
        // template, and deallocates and deletes it when the pod is gone.
        c.start_controller_manager(&["resourceclaim-controller"])
            .await?;
        // The dedicated scheduler, as the chart ships it: every pod of its profile reaches the
        // extender's own stanza, whose prioritize ranks claim pods too. No DRA stanza.
        c.start_extender("").await?;
        c.start_scheduler("scheduler-config/gpu-scheduler-dedicated.yaml")
            .await?;

        // The first pod kept to tmpl-b, the second free: binpack puts it beside the first.
        create_template_pod(&client, "t-1", "two-gpus", Some("tmpl-b")).await?;
        wait_bound(&client, "t-1", BIND).await?;
        place_from_template(&client, "t-2", "two-gpus", "tmpl-b").await?;
        let mut claims = Vec::new();
        for pod in ["t-1", "t-2"] {
            let claim = generated_claim(&client, pod).await?;
            ensure!(
                allocated(&client, &claim).await?.len() == 2,
                "{claim} not allocated 2 GPUs"
            );
            claims.push(format!("{NS}/{claim}"));
        }
        claims.sort();
        // Every claim's GPUs listed, with its pod.
        let report = wait_inspect(c, "both template claims on tmpl-b", BIND, |r| {
            held_claims(r, "tmpl-b") == claims
        })
        .await?;
        for (claim, pod) in claims.iter().zip(["t-1", "t-2"]) {
            ensure!(
                claim_gpus(&report, "tmpl-b", claim).len() == 2,
                "{claim}: {:#}",
                report["dra"]
            );
            let listed = report["dra"]["claims"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["claim"] == claim.as_str())
                .with_context(|| format!("{claim} in inspect's claims"))?;
            ensure!(listed["node"] == "tmpl-b", "{claim}: {listed:#}");
            let pods = listed["pods"].to_string();
            ensure!(pods.contains(&format!("{NS}/{pod}")), "{claim}: {listed:#}");
        }
        eprintln!("  t-1 and t-2 packed on tmpl-b: {claims:?}");

        // A third finds tmpl-b full and goes to tmpl-a.
        place_from_template(&client, "t-3", "two-gpus", "tmpl-a").await?;

        // Released: deleting t-3 has kube-controller-manager deallocate its claim, and the
        // extender frees its GPUs.
        let third = generated_claim(&client, "t-3").await?;
        delete_pod(&client, "t-3").await?;
        let report = wait_inspect(c, "t-3's claim released", BIND, |r| {
            held_claims(r, "tmpl-a").is_empty()
        })
        .await?;
        let metrics = c.metrics().await?;
        let ranked = metric_sum(
            &metrics,
            "gpu_extender_requests_total",
            &[("verb", "prioritize")],
        );
        // t-2's: kube-scheduler asks no ranking where one node passes its filters (t-1, t-3).
        ensure!(ranked >= 1.0, "prioritize calls: {ranked}");
        let allocated_claims = metric_sum(&metrics, "gpu_extender_dra_claims_allocated", &[]);
        ensure!(
            allocated_claims == 2.0,
            "claims allocated after the release: {allocated_claims}: {:#}",
            report["dra"]
        );
        // kube-controller-manager deallocated it (the garbage collector, not run here, would
        // delete it next: the pod owns it).
        let left = Api::<ResourceClaim>::namespaced(client.clone(), NS)
            .get_opt(&third)
            .await?
            .and_then(|claim| claim.status)
            .and_then(|status| status.allocation);
        ensure!(left.is_none(), "{third} still allocated: {left:?}");
        // The freed GPUs take a pod asking all four, and the table shows them held by it.
        create_template(&client, "four-gpus", 4).await?;
        place_from_template(&client, "t-4", "four-gpus", "tmpl-a").await?;
        let fourth = format!("{NS}/{}", generated_claim(&client, "t-4").await?);
        wait_inspect(c, "t-4's four GPUs", BIND, |r| {
            claim_gpus(r, "tmpl-a", &fourth).len() == 4
        })
        .await?;

        // A driver republishing tmpl-a's pool as generation 2: only the new slice counts and
        // the old one is said to be ignored.
        let newer: ResourceSlice = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "tmpl-a-gpus-2"},
            "spec": {
                "driver": DRIVER,
                "nodeName": "tmpl-a",
                "pool": {"name": "tmpl-a", "generation": 2, "resourceSliceCount": 1},
                "devices": (0..4).map(|i| gpu(i, &format!("GPU-tmpl-a-{i}"), Some("80Gi"))).collect::<Vec<_>>(),
            },
        }))?;
        Api::<ResourceSlice>::all(client.clone())
            .create(&PostParams::default(), &newer)
            .await?;
        let report = wait_inspect(c, "the older generation said", BIND, |r| {
            r["dra"]["problems"]
                .to_string()
                .contains("pool gpu.nvidia.com/tmpl-a: 1 slice(s) of an older generation ignored")
        })
        .await?;
        let tmpl_a = node(&report, "tmpl-a")?;
        ensure!(
            tmpl_a["gpus"].as_array().map_or(0, Vec::len) == 4,
            "tmpl-a counted once across generations: {tmpl_a:#}"
        );
        Ok(())
    });
}

/// The `mig.nvidia.com` DeviceClass NVIDIA's driver installs for its MIG devices.
const MIG_CLASS: &str = "mig.nvidia.com";

/// A `1g.10gb` MIG device of card 0 of `node`, as NVIDIA's driver publishes one.
fn mig_device(node: &str, slice: u16) -> Value {
    json!({
        "name": format!("gpu-0-mig-1g10gb-{slice}"),
        "attributes": {
            "type": {"string": "mig"},
            "uuid": {"string": format!("MIG-{node}-{slice}")},
            "parentUUID": {"string": format!("GPU-{node}-0")},
            "parentIndex": {"int": 0},
            "profile": {"string": "1g.10gb"},
            "productName": {"string": "NVIDIA A100-SXM4-80GB"},
        },
        "capacity": {"memory": {"value": "10Gi"}},
    })
}

/// The `mig.nvidia.com` DeviceClass: every MIG device of the driver.
async fn create_mig_device_class(client: &kube::Client) -> Result<()> {
    let expression =
        format!("device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'mig'");
    let device_class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": MIG_CLASS},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }))?;
    Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &device_class)
        .await
        .context("creating the MIG DeviceClass")?;
    Ok(())
}

/// A claim for one `1g.10gb` slice, picked by the profile as NVIDIA's examples do.
async fn create_mig_claim(client: &kube::Client, name: &str) -> Result<()> {
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
            "deviceClassName": MIG_CLASS,
            "count": 1,
            "selectors": [{"cel": {"expression": format!("device.attributes['{DRIVER}'].profile == '1g.10gb'")}}],
        }}]}},
    }))?;
    Api::<ResourceClaim>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &claim)
        .await
        .with_context(|| format!("creating ResourceClaim {name}"))?;
    Ok(())
}

/// `node`'s `1g.10gb` pool as `inspect` shows it: (held, advertised, the claims holding it).
fn mig_pool(report: &Value, node: &str) -> (u64, u64, Vec<String>) {
    let pool = report["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["name"] == node)
        .flat_map(|n| n["mig"].as_array().cloned().unwrap_or_default())
        .find(|pool| pool["profile"] == "1g.10gb")
        .unwrap_or_default();
    let mut claims: Vec<String> = pool["claims"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["claim"].as_str().map(str::to_owned))
        .collect();
    claims.sort();
    (
        pool["held"].as_u64().unwrap_or(0),
        pool["advertised"].as_u64().unwrap_or(0),
        claims,
    )
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn dra_mig_claims_are_packed_onto_the_node_whose_slices_are_in_use() {
    crate::harness::run("dra-mig", async |c| {
        let client = c.client.clone();
        // Two DRA-only nodes, each with one card split into seven 1g.10gb devices.
        for node in ["mig-a", "mig-b"] {
            dra_node(&client, node).await?;
            let devices = (0..7).map(|slice| mig_device(node, slice)).collect();
            publish(
                &client,
                &format!("{node}-gpus"),
                DRIVER,
                node,
                node,
                1,
                devices,
            )
            .await?;
        }
        create_mig_device_class(&client).await?;
        // Binpack (the default policy), with the DRA stanza.
        c.start_extender("").await?;
        let rendered = with_dra_stanza(c)?;
        c.start_scheduler_rendered(PROFILE_CONFIG, &rendered, &[])
            .await?;
        wait_inspect(c, "the nodes' MIG pools", BIND, |r| {
            mig_pool(r, "mig-a").1 == 7 && mig_pool(r, "mig-b").1 == 7
        })
        .await?;

        // One slice already in use on mig-b.
        create_mig_claim(&client, "mig-first").await?;
        create_claim_pod(&client, "mig-first", "mig-first", Some("mig-b")).await?;
        wait_bound(&client, "mig-first", BIND).await?;
        wait_inspect(c, "mig-first's slice", BIND, |r| {
            mig_pool(r, "mig-b") == (1, 7, vec!["default/mig-first".to_owned()])
        })
        .await?;
        // Two more, free to go anywhere: binpack packs them onto mig-b, whose card is in use.
        for name in ["mig-next-1", "mig-next-2"] {
            create_mig_claim(&client, name).await?;
            create_claim_pod(&client, name, name, None).await?;
            let bound = wait_bound(&client, name, BIND).await?;
            let node = node_of(&bound).unwrap_or_default().to_owned();
            eprintln!("  {name}: {node} ({:?})", allocated(&client, name).await?);
            ensure!(
                node == "mig-b",
                "{name} went to {node}, not mig-b whose slices are in use"
            );
        }
        let report = wait_inspect(c, "the three claims' slices on mig-b", BIND, |r| {
            mig_pool(r, "mig-b").0 == 3
        })
        .await?;
        ensure!(
            mig_pool(&report, "mig-b")
                == (
                    3,
                    7,
                    vec![
                        "default/mig-first".to_owned(),
                        "default/mig-next-1".to_owned(),
                        "default/mig-next-2".to_owned(),
                    ]
                ),
            "mig-b's pool: {:?}",
            mig_pool(&report, "mig-b")
        );
        ensure!(
            mig_pool(&report, "mig-a") == (0, 7, Vec::new()),
            "mig-a's pool: {:?}",
            mig_pool(&report, "mig-a")
        );
        let metrics = c.metrics().await?;
        let held = metric_sum(
            &metrics,
            "gpu_extender_mig_slices",
            &[("node", "mig-b"), ("state", "held")],
        );
        ensure!(held == 3.0, "gpu_extender_mig_slices held on mig-b: {held}");
        Ok(())
    });
}
