//! Bind: the one place that writes to the API server. Given the node kube-scheduler chose, pick
//! the exact GPUs (the node's GPU-level policy), hold them as a reservation under the table's
//! write lock so no concurrent bind or filter can hand them out again, then create the pod's
//! Binding carrying the allocation record, so that binding and record are one API write.
//!
//! [`Binder`] decides, reserves and writes; the API write sits behind [`PodApi`] so tests can
//! script the API server's answers, and time is passed in ([`BindTime`]), never read there.
//! [`MeteredBinder`] is the service's [`Bind`]: it reads the clock, keeps the bind within its
//! time budget, counts outcomes and publishes the bind's Event.

use crate::objects::quota::quota_names;
use gpu_engine::quota::{Amounts, namespace_of};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use tracing::{debug, warn};

use super::api::{BindTime, BindingWrite, PodApi};
use super::events::BindEvents;
use crate::config::Config;
use crate::objects::record;
use crate::objects::translate::{pod_host_request, pod_request};
use crate::state::{ApiError, Bind, BindError, BindOutcome, BindRequest, PolicyCell, TableWriter};
use crate::telemetry::Metrics;
use gpu_engine::{
    Change, CpuMilli, Hold, MemMiB, NodeName, PodAllocation, PodKey, PodRequest, fit,
};

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
    state: TableWriter,
    cfg: Arc<Config>,
    policy: PolicyCell,
    api: A,
}

impl<A: PodApi> Binder<A> {
    /// A binder over `state`, deciding with `policy` (GPU choice per the node's placement) and
    /// writing through `api`.
    pub fn new(
        state: TableWriter,
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
        check_scheduler(&key, &pod, &self.cfg.server.scheduler_names)?;
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
        // Filter admitted the pod against the quota, but binds run in parallel with the next
        // filter: checked again under the write lock, so two pods of one team cannot both take
        // its last room.
        if allocation.has_gpus() {
            let quotas = self.state.quotas();
            let namespace = namespace_of(key);
            if let Some(quota) = quotas.get(namespace) {
                let used = quota.used_in(&table);
                quota
                    .admit(
                        &used,
                        &Amounts::held_by(&allocation),
                        &quota_names(&self.cfg),
                    )
                    .map_err(|reason| BindError::OverQuota {
                        pod: key.clone(),
                        reason,
                    })?;
            }
        }
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
        let current = self.api.get_pod(namespace_of(key), key_name(key)).await;
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

/// How long a bind that ran out of its budget may spend finding out whether its Binding landed
/// anyway: `server.requestTimeoutMs` plus this stays below kube-scheduler's `httpTimeout`
/// (2 s + 1 s against the shipped 5 s).
pub const LATE_COMMIT_WINDOW: Duration = Duration::from_secs(1);

/// The binder the service uses, with its outcomes counted and a time budget: an answer with
/// `Error` before kube-scheduler's `httpTimeout` beats a late success it has stopped waiting for.
pub struct MeteredBinder<A> {
    binder: Binder<A>,
    /// Told of every successful bind (an Event on the pod); never fails the bind.
    events: Option<Arc<dyn BindEvents>>,
    metrics: Metrics,
    epoch: Instant,
    budget: Duration,
}

impl<A> std::fmt::Debug for MeteredBinder<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeteredBinder")
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl<A: PodApi + 'static> MeteredBinder<A> {
    /// Wraps `binder`; reservations and bind times share `epoch` with the watch's expiry tick.
    pub fn new(binder: Binder<A>, metrics: Metrics, epoch: Instant, budget: Duration) -> Self {
        Self {
            binder,
            events: None,
            metrics,
            epoch,
            budget,
        }
    }

    /// Records an event for each successful bind through `events`.
    pub fn with_events(mut self, events: Arc<dyn BindEvents>) -> Self {
        self.events = Some(events);
        self
    }
}

impl<A: PodApi + 'static> Bind for MeteredBinder<A> {
    fn bind(&self, request: BindRequest) -> BoxFuture<'_, Result<BindOutcome, BindError>> {
        Box::pin(async move {
            let time = BindTime::now(self.epoch);
            let outcome = tokio::time::timeout(self.budget, self.binder.bind(&request, time)).await;
            let (label, result) = match outcome {
                Ok(Ok(BindOutcome::Bound(allocation))) => {
                    if let Some(events) = &self.events {
                        events.bound(&request, &allocation);
                    }
                    ("bound", Ok(BindOutcome::Bound(allocation)))
                }
                Ok(Ok(BindOutcome::AlreadyBound)) => {
                    ("already_bound", Ok(BindOutcome::AlreadyBound))
                }
                Ok(Err(error)) => (error.label(), Err(error)),
                // Out of time, but the write may have landed (a slow API server answers late):
                // one read tells, so that a committed bind is not reported as a failure that
                // kube-scheduler would retry.
                Err(_) => match tokio::time::timeout(
                    LATE_COMMIT_WINDOW,
                    self.binder.confirm_late(&request),
                )
                .await
                {
                    Ok(Some(outcome)) => ("late_commit", Ok(outcome)),
                    _ => {
                        let error = BindError::TimedOut {
                            pod: PodKey::new(&request.namespace, &request.name),
                            budget_ms: self.budget.as_millis(),
                        };
                        (error.label(), Err(error))
                    }
                },
            };
            self.metrics.binds.with_label_values(&[label]).inc();
            result
        })
    }
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

/// Refuses a pod whose `spec.schedulerName` (kube-scheduler's `default-scheduler` when unset)
/// is not one of `served`; an empty `served` accepts any.
fn check_scheduler(key: &PodKey, pod: &Pod, served: &[String]) -> Result<(), BindError> {
    let scheduler = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.scheduler_name.as_deref())
        .unwrap_or("default-scheduler");
    if served.is_empty() || served.iter().any(|name| name == scheduler) {
        return Ok(());
    }
    Err(BindError::OtherScheduler {
        pod: key.clone(),
        scheduler: scheduler.to_owned(),
        served: served.join(", "),
    })
}

#[cfg(test)]
mod tests;
