//! Kubernetes Events on pods for bind decisions, so `kubectl describe pod` says which GPUs a pod
//! got; for quota reclaims, on the evicted pods and the pod they were evicted for; and for
//! allocation records the watch refused, on the pod that carries one. Published in the
//! background: an event is a courtesy, and a failure to publish one (no RBAC, a busy API
//! server) must never fail or delay the bind or eviction that caused it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use tracing::warn;

use super::lease::Writer;
use crate::explain::describe_allocation;
use crate::inspect::RejectedRecord;
use crate::state::{BindRequest, ClusterState};
use crate::telemetry::Metrics;
use gpu_engine::{NodeName, PodAllocation, PodKey};

/// The `reason` of the event on a pod whose allocation record the watch refused.
pub const RECORD_REJECTED_REASON: &str = "AllocationRecordRejected";

/// How often refused records are looked for to tell.
const REJECTED_INTERVAL: Duration = Duration::from_secs(2);

/// The `reason` of the event recorded after a bind.
pub const BOUND_REASON: &str = "GpusAllocated";

/// The `reason` of the events recorded when a quota reclaims GPUs.
pub const RECLAIM_REASON: &str = "GpuQuotaReclaim";

/// Receives quota reclaims worth an event.
pub trait ReclaimEvents: Send + Sync + 'static {
    /// `victim` was evicted from `node` for `beneficiary`. Returns at once.
    fn evicted(&self, victim: &PodKey, beneficiary: &PodKey, node: &NodeName);
    /// `victims` were evicted from `node` for `beneficiary`. Returns at once.
    fn reclaimed(&self, beneficiary: &PodKey, victims: &[PodKey], node: &NodeName);
}

/// Receives bind decisions worth an event.
pub trait BindEvents: Send + Sync + 'static {
    /// `request`'s pod was bound with `allocation`. Returns at once.
    fn bound(&self, request: &BindRequest, allocation: &PodAllocation);
}

/// Events through kube-runtime's recorder (`events.k8s.io/v1`, reporting controller
/// `gpu-extender`).
#[derive(Clone)]
pub struct KubeEvents {
    recorder: Recorder,
    metrics: Metrics,
}

impl std::fmt::Debug for KubeEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeEvents").finish_non_exhaustive()
    }
}

impl KubeEvents {
    /// A publisher counting its results in `metrics.pod_events`.
    pub fn new(client: kube::Client, metrics: Metrics) -> Self {
        Self {
            recorder: Recorder::new(client, "gpu-extender".into()),
            metrics,
        }
    }
}

/// The event note for a bind: the node and each GPU with what the pod holds on it.
pub fn bound_note(request: &BindRequest, allocation: &PodAllocation) -> String {
    format!(
        "bound to node {}: {}",
        request.node,
        describe_allocation(allocation)
    )
}

impl KubeEvents {
    /// Publishes `event` on `reference` in the background, counting the result.
    fn publish(&self, event: Event, reference: ObjectReference) {
        let recorder = self.recorder.clone();
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            let result = match recorder.publish(&event, &reference).await {
                Ok(()) => "sent",
                Err(error) => {
                    let pod = format!(
                        "{}/{}",
                        reference.namespace.unwrap_or_default(),
                        reference.name.unwrap_or_default()
                    );
                    warn!(%pod, %error, reason = %event.reason, "could not record an event on the pod");
                    "error"
                }
            };
            metrics.pod_events.with_label_values(&[result]).inc();
        });
    }
}

/// The reference an event names a pod by, from its key (no UID: the reclaimer knows pods by key).
fn pod_reference(pod: &PodKey) -> ObjectReference {
    let (namespace, name) = pod.as_str().split_once('/').unwrap_or(("", pod.as_str()));
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        namespace: Some(namespace.to_owned()),
        name: Some(name.to_owned()),
        ..ObjectReference::default()
    }
}

/// The event note on a pod evicted for a quota.
pub fn evicted_note(beneficiary: &PodKey, node: &NodeName) -> String {
    format!(
        "evicted from node {node}: its ElasticQuota borrows above its min, and {beneficiary}, under its own min, needs the GPUs"
    )
}

/// The event note on the pod a quota reclaimed GPUs for.
pub fn reclaimed_note(victims: &[PodKey], node: &NodeName) -> String {
    let names: Vec<&str> = victims.iter().map(PodKey::as_str).collect();
    format!(
        "evicted {} borrowing pod(s) on node {node} to give this pod its ElasticQuota's guaranteed GPUs: {}",
        victims.len(),
        names.join(", ")
    )
}

impl ReclaimEvents for KubeEvents {
    fn evicted(&self, victim: &PodKey, beneficiary: &PodKey, node: &NodeName) {
        let event = Event {
            type_: EventType::Warning,
            reason: RECLAIM_REASON.to_owned(),
            note: Some(evicted_note(beneficiary, node)),
            action: "Evict".to_owned(),
            secondary: Some(pod_reference(beneficiary)),
        };
        self.publish(event, pod_reference(victim));
    }

    fn reclaimed(&self, beneficiary: &PodKey, victims: &[PodKey], node: &NodeName) {
        let event = Event {
            type_: EventType::Normal,
            reason: RECLAIM_REASON.to_owned(),
            note: Some(reclaimed_note(victims, node)),
            action: "Reclaim".to_owned(),
            secondary: None,
        };
        self.publish(event, pod_reference(beneficiary));
    }
}

impl BindEvents for KubeEvents {
    fn bound(&self, request: &BindRequest, allocation: &PodAllocation) {
        let reference = ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            namespace: Some(request.namespace.clone()),
            name: Some(request.name.clone()),
            uid: (!request.uid.is_empty()).then(|| request.uid.clone()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Normal,
            reason: BOUND_REASON.to_owned(),
            note: Some(bound_note(request, allocation)),
            action: "Bind".to_owned(),
            secondary: None,
        };
        self.publish(event, reference);
    }
}

/// The event note on a pod whose allocation record was refused.
pub fn rejected_note(rejected: &RejectedRecord) -> String {
    format!(
        "the gpu-extender.io/allocation record on this pod was not applied ({}: {}); the \
         scheduler counts the pod as the extender bound it, or from its requests. Only the \
         extender writes the record, once, at bind",
        rejected.reason, rejected.detail
    )
}

impl KubeEvents {
    /// A Warning on the pod of `rejected`.
    pub fn record_rejected(&self, rejected: &RejectedRecord) {
        let (namespace, name) = rejected.pod.split_once('/').unwrap_or(("", &rejected.pod));
        let mut reference = pod_reference(&PodKey::new(namespace, name));
        reference.uid = (!rejected.uid.is_empty()).then(|| rejected.uid.clone());
        let event = Event {
            type_: EventType::Warning,
            reason: RECORD_REJECTED_REASON.to_owned(),
            note: Some(rejected_note(rejected)),
            action: "Watch".to_owned(),
            secondary: None,
        };
        self.publish(event, reference);
    }
}

/// Tells each pod whose record the watch refused, once per refusal, with an Event; only while
/// this replica is the writer (`writer`), so two replicas do not both tell it. Runs until
/// aborted.
pub async fn tell_rejected_records(cluster: Arc<ClusterState>, events: KubeEvents, writer: Writer) {
    let mut ticks = tokio::time::interval(REJECTED_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if !writer.holds() {
            continue;
        }
        for rejected in cluster.take_untold_rejections() {
            events.record_rejected(&rejected);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on a broken fixture")]

    use super::*;
    use gpu_engine::{ContainerAllocation, CpuMilli, GpuGrant, GpuIndex, Grant, MemMiB, NodeName};

    #[test]
    fn the_note_names_the_node_and_each_gpu() {
        let request = BindRequest {
            namespace: "ns".into(),
            name: "p".into(),
            uid: "u".into(),
            node: "t4-1".into(),
        };
        let mut allocation =
            PodAllocation::host_only(NodeName::new("t4-1"), CpuMilli(1000), MemMiB(1024));
        allocation.containers.push(ContainerAllocation {
            name: "main".into(),
            gpus: vec![
                GpuGrant {
                    gpu: GpuIndex(0),
                    grant: Grant::Whole,
                },
                GpuGrant {
                    gpu: GpuIndex(1),
                    grant: Grant::Share {
                        mem: MemMiB(8 * 1024),
                        compute: gpu_engine::ComputeMilli(0),
                    },
                },
            ],
        });
        assert_eq!(
            bound_note(&request, &allocation),
            "bound to node t4-1: GPU0 (whole), GPU1 (8 GiB)"
        );
    }
}
