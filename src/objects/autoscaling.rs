//! What cluster-autoscaler's scheduling simulation is shown of the extender's per-GPU rules. The
//! simulation runs kube-scheduler's in-tree plugins and never calls extenders, so a share that
//! fits a node's sum of GPU memory but no single GPU, or a model named only in an annotation,
//! is invisible to it. Two halves, both pure functions here: the label a memory-sharing node
//! carries ([`LARGEST_FREE_LABEL`], kept by `k8s::node_label`), and the required node affinity
//! on that label and on the model label that the admission webhook (`http::webhook`) adds to a
//! GPU pod. kube-scheduler's NodeAffinity plugin, and so the autoscaler's simulation of it, then
//! evaluates what only the extender knew.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::translate::pod_request;
use crate::config::Config;
use gpu_engine::request::normalize_model;
use gpu_engine::{GpuDemand, GpuMode, ModelPattern, NodeState};

/// Node label: the most GPU memory, in MiB, free on any one healthy GPU of a memory-sharing node
/// that can take one more share. Node-group templates carry it at a full GPU's memory.
pub const LARGEST_FREE_LABEL: &str = "gpu-extender.io/largest-free-gpu-mem-mib";

/// The value of [`LARGEST_FREE_LABEL`] for `node`: `None` for a node that takes no shares
/// (whole-GPU and topology nodes); 0 when every GPU is unhealthy, held whole, or at
/// `max_shares` pods.
pub fn largest_free_mib(node: &NodeState, max_shares: u16) -> Option<u64> {
    if !matches!(node.spec.mode, GpuMode::ShareMemory | GpuMode::CoreMem) {
        return None;
    }
    let healthy = node.healthy_mask();
    Some(
        (0..node.spec.gpus.len())
            .filter(|&position| position < 64 && healthy & (1u64 << position) != 0)
            .filter(|&position| node.gpus[position].shares < max_shares)
            .map(|position| node.gpu_mem_free(position).0)
            .max()
            .unwrap_or(0),
    )
}

/// The required node-affinity expressions (`NodeSelectorRequirement`s as JSON) that make the
/// pod's GPU constraints visible to the in-tree NodeAffinity filter:
/// - a memory share of M MiB on each GPU: [`LARGEST_FREE_LABEL`] `Gt` M-1 (necessary, not
///   sufficient, for a share over several GPUs: the label speaks of one GPU);
/// - `model-include`: the model label `In` the patterns that name a model exactly, as written,
///   and every model of `known_models` (the models on the extender's nodes) a pattern matches;
///   left out when that set is empty (a prefix pattern that matches no known model), so that
///   the pod is never kept from a node group the extender would accept;
/// - `model-exclude`: the model label `NotIn` the same kind of set.
///
/// Nothing for a pod that asks for no GPU, or whose request or annotations do not read: the
/// extender reports those itself when the pod is scheduled.
pub fn affinity_requirements(pod: &Pod, cfg: &Config, known_models: &[String]) -> Vec<Value> {
    let Ok(Some(request)) = pod_request(pod, cfg) else {
        return Vec::new();
    };
    let mut requirements = Vec::new();
    let share_mib = request
        .containers
        .iter()
        .chain(&request.init_containers)
        .filter_map(|container| match container.gpu {
            GpuDemand::Share { mem_per_gpu, .. } => Some(mem_per_gpu.0),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    if share_mib > 0 {
        requirements.push(json!({
            "key": LARGEST_FREE_LABEL,
            "operator": "Gt",
            "values": [(share_mib - 1).to_string()],
        }));
    }
    let annotations = pod.metadata.annotations.as_ref();
    for (key, operator) in [
        (&cfg.annotations.model_include, "In"),
        (&cfg.annotations.model_exclude, "NotIn"),
    ] {
        let Some(list) = annotations.and_then(|a| a.get(key)) else {
            continue;
        };
        let models = models_named(list, known_models);
        if !models.is_empty() {
            requirements.push(json!({
                "key": cfg.node_labels.model,
                "operator": operator,
                "values": models,
            }));
        }
    }
    requirements
}

/// The model label values a comma-separated list of model patterns stands for: each exact
/// pattern as written (when it is a valid label value), and each of `known_models` that some
/// pattern matches. Empty when a pattern does not parse (the extender refuses the pod then).
fn models_named(list: &str, known_models: &[String]) -> BTreeSet<String> {
    let mut models = BTreeSet::new();
    for raw in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Ok(pattern) = ModelPattern::parse(raw) else {
            return BTreeSet::new();
        };
        if !raw.ends_with('*') && is_label_value(raw) {
            models.insert(raw.to_owned());
        }
        models.extend(
            known_models
                .iter()
                .filter(|model| pattern.matches_normalized(&normalize_model(model)))
                .filter(|model| is_label_value(model))
                .cloned(),
        );
    }
    models
}

/// Whether `text` is a valid label value (63 characters at most: alphanumerics, `-`, `_`, `.`,
/// beginning and ending with an alphanumeric).
fn is_label_value(text: &str) -> bool {
    let ends_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    !text.is_empty()
        && text.len() <= 63
        && ends_ok(text.chars().next())
        && ends_ok(text.chars().last())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// `affinity` (the pod's `spec.affinity`, absent or an object) with every one of
/// `requirements` in each of its required node-selector terms (terms are alternatives, so each
/// must carry them), or in a new single term when it has none. `None` when it already holds
/// them all (the webhook then sends no patch) or when it is not an object.
pub fn with_requirements(affinity: Option<&Value>, requirements: &[Value]) -> Option<Value> {
    let mut affinity = affinity.cloned().unwrap_or_else(|| json!({}));
    let required = affinity
        .as_object_mut()?
        .entry("nodeAffinity")
        .or_insert_with(|| json!({}))
        .as_object_mut()?
        .entry("requiredDuringSchedulingIgnoredDuringExecution")
        .or_insert_with(|| json!({}))
        .as_object_mut()?;
    let terms = required
        .entry("nodeSelectorTerms")
        .or_insert_with(|| json!([]))
        .as_array_mut()?;
    if terms.is_empty() {
        terms.push(json!({ "matchExpressions": [] }));
    }
    let mut changed = false;
    for term in terms.iter_mut() {
        let expressions = term
            .as_object_mut()?
            .entry("matchExpressions")
            .or_insert_with(|| json!([]))
            .as_array_mut()?;
        for requirement in requirements {
            if !expressions.contains(requirement) {
                expressions.push(requirement.clone());
                changed = true;
            }
        }
    }
    changed.then_some(affinity)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_engine::{Gpu, LinkMatrix, MemMiB, NodeSpec};

    fn pod(resources: Value, annotations: Value, affinity: Option<Value>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "default", "annotations": annotations},
            "spec": {
                "containers": [{"name": "main", "resources": {"limits": resources}}],
                "affinity": affinity,
            },
        }))
        .unwrap()
    }

    fn known() -> Vec<String> {
        vec!["NVIDIA-A10".to_owned(), "Tesla-T4".to_owned()]
    }

    #[test]
    fn a_share_asks_for_a_gpu_with_as_much_free() {
        let cfg = Config::default();
        let p = pod(json!({"aliyun.com/gpu-mem": "21"}), json!({}), None);
        let requirements = affinity_requirements(&p, &cfg, &known());
        assert_eq!(
            requirements,
            vec![json!({"key": LARGEST_FREE_LABEL, "operator": "Gt", "values": ["21503"]})]
        );
    }

    #[test]
    fn whole_gpus_and_cpu_pods_get_nothing_but_their_models() {
        let cfg = Config::default();
        assert!(
            affinity_requirements(&pod(json!({"cpu": "1"}), json!({}), None), &cfg, &known())
                .is_empty()
        );
        let whole = pod(
            json!({"nvidia.com/gpu": "2"}),
            json!({"gpu-extender.io/model-include": "nvidia-a1*, a100*, Tesla-T4"}),
            None,
        );
        assert_eq!(
            affinity_requirements(&whole, &cfg, &known()),
            vec![json!({
                "key": "aliyun.accelerator/nvidia_name",
                "operator": "In",
                "values": ["NVIDIA-A10", "Tesla-T4"],
            })],
            "the known models the patterns match, and the exact name as written; a100* matches none"
        );
    }

    #[test]
    fn model_lists_name_what_they_match_and_skip_what_cannot_be_said() {
        let cfg = Config::default();
        let excluded = pod(
            json!({"aliyun.com/gpu-mem": "4"}),
            json!({"gpu-extender.io/model-exclude": "tesla-t4", "gpu-extender.io/model-include": "H100*"}),
            None,
        );
        let requirements = affinity_requirements(&excluded, &cfg, &known());
        assert_eq!(requirements.len(), 2, "{requirements:?}");
        assert_eq!(
            requirements[1],
            json!({"key": "aliyun.accelerator/nvidia_name", "operator": "NotIn", "values": ["Tesla-T4", "tesla-t4"]})
        );
        let unreadable = pod(
            json!({"nvidia.com/gpu": "1"}),
            json!({"gpu-extender.io/model-include": "A10/x"}),
            None,
        );
        assert!(affinity_requirements(&unreadable, &cfg, &known()).is_empty());
    }

    #[test]
    fn requirements_join_every_term_once() {
        let requirement = json!({"key": LARGEST_FREE_LABEL, "operator": "Gt", "values": ["3"]});
        let fresh = with_requirements(None, std::slice::from_ref(&requirement)).unwrap();
        assert_eq!(
            fresh,
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [requirement.clone()]}]}}})
        );
        assert_eq!(
            with_requirements(Some(&fresh), std::slice::from_ref(&requirement)),
            None
        );
        let two_terms = json!({
            "podAntiAffinity": {},
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]},
            ]}},
        });
        let joined =
            with_requirements(Some(&two_terms), std::slice::from_ref(&requirement)).unwrap();
        let terms = &joined["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
        assert_eq!(terms[0]["matchExpressions"].as_array().unwrap().len(), 2);
        assert_eq!(terms[1]["matchExpressions"], json!([requirement]));
        assert_eq!(joined["podAntiAffinity"], json!({}));
        assert_eq!(with_requirements(Some(&json!("x")), &[requirement]), None);
    }

    fn node(mode: GpuMode, memory: &[u64]) -> NodeState {
        let gpus: Vec<Gpu> = memory
            .iter()
            .zip(0u16..)
            .map(|(mib, index)| Gpu::new(index, "NVIDIA-A10", MemMiB(*mib)))
            .collect();
        let links = LinkMatrix::uniform(gpus.len());
        NodeState::new(NodeSpec::with_gpus("n", mode, gpus, links))
    }

    #[test]
    fn the_label_is_the_largest_free_share_of_a_sharing_node() {
        let mut shared = node(GpuMode::ShareMemory, &[16_384, 24_576]);
        assert_eq!(largest_free_mib(&shared, 8), Some(24_576));
        shared.gpus[1].mem = MemMiB(20_480);
        shared.gpus[1].shares = 1;
        assert_eq!(largest_free_mib(&shared, 8), Some(16_384));
        shared.gpus[0].shares = 8;
        assert_eq!(
            largest_free_mib(&shared, 8),
            Some(4_096),
            "a GPU at the share cap is full"
        );
        assert_eq!(
            largest_free_mib(&node(GpuMode::Exclusive, &[24_576]), 8),
            None
        );
        assert_eq!(largest_free_mib(&node(GpuMode::CoreMem, &[]), 8), Some(0));
    }
}
