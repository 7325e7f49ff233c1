//! A Karmada replica template read as the pod it stands for: the per-replica resource requests,
//! node selector, required node affinity and tolerations of a `ReplicaRequirements` message,
//! checked and built into a Kubernetes [`Pod`], so that the extender's own translation
//! ([`placement_request`]) and kube-scheduler's node-level filters
//! ([`crate::objects::admission`]) read it exactly as they read a real pod.
//!
//! Anything the extender cannot count or Kubernetes would refuse is an error naming the field:
//! a resource it does not know, a quantity that does not parse or is negative, an operator
//! outside Kubernetes' sets, a selector term the API server would reject.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    Pod, PodSpec, ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as WireQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use prost::Message as _;

use super::proto::{core, pb, resource};
use crate::config::Config;
use crate::objects::translate::{TranslateError, check_amount, placement_request};
use gpu_engine::PodRequest;

/// Host resources a template may ask for besides the configured GPU resources. Ephemeral
/// storage and the pod count are accepted and checked for form; the engine counts pods per
/// node (`max_pods`), not storage.
const HOST_RESOURCES: [&str; 4] = ["cpu", "memory", "ephemeral-storage", "pods"];

/// The name the template's one container gets (errors from translation name it).
pub const CONTAINER: &str = "replica";

/// A template read: the pod it stands for and what the engine places for it.
#[derive(Clone, Debug)]
pub struct Template {
    pub pod: Pod,
    pub request: PodRequest,
}

/// Why a template cannot be estimated; every variant is the client's mistake
/// (gRPC `InvalidArgument`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    #[error("replicaRequirements is required")]
    MissingRequirements,
    #[error(
        "resource {0:?} is not one the GPU extender counts (cpu, memory, ephemeral-storage, pods \
         and the configured GPU resources)"
    )]
    UnknownResource(String),
    #[error("resource {name:?}: {problem}")]
    BadQuantity { name: String, problem: String },
    #[error("{field}: cannot decode the embedded Kubernetes message: {problem}")]
    Undecodable {
        field: &'static str,
        problem: String,
    },
    #[error("{field}: {problem}")]
    BadClaim { field: String, problem: String },
    #[error("{0}")]
    Translate(#[from] TranslateError),
}

/// Reads `requirements` (absent: an error) as a pod in the cluster configured by `cfg`.
pub fn template(
    requirements: Option<&pb::ReplicaRequirements>,
    cfg: &Config,
) -> Result<Template, TemplateError> {
    let requirements = requirements.ok_or(TemplateError::MissingRequirements)?;
    let requests = resource_requests(requirements, cfg)?;
    let claim = requirements.node_claim.as_ref();
    let node_selector = claim
        .map(|c| {
            c.node_selector
                .clone()
                .into_iter()
                .collect::<BTreeMap<_, _>>()
        })
        .filter(|selector| !selector.is_empty());
    let affinity = claim
        .map(node_affinity)
        .transpose()?
        .flatten()
        .map(|required| Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(required),
                ..NodeAffinity::default()
            }),
            ..Affinity::default()
        });
    let tolerations = claim
        .map(tolerations)
        .transpose()?
        .filter(|t| !t.is_empty());
    let namespace = Some(requirements.namespace.clone()).filter(|ns| !ns.is_empty());
    let priority_class_name =
        Some(requirements.priority_class_name.clone()).filter(|name| !name.is_empty());
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("karmada-replica-template".to_owned()),
            namespace,
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: CONTAINER.to_owned(),
                resources: Some(ResourceRequirements {
                    requests: Some(requests),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            }],
            node_selector,
            affinity,
            tolerations,
            priority_class_name,
            ..PodSpec::default()
        }),
        status: None,
    };
    let request = placement_request(&pod, cfg, true)?.unwrap_or_default();
    Ok(Template { pod, request })
}

/// The per-replica requests: `resourceRequestBytes` (each a serialized Quantity), or the
/// deprecated `resourceRequest` map when that is empty, as Karmada's own helpers read them.
fn resource_requests(
    requirements: &pb::ReplicaRequirements,
    cfg: &Config,
) -> Result<BTreeMap<String, WireQuantity>, TemplateError> {
    let mut requests = BTreeMap::new();
    if requirements.resource_request_bytes.is_empty() {
        #[allow(
            deprecated,
            reason = "Karmada v1.18 clients still fill the deprecated field"
        )]
        for (name, quantity) in &requirements.resource_request {
            requests.insert(name.clone(), quantity_text(name, quantity)?);
        }
    } else {
        for (name, bytes) in &requirements.resource_request_bytes {
            let quantity = resource::Quantity::decode(bytes.as_slice()).map_err(|e| {
                TemplateError::Undecodable {
                    field: "resourceRequestBytes",
                    problem: format!("{name}: {e}"),
                }
            })?;
            requests.insert(name.clone(), quantity_text(name, &quantity)?);
        }
    }
    let r = &cfg.resources;
    let gpu = [&r.whole_gpu, &r.gpu_mem, &r.gpu_core, &r.topology_gpu];
    for (name, quantity) in &requests {
        if !HOST_RESOURCES.contains(&name.as_str()) && !gpu.contains(&name) {
            return Err(TemplateError::UnknownResource(name.clone()));
        }
        check_amount(CONTAINER, name, quantity)?;
    }
    Ok(requests)
}

fn quantity_text(name: &str, quantity: &resource::Quantity) -> Result<WireQuantity, TemplateError> {
    quantity
        .string
        .clone()
        .map(WireQuantity)
        .ok_or_else(|| TemplateError::BadQuantity {
            name: name.to_owned(),
            problem: "the quantity is empty".to_owned(),
        })
}

/// The required node affinity: `nodeAffinityBytes` (a serialized NodeSelector), or the
/// deprecated `nodeAffinity` when that is empty.
fn node_affinity(claim: &pb::NodeClaim) -> Result<Option<NodeSelector>, TemplateError> {
    #[allow(
        deprecated,
        reason = "Karmada v1.18 clients still fill the deprecated field"
    )]
    let legacy = claim.node_affinity.clone();
    let selector = if claim.node_affinity_bytes.is_empty() {
        legacy
    } else {
        Some(
            core::NodeSelector::decode(claim.node_affinity_bytes.as_slice()).map_err(|e| {
                TemplateError::Undecodable {
                    field: "nodeClaim.nodeAffinityBytes",
                    problem: e.to_string(),
                }
            })?,
        )
    };
    let Some(selector) = selector else {
        return Ok(None);
    };
    if selector.node_selector_terms.is_empty() {
        return Err(TemplateError::BadClaim {
            field: "nodeClaim.nodeAffinity.nodeSelectorTerms".to_owned(),
            problem: "a required node affinity needs at least one term".to_owned(),
        });
    }
    let terms = selector
        .node_selector_terms
        .into_iter()
        .enumerate()
        .map(|(t, term)| {
            let field = |list: &str, r: usize| {
                format!("nodeClaim.nodeAffinity.nodeSelectorTerms[{t}].{list}[{r}]")
            };
            let read = |list: &str, requirements: Vec<core::NodeSelectorRequirement>| {
                requirements
                    .into_iter()
                    .enumerate()
                    .map(|(r, req)| requirement(&field(list, r), req))
                    .collect::<Result<Vec<_>, _>>()
            };
            Ok(NodeSelectorTerm {
                match_expressions: Some(read("matchExpressions", term.match_expressions)?),
                match_fields: Some(read("matchFields", term.match_fields)?),
            })
        })
        .collect::<Result<Vec<_>, TemplateError>>()?;
    Ok(Some(NodeSelector {
        node_selector_terms: terms,
    }))
}

/// One selector requirement, checked as the API server validates a pod's.
fn requirement(
    field: &str,
    req: core::NodeSelectorRequirement,
) -> Result<NodeSelectorRequirement, TemplateError> {
    let bad = |problem: String| TemplateError::BadClaim {
        field: field.to_owned(),
        problem,
    };
    let key = req.key.unwrap_or_default();
    if key.is_empty() {
        return Err(bad("key is required".to_owned()));
    }
    let operator = req.operator.unwrap_or_default();
    let values = req.values;
    match operator.as_str() {
        "In" | "NotIn" if values.is_empty() => {
            return Err(bad(format!("{operator} needs at least one value")));
        }
        "Exists" | "DoesNotExist" if !values.is_empty() => {
            return Err(bad(format!("{operator} takes no values")));
        }
        "Gt" | "Lt" if values.len() != 1 || values[0].parse::<i64>().is_err() => {
            return Err(bad(format!("{operator} takes exactly one integer value")));
        }
        "In" | "NotIn" | "Exists" | "DoesNotExist" | "Gt" | "Lt" => {}
        other => {
            return Err(bad(format!(
                "operator {other:?} is not one of In, NotIn, Exists, DoesNotExist, Gt, Lt"
            )));
        }
    }
    Ok(NodeSelectorRequirement {
        key,
        operator,
        values: Some(values),
    })
}

/// The tolerations: `tolerationsBytes` (each a serialized Toleration), or the deprecated
/// `tolerations` when that is empty; checked as the API server validates a pod's.
fn tolerations(claim: &pb::NodeClaim) -> Result<Vec<Toleration>, TemplateError> {
    #[allow(
        deprecated,
        reason = "Karmada v1.18 clients still fill the deprecated field"
    )]
    let legacy = &claim.tolerations;
    let decoded = if claim.tolerations_bytes.is_empty() {
        legacy.clone()
    } else {
        claim
            .tolerations_bytes
            .iter()
            .map(|bytes| core::Toleration::decode(bytes.as_slice()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TemplateError::Undecodable {
                field: "nodeClaim.tolerationsBytes",
                problem: e.to_string(),
            })?
    };
    decoded
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let bad = |problem: String| TemplateError::BadClaim {
                field: format!("nodeClaim.tolerations[{i}]"),
                problem,
            };
            let key = t.key.unwrap_or_default();
            let operator = t.operator.unwrap_or_default();
            let value = t.value.unwrap_or_default();
            let effect = t.effect.unwrap_or_default();
            match operator.as_str() {
                "" | "Equal" if key.is_empty() => {
                    return Err(bad("an empty key needs operator Exists".to_owned()));
                }
                "Exists" if !value.is_empty() => {
                    return Err(bad("operator Exists takes no value".to_owned()));
                }
                "" | "Equal" | "Exists" => {}
                other => {
                    return Err(bad(format!(
                        "operator {other:?} is not one of Equal, Exists"
                    )));
                }
            }
            if !["", "NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect.as_str()) {
                return Err(bad(format!(
                    "effect {effect:?} is not one of NoSchedule, PreferNoSchedule, NoExecute"
                )));
            }
            let some = |text: String| Some(text).filter(|s| !s.is_empty());
            Ok(Toleration {
                key: some(key),
                operator: some(operator),
                value: some(value),
                effect: some(effect),
                toleration_seconds: t.toleration_seconds,
            })
        })
        .collect()
}
