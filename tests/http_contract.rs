//! HTTP contract of the extender, through the routers without a socket: every verb in both
//! cache modes with bodies recorded from a real kube-scheduler v1.34, nulls, malformed and
//! oversized bodies, unknown nodes, pods without GPUs, bad GPU requests and the not-ready state.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a panic is a test failure with its location"
)]

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use gpu_engine::{Change, NodeSpec, Table};
use gpu_extender::config::Config;
use gpu_extender::http::server::{AppState, admin_router, router};
use gpu_extender::objects::translate;
use gpu_extender::state::{ClusterState, PolicyCell, TableWriter};
use gpu_extender::telemetry::Metrics;

const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/kube-scheduler-v1.34"
);

fn fixture(name: &str) -> Value {
    let text = std::fs::read_to_string(format!("{FIXTURES}/{name}")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The two T4 nodes of the recordings, translated from their recorded Node objects.
fn recorded_nodes(config: &Config) -> Vec<NodeSpec> {
    let body = fixture("filter-nocache.json");
    body["Nodes"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| {
            let node: k8s_openapi::api::core::v1::Node =
                serde_json::from_value(item.clone()).unwrap();
            translate::node_spec(&node, config).unwrap()
        })
        .collect()
}

struct Harness {
    state: AppState,
    /// The table's writer, for tests that change the table under the router.
    writer: TableWriter,
}

impl Harness {
    fn new(ready: bool) -> Self {
        let config = Arc::new(Config::default());
        let table = Table::rebuild(20, recorded_nodes(&config), []);
        if !ready {
            // Not synced yet: the state as the service starts, before the watch's first lists.
            let fresh = TableWriter::new(ClusterState::new(20));
            *fresh.write() = table;
            return Self::with_writer(config, fresh);
        }
        Self::with_writer(config, TableWriter::new(ClusterState::with_table(table)))
    }

    fn with_writer(config: Arc<Config>, writer: TableWriter) -> Self {
        let cluster = Arc::clone(writer.reader());
        let policy: PolicyCell = config.engine_policy().into();
        // As `serve` wires it: the table's gauges are read from the state at every scrape.
        let metrics = Metrics::new().unwrap();
        metrics
            .watch_state(Arc::clone(&cluster), policy.clone())
            .unwrap();
        let state = AppState::new(cluster, config, metrics)
            .with_policy(policy)
            .with_body_limit(1024 * 1024);
        Self { state, writer }
    }

    fn extender(&self) -> Router {
        router(self.state.clone(), "/scheduler")
    }

    async fn post(&self, verb: &str, body: impl Into<Body>) -> (StatusCode, Vec<u8>) {
        let request = Request::post(format!("/scheduler/{verb}"))
            .header("content-type", "application/json")
            .body(body.into())
            .unwrap();
        let response = self.extender().oneshot(request).await.unwrap();
        let status = response.status();
        (
            status,
            response
                .into_body()
                .collect()
                .await
                .unwrap()
                .to_bytes()
                .to_vec(),
        )
    }

    async fn post_json(&self, verb: &str, body: &Value) -> Value {
        let (status, bytes) = self.post(verb, body.to_string()).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{}",
            String::from_utf8_lossy(&bytes)
        );
        serde_json::from_slice(&bytes).unwrap()
    }

    async fn admin(&self, path: &str) -> (StatusCode, String) {
        let response = admin_router(self.state.clone())
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }
}

fn with_gpu_limit(mut body: Value, resource: &str, value: &str) -> Value {
    body["Pod"]["spec"]["containers"][0]["resources"] = json!({"limits": {resource: value}});
    body["Pod"]["spec"]["initContainers"] = Value::Null;
    body
}

#[tokio::test]
async fn filter_cache_mode_answers_every_key_for_recorded_body() {
    let harness = Harness::new(true);
    let answer = harness
        .post_json("filter", &fixture("filter-cache.json"))
        .await;
    assert_eq!(answer["NodeNames"], json!(["gpu-a", "gpu-b"]));
    assert_eq!(answer["Nodes"], Value::Null);
    assert_eq!(answer["FailedNodes"], json!({}));
    assert_eq!(answer["FailedAndUnresolvableNodes"], json!({}));
    assert_eq!(answer["Error"], "");
}

#[tokio::test]
async fn filter_cache_mode_rejects_full_and_unknown_nodes_with_node_independent_reasons() {
    let harness = Harness::new(true);
    let mut body = with_gpu_limit(fixture("filter-cache.json"), "nvidia.com/gpu", "3");
    body["NodeNames"] = json!(["gpu-a", "gpu-b", "not-a-node"]);
    let answer = harness.post_json("filter", &body).await;
    assert_eq!(answer["NodeNames"], json!([]));
    assert_eq!(
        answer["FailedAndUnresolvableNodes"]["gpu-a"],
        "node has fewer GPUs than requested"
    );
    assert_eq!(
        answer["FailedAndUnresolvableNodes"]["gpu-b"],
        "node has fewer GPUs than requested"
    );
    assert_eq!(
        answer["FailedNodes"]["not-a-node"],
        "node not yet known to the GPU extender"
    );

    // Fill gpu-a, then a 2-GPU pod is "full right now" there: resolvable.
    let two = with_gpu_limit(fixture("filter-cache.json"), "nvidia.com/gpu", "2");
    {
        let mut table = harness.writer.write();
        let pod = translate::pod_request(
            &serde_json::from_value(two["Pod"].clone()).unwrap(),
            &Config::default(),
        )
        .unwrap()
        .unwrap();
        let node = table.node_by_str("gpu-a").unwrap().clone();
        let placed = gpu_engine::fit(&node, &pod, &harness.state.policy.load()).unwrap();
        table.apply(Change::PodBound {
            pod: gpu_engine::PodKey::new("ml", "busy"),
            allocation: placed,
        });
    }
    let answer = harness.post_json("filter", &two).await;
    assert_eq!(answer["NodeNames"], json!(["gpu-b"]));
    assert_eq!(answer["FailedNodes"]["gpu-a"], "not enough free whole GPUs");
}

#[tokio::test]
async fn filter_best_only_answers_the_policys_one_node_and_reasons_only_when_none_fits() {
    let harness = Harness::new(true);
    harness.state.policy.store(gpu_engine::Policy {
        filter_best_only: true,
        ..(*harness.state.policy.load()).clone()
    });
    // Fits both recorded nodes: one name, and no reasons for kube-scheduler to decode.
    let mut one = with_gpu_limit(fixture("filter-cache.json"), "nvidia.com/gpu", "1");
    one["NodeNames"] = json!(["gpu-a", "gpu-b", "not-a-node"]);
    let answer = harness.post_json("filter", &one).await;
    let names = answer["NodeNames"].as_array().unwrap();
    assert_eq!(names.len(), 1, "{answer}");
    assert!(names[0] == "gpu-a" || names[0] == "gpu-b", "{answer}");
    assert_eq!(answer["FailedNodes"], json!({}));
    assert_eq!(answer["FailedAndUnresolvableNodes"], json!({}));
    // The same choice whatever the candidates' order.
    one["NodeNames"] = json!(["not-a-node", "gpu-b", "gpu-a"]);
    assert_eq!(
        harness.post_json("filter", &one).await["NodeNames"],
        json!(names)
    );

    // Fits nowhere: every reason, as without narrowing (events and preemption read them).
    let mut three = with_gpu_limit(fixture("filter-cache.json"), "nvidia.com/gpu", "3");
    three["NodeNames"] = json!(["gpu-a", "gpu-b"]);
    let answer = harness.post_json("filter", &three).await;
    assert_eq!(answer["NodeNames"], json!([]));
    assert_eq!(
        answer["FailedAndUnresolvableNodes"]["gpu-a"],
        "node has fewer GPUs than requested"
    );

    // A pod that asks for no GPU is placed by its CPU and memory: one node as well.
    let mut cpu_only = fixture("filter-cache.json");
    cpu_only["Pod"]["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "1"}});
    cpu_only["Pod"]["spec"]["initContainers"] = Value::Null;
    cpu_only["NodeNames"] = json!(["gpu-a", "gpu-b"]);
    let answer = harness.post_json("filter", &cpu_only).await;
    assert_eq!(answer["NodeNames"].as_array().unwrap().len(), 1, "{answer}");
}

#[tokio::test]
async fn filter_holds_a_gpu_nodes_host_for_its_free_gpus_when_asked() {
    use gpu_engine::model::{CpuMilli, MemMiB};
    use gpu_engine::policy::fgd_plus::Tuning;
    use gpu_engine::{Policy, ScoringPolicy, TypicalPod, TypicalPods};
    let harness = Harness::new(true);
    // The typical pod asks 4 cores per GPU: each recorded node's 8 cores feed its 2 GPUs exactly.
    let typical = TypicalPods::new(vec![TypicalPod {
        cpu: CpuMilli(4000),
        memory: MemMiB(0),
        gpus: 1,
        milli: 1000,
        models: Vec::new(),
        weight: 1.0,
    }]);
    let placing_every_pod = |hold_host| Policy {
        filter_best_only: true,
        fgd_plus: Tuning {
            hold_host,
            ..Tuning::default()
        },
        ..Policy::scoring(ScoringPolicy::FgdPlus).with_typical(typical.clone())
    };
    let mut cpu_only = fixture("filter-cache.json");
    cpu_only["Pod"]["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "1"}});
    cpu_only["Pod"]["spec"]["initContainers"] = Value::Null;
    cpu_only["NodeNames"] = json!(["gpu-a", "gpu-b"]);
    harness.state.policy.store(placing_every_pod(false));
    let answer = harness.post_json("filter", &cpu_only).await;
    assert_eq!(answer["NodeNames"].as_array().unwrap().len(), 1, "{answer}");
    harness.state.policy.store(placing_every_pod(true));
    let answer = harness.post_json("filter", &cpu_only).await;
    assert_eq!(answer["NodeNames"], json!([]), "{answer}");
    for node in ["gpu-a", "gpu-b"] {
        // Resolvable: the node takes the pod once its GPUs are in use.
        assert_eq!(
            answer["FailedNodes"][node], "node CPU and memory are held for its free GPUs",
            "{answer}"
        );
    }
    // A GPU pod is never held.
    let mut gpu_pod = with_gpu_limit(fixture("filter-cache.json"), "nvidia.com/gpu", "1");
    gpu_pod["NodeNames"] = json!(["gpu-a", "gpu-b"]);
    let answer = harness.post_json("filter", &gpu_pod).await;
    assert_eq!(answer["NodeNames"].as_array().unwrap().len(), 1, "{answer}");
}

#[tokio::test]
async fn filter_non_cache_mode_returns_the_objects_it_was_given() {
    let harness = Harness::new(false); // stateless: works before the table is synced
    let body = fixture("filter-nocache.json");
    let answer = harness.post_json("filter", &body).await;
    assert_eq!(answer["NodeNames"], Value::Null);
    assert_eq!(
        answer["Nodes"]["items"], body["Nodes"]["items"],
        "objects come back unchanged"
    );

    let too_big = with_gpu_limit(body, "nvidia.com/gpu", "4");
    let answer = harness.post_json("filter", &too_big).await;
    assert_eq!(answer["Nodes"]["items"], json!([]));
    assert_eq!(
        answer["FailedAndUnresolvableNodes"]
            .as_object()
            .unwrap()
            .len(),
        2
    );
}

/// Found by the `extender_filter` fuzz target: a node object that does not decode (here a
/// malformed timestamp) is rejected under its own name, never under an empty one.
#[tokio::test]
async fn filter_non_cache_mode_names_an_unreadable_node_object() {
    let harness = Harness::new(false);
    let mut body = fixture("filter-nocache.json");
    let name = body["Nodes"]["items"][0]["metadata"]["name"].clone();
    body["Nodes"]["items"][0]["metadata"]["creationTimestamp"] = json!("2026-11-:2T00:00:00Z");
    let answer = harness.post_json("filter", &body).await;
    let unresolvable = answer["FailedAndUnresolvableNodes"].as_object().unwrap();
    let reason = unresolvable[name.as_str().unwrap()].as_str().unwrap();
    assert!(reason.contains("unreadable"), "{reason}");
    assert!(!unresolvable.contains_key(""), "{answer}");
    let passed: Vec<&Value> = answer["Nodes"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| &item["metadata"]["name"])
        .collect();
    assert!(
        !passed.contains(&&name),
        "an unreadable node passed: {answer}"
    );
}

/// Found by the `extender_filter` fuzz target: two node objects without a name (one passing,
/// one failing) made the empty name both passed and failed. Nameless and repeated names are
/// refused as unresolvable, and none of their objects is passed.
#[tokio::test]
async fn filter_non_cache_mode_refuses_nameless_and_repeated_node_objects() {
    let harness = Harness::new(false);
    let mut body = fixture("filter-nocache.json");
    let items = body["Nodes"]["items"].as_array().unwrap().clone();
    let first = items[0].clone();
    let name = first["metadata"]["name"].as_str().unwrap().to_owned();
    let mut nameless = first.clone();
    nameless["metadata"].as_object_mut().unwrap().remove("name");
    let mut all = items.clone();
    all.push(first.clone());
    all.push(nameless.clone());
    all.push(nameless);
    body["Nodes"]["items"] = Value::Array(all);
    let answer = harness.post_json("filter", &body).await;
    let unresolvable = answer["FailedAndUnresolvableNodes"].as_object().unwrap();
    let passed: Vec<&str> = answer["Nodes"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|item| item["metadata"]["name"].as_str())
        .collect();
    assert!(
        unresolvable[""]
            .as_str()
            .unwrap()
            .contains("no metadata.name"),
        "{answer}"
    );
    assert!(
        unresolvable[name.as_str()]
            .as_str()
            .unwrap()
            .contains("more than once"),
        "{answer}"
    );
    assert!(!passed.contains(&name.as_str()), "{answer}");
    assert_eq!(
        answer["Nodes"]["items"].as_array().unwrap().len(),
        passed.len(),
        "a nameless object passed: {answer}"
    );
    for other in &items[1..] {
        let other = other["metadata"]["name"].as_str().unwrap();
        assert!(
            passed.contains(&other) || answer["FailedNodes"].get(other).is_some(),
            "{other} lost its own verdict: {answer}"
        );
    }
}

#[tokio::test]
async fn filter_rejects_a_malformed_gpu_request_on_every_node_with_its_reason() {
    let harness = Harness::new(true);
    let body = with_gpu_limit(fixture("filter-cache.json"), "nvidia.com/gpu", "500m");
    let answer = harness.post_json("filter", &body).await;
    assert_eq!(
        answer["Error"], "",
        "a bad request is unschedulable, not a scheduler error"
    );
    let reasons = answer["FailedAndUnresolvableNodes"].as_object().unwrap();
    assert_eq!(reasons.len(), 2);
    let reason = reasons["gpu-a"].as_str().unwrap();
    assert!(
        reason.contains("nvidia.com/gpu"),
        "reason names the resource: {reason}"
    );
    assert!(
        harness
            .state
            .metrics
            .render()
            .unwrap()
            .contains("gpu_extender_invalid_requests_total 1")
    );
}

#[tokio::test]
async fn pods_without_gpus_pass_every_node_and_get_no_preference() {
    let harness = Harness::new(true);
    let mut body = fixture("filter-cache.json");
    body["Pod"]["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "1"}});
    body["Pod"]["spec"]["initContainers"] = Value::Null;
    let answer = harness.post_json("filter", &body).await;
    assert_eq!(answer["NodeNames"], json!(["gpu-a", "gpu-b"]));
    // No preference is an empty answer: kube-scheduler counts every host left out as 0.
    let scores = harness.post_json("prioritize", &body).await;
    assert_eq!(scores, json!([]));
}

#[tokio::test]
async fn filter_is_an_error_until_the_table_is_synced() {
    let harness = Harness::new(false);
    let answer = harness
        .post_json("filter", &fixture("filter-cache.json"))
        .await;
    assert!(answer["Error"].as_str().unwrap().contains("not ready"));
    let synced = Harness::new(true);
    let answer = synced
        .post_json("filter", &fixture("filter-cache.json"))
        .await;
    assert_eq!(answer["Error"], "");
}

#[tokio::test]
async fn prioritize_answers_a_bare_array_in_both_modes() {
    let harness = Harness::new(true);
    for name in ["prioritize-cache.json", "prioritize-nocache.json"] {
        let answer = harness.post_json("prioritize", &fixture(name)).await;
        let list = answer.as_array().unwrap();
        assert!(!list.is_empty(), "{name}: {answer}");
        for entry in list {
            let score = entry["Score"].as_i64().unwrap();
            assert!((1..=10).contains(&score));
            assert!(entry["Host"].as_str().unwrap().starts_with("gpu-"));
        }
    }
}

#[tokio::test]
async fn prioritize_leaves_out_the_hosts_it_scores_zero() {
    let harness = Harness::new(true);
    let mut body = fixture("prioritize-cache.json");
    // A node the table does not know cannot take the pod: it scores 0 and is left out, as
    // kube-scheduler counts a host missing from the answer as 0.
    body["NodeNames"] = json!(["gpu-a", "ghost", "gpu-b"]);
    let answer = harness.post_json("prioritize", &body).await;
    let hosts: Vec<&str> = answer
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["Host"].as_str().unwrap())
        .collect();
    assert_eq!(hosts, ["gpu-a", "gpu-b"], "{answer}");
}

#[tokio::test]
async fn bind_without_a_binder_answers_an_error_field() {
    let harness = Harness::new(true);
    let answer = harness.post_json("bind", &fixture("bind.json")).await;
    assert!(answer["Error"].as_str().unwrap().contains("no binder"));
}

#[tokio::test]
async fn preempt_always_answers_meta_victims() {
    let harness = Harness::new(true);
    for name in ["preempt-cache.json", "preempt-nocache.json"] {
        let answer = harness.post_json("preempt", &fixture(name)).await;
        let map = answer["NodeNameToMetaVictims"].as_object().unwrap();
        assert!(!map.is_empty(), "{name}");
        for victims in map.values() {
            assert!(
                victims["Pods"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|p| p["UID"].is_string())
            );
        }
    }
}

#[tokio::test]
async fn nulls_are_accepted_in_every_optional_field() {
    let harness = Harness::new(true);
    let answer = harness
        .post_json(
            "filter",
            &json!({"Pod": null, "Nodes": null, "NodeNames": null}),
        )
        .await;
    assert_eq!(answer["Error"], "filter request has no Pod");
    let scores = harness
        .post_json(
            "prioritize",
            &json!({"Pod": null, "Nodes": null, "NodeNames": null}),
        )
        .await;
    assert_eq!(scores, json!([]));
    let answer = harness
        .post_json(
            "preempt",
            &json!({"Pod": null, "NodeNameToVictims": null, "NodeNameToMetaVictims": null}),
        )
        .await;
    assert_eq!(answer, json!({"NodeNameToMetaVictims": {}}));
    let answer = harness
        .post_json(
            "bind",
            &json!({"PodName": null, "PodNamespace": null, "PodUID": null, "Node": null}),
        )
        .await;
    assert!(answer["Error"].is_string());
}

#[tokio::test]
async fn malformed_and_oversized_bodies_get_clear_http_errors() {
    let harness = Harness::new(true);
    for verb in ["filter", "prioritize", "bind", "preempt"] {
        let (status, body) = harness.post(verb, "{not json").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{verb}");
        let message = String::from_utf8_lossy(&body);
        assert!(
            message.contains(&format!("cannot decode {verb} request body")),
            "{message}"
        );
    }
    let (status, _) = harness.post("filter", r#"{"Pod": 7}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let huge = format!(
        r#"{{"Pod":null,"NodeNames":["{}"]}}"#,
        "x".repeat(2 * 1024 * 1024)
    );
    let (status, _) = harness.post("filter", huge).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    // Nothing above changed the table.
    assert!(harness.state.cluster.read().check_invariants().is_ok());
    assert_eq!(harness.state.cluster.read().pod_count(), 0);
}

#[tokio::test]
async fn admin_surface_reports_health_readiness_metrics_and_inspection() {
    let harness = Harness::new(false);
    assert_eq!(harness.admin("/healthz").await.0, StatusCode::OK);
    assert_eq!(
        harness.admin("/readyz").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let harness = Harness::new(true);
    assert_eq!(harness.admin("/readyz").await.0, StatusCode::OK);

    harness
        .post_json("filter", &fixture("filter-cache.json"))
        .await;
    let (status, text) = harness.admin("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        text.contains(r#"gpu_extender_requests_total{outcome="ok",verb="filter"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"gpu_extender_filter_nodes_total{verdict="passed"} 2"#));
    assert!(text.contains("gpu_extender_table_nodes 2"));

    let (status, text) = harness.admin("/inspect").await;
    assert_eq!(status, StatusCode::OK);
    let report: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(report["totals"]["gpus"], 4);
    assert_eq!(report["nodes"][0]["name"], "gpu-a");

    // The answers that read the whole table are built off the runtime's workers, and typed as
    // before.
    for (path, kind) in [
        ("/inspect", "application/json"),
        ("/ui/data", "application/json"),
        ("/metrics", "text/plain; version=0.0.4; charset=utf-8"),
    ] {
        let response = admin_router(harness.state.clone())
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        assert_eq!(response.headers()["content-type"], kind, "{path}");
    }
}

/// A binder that holds its bind until the test lets it go, saying when it has started.
struct HeldBinder {
    started: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

impl gpu_extender::state::Bind for HeldBinder {
    fn bind(
        &self,
        _request: gpu_extender::state::BindRequest,
    ) -> futures::future::BoxFuture<
        '_,
        Result<gpu_extender::state::BindOutcome, gpu_extender::state::BindError>,
    > {
        Box::pin(async move {
            self.started.notify_one();
            self.release.notified().await;
            Ok(gpu_extender::state::BindOutcome::AlreadyBound)
        })
    }
}

/// Over the concurrency limit, a request that cannot get a turn within the budget is answered
/// 503 with the reason (and counted), instead of waiting on; once a turn frees, requests are
/// served again. The limit is 1 and the only turn is held by a bind the test controls, so the
/// outcome does not depend on timing.
#[tokio::test]
async fn over_the_concurrency_limit_a_request_is_shed_with_503_not_queued_forever() {
    let config = Arc::new(Config::default());
    let binder = Arc::new(HeldBinder {
        started: tokio::sync::Notify::new(),
        release: tokio::sync::Notify::new(),
    });
    let cluster = ClusterState::with_table(Table::rebuild(20, recorded_nodes(&config), []));
    let state = AppState::new(Arc::new(cluster), config, Metrics::new().unwrap())
        .with_binder(binder.clone())
        .with_body_limit(1024 * 1024);
    let extender = gpu_extender::http::server::guarded_router(
        state.clone(),
        "/scheduler",
        1,
        std::time::Duration::from_millis(50),
    );
    let call = |verb: &str, body: String| {
        Request::post(format!("/scheduler/{verb}"))
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap()
    };
    let bind = json!({"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "gpu-a"});
    let held = tokio::spawn(extender.clone().oneshot(call("bind", bind.to_string())));
    binder.started.notified().await;

    let filter = fixture("filter-cache.json").to_string();
    let shed = extender
        .clone()
        .oneshot(call("filter", filter.clone()))
        .await
        .unwrap();
    assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    let message = shed.into_body().collect().await.unwrap().to_bytes();
    let message = String::from_utf8_lossy(&message);
    assert!(
        message.contains("limits.maxConcurrentRequests"),
        "{message}"
    );
    assert!(
        state
            .metrics
            .render()
            .unwrap()
            .contains("gpu_extender_requests_shed_total 1")
    );

    binder.release.notify_one();
    assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);
    let served = extender.oneshot(call("filter", filter)).await.unwrap();
    assert_eq!(served.status(), StatusCode::OK);
}

/// Issue 15: a pod as HAMi's users write it (`nvidia.com/gpu` with `nvidia.com/gpumem` in MiB
/// and `nvidia.com/gpucores` in one container), under the HAMi configuration of
/// docs/configuration.md, passes filter on a node with two 15 GiB cards and is refused, with the
/// per-GPU memory reason, on a node whose cards are too small for 3000 MiB twice over.
#[tokio::test]
async fn filter_takes_a_hami_pod_under_the_documented_hami_configuration() {
    let mut config = Config::default();
    config.resources.gpu_mem = "nvidia.com/gpumem".into();
    config.resources.gpu_core = "nvidia.com/gpucores".into();
    config.resources.gpu_core_percent_step = 1;
    config.resources.sharing = gpu_extender::config::Sharing::Hami;
    config.validate().unwrap();
    let node = |name: &str, mib: u32| {
        let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {
                "ack.node.gpu.schedule": "core_mem", "nvidia.com/gpu.product": "Tesla-T4",
                "nvidia.com/gpu.memory": mib.to_string(), "nvidia.com/gpu.count": "2"}},
            "status": {"allocatable": {"nvidia.com/gpu": "20"}}
        }))
        .unwrap();
        translate::node_spec(&node, &config).unwrap()
    };
    let table = Table::rebuild(20, [node("t4", 15360), node("tiny", 2048)], []);
    let harness = Harness::with_writer(
        Arc::new(config),
        TableWriter::new(ClusterState::with_table(table)),
    );
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-pod", "namespace": "default", "uid": "u-1"},
        "spec": {"containers": [{
            "name": "ubuntu-container",
            "image": "ubuntu:18.04",
            "command": ["bash", "-c", "sleep 86400"],
            "resources": {"limits": {
                "nvidia.com/gpu": 2,
                "nvidia.com/gpumem": 3000,
                "nvidia.com/gpucores": 33
            }}
        }]}
    });
    let answer = harness
        .post_json("filter", &json!({"Pod": pod, "NodeNames": ["t4", "tiny"]}))
        .await;
    assert_eq!(answer["NodeNames"], json!(["t4"]), "{answer}");
    assert_eq!(
        answer["FailedAndUnresolvableNodes"]["tiny"],
        "node GPUs have too little memory for the request",
        "{answer}"
    );
    assert_eq!(answer["Error"], json!(""), "{answer}");
}
