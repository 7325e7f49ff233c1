//! The Karmada scheduler-estimator service (`gpu_extender::estimator`) called without a socket:
//! answers from the table (per-GPU fit, node claims, pods already there), bad requests answered
//! with a gRPC code and a reason, never a panic (also for arbitrary bytes and random well-formed
//! requests), and calls past `estimator.maxConcurrentRequests` refused at once.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a panic is a test failure with its location"
)]

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use gpu_engine::{
    ContainerAllocation, CpuMilli, GpuGrant, GpuIndex, GpuMode, Grant, MemMiB, NodeName, NodeSpec,
    PodAllocation, PodKey, Table,
};
use gpu_extender::config::Config;
use gpu_extender::estimator::proto::service::estimator_server::Estimator;
use gpu_extender::estimator::proto::{core, pb, resource};
use gpu_extender::estimator::{EstimatorService, WorkloadError, Workloads};
use gpu_extender::state::{ClusterState, PolicyCell};
use gpu_extender::telemetry::Metrics;
use k8s_openapi::api::core::v1::{Node, NodeSpec as KubeNodeSpec, NodeStatus, Pod, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use proptest::prelude::*;
use prost::Message as _;
use serde_json::json;
use tonic::{Code, Request};

const GPU_MEM: &str = "aliyun.com/gpu-mem";
const WHOLE: &str = "nvidia.com/gpu";

/// A share node of `gpus` 16 GiB T4s.
fn t4(name: &str, gpus: u16) -> NodeSpec {
    NodeSpec::uniform(name, GpuMode::ShareMemory, gpus, "T4", MemMiB(16_384)).with_host(
        CpuMilli(32_000),
        MemMiB(128 * 1024),
        110,
    )
}

/// What the watch keeps of a node: its labels, taints and GPU allocatable.
fn node_object(name: &str, labels: &[(&str, &str)], taint: Option<&str>, gpus: u16) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(KubeNodeSpec {
            taints: taint.map(|key| {
                vec![Taint {
                    key: key.to_owned(),
                    effect: "NoSchedule".to_owned(),
                    ..Taint::default()
                }]
            }),
            ..KubeNodeSpec::default()
        }),
        status: Some(NodeStatus {
            allocatable: Some(BTreeMap::from([(
                GPU_MEM.to_owned(),
                Quantity((u32::from(gpus) * 16).to_string()),
            )])),
            ..NodeStatus::default()
        }),
    }
}

/// Three 4-GPU T4 nodes: `a` (zone=x), `b` (zone=y), `c` (zone=x, tainted dedicated=ml). `a`
/// already runs a pod holding 8 GiB of its GPU 0.
fn service(cfg: Config) -> EstimatorService {
    let mut table = Table::new(cfg.policy.max_pods_per_shared_gpu);
    for name in ["a", "b", "c"] {
        table.apply(gpu_engine::Change::UpsertNode(t4(name, 4)));
    }
    let running = PodAllocation {
        node: NodeName::new("a"),
        cpu: CpuMilli(0),
        memory: MemMiB(0),
        containers: vec![ContainerAllocation {
            name: "main".into(),
            gpus: vec![GpuGrant {
                gpu: GpuIndex(0),
                grant: Grant::Share {
                    mem: MemMiB(8 * 1024),
                    compute: gpu_engine::ComputeMilli(0),
                },
            }],
        }],
        init_containers: Vec::new(),
        mig: Vec::new(),
    };
    table
        .reserve(PodKey::new("ml", "running"), running, u64::MAX)
        .unwrap();
    let cluster = Arc::new(ClusterState::with_table(table));
    cluster.note_node_claims(
        NodeName::new("a"),
        &node_object("a", &[("zone", "x")], None, 4),
    );
    cluster.note_node_claims(
        NodeName::new("b"),
        &node_object("b", &[("zone", "y")], None, 4),
    );
    cluster.note_node_claims(
        NodeName::new("c"),
        &node_object("c", &[("zone", "x")], Some("dedicated"), 4),
    );
    let policy = PolicyCell::from(Arc::new(cfg.engine_policy()));
    EstimatorService::new(cluster, policy, Arc::new(cfg), Metrics::new().unwrap())
}

fn quantity(text: &str) -> Vec<u8> {
    resource::Quantity {
        string: Some(text.to_owned()),
    }
    .encode_to_vec()
}

fn request(
    resources: &[(&str, &str)],
    claim: Option<pb::NodeClaim>,
) -> pb::MaxAvailableReplicasRequest {
    pb::MaxAvailableReplicasRequest {
        cluster: "member".into(),
        replica_requirements: Some(pb::ReplicaRequirements {
            node_claim: claim,
            namespace: "ml".into(),
            resource_request_bytes: resources
                .iter()
                .map(|(name, amount)| ((*name).to_owned(), quantity(amount)))
                .collect(),
            ..pb::ReplicaRequirements::default()
        }),
        ..pb::MaxAvailableReplicasRequest::default()
    }
}

fn estimate(
    service: &EstimatorService,
    request: &pb::MaxAvailableReplicasRequest,
) -> Result<u64, (Code, String)> {
    service
        .max_available_replicas(request)
        .map_err(|status| (status.code(), status.message().to_owned()))
}

fn toleration(key: &str) -> Vec<u8> {
    core::Toleration {
        key: Some(key.into()),
        operator: Some("Exists".into()),
        ..core::Toleration::default()
    }
    .encode_to_vec()
}

#[test]
fn a_share_template_counts_per_gpu_and_honours_the_pod_already_there() {
    let service = service(Config::default());
    // 10 GiB: one per 16 GiB GPU, none beside the 8 GiB pod on a's GPU 0; the tainted node c
    // is not for this template. By summed GPU memory, a and b would hold (56 + 64) / 10 = 12.
    let answer = estimate(&service, &request(&[(GPU_MEM, "10"), ("cpu", "1")], None)).unwrap();
    assert_eq!(answer, 3 + 4);
    // 8 GiB: two per GPU, one more beside the running pod.
    assert_eq!(
        estimate(&service, &request(&[(GPU_MEM, "8")], None)).unwrap(),
        7 + 8
    );
}

#[test]
fn node_claims_select_and_tolerate_as_kube_scheduler_does() {
    let service = service(Config::default());
    let claim = |selector: &[(&str, &str)],
                 tolerate: Option<&str>,
                 affinity: Option<core::NodeSelector>| pb::NodeClaim {
        node_selector: selector
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        tolerations_bytes: tolerate.map(toleration).into_iter().collect(),
        node_affinity_bytes: affinity.map(|a| a.encode_to_vec()).unwrap_or_default(),
        ..pb::NodeClaim::default()
    };
    let ask = [(GPU_MEM, "10")];
    // zone=x: a only (c is tainted).
    let zone_x = request(&ask, Some(claim(&[("zone", "x")], None, None)));
    assert_eq!(estimate(&service, &zone_x).unwrap(), 3);
    // Tolerating the taint adds c.
    let tolerant = request(&ask, Some(claim(&[("zone", "x")], Some("dedicated"), None)));
    assert_eq!(estimate(&service, &tolerant).unwrap(), 3 + 4);
    // Required affinity zone NotIn [x]: b only.
    let not_x = core::NodeSelector {
        node_selector_terms: vec![core::NodeSelectorTerm {
            match_expressions: vec![core::NodeSelectorRequirement {
                key: Some("zone".into()),
                operator: Some("NotIn".into()),
                values: vec!["x".into()],
            }],
            match_fields: Vec::new(),
        }],
    };
    let affinity = request(&ask, Some(claim(&[], Some("dedicated"), Some(not_x))));
    assert_eq!(estimate(&service, &affinity).unwrap(), 4);
}

#[test]
fn whole_gpus_on_share_nodes_and_host_only_templates_are_counted_by_the_engine() {
    let service = service(Config::default());
    // Share nodes serve no whole GPUs.
    assert_eq!(
        estimate(&service, &request(&[(WHOLE, "1")], None)).unwrap(),
        0
    );
    // CPU only: 32 cores a node, c tainted.
    assert_eq!(
        estimate(&service, &request(&[("cpu", "4")], None)).unwrap(),
        2 * 8
    );
}

#[test]
fn bad_requests_get_invalid_argument_with_a_reason() {
    let service = service(Config::default());
    let cases: Vec<(pb::MaxAvailableReplicasRequest, &str)> = vec![
        (
            request(&[("example.com/fpga", "1")], None),
            "example.com/fpga",
        ),
        (request(&[(GPU_MEM, "-3")], None), "negative"),
        (
            request(&[("cpu", "lots")], None),
            "not a Kubernetes quantity",
        ),
        (request(&[(GPU_MEM, "1.5")], None), "whole number"),
        (
            pb::MaxAvailableReplicasRequest {
                cluster: "member".into(),
                ..pb::MaxAvailableReplicasRequest::default()
            },
            "replicaRequirements",
        ),
        (
            request(
                &[(GPU_MEM, "1")],
                Some(pb::NodeClaim {
                    node_affinity_bytes: vec![0xff, 0xff, 0xff],
                    ..pb::NodeClaim::default()
                }),
            ),
            "nodeAffinityBytes",
        ),
        (
            request(
                &[(GPU_MEM, "1")],
                Some(pb::NodeClaim {
                    node_affinity_bytes: core::NodeSelector {
                        node_selector_terms: vec![core::NodeSelectorTerm {
                            match_expressions: vec![core::NodeSelectorRequirement {
                                key: Some("zone".into()),
                                operator: Some("Near".into()),
                                values: Vec::new(),
                            }],
                            match_fields: Vec::new(),
                        }],
                    }
                    .encode_to_vec(),
                    ..pb::NodeClaim::default()
                }),
            ),
            "operator \"Near\"",
        ),
        (
            request(
                &[(GPU_MEM, "1")],
                Some(pb::NodeClaim {
                    tolerations_bytes: vec![
                        core::Toleration {
                            operator: Some("Equal".into()),
                            value: Some("v".into()),
                            ..core::Toleration::default()
                        }
                        .encode_to_vec(),
                    ],
                    ..pb::NodeClaim::default()
                }),
            ),
            "empty key",
        ),
    ];
    for (request, reason) in cases {
        let (code, message) = estimate(&service, &request).unwrap_err();
        assert_eq!(code, Code::InvalidArgument, "{message}");
        assert!(
            message.contains(reason),
            "{message:?} should name {reason:?}"
        );
    }
}

#[test]
fn another_clusters_request_and_assumed_workloads_are_refused() {
    let mut cfg = Config::default();
    cfg.estimator.cluster = "member".into();
    let service = service(cfg);
    let mut other = request(&[(GPU_MEM, "1")], None);
    other.cluster = "elsewhere".into();
    assert_eq!(
        estimate(&service, &other).unwrap_err().0,
        Code::InvalidArgument
    );
    let mut assumed = request(&[(GPU_MEM, "1")], None);
    assumed
        .assumed_workloads
        .push(pb::AssumedWorkload::default());
    assert_eq!(
        estimate(&service, &assumed).unwrap_err().0,
        Code::Unimplemented
    );
}

#[test]
fn a_table_not_yet_synced_answers_unavailable() {
    let cfg = Config::default();
    let cluster = Arc::new(ClusterState::new(cfg.policy.max_pods_per_shared_gpu));
    let policy = PolicyCell::from(Arc::new(cfg.engine_policy()));
    let service = EstimatorService::new(cluster, policy, Arc::new(cfg), Metrics::new().unwrap());
    let (code, _) = estimate(&service, &request(&[(GPU_MEM, "1")], None)).unwrap_err();
    assert_eq!(code, Code::Unavailable);
}

/// A fake API server knowing one Deployment, `ml/train`, whose current ReplicaSet is `rs-new`.
struct OneDeployment;

impl Workloads for OneDeployment {
    fn current_replica_set<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, WorkloadError>> {
        let answer = match (namespace, name) {
            ("ml", "train") => Ok(Some("rs-new".to_owned())),
            ("ml", "rolling") => Ok(None),
            ("ml", "broken") => Err(WorkloadError::Api {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                problem: "connection refused".to_owned(),
            }),
            _ => Err(WorkloadError::NotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            }),
        };
        Box::pin(async move { answer })
    }
}

/// A pending GPU pod as the watch keeps it: its controller and, when `unschedulable_since` is
/// given, kube-scheduler's Unschedulable verdict from then.
fn waiting_pod(name: &str, owner: &str, unschedulable_since: Option<&str>, bound: bool) -> Pod {
    let mut pod = json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                          "name": owner, "uid": owner, "controller": true}]},
        "spec": {"containers": [{"name": "main",
                                 "resources": {"limits": {GPU_MEM: "10"}}}]},
        "status": {"phase": "Pending"}
    });
    if let Some(since) = unschedulable_since {
        pod["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "False",
            "reason": "Unschedulable", "lastTransitionTime": since}]);
    }
    if bound {
        pod["spec"]["nodeName"] = json!("a");
    }
    serde_json::from_value(pod).unwrap()
}

fn unschedulable_request(
    kind: &str,
    name: &str,
    threshold_s: i64,
) -> pb::UnschedulableReplicasRequest {
    pb::UnschedulableReplicasRequest {
        cluster: "member".into(),
        resource: Some(pb::ObjectReference {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            namespace: "ml".into(),
            name: name.into(),
        }),
        unschedulable_threshold: threshold_s * 1_000_000_000,
    }
}

#[tokio::test]
async fn unschedulable_replicas_are_the_current_replica_sets_pods_waiting_past_the_threshold() {
    let cfg = Config::default();
    let cluster = Arc::new(ClusterState::with_table(Table::new(
        cfg.policy.max_pods_per_shared_gpu,
    )));
    let pods = [
        // Of the current ReplicaSet: waiting 10 min, 2 min, and not (yet) tried.
        waiting_pod("w10", "rs-new", Some("2026-11-24T11:50:00Z"), false),
        waiting_pod("w2", "rs-new", Some("2026-11-24T11:58:00Z"), false),
        waiting_pod("fresh", "rs-new", None, false),
        // Of the old ReplicaSet, and of another workload: not counted.
        waiting_pod("old", "rs-old", Some("2026-11-24T11:00:00Z"), false),
        waiting_pod("other", "rs-other", Some("2026-11-24T11:00:00Z"), false),
    ];
    for pod in pods {
        let key = PodKey::new("ml", pod.metadata.name.as_deref().unwrap());
        let uid = pod.metadata.uid.clone().unwrap();
        cluster.note_gpu_pod(key, &uid, Some(Arc::new(pod)));
    }
    let policy = PolicyCell::from(Arc::new(cfg.engine_policy()));
    let service = EstimatorService::new(
        Arc::clone(&cluster),
        policy.clone(),
        Arc::new(cfg.clone()),
        Metrics::new().unwrap(),
    )
    .with_workloads(Arc::new(OneDeployment));
    let now: Timestamp = "2026-11-24T12:00:00Z".parse().unwrap();
    let count = async |request: pb::UnschedulableReplicasRequest| {
        service
            .unschedulable_replicas(&request, now)
            .await
            .map_err(|status| (status.code(), status.message().to_owned()))
    };
    // No threshold: both that kube-scheduler has refused; 5 minutes: the one waiting 10.
    assert_eq!(
        count(unschedulable_request("Deployment", "train", 0)).await,
        Ok(2)
    );
    assert_eq!(
        count(unschedulable_request("Deployment", "train", 300)).await,
        Ok(1)
    );
    assert_eq!(
        count(unschedulable_request("Deployment", "train", 3600)).await,
        Ok(0)
    );
    // A negative threshold counts as none, as Karmada's estimator reads it.
    assert_eq!(
        count(unschedulable_request("Deployment", "train", -5)).await,
        Ok(2)
    );
    // A Deployment whose new ReplicaSet is not made yet has none.
    assert_eq!(
        count(unschedulable_request("Deployment", "rolling", 0)).await,
        Ok(0)
    );

    let code = async |request| count(request).await.unwrap_err().0;
    assert_eq!(
        code(unschedulable_request("Deployment", "gone", 0)).await,
        Code::NotFound
    );
    assert_eq!(
        code(unschedulable_request("Deployment", "broken", 0)).await,
        Code::Unavailable
    );
    assert_eq!(
        code(unschedulable_request("StatefulSet", "train", 0)).await,
        Code::Unimplemented
    );
    let mut wrong_group = unschedulable_request("Deployment", "train", 0);
    if let Some(resource) = wrong_group.resource.as_mut() {
        resource.api_version = "v1".into();
    }
    assert_eq!(code(wrong_group).await, Code::InvalidArgument);
    let mut no_resource = unschedulable_request("Deployment", "train", 0);
    no_resource.resource = None;
    assert_eq!(code(no_resource).await, Code::InvalidArgument);

    // The pod bound since: no longer counted.
    let bound = waiting_pod("w10", "rs-new", Some("2026-11-24T11:50:00Z"), true);
    cluster.note_gpu_pod(PodKey::new("ml", "w10"), "uid-w10", Some(Arc::new(bound)));
    assert_eq!(
        count(unschedulable_request("Deployment", "train", 0)).await,
        Ok(1)
    );

    // Without an API client the method is not offered.
    let bare = EstimatorService::new(cluster, policy, Arc::new(cfg), Metrics::new().unwrap());
    let answer = bare
        .unschedulable_replicas(&unschedulable_request("Deployment", "train", 0), now)
        .await;
    assert_eq!(answer.unwrap_err().code(), Code::Unimplemented);
}

/// A Deployment lookup that reports it has started and then waits for a permit of `release`:
/// a `GetUnschedulableReplicas` call held in flight.
struct Held {
    inside: tokio::sync::mpsc::UnboundedSender<()>,
    release: Arc<tokio::sync::Semaphore>,
}

impl Workloads for Held {
    fn current_replica_set<'a>(
        &'a self,
        _namespace: &'a str,
        _name: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, WorkloadError>> {
        Box::pin(async move {
            self.inside.send(()).unwrap();
            let _turn = self.release.acquire().await.unwrap();
            Ok(Some("rs-new".to_owned()))
        })
    }
}

#[tokio::test]
async fn calls_past_the_cap_are_refused_at_once_and_counted() {
    let mut cfg = Config::default();
    cfg.estimator.max_concurrent_requests = 1;
    let cluster = Arc::new(ClusterState::with_table(Table::new(
        cfg.policy.max_pods_per_shared_gpu,
    )));
    let policy = PolicyCell::from(Arc::new(cfg.engine_policy()));
    let metrics = Metrics::new().unwrap();
    let (inside_tx, mut inside) = tokio::sync::mpsc::unbounded_channel();
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let held = Held {
        inside: inside_tx,
        release: Arc::clone(&release),
    };
    let service = Arc::new(
        EstimatorService::new(cluster, policy, Arc::new(cfg), metrics.clone())
            .with_workloads(Arc::new(held)),
    );
    let first = tokio::spawn({
        let service = Arc::clone(&service);
        async move {
            Estimator::get_unschedulable_replicas(
                &*service,
                Request::new(unschedulable_request("Deployment", "train", 0)),
            )
            .await
        }
    });
    inside.recv().await.unwrap();

    // The one turn is taken: every method is refused at once, saying why.
    let refused = [
        Estimator::max_available_replicas(
            &*service,
            Request::new(request(&[(GPU_MEM, "1")], None)),
        )
        .await
        .map(|_| ()),
        Estimator::max_available_component_sets(
            &*service,
            Request::new(pb::MaxAvailableComponentSetsRequest::default()),
        )
        .await
        .map(|_| ()),
        Estimator::get_unschedulable_replicas(
            &*service,
            Request::new(unschedulable_request("Deployment", "train", 0)),
        )
        .await
        .map(|_| ()),
    ];
    for answer in refused {
        let status = answer.unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(
            status.message().contains("estimator.maxConcurrentRequests"),
            "{status:?}"
        );
    }
    assert_eq!(metrics.estimator_requests_shed.get(), 3);
    let counted = |method: &str, code: &str| {
        metrics
            .estimator_requests
            .with_label_values(&[method, code])
            .get()
    };
    assert_eq!(counted("MaxAvailableReplicas", "ResourceExhausted"), 1);

    // The call in flight is answered; its turn is then free again.
    release.add_permits(1);
    let answered = first.await.unwrap().unwrap();
    assert_eq!(answered.get_ref().unschedulable_replicas, 0);
    assert_eq!(counted("GetUnschedulableReplicas", "OK"), 1);
    let after = Estimator::max_available_replicas(
        &*service,
        Request::new(request(&[(GPU_MEM, "1")], None)),
    )
    .await;
    assert!(after.is_ok(), "{after:?}");
    assert_eq!(metrics.estimator_requests_shed.get(), 3);
}

/// A resource name: mostly ones the extender knows, sometimes not.
fn resource_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "cpu", "memory", "pods", "ephemeral-storage", GPU_MEM, WHOLE,
            "aliyun.com/gpu", "aliyun.com/gpu-core.percentage",
        ])
        .prop_map(str::to_owned),
        1 => "[a-z./-]{0,12}",
    ]
}

/// A quantity: mostly well formed, sometimes huge, negative, fractional or garbage.
fn quantity_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (0u64..64).prop_map(|n| n.to_string()),
        1 => any::<i64>().prop_map(|n| n.to_string()),
        1 => "[0-9]{1,40}(m|k|Ki|Mi|Gi|Ti|Ei|e9|\\.5)?",
        1 => "[-+.0-9a-zA-Z]{0,8}",
    ]
}

fn requirement() -> impl Strategy<Value = core::NodeSelectorRequirement> {
    (
        prop::option::of("[a-z]{0,4}"),
        prop::option::of(prop::sample::select(vec![
            "In",
            "NotIn",
            "Exists",
            "DoesNotExist",
            "Gt",
            "Lt",
            "in",
            "",
        ])),
        prop::collection::vec("[-0-9a-z]{0,4}", 0..3),
    )
        .prop_map(|(key, operator, values)| core::NodeSelectorRequirement {
            key,
            operator: operator.map(str::to_owned),
            values,
        })
}

fn claim() -> impl Strategy<Value = pb::NodeClaim> {
    (
        prop::collection::btree_map("[a-z]{1,4}", "[a-z]{0,3}", 0..3),
        prop::option::of(prop::collection::vec(
            (
                prop::collection::vec(requirement(), 0..3),
                prop::collection::vec(requirement(), 0..2),
            ),
            0..3,
        )),
        prop::collection::vec(
            (
                prop::option::of("[a-z]{0,4}"),
                prop::option::of(prop::sample::select(vec!["Exists", "Equal", "Lt", ""])),
                prop::option::of("[a-z]{0,3}"),
                prop::option::of(prop::sample::select(vec![
                    "NoSchedule",
                    "NoExecute",
                    "Bad",
                    "",
                ])),
            ),
            0..3,
        ),
        prop::collection::vec(any::<u8>(), 0..4),
    )
        .prop_map(|(selector, terms, tolerations, junk)| pb::NodeClaim {
            node_selector: selector.into_iter().collect(),
            node_affinity_bytes: match terms {
                Some(terms) => core::NodeSelector {
                    node_selector_terms: terms
                        .into_iter()
                        .map(|(match_expressions, match_fields)| core::NodeSelectorTerm {
                            match_expressions,
                            match_fields,
                        })
                        .collect(),
                }
                .encode_to_vec(),
                None => junk,
            },
            tolerations_bytes: tolerations
                .into_iter()
                .map(|(key, operator, value, effect)| {
                    core::Toleration {
                        key,
                        operator: operator.map(str::to_owned),
                        value,
                        effect: effect.map(str::to_owned),
                        toleration_seconds: None,
                    }
                    .encode_to_vec()
                })
                .collect(),
            ..pb::NodeClaim::default()
        })
}

/// The codes a request may be answered with: an answer, or the client's mistake.
fn acceptable(answer: &Result<u64, (Code, String)>) -> bool {
    match answer {
        Ok(replicas) => *replicas <= i32::MAX as u64,
        Err((Code::InvalidArgument, message)) => !message.is_empty(),
        Err(_) => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Random well-formed messages with random contents: an answer or InvalidArgument with a
    /// reason, never a panic.
    #[test]
    fn random_templates_get_an_answer_or_invalid_argument(
        resources in prop::collection::vec((resource_name(), quantity_text()), 0..4),
        claim in prop::option::of(claim()),
    ) {
        let service = service(Config::default());
        let resources: Vec<(&str, &str)> =
            resources.iter().map(|(n, q)| (n.as_str(), q.as_str())).collect();
        let answer = estimate(&service, &request(&resources, claim));
        prop_assert!(acceptable(&answer), "{answer:?}");
    }

    /// Arbitrary bytes on the wire: whatever decodes as a request is answered without a panic.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let service = service(Config::default());
        if let Ok(request) = pb::MaxAvailableReplicasRequest::decode(bytes.as_slice()) {
            let answer = estimate(&service, &request);
            let refused = matches!(&answer, Err((Code::Unimplemented, _)));
            prop_assert!(acceptable(&answer) || refused, "{answer:?}");
        }
    }
}
