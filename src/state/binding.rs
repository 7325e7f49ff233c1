//! The bind seam between the HTTP layer and the binder: what kube-scheduler asks to bind, what
//! a bind did, and one typed error for every way it can fail (its message is what
//! kube-scheduler gets in `Error` and shows in the pod's events). The binder in
//! [`crate::k8s::bind`] implements [`Bind`]; the HTTP layer holds it as `dyn Bind`, so neither
//! imports the other and tests substitute a binder here.

use futures::future::BoxFuture;
use thiserror::Error;

use crate::objects::translate::TranslateError;
use gpu_engine::{NodeName, PodAllocation, PodKey, RejectReason, TableError};

/// Binds pods: what the HTTP layer's bind verb asks of the Kubernetes side.
pub trait Bind: Send + Sync + 'static {
    /// Chooses the GPUs on `request.node`, records them and binds the pod, within the
    /// service's time budget.
    fn bind(&self, request: BindRequest) -> BoxFuture<'_, Result<BindOutcome, BindError>>;
}

/// What kube-scheduler asks to bind (`ExtenderBindingArgs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindRequest {
    pub namespace: String,
    pub name: String,
    /// The pod's UID as the scheduler knows it; empty skips the check.
    pub uid: String,
    pub node: String,
}

/// What a successful bind did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BindOutcome {
    /// Bound now, with this allocation.
    Bound(PodAllocation),
    /// The pod was already bound to the requested node (a retried bind, or a late answer
    /// found committed): nothing written.
    AlreadyBound,
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
    /// The pod names a scheduler this extender does not serve (`server.schedulerNames`): the
    /// bind did not come from the kube-scheduler it works for.
    #[error(
        "pod {pod} asks for scheduler {scheduler:?}, which this extender does not bind for (server.schedulerNames: {served})"
    )]
    OtherScheduler {
        pod: PodKey,
        scheduler: String,
        served: String,
    },
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
    /// Another bind of the same namespace took the quota's room since filter passed the pod.
    #[error("pod {pod}: {reason}")]
    OverQuota { pod: PodKey, reason: String },
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
    /// The bind's budget (`server.requestTimeoutMs`) ran out and no Binding was found after it.
    #[error(
        "binding pod {pod} took longer than {budget_ms} ms; its reservation lapses unless the bind completed"
    )]
    TimedOut { pod: PodKey, budget_ms: u128 },
    /// The service has no binder (a tool or test serving a fixed table).
    #[error("GPU extender has no binder: not connected to the API server")]
    NoBinder,
}

impl BindError {
    /// The `result` label of `gpu_extender_binds_total` for this error.
    pub fn label(&self) -> &'static str {
        match self {
            Self::PodGone(_) | Self::PodReplaced { .. } => "pod_gone",
            Self::BoundElsewhere { .. } => "bound_elsewhere",
            Self::OtherScheduler { .. } => "other_scheduler",
            Self::Request { .. } => "invalid_request",
            Self::NodeUnknown(_) => "node_gone",
            Self::NoLongerFits { .. } | Self::Table { .. } => "no_fit",
            Self::OverQuota { .. } => "over_quota",
            Self::Api { .. } | Self::Read { .. } | Self::NoBinder => "api_error",
            Self::TimedOut { .. } => "timeout",
        }
    }
}
