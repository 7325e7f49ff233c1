//! Wire to domain: Kubernetes Nodes and Pods into engine values (nodes in `node`, pods in `pod`). The sole owner of label,
//! annotation and quantity parsing; pure functions of an object and the [`Config`], no I/O.
//! Formats are documented in `docs/annotations.md`.
//!
//! Errors here are shown to users (a pod's FailedScheduling event, the logs for a node), so they
//! say which container, resource, label or annotation is wrong and what would be valid.

use thiserror::Error;

use super::quantity::QuantityError;
use gpu_engine::{MigProfile, RequestError};

mod node;
mod pod;
#[cfg(test)]
mod tests;

pub use node::{
    NODE_GPUS_VERSION, NodeGpuDoc, NodeGpusDoc, NodeTranslation, link_cell, node_spec, parse_link,
    translate_node,
};
pub use pod::{
    HAMI_MEM_PERCENTAGE, check_amount, names_gpu_resource, placement_request, pod_host_request,
    pod_key, pod_mig_request, pod_request, pod_resource_request,
};

/// The prefix of the extended resources NVIDIA's device plugin advertises MIG slices under with
/// its `mixed` strategy: `nvidia.com/mig-<profile>` (`nvidia.com/mig-3g.20gb`; a profile's `+`
/// is written `.`, `nvidia.com/mig-1g.10gb.me`). Recognised by prefix, not configured: the
/// device plugin names them so (docs/mig.md).
pub const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";

/// GPU Feature Discovery's node label naming the device plugin's MIG strategy. Under `single`
/// the device plugin's `nvidia.com/gpu` units are MIG slices, not cards (docs/mig.md).
pub const MIG_STRATEGY_LABEL: &str = "nvidia.com/mig.strategy";

/// The MIG profile a resource name of [`MIG_RESOURCE_PREFIX`] names, `None` for another
/// resource; `Some(Err)` for a name of the prefix that is no profile.
pub fn mig_profile_of(resource: &str) -> Option<Result<MigProfile, RequestError>> {
    resource
        .strip_prefix(MIG_RESOURCE_PREFIX)
        .map(|name| MigProfile::parse(name).map_err(RequestError::from))
}

/// The most GPUs one node may have (the engine's GPU sets are 64-bit masks).
const MAX_GPUS: u64 = 64;

/// The model name used when no label, GFD label or annotation names one.
pub const UNKNOWN_MODEL: &str = "unknown";

/// Why an object cannot be translated, in words for the pod's owner or the cluster admin.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum TranslateError {
    #[error("container {container}: {resource} quantity {value:?} {problem}")]
    Quantity {
        container: String,
        resource: String,
        value: String,
        problem: QuantityError,
    },
    #[error(
        "container {container}: {resource} is counted in {unit}; write a plain number such as {example}, not {value:?}"
    )]
    GpuMemoryUnit {
        container: String,
        resource: String,
        value: String,
        unit: &'static str,
        example: u32,
    },
    #[error("container {container}: {resource} is not supported; {instead}")]
    Unsupported {
        container: String,
        resource: String,
        instead: String,
    },
    #[error("container {container}: {source}")]
    Request {
        container: String,
        #[source]
        source: RequestError,
    },
    #[error("pod label {key}={value:?}: {problem}")]
    PodLabel {
        key: String,
        value: String,
        problem: String,
    },
    #[error("pod annotation {key}: {problem}")]
    PodAnnotation { key: String, problem: String },
    #[error(
        "node label {key}={value:?} is not a GPU mode; expected default, cgpu, share, mps, core_mem or topology"
    )]
    UnknownMode { key: String, value: String },
    #[error("node label {key}={value:?}: {problem}")]
    NodeLabel {
        key: String,
        value: String,
        problem: String,
    },
    #[error("node {field} {resource}={value:?}: {problem}")]
    NodeQuantity {
        field: &'static str,
        resource: String,
        value: String,
        problem: QuantityError,
    },
    #[error("node has {0} GPUs; at most 64 are supported, so its GPUs are ignored")]
    TooManyGpus(u64),
    #[error("node annotation {key} is not valid, GPUs are taken from labels instead: {problem}")]
    NodeGpus { key: String, problem: String },
    #[error("node resource {resource}: {problem}; its MIG slices are not counted")]
    NodeMig { resource: String, problem: String },
}

impl TranslateError {
    /// Whether the error came from the per-GPU detail annotation (the node then falls back to
    /// its labels and capacity).
    pub fn is_detail_annotation(&self) -> bool {
        matches!(self, Self::NodeGpus { .. })
    }
}
