//! Kubernetes Events on pods for bind decisions, so `kubectl describe pod` says which GPUs a pod
//! got. Published in the background: an event is a courtesy, and a failure to publish one (no
//! RBAC, a busy API server) must never fail or delay the bind that caused it.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use tracing::warn;

use crate::engine::PodAllocation;
use crate::explain::describe_allocation;
use crate::state::BindRequest;
use crate::telemetry::Metrics;

/// The `reason` of the event recorded after a bind.
pub const BOUND_REASON: &str = "GpusAllocated";

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
        let recorder = self.recorder.clone();
        let metrics = self.metrics.clone();
        let pod = format!("{}/{}", request.namespace, request.name);
        tokio::spawn(async move {
            let result = match recorder.publish(&event, &reference).await {
                Ok(()) => "sent",
                Err(error) => {
                    warn!(%pod, %error, "could not record the bind event on the pod");
                    "error"
                }
            };
            metrics.pod_events.with_label_values(&[result]).inc();
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on a broken fixture")]

    use super::*;
    use crate::engine::{
        ContainerAllocation, CpuMilli, GpuGrant, GpuIndex, Grant, MemMiB, NodeName,
    };

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
                        compute: crate::engine::ComputeMilli(0),
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
