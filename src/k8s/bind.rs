//! Bind: the one place that writes to the API server. Given the node kube-scheduler chose, pick
//! the exact GPUs (the node's GPU-level policy), hold them as a reservation under the table's
//! write lock so no concurrent bind or filter can hand them out again, then create the pod's
//! Binding carrying the allocation record, so that binding and record are one API write.
//!
//! The API write sits behind [`PodApi`] so tests can script the API server's answers. Time is
//! passed in ([`BindTime`]), never read here.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use thiserror::Error;
use tracing::{debug, warn};

use super::record;
use super::requeue::PodTouch;
use super::translate::{TranslateError, pod_host_request, pod_request};
use super::watch::{ClusterState, monotonic_ms};
use crate::config::Config;
use crate::engine::{
    Change, CpuMilli, Hold, MemMiB, NodeName, PodAllocation, PodKey, PodRequest, RejectReason,
    TableError, fit,
};
use crate::k8s::learn::PolicyCell;

/// What kube-scheduler asks to bind (`ExtenderBindingArgs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindRequest {
    pub namespace: String,
    pub name: String,
    /// The pod's UID as the scheduler knows it; empty skips the check.
    pub uid: String,
    pub node: String,
}

/// The moment of a bind, on both clocks: `monotonic_ms` for the reservation's TTL (the same
/// time base as the expiry tick, see [`monotonic_ms`]) and `unix_nanos` for the gpushare
/// device plugin's assume time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindTime {
    pub monotonic_ms: u64,
    pub unix_nanos: u128,
}

impl BindTime {
    /// Now, for the service (tests build `BindTime` from plain numbers).
    pub fn now(epoch: Instant) -> Self {
        // The one read of the wall clock, for the device plugin's annotation and the requeue
        // stamp only; decisions use the monotonic clock.
        #[allow(
            clippy::disallowed_methods,
            reason = "the gpushare assume time is wall-clock by definition"
        )]
        let wall = SystemTime::now();
        Self {
            monotonic_ms: monotonic_ms(epoch),
            unix_nanos: wall
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        }
    }
}

/// The write the binder asks of the API server: `POST pods/{name}/binding`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindingWrite {
    pub namespace: String,
    pub name: String,
    /// Precondition: the API server refuses (409) if the pod's UID differs.
    pub uid: String,
    pub node: String,
    /// Copied by the API server onto the pod.
    pub annotations: BTreeMap<String, String>,
}

/// An API server answer other than success.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ApiError {
    /// 409: already bound, or the UID precondition failed.
    #[error("conflict: {0}")]
    Conflict(String),
    /// 404: the pod is gone.
    #[error("not found: {0}")]
    NotFound(String),
    #[error("API server error {}: {message}", code.map_or_else(|| "(no response)".to_owned(), |c| c.to_string()))]
    Other { code: Option<u16>, message: String },
}

/// The API calls bind needs. Implemented by [`KubeApi`]; tests script it.
pub trait PodApi: Send + Sync {
    /// Creates the pod's Binding.
    fn create_binding(
        &self,
        binding: &BindingWrite,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;

    /// Reads a pod; `Ok(None)` when it does not exist.
    fn get_pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Pod>, ApiError>> + Send;
}

/// Why a bind failed. The message goes back to kube-scheduler in `Error` and ends up in the
/// pod's events, so it says what happened in words.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum BindError {
    #[error("pod {0} no longer exists")]
    PodGone(PodKey),
    #[error(
        "pod {pod} was deleted and recreated (scheduler has uid {expected}, the pod is {found})"
    )]
    PodReplaced {
        pod: PodKey,
        expected: String,
        found: String,
    },
    #[error("pod {pod} is already bound to node {node}")]
    BoundElsewhere { pod: PodKey, node: String },
    #[error("pod {pod}: {source}")]
    Request {
        pod: PodKey,
        #[source]
        source: TranslateError,
    },
    #[error("node {0} is not known (deleted, or not yet seen)")]
    NodeUnknown(NodeName),
    #[error("pod {pod} no longer fits node {node}: {reason}")]
    NoLongerFits {
        pod: PodKey,
        node: NodeName,
        reason: RejectReason,
    },
    #[error("reserving for pod {pod}: {source}")]
    Table {
        pod: PodKey,
        #[source]
        source: TableError,
    },
    #[error("binding pod {pod} to node {node}: {source}")]
    Api {
        pod: PodKey,
        node: NodeName,
        #[source]
        source: ApiError,
    },
    #[error("reading pod {pod}: {source}")]
    Read {
        pod: PodKey,
        #[source]
        source: ApiError,
    },
}

/// What a successful bind did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BindOutcome {
    /// Bound now, with this allocation.
    Bound(PodAllocation),
    /// The pod was already bound to the requested node (a retried bind): nothing written.
    AlreadyBound,
}

/// A reservation made by [`Binder::reserve`], and the annotations that record it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reserved {
    New {
        allocation: PodAllocation,
        annotations: BTreeMap<String, String>,
    },
    /// The table already holds the pod as bound to this node.
    AlreadyBound,
}

/// Binds pods: decides the GPUs, reserves them, writes the Binding.
#[derive(Debug)]
pub struct Binder<A> {
    state: Arc<ClusterState>,
    cfg: Arc<Config>,
    policy: PolicyCell,
    api: A,
}

impl<A: PodApi> Binder<A> {
    /// A binder over `state`, deciding with `policy` (GPU choice per the node's placement) and
    /// writing through `api`.
    pub fn new(
        state: Arc<ClusterState>,
        cfg: Arc<Config>,
        policy: impl Into<PolicyCell>,
        api: A,
    ) -> Self {
        Self {
            state,
            cfg,
            policy: policy.into(),
            api,
        }
    }

    /// Binds `request.name` to `request.node`. Idempotent: a pod already bound to that node is
    /// a success with nothing written. On any failure nothing stays reserved.
    pub async fn bind(
        &self,
        request: &BindRequest,
        time: BindTime,
    ) -> Result<BindOutcome, BindError> {
        let key = PodKey::new(&request.namespace, &request.name);
        let node = NodeName::new(&request.node);
        let pod = self.find_pod(&key, request).await?;
        if let Some(outcome) = check_pod(&key, &pod, request)? {
            return Ok(outcome);
        }
        let translate = |source| BindError::Request {
            pod: key.clone(),
            source,
        };
        let pod_request = pod_request(&pod, &self.cfg).map_err(translate)?;
        let host = pod_host_request(&pod).map_err(translate)?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let (allocation, annotations) =
            match self.reserve(&key, &uid, pod_request.as_ref(), host, &node, time)? {
                Reserved::AlreadyBound => return Ok(BindOutcome::AlreadyBound),
                Reserved::New {
                    allocation,
                    annotations,
                } => (allocation, annotations),
            };
        let write = BindingWrite {
            namespace: request.namespace.clone(),
            name: request.name.clone(),
            uid: uid.clone(),
            node: request.node.clone(),
            annotations,
        };
        match self.api.create_binding(&write).await {
            Ok(()) => {
                debug!(pod = %key, node = %node, "bound");
                Ok(BindOutcome::Bound(allocation))
            }
            Err(ApiError::Conflict(message)) => {
                self.after_conflict(&key, &uid, &node, &allocation, message)
                    .await
            }
            Err(ApiError::NotFound(_)) => {
                self.cancel(&key, &allocation);
                Err(BindError::PodGone(key))
            }
            Err(source) => {
                self.cancel(&key, &allocation);
                warn!(pod = %key, node = %node, %source, "binding failed; reservation released");
                Err(BindError::Api {
                    pod: key,
                    node,
                    source,
                })
            }
        }
    }

    /// The decision and the reservation, under one short write lock: expire lapsed
    /// reservations, fit the pod on the node's current usage, reserve until
    /// `time + bind.reservationTtlSeconds`, and build the record. `request` is `None` for a pod
    /// that asks for no GPU (it reserves CPU and memory and writes no record).
    pub fn reserve(
        &self,
        key: &PodKey,
        pod_uid: &str,
        request: Option<&PodRequest>,
        host: (CpuMilli, MemMiB),
        node: &NodeName,
        time: BindTime,
    ) -> Result<Reserved, BindError> {
        let mut table = self.state.write();
        self.state.expire_in(&mut table, time.monotonic_ms);
        if let Some(entry) = table.pod(key) {
            match entry.hold {
                Hold::Bound if entry.allocation.node == *node => return Ok(Reserved::AlreadyBound),
                Hold::Bound => {
                    return Err(BindError::BoundElsewhere {
                        pod: key.clone(),
                        node: entry.allocation.node.to_string(),
                    });
                }
                // A previous attempt for this pod that never completed: decide afresh.
                Hold::Reserved { .. } => {
                    self.state.release_in(&mut table, key);
                }
            }
        }
        let state = table
            .node(node)
            .ok_or_else(|| BindError::NodeUnknown(node.clone()))?;
        let (allocation, annotations) = match request {
            Some(request) => {
                let allocation = fit(state, request, &self.policy.load()).map_err(|reason| {
                    BindError::NoLongerFits {
                        pod: key.clone(),
                        node: node.clone(),
                        reason,
                    }
                })?;
                let annotations = record::encode(
                    &allocation,
                    &state.spec,
                    pod_uid,
                    time.unix_nanos,
                    &self.cfg,
                );
                (allocation, annotations)
            }
            None => (
                PodAllocation::host_only(node.clone(), host.0, host.1),
                BTreeMap::new(),
            ),
        };
        let expires = time
            .monotonic_ms
            .saturating_add(self.cfg.reservation_ttl_ms());
        table
            .reserve(key.clone(), allocation.clone(), expires)
            .map_err(|source| BindError::Table {
                pod: key.clone(),
                source,
            })?;
        Ok(Reserved::New {
            allocation,
            annotations,
        })
    }

    /// After a bind ran out of time: whether its Binding landed anyway, read once from the
    /// watch cache, else from the API server. `Some` when the pod (same UID) is bound to the
    /// requested node: the bind succeeded, only its answer was late (the watch turns the
    /// reservation into the record as for any bind).
    pub async fn confirm_late(&self, request: &BindRequest) -> Option<BindOutcome> {
        let key = PodKey::new(&request.namespace, &request.name);
        let bound_here = |pod: &Pod| {
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            (request.uid.is_empty() || uid == request.uid)
                && pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
                    == Some(request.node.as_str())
        };
        if self.state.pod(&key).is_some_and(|pod| bound_here(&pod)) {
            return Some(BindOutcome::AlreadyBound);
        }
        match self.api.get_pod(&request.namespace, &request.name).await {
            Ok(Some(pod)) if bound_here(&pod) => Some(BindOutcome::AlreadyBound),
            _ => None,
        }
    }

    /// Releases `key`'s reservation if it is still the one made with `allocation` (the watch
    /// may have replaced it with the bound truth meanwhile).
    pub fn cancel(&self, key: &PodKey, allocation: &PodAllocation) {
        let mut table = self.state.write();
        let ours = table.pod(key).is_some_and(|entry| {
            matches!(entry.hold, Hold::Reserved { .. }) && entry.allocation == *allocation
        });
        if ours {
            self.state.release_in(&mut table, key);
        }
    }

    /// The pod from the watch cache, else (the watch may lag the scheduler by a moment, or
    /// still hold a deleted pod of the same name) from the API server.
    async fn find_pod(&self, key: &PodKey, request: &BindRequest) -> Result<Arc<Pod>, BindError> {
        if let Some(pod) = self.state.pod(key) {
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            if request.uid.is_empty() || uid == request.uid {
                return Ok(pod);
            }
        }
        match self.api.get_pod(&request.namespace, &request.name).await {
            Ok(Some(pod)) => Ok(Arc::new(pod)),
            Ok(None) => Err(BindError::PodGone(key.clone())),
            Err(ApiError::NotFound(_)) => Err(BindError::PodGone(key.clone())),
            Err(source) => Err(BindError::Read {
                pod: key.clone(),
                source,
            }),
        }
    }

    /// 409: most often an earlier attempt of this very bind succeeded but its answer was lost.
    /// Read the pod: bound where asked means success, and its record (the truth) replaces our
    /// reservation in one write, so the capacity is never free in between.
    async fn after_conflict(
        &self,
        key: &PodKey,
        uid: &str,
        node: &NodeName,
        allocation: &PodAllocation,
        message: String,
    ) -> Result<BindOutcome, BindError> {
        let current = self.api.get_pod(key_namespace(key), key_name(key)).await;
        let mut table = self.state.write();
        let ours = table.pod(key).is_some_and(|entry| {
            matches!(entry.hold, Hold::Reserved { .. }) && entry.allocation == *allocation
        });
        if ours {
            self.state.release_in(&mut table, key);
        }
        let conflict = || BindError::Api {
            pod: key.clone(),
            node: node.clone(),
            source: ApiError::Conflict(message.clone()),
        };
        let Ok(Some(pod)) = current else {
            return Err(conflict());
        };
        if pod.metadata.uid.as_deref().unwrap_or_default() != uid {
            return Err(conflict());
        }
        match pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            Some(bound) if bound == node.as_str() => {
                if let Ok(Some(actual)) = record::decode(&pod, &self.cfg) {
                    table.apply(Change::PodBound {
                        pod: key.clone(),
                        allocation: actual,
                    });
                }
                Ok(BindOutcome::AlreadyBound)
            }
            Some(other) => Err(BindError::BoundElsewhere {
                pod: key.clone(),
                node: other.to_owned(),
            }),
            None => Err(conflict()),
        }
    }
}

fn key_namespace(key: &PodKey) -> &str {
    key.as_str().split_once('/').map_or("", |(ns, _)| ns)
}

fn key_name(key: &PodKey) -> &str {
    key.as_str()
        .split_once('/')
        .map_or(key.as_str(), |(_, name)| name)
}

/// Uid and node checks before deciding: a recreated pod is refused, an already bound pod is a
/// success where asked and an error elsewhere.
fn check_pod(
    key: &PodKey,
    pod: &Pod,
    request: &BindRequest,
) -> Result<Option<BindOutcome>, BindError> {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    if !request.uid.is_empty() && uid != request.uid {
        return Err(BindError::PodReplaced {
            pod: key.clone(),
            expected: request.uid.clone(),
            found: uid.to_owned(),
        });
    }
    match pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
        None => Ok(None),
        Some(node) if node == request.node => Ok(Some(BindOutcome::AlreadyBound)),
        Some(node) => Err(BindError::BoundElsewhere {
            pod: key.clone(),
            node: node.to_owned(),
        }),
    }
}

/// [`PodApi`] over a kube client.
#[derive(Clone)]
pub struct KubeApi {
    client: kube::Client,
}

impl std::fmt::Debug for KubeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeApi")
    }
}

impl KubeApi {
    /// Wraps a client.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl PodApi for KubeApi {
    async fn create_binding(&self, write: &BindingWrite) -> Result<(), ApiError> {
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(write.name.clone()),
                namespace: Some(write.namespace.clone()),
                uid: (!write.uid.is_empty()).then(|| write.uid.clone()),
                annotations: (!write.annotations.is_empty()).then(|| write.annotations.clone()),
                ..ObjectMeta::default()
            },
            target: ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(write.node.clone()),
                ..ObjectReference::default()
            },
        };
        // The API server answers a Binding with a Status, not a Pod.
        Api::<Pod>::namespaced(self.client.clone(), &write.namespace)
            .create_subresource::<Binding, serde_json::Value>(
                "binding",
                &write.name,
                &PostParams::default(),
                &binding,
            )
            .await
            .map(|_| ())
            .map_err(api_error)
    }

    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, ApiError> {
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(api_error)
    }
}

impl PodTouch for KubeApi {
    async fn touch_pod(
        &self,
        namespace: &str,
        name: &str,
        annotation: &str,
        value: &str,
    ) -> Result<(), ApiError> {
        let patch = serde_json::json!({ "metadata": { "annotations": { annotation: value } } });
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(api_error)
    }
}

fn api_error(error: kube::Error) -> ApiError {
    match error {
        kube::Error::Api(status) => match status.code {
            409 => ApiError::Conflict(status.message),
            404 => ApiError::NotFound(status.message),
            code => ApiError::Other {
                code: Some(code),
                message: status.message,
            },
        },
        other => ApiError::Other {
            code: None,
            message: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests;
