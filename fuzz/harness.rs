//! What each fuzz target checks, shared by the cargo-fuzz targets (`fuzz/fuzz_targets/`) and the
//! stable test that replays the saved corpus (`tests/fuzz_corpus.rs`). Every function takes
//! arbitrary bytes and panics only when the product breaks a promise: a panic inside the
//! product, a 5xx answer, an answer of the wrong shape, an answer about nodes nobody asked
//! about, a read-only verb that changed the table, or a table invariant broken by a decision
//! the engine said was possible.

#![allow(
    dead_code,
    reason = "each fuzz target includes this file and calls one of its entry points"
)]

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};
use tower::ServiceExt;

use gpu_engine::{NodeSpec, NodeState, PodKey, Table, fit};
use gpu_extender::config::Config;
use gpu_extender::http::server::{AppState, router};
use gpu_extender::http::wire::{
    ExtenderArgs, ExtenderBindingResult, ExtenderFilterResult, ExtenderPreemptionArgs,
    ExtenderPreemptionResult, HostPriorityList, NodeList,
};
use gpu_extender::k8s::watch::slim_pod;
use gpu_extender::objects::translate::{
    names_gpu_resource, node_spec, pod_host_request, pod_request, translate_node,
};
use gpu_extender::objects::{record, translate};
use gpu_extender::state::ClusterState;
use gpu_extender::telemetry::Metrics;

/// The largest body the fuzzed router accepts (bigger ones must get 413, not a crash).
const BODY_LIMIT: usize = 256 * 1024;

/// The extender verbs, as routed under the default `/scheduler` prefix.
#[derive(Clone, Copy, Debug)]
pub enum Verb {
    Filter,
    Prioritize,
    Bind,
    Preempt,
}

impl Verb {
    fn path(self) -> &'static str {
        match self {
            Verb::Filter => "/scheduler/filter",
            Verb::Prioritize => "/scheduler/prioritize",
            Verb::Bind => "/scheduler/bind",
            Verb::Preempt => "/scheduler/preempt",
        }
    }
}

/// Nodes of every mode, as Node objects a device plugin and the labels would describe: the
/// table the fuzzed router answers from (and the nodes pods are fitted against).
fn node_objects() -> Vec<Value> {
    let node = |name: &str, labels: Value, allocatable: Value| {
        json!({"metadata": {"name": name, "labels": labels},
               "status": {"allocatable": allocatable}})
    };
    vec![
        node(
            "excl-a100",
            json!({"aliyun.accelerator/nvidia_name": "NVIDIA-A100-SXM4-80GB",
                   "aliyun.accelerator/nvidia_mem": "81920MiB",
                   "aliyun.accelerator/nvidia_count": "8"}),
            json!({"cpu": "96", "memory": "768Gi", "pods": "110", "nvidia.com/gpu": "8"}),
        ),
        node(
            "share-t4",
            json!({"ack.node.gpu.schedule": "cgpu", "aliyun.accelerator/nvidia_name": "Tesla-T4",
                   "aliyun.accelerator/nvidia_mem": "15109MiB",
                   "aliyun.accelerator/nvidia_count": "4"}),
            json!({"cpu": "32", "memory": "128Gi", "pods": "110",
                   "aliyun.com/gpu-mem": "56", "aliyun.com/gpu-count": "4"}),
        ),
        node(
            "core-v100",
            json!({"ack.node.gpu.schedule": "core_mem", "ack.node.gpu.placement": "spread",
                   "aliyun.accelerator/nvidia_name": "Tesla-V100-SXM2-32GB",
                   "aliyun.accelerator/nvidia_mem": "32510MiB",
                   "aliyun.accelerator/nvidia_count": "2"}),
            json!({"cpu": "16", "memory": "64Gi", "pods": "110",
                   "aliyun.com/gpu-mem": "62", "aliyun.com/gpu-core.percentage": "200"}),
        ),
        node(
            "topo-h100",
            json!({"ack.node.gpu.schedule": "topology",
                   "aliyun.accelerator/nvidia_name": "NVIDIA-H100-80GB-HBM3",
                   "aliyun.accelerator/nvidia_mem": "81559MiB",
                   "aliyun.accelerator/nvidia_count": "8"}),
            json!({"cpu": "192", "memory": "1536Gi", "pods": "110", "aliyun.com/gpu": "8"}),
        ),
    ]
}

fn config() -> &'static Arc<Config> {
    static CONFIG: OnceLock<Arc<Config>> = OnceLock::new();
    CONFIG.get_or_init(|| Arc::new(Config::default()))
}

/// The fixed nodes, translated.
fn specs() -> &'static Vec<NodeSpec> {
    static SPECS: OnceLock<Vec<NodeSpec>> = OnceLock::new();
    SPECS.get_or_init(|| {
        node_objects()
            .into_iter()
            .filter_map(|value| serde_json::from_value::<Node>(value).ok())
            .filter_map(|node| node_spec(&node, config()).ok())
            .collect()
    })
}

struct Extender {
    runtime: tokio::runtime::Runtime,
    state: AppState,
}

fn extender() -> &'static Extender {
    static EXTENDER: OnceLock<Extender> = OnceLock::new();
    EXTENDER.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|error| panic!("fuzz harness: no runtime: {error}"));
        let table = Table::rebuild(20, specs().clone(), []);
        let metrics =
            Metrics::new().unwrap_or_else(|error| panic!("fuzz harness: metrics: {error}"));
        // No binder: bind must answer with an `Error`, never crash.
        let state = AppState::new(
            Arc::new(ClusterState::with_table(table)),
            Arc::clone(config()),
            metrics,
        )
        .with_body_limit(BODY_LIMIT);
        Extender { runtime, state }
    })
}

/// Posts `data` to `verb` and checks the answer.
pub fn extender_verb(verb: Verb, data: &[u8]) {
    let extender = extender();
    let before = table_summary(&extender.state.cluster.read());
    let (status, body) = extender.runtime.block_on(async {
        let request = Request::post(verb.path())
            .header("content-type", "application/json")
            .body(Body::from(data.to_vec()))
            .unwrap_or_else(|error| panic!("fuzz harness: request: {error}"));
        let response = router(extender.state.clone(), "/scheduler")
            .oneshot(request)
            .await
            .unwrap_or_else(|never| match never {});
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map(|collected| collected.to_bytes().to_vec())
            .unwrap_or_default();
        (status, body)
    });
    assert!(
        [
            StatusCode::OK,
            StatusCode::BAD_REQUEST,
            StatusCode::PAYLOAD_TOO_LARGE,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            StatusCode::UNPROCESSABLE_ENTITY,
        ]
        .contains(&status),
        "{verb:?} answered {status}: {}",
        String::from_utf8_lossy(&body)
    );
    let table = extender.state.cluster.read();
    assert_eq!(
        before,
        table_summary(&table),
        "{verb:?} changed the table (only a bind with a binder may)"
    );
    drop(table);
    if status != StatusCode::OK {
        return;
    }
    match verb {
        Verb::Filter => check_filter(data, &body),
        Verb::Prioritize => check_prioritize(data, &body),
        Verb::Bind => {
            let result: ExtenderBindingResult =
                serde_json::from_slice(&body).unwrap_or_else(|error| {
                    panic!("bind answer is not ExtenderBindingResult: {error}")
                });
            assert!(
                !result.error.is_empty(),
                "bind without a binder must report an error"
            );
        }
        Verb::Preempt => check_preempt(data, &body),
    }
}

/// The node names a request asked about: `NodeNames`, or the names of the `Nodes` items.
fn asked_nodes(args: &ExtenderArgs) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = args.node_names.iter().flatten().cloned().collect();
    names.extend(list_names(args.nodes.as_ref()));
    names
}

/// The `metadata.name` of each item of a node list (items are kept as raw JSON); an item without
/// a name is answered for under the empty name, so it counts as asked under that name.
fn list_names(list: Option<&NodeList>) -> Vec<String> {
    list.iter()
        .flat_map(|list| list.items.iter())
        .filter_map(|raw| serde_json::from_str::<Value>(raw.get()).ok())
        .map(|node| {
            node["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

fn check_filter(data: &[u8], body: &[u8]) {
    let result: ExtenderFilterResult = serde_json::from_slice(body)
        .unwrap_or_else(|error| panic!("filter answer is not ExtenderFilterResult: {error}"));
    let Ok(args) = serde_json::from_slice::<ExtenderArgs>(data) else {
        return;
    };
    let asked = asked_nodes(&args);
    let passed: BTreeSet<String> = result
        .node_names
        .iter()
        .flatten()
        .cloned()
        .chain(list_names(result.nodes.as_ref()))
        .collect();
    for name in &passed {
        assert!(asked.contains(name), "filter passed {name:?}, never asked");
    }
    for failed in result
        .failed_nodes
        .keys()
        .chain(result.failed_and_unresolvable_nodes.keys())
    {
        assert!(
            asked.contains(failed),
            "filter failed {failed:?}, never asked"
        );
        assert!(
            !passed.contains(failed),
            "filter both passed and failed {failed:?}"
        );
    }
}

fn check_prioritize(data: &[u8], body: &[u8]) {
    let list: HostPriorityList = serde_json::from_slice(body)
        .unwrap_or_else(|error| panic!("prioritize answer is not HostPriorityList: {error}"));
    let Ok(args) = serde_json::from_slice::<ExtenderArgs>(data) else {
        return;
    };
    let asked = asked_nodes(&args);
    for host in &list {
        assert!(
            asked.contains(&host.host),
            "scored {:?}, never asked",
            host.host
        );
        assert!(
            (0..=10).contains(&host.score),
            "score {} of {:?} is outside kube-scheduler's 0..=10",
            host.score,
            host.host
        );
    }
}

fn check_preempt(data: &[u8], body: &[u8]) {
    let result: ExtenderPreemptionResult = serde_json::from_slice(body)
        .unwrap_or_else(|error| panic!("preempt answer is not ExtenderPreemptionResult: {error}"));
    let Ok(args) = serde_json::from_slice::<ExtenderPreemptionArgs>(data) else {
        return;
    };
    let asked: BTreeSet<&String> = args
        .node_name_to_meta_victims
        .keys()
        .chain(args.node_name_to_victims.keys())
        .collect();
    for node in result.node_name_to_meta_victims.keys() {
        assert!(
            asked.contains(node),
            "preempt kept {node:?}, never proposed"
        );
    }
}

/// Nodes, pods and every GPU's usage: equal before and after a read-only verb.
fn table_summary(table: &Table) -> String {
    let mut nodes: Vec<String> = table
        .nodes()
        .map(|node| format!("{}:{:?}", node.spec.name, node.gpus))
        .collect();
    nodes.sort();
    format!("{} pods; {}", table.pod_count(), nodes.join(" "))
}

/// Decodes a Node and translates it as the watch would; a node the translation accepts must be
/// usable by the engine and the table.
pub fn node(data: &[u8]) {
    let Ok(node) = serde_json::from_slice::<Node>(data) else {
        return;
    };
    let translation = translate_node(&node, config());
    let spec = translation.spec;
    let mut table = Table::new(20);
    table.apply(gpu_engine::Change::UpsertNode(spec.clone()));
    check_invariants(&table, "a translated node");
    // A standard request of each kind against it: decisions must not panic, and a placement
    // the engine offers must be accepted by the table.
    let state = NodeState::new(spec);
    for pod in standard_pods() {
        if let Ok(Some(request)) = pod_request(&pod, config())
            && let Ok(allocation) = fit(&state, &request, &config().engine_policy())
        {
            let key = PodKey::new("fuzz", "standard");
            let reserved = table.reserve(key.clone(), allocation, 1);
            assert!(
                reserved.is_ok(),
                "fit offered a placement the table refused: {reserved:?}"
            );
            check_invariants(&table, "a reservation fit offered");
            table.release(&key);
        }
    }
}

/// Decodes a Pod and reads it as the extender would (request, host request, record, slimming);
/// a request the translation accepts is fitted on every node, and each offered placement must
/// be accepted by the table and released cleanly.
pub fn pod(data: &[u8]) {
    let Ok(pod) = serde_json::from_slice::<Pod>(data) else {
        return;
    };
    let cfg = config();
    let _ = names_gpu_resource(&pod, cfg);
    let _ = pod_host_request(&pod);
    let _ = translate::pod_key(&pod);
    let slim = slim_pod(&pod, cfg);
    // Slimming keeps everything translation reads: the same answer before and after.
    assert_eq!(
        format!("{:?}", pod_request(&pod, cfg)),
        format!("{:?}", pod_request(&slim, cfg)),
        "slim_pod changed what the pod asks for"
    );
    if let Ok(Some(allocation)) = record::decode(&pod, cfg) {
        let node = pod
            .spec
            .as_ref()
            .and_then(|spec| spec.node_name.as_deref())
            .unwrap_or_default();
        assert_eq!(
            allocation.node.as_str(),
            node,
            "a record was accepted for another node"
        );
    }
    let Ok(Some(request)) = pod_request(&pod, cfg) else {
        return;
    };
    let policy = cfg.engine_policy();
    let mut table = Table::rebuild(20, specs().clone(), []);
    let key = PodKey::new("fuzz", "pod");
    for spec in specs() {
        let Some(state) = table.node(&spec.name) else {
            continue;
        };
        let Ok(allocation) = fit(state, &request, &policy) else {
            continue;
        };
        let reserved = table.reserve(key.clone(), allocation, 1);
        assert!(
            reserved.is_ok(),
            "fit offered a placement the table refused on {}: {reserved:?}",
            spec.name
        );
        check_invariants(&table, "a reservation fit offered");
        table.release(&key);
        check_invariants(&table, "a release");
    }
    assert_eq!(table.pod_count(), 0, "release left a pod behind");
}

/// Pods of every request kind, to fit against fuzzed nodes.
fn standard_pods() -> Vec<Pod> {
    let pod = |requests: Value, labels: Value| -> Option<Pod> {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "fuzz", "labels": labels},
            "spec": {"containers": [{"name": "c", "resources": {"requests": requests}}]}
        }))
        .ok()
    };
    [
        pod(json!({"nvidia.com/gpu": "2"}), json!({})),
        pod(json!({"aliyun.com/gpu-mem": "8"}), json!({})),
        pod(
            json!({"aliyun.com/gpu-mem": "16"}),
            json!({"aliyun.com/gpu-count": "2"}),
        ),
        pod(
            json!({"aliyun.com/gpu-mem": "4", "aliyun.com/gpu-core.percentage": "30"}),
            json!({}),
        ),
        pod(json!({"aliyun.com/gpu": "4"}), json!({})),
    ]
    .into_iter()
    .flatten()
    .collect()
}

fn check_invariants(table: &Table, after: &str) {
    if let Err(violations) = table.check_invariants() {
        panic!("invariants broken after {after}: {violations:?}");
    }
}
