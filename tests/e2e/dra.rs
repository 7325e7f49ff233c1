//! GPUs handed out by Dynamic Resource Allocation (issue 63): the test acts as NVIDIA's DRA
//! driver, publishing ResourceSlices for fake GPU nodes, and creates ResourceClaims directly;
//! kube-scheduler's DRA plugin allocates them and binds their pods. The extender accounts the
//! claims' GPUs next to the GPUs it places itself: a node offered both ways never double-books,
//! `inspect` lists every claim's GPUs and pods, a released claim frees its GPUs, and bad or
//! partial slices are said, not guessed around. With the DRA prioritize stanza (docs/dra.md),
//! claim pods are packed as the policy says.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::harness::{Cluster, PROFILE_CONFIG, metric_sum};
use crate::objects::{
    GpuNode, Mode, NS, NVIDIA_GPU, PodSpec, create_bound, create_pod, delete_pod, node_of, pods,
    wait_bound, wait_unschedulable,
};
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
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}],
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
        let device_class: DeviceClass = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER}'")}}]},
        }))?;
        Api::<DeviceClass>::all(client.clone())
            .create(&PostParams::default(), &device_class)
            .await?;
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
        let dra_a = report["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["name"] == "dra-a")
            .context("dra-a in inspect")?;
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
            dra_node(&client, node).await?;
            let gpus = (0..4)
                .map(|i| gpu(i, &format!("GPU-{node}-{i}"), Some("80Gi")))
                .collect();
            publish(
                &client,
                &format!("{node}-gpus"),
                DRIVER,
                node,
                node,
                1,
                gpus,
            )
            .await?;
        }
        let device_class: DeviceClass = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER}'")}}]},
        }))?;
        Api::<DeviceClass>::all(client.clone())
            .create(&PostParams::default(), &device_class)
            .await?;
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
