//! ResourceSlices and ResourceClaims as NVIDIA's DRA driver and kube-scheduler write them, for
//! the unit tests of the reader and the feed.
#![allow(clippy::unwrap_used, reason = "test fixtures")]

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

/// A whole GPU of NVIDIA's driver.
pub(crate) fn gpu(index: i64, uuid: &str) -> Value {
    json!({
        "name": format!("gpu-{index}"),
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": uuid},
            "index": {"int": index},
            "productName": {"string": "NVIDIA A100-SXM4-80GB"},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    })
}

/// A `3g.40gb` MIG slice of GPU `parent`.
pub(crate) fn mig(name: &str, parent: i64, parent_uuid: &str, gib: u64) -> Value {
    mig_slice(name, parent, parent_uuid, "3g.40gb", gib)
}

/// A MIG slice of `profile` of GPU `parent`.
pub(crate) fn mig_slice(
    name: &str,
    parent: i64,
    parent_uuid: &str,
    profile: &str,
    gib: u64,
) -> Value {
    json!({
        "name": name,
        "attributes": {
            "type": {"string": "mig"},
            "uuid": {"string": format!("MIG-{name}")},
            "parentUUID": {"string": parent_uuid},
            "parentIndex": {"int": parent},
            "profile": {"string": profile},
            "gpu.nvidia.com/productName": {"string": "NVIDIA A100-SXM4-80GB"},
        },
        "capacity": {"memory": {"value": format!("{gib}Gi")}},
    })
}

pub(crate) fn slice(
    name: &str,
    driver: &str,
    node: &str,
    generation: i64,
    count: i64,
    devices: Vec<Value>,
) -> ResourceSlice {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
            "devices": devices,
        },
    }))
    .unwrap()
}

pub(crate) fn claim(name: &str, devices: &[(&str, &str)], pods: &[&str]) -> ResourceClaim {
    let results: Vec<Value> = devices
        .iter()
        .map(|(pool, device)| {
            json!({"request": "gpus", "driver": "gpu.nvidia.com", "pool": pool, "device": device})
        })
        .collect();
    let reserved: Vec<Value> = pods
        .iter()
        .map(|pod| json!({"resource": "pods", "name": pod, "uid": format!("uid-{pod}")}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": reserved,
        },
    }))
    .unwrap()
}

/// A claim not allocated yet, asking for `count` devices of `class`.
pub(crate) fn pending_claim(name: &str, class: &str, count: i64) -> ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"devices": {"requests": [
            {"name": "gpus", "exactly": {"deviceClassName": class, "count": count}},
        ]}},
    }))
    .unwrap()
}

/// A pending pod of namespace `team` using the claim `claim`.
pub(crate) fn claim_pod(name: &str, claim: &str) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "team"},
        "spec": {
            "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}],
            "containers": [{"name": "c", "resources": {"claims": [{"name": "gpus"}], "requests": {"cpu": "1"}}}],
        },
    }))
    .unwrap()
}

/// A claim not allocated yet, asking for `count` MIG slices of `class` picked by the CEL
/// `expression`s (none: no selector).
pub(crate) fn pending_mig_claim(
    name: &str,
    class: &str,
    count: i64,
    expressions: &[&str],
) -> ResourceClaim {
    let selectors: Vec<Value> = expressions
        .iter()
        .map(|expression| json!({"cel": {"expression": expression}}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"devices": {"requests": [
            {"name": "slices", "exactly": {"deviceClassName": class, "count": count, "selectors": selectors}},
        ]}},
    }))
    .unwrap()
}
