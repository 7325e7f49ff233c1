//! kube-scheduler's node-level checks that run before the extender is asked, as `explain` applies
//! them: a cordoned node, taints the pod does not tolerate, its node selector and required node
//! affinity, and the node's allocatable count of the GPU resources kube-scheduler checks itself.
//! Pure functions of the Node, the Pod, what the node's other pods request, and the [`Config`].
//!
//! The extender only ever sees the nodes that passed these filters, so a verdict of the GPU
//! engine on a node that fails one of them would contradict kube-scheduler's own event.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, NodeSpec, Pod, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::quantity::Quantity;
use super::translate::{TranslateError, pod_resource_request};
use crate::config::{Config, Sharing};

/// The kube-scheduler filter plugin that refuses a node, in the order kube-scheduler runs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    /// The node is cordoned (`spec.unschedulable`) and the pod does not tolerate that.
    NodeUnschedulable,
    /// A `NoSchedule` or `NoExecute` taint the pod does not tolerate.
    TaintToleration,
    /// The pod's `nodeSelector` or required node affinity does not match the node.
    NodeAffinity,
    /// The node's allocatable count of a GPU resource, less what its pods request, is too small.
    NodeResourcesFit,
}

impl Layer {
    /// The plugin's name, as kube-scheduler's configuration and logs spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NodeUnschedulable => "NodeUnschedulable",
            Self::TaintToleration => "TaintToleration",
            Self::NodeAffinity => "NodeAffinity",
            Self::NodeResourcesFit => "NodeResourcesFit",
        }
    }
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why kube-scheduler refuses the node before the extender is asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRefusal {
    pub layer: Layer,
    /// In words, starting with kube-scheduler's own reason (`Insufficient nvidia.com/gpu`).
    pub detail: String,
}

impl NodeRefusal {
    /// Whether waiting (or preemption) could lift it: only a resource count can change by pods
    /// leaving; a taint, label or affinity needs someone to change the node or the pod.
    pub fn is_resolvable(&self) -> bool {
        self.layer == Layer::NodeResourcesFit
    }
}

/// The GPU resource names kube-scheduler's NodeResourcesFit checks against node allocatable:
/// whole GPUs, topology GPUs and GPU memory, which the shipped scheduler configuration leaves to
/// kube-scheduler (`ignoredByScheduler: false`). The compute percentage is `ignoredByScheduler:
/// true` there and not checked; with `resources.sharing: hami` neither is GPU memory, which
/// HAMi's device plugin does not advertise as a node resource.
pub fn checked_resources(cfg: &Config) -> Vec<&str> {
    let r = &cfg.resources;
    let mut names = vec![r.whole_gpu.as_str(), r.topology_gpu.as_str()];
    if r.sharing == Sharing::Cgpu {
        names.push(&r.gpu_mem);
    }
    names
}

/// What the pods bound to each node request of [`checked_resources`], by node name: what
/// NodeResourcesFit subtracts from allocatable. A pod whose request cannot be read counts 0.
pub fn requested_by_node<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    cfg: &Config,
) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut used: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for pod in pods {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_ref()) else {
            continue;
        };
        for name in checked_resources(cfg) {
            let amount = pod_resource_request(pod, name).unwrap_or(0);
            if amount > 0 {
                let total = used
                    .entry(node.clone())
                    .or_default()
                    .entry(name.to_owned())
                    .or_default();
                *total = total.saturating_add(amount);
            }
        }
    }
    used
}

/// The first of kube-scheduler's node-level filters that refuses `pod` on `node`, in its order
/// (NodeUnschedulable, TaintToleration, NodeAffinity, NodeResourcesFit); `None` when all pass. `used` is what the
/// node's pods already request (from [`requested_by_node`]). A GPU request that cannot be read is
/// an error: the pod's translation reports it the same way.
pub fn node_refusal(
    node: &Node,
    pod: &Pod,
    used: Option<&BTreeMap<String, u64>>,
    cfg: &Config,
) -> Result<Option<NodeRefusal>, TranslateError> {
    if let Some(refusal) = claim_refusal(node, pod) {
        return Ok(Some(refusal));
    }
    let asks = resource_asks(pod, cfg)?;
    Ok(resource_refusal(node, &asks, used))
}

/// The first of the filters that read the node's cordon, taints and labels against the pod's
/// tolerations, node selector and required affinity (NodeUnschedulable, TaintToleration,
/// NodeAffinity) that refuses `pod` on `node`.
pub fn claim_refusal(node: &Node, pod: &Pod) -> Option<NodeRefusal> {
    let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    // The taint is built only for a cordoned node: the estimator asks this of every node.
    if cordoned && {
        let unschedulable = Taint {
            key: "node.kubernetes.io/unschedulable".to_owned(),
            effect: "NoSchedule".to_owned(),
            ..Taint::default()
        };
        !tolerations(pod)
            .iter()
            .any(|t| tolerates(t, &unschedulable))
    } {
        return Some(NodeRefusal {
            layer: Layer::NodeUnschedulable,
            detail: "node(s) were unschedulable (cordoned)".to_owned(),
        });
    }
    if let Some(taint) = untolerated_taint(node, pod) {
        return Some(NodeRefusal {
            layer: Layer::TaintToleration,
            detail: format!(
                "node(s) had untolerated taint {{{}: {}}} ({})",
                taint.key,
                taint.value.as_deref().unwrap_or(""),
                taint.effect
            ),
        });
    }
    affinity_mismatch(node, pod).map(|detail| NodeRefusal {
        layer: Layer::NodeAffinity,
        detail,
    })
}

/// Whether `pod` restricts the nodes it runs on by labels or name: a non-empty node selector, or
/// required node affinity (even with no terms, which matches no node). A pod that names no node
/// is refused only by cordon and taints ([`NodeClaims::admits_unclaimed`]).
pub fn names_nodes(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let selects = spec.node_selector.as_ref().is_some_and(|s| !s.is_empty());
    let requires = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .is_some_and(|a| {
            a.required_during_scheduling_ignored_during_execution
                .is_some()
        });
    selects || requires
}

/// What `pod` asks of each of [`checked_resources`] it asks any of: read once, then compared
/// with many nodes by [`resource_refusal`].
pub fn resource_asks(pod: &Pod, cfg: &Config) -> Result<Vec<(String, u64)>, TranslateError> {
    let mut asks = Vec::new();
    for name in checked_resources(cfg) {
        let asked = pod_resource_request(pod, name)?;
        if asked > 0 {
            asks.push((name.to_owned(), asked));
        }
    }
    Ok(asks)
}

/// kube-scheduler's NodeResourcesFit on the GPU resources it checks: the first of `asks` that
/// the node's allocatable, less `used`, cannot hold.
pub fn resource_refusal(
    node: &Node,
    asks: &[(String, u64)],
    used: Option<&BTreeMap<String, u64>>,
) -> Option<NodeRefusal> {
    refusal_by_allocatable(|name| allocatable(node, name), asks, used)
}

/// [`resource_refusal`] given the node's allocatable of each resource as a whole number.
fn refusal_by_allocatable(
    allocatable: impl Fn(&str) -> u64,
    asks: &[(String, u64)],
    used: Option<&BTreeMap<String, u64>>,
) -> Option<NodeRefusal> {
    for (name, asked) in asks {
        let allocatable = allocatable(name);
        let in_use = used.and_then(|u| u.get(name)).copied().unwrap_or(0);
        if in_use.saturating_add(*asked) > allocatable {
            return Some(NodeRefusal {
                layer: Layer::NodeResourcesFit,
                detail: format!(
                    "Insufficient {name}: the node has {allocatable} allocatable, its pods \
                     request {in_use}, the pod asks {asked}"
                ),
            });
        }
    }
    None
}

/// What kube-scheduler's node-level filters read of one node, kept by the estimator for every
/// node to apply a template's node claims: a copy of the node with only its name, labels,
/// cordon and taints, and its allocatable read once as whole numbers (parsing each quantity on
/// every estimate was a fifth of an estimate's cost over thousands of nodes).
#[derive(Clone, Debug, PartialEq)]
pub struct NodeClaims {
    node: Node,
    /// Neither cordoned nor tainted NoSchedule or NoExecute: only a pod's node selector or
    /// required affinity can keep it off this node ([`NodeClaims::admits_unclaimed`]).
    open: bool,
    /// `status.allocatable` as kube-scheduler counts it; a quantity that does not read as a
    /// whole number is absent here, so it counts 0 as [`allocatable`] counts it.
    allocatable: BTreeMap<String, u64>,
}

impl NodeClaims {
    /// The node's label `key`, as the watch last saw it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.node
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(key))
            .map(String::as_str)
    }

    /// What the filters read of `node`.
    pub fn of(node: &Node) -> Self {
        let allocatable = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|(name, _)| {
                let amount = allocatable(node, name);
                (amount > 0).then(|| (name.clone(), amount))
            })
            .collect();
        let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
        let repelling = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_deref())
            .unwrap_or(&[])
            .iter()
            .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute");
        Self {
            node: claims_only(node),
            open: !cordoned && !repelling,
            allocatable,
        }
    }

    /// [`claim_refusal`] on this node.
    pub fn claim_refusal(&self, pod: &Pod) -> Option<NodeRefusal> {
        claim_refusal(&self.node, pod)
    }

    /// Whether [`claim_refusal`] admits, without reading them, every pod that names no node
    /// ([`names_nodes`] false): the node is neither cordoned nor tainted NoSchedule or
    /// NoExecute, so tolerations do not matter and no selector or affinity is asked. Lets the
    /// estimator skip the claims of most nodes for most templates.
    pub fn admits_unclaimed(&self) -> bool {
        self.open
    }

    /// [`resource_refusal`] on this node.
    pub fn resource_refusal(
        &self,
        asks: &[(String, u64)],
        used: Option<&BTreeMap<String, u64>>,
    ) -> Option<NodeRefusal> {
        refusal_by_allocatable(
            |name| self.allocatable.get(name).copied().unwrap_or(0),
            asks,
            used,
        )
    }
}

/// One pod as kube-scheduler's node-level filters read it, for checking many nodes: its GPU
/// resource asks read once, and whether it restricts the nodes it runs on at all.
#[derive(Clone, Debug)]
pub struct PodClaims<'p> {
    pod: &'p Pod,
    asks: Vec<(String, u64)>,
    unclaimed: bool,
}

impl<'p> PodClaims<'p> {
    /// Reads `pod`'s asks of [`checked_resources`]; an unreadable quantity is an error.
    pub fn of(pod: &'p Pod, cfg: &Config) -> Result<Self, TranslateError> {
        Ok(Self {
            pod,
            asks: resource_asks(pod, cfg)?,
            unclaimed: !names_nodes(pod),
        })
    }

    /// Whether the node-level filters admit the pod on the node `name`, whose claims are
    /// `claims` (its labels, taints, cordon and allocatable), by allocatable alone: what the
    /// node's other pods use is the engine's to judge. A node with no claims recorded (a table
    /// built by hand) has no labels, taints or cordon, and no allocatable to check.
    pub fn admitted_by(&self, name: &str, claims: Option<&NodeClaims>) -> bool {
        match claims {
            // Most pods name no node and most nodes are open to them: their claims are then not
            // read (the same answer as reading them, checked by the unit tests).
            Some(claims) => {
                let claims_checked = !(self.unclaimed && claims.admits_unclaimed());
                !(claims_checked && claims.claim_refusal(self.pod).is_some())
                    && claims.resource_refusal(&self.asks, None).is_none()
            }
            None => claim_refusal(&named_node(name), self.pod).is_none(),
        }
    }
}

/// A node known only by its name.
fn named_node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

/// A copy of `node` with only what [`claim_refusal`] reads: its name and labels, cordon and
/// taints.
fn claims_only(node: &Node) -> Node {
    Node {
        metadata: ObjectMeta {
            name: node.metadata.name.clone(),
            labels: node.metadata.labels.clone(),
            ..ObjectMeta::default()
        },
        spec: node.spec.as_ref().map(|spec| NodeSpec {
            unschedulable: spec.unschedulable,
            taints: spec.taints.clone(),
            ..NodeSpec::default()
        }),
        status: None,
    }
}

/// The node's `status.allocatable` of `name` as a whole number (kube-scheduler reads allocatable
/// only); 0 when absent or unreadable, as kube-scheduler counts a resource the node lacks.
fn allocatable(node: &Node, name: &str) -> u64 {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(name))
        .and_then(|q| Quantity::parse(&q.0).ok())
        .and_then(|q| q.floor_scaled(1, 1).ok())
        .unwrap_or(0)
}

/// The first `NoSchedule` or `NoExecute` taint of the node that no toleration of the pod
/// tolerates (`PreferNoSchedule` only scores).
fn untolerated_taint<'a>(node: &'a Node, pod: &Pod) -> Option<&'a Taint> {
    let tolerations = tolerations(pod);
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or(&[])
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .find(|taint| !tolerations.iter().any(|t| tolerates(t, taint)))
}

fn tolerations(pod: &Pod) -> &[Toleration] {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or(&[])
}

/// Kubernetes' `Toleration.ToleratesTaint`: the effect matches (or the toleration names none),
/// the key matches (or the toleration has none and operator `Exists`), and with `Equal` (the
/// default) the values are equal.
fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or("");
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" => {
            !key.is_empty()
                && toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        _ => false,
    }
}

/// Why the pod's `nodeSelector` or required node affinity does not match the node, if it does not.
fn affinity_mismatch(node: &Node, pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    if let Some(selector) = spec.node_selector.as_ref() {
        for (key, value) in selector {
            if labels.get(key) != Some(value) {
                return Some(format!(
                    "node(s) didn't match Pod's node affinity/selector: nodeSelector \
                     {key}={value}, the node has {}",
                    labels
                        .get(key)
                        .map_or_else(|| "no such label".to_owned(), |v| format!("{key}={v}"))
                ));
            }
        }
    }
    let terms = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice())?;
    let name = node.metadata.name.as_deref().unwrap_or("");
    if terms.iter().any(|term| term_matches(term, labels, name)) {
        None
    } else {
        Some(format!(
            "node(s) didn't match Pod's node affinity/selector: none of the {} required node \
             affinity term(s) matches the node's labels",
            terms.len()
        ))
    }
}

/// A node selector term: all its expressions and fields hold; a term with neither matches
/// nothing (Kubernetes' rule).
fn term_matches(term: &NodeSelectorTerm, labels: &BTreeMap<String, String>, name: &str) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or(&[]);
    let fields = term.match_fields.as_deref().unwrap_or(&[]);
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions
        .iter()
        .all(|r| requirement_holds(r, labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| {
            // The only field Kubernetes supports here.
            r.key == "metadata.name" && requirement_holds(r, Some(name))
        })
}

/// One requirement on one label's value (`None`: the node lacks the label).
fn requirement_holds(requirement: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = requirement.values.as_deref().unwrap_or(&[]);
    let number = |text: &str| text.trim().parse::<i64>().ok();
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), Some(bound)) = (
                value.and_then(number),
                values.first().and_then(|b| number(b)),
            ) else {
                return false;
            };
            if requirement.operator == "Gt" {
                have > bound
            } else {
                have < bound
            }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on a broken fixture")]

    use serde_json::json;

    use super::*;

    fn node(value: serde_json::Value) -> Node {
        serde_json::from_value(value).unwrap()
    }

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn refusal(node: &Node, pod: &Pod) -> Option<NodeRefusal> {
        node_refusal(node, pod, None, &Config::default()).unwrap()
    }

    fn gpu_pod(spec: serde_json::Value) -> Pod {
        let mut value = json!({
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        });
        if let (Some(target), Some(extra)) = (value["spec"].as_object_mut(), spec.as_object()) {
            target.extend(extra.clone());
        }
        pod(value)
    }

    fn gpu_node(labels: serde_json::Value, taints: serde_json::Value) -> Node {
        node(json!({
            "metadata": {"name": "n", "labels": labels},
            "spec": {"taints": taints},
            "status": {"allocatable": {"nvidia.com/gpu": "2"}}
        }))
    }

    #[test]
    fn taints_refuse_unless_tolerated() {
        let tainted = gpu_node(
            json!({}),
            json!([{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]),
        );
        let refused = refusal(&tainted, &gpu_pod(json!({}))).unwrap();
        assert_eq!(refused.layer, Layer::TaintToleration);
        assert!(
            refused.detail.contains("dedicated: infer"),
            "{}",
            refused.detail
        );
        assert!(!refused.is_resolvable());
        for tolerations in [
            json!([{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]),
            json!([{"key": "dedicated", "operator": "Exists"}]),
            json!([{"operator": "Exists"}]),
        ] {
            let pod = gpu_pod(json!({"tolerations": tolerations}));
            assert_eq!(refusal(&tainted, &pod), None, "{tolerations}");
        }
        let wrong = gpu_pod(json!({"tolerations": [{"key": "dedicated", "value": "train"}]}));
        assert!(refusal(&tainted, &wrong).is_some());
        // PreferNoSchedule only scores.
        let soft = gpu_node(
            json!({}),
            json!([{"key": "k", "effect": "PreferNoSchedule"}]),
        );
        assert_eq!(refusal(&soft, &gpu_pod(json!({}))), None);
    }

    #[test]
    fn an_open_node_admits_every_pod_that_names_no_node_as_the_full_check_does() {
        let nodes = [
            gpu_node(json!({"zone": "a"}), json!([])),
            gpu_node(
                json!({}),
                json!([{"key": "k", "effect": "PreferNoSchedule"}]),
            ),
            gpu_node(json!({}), json!([{"key": "k", "effect": "NoSchedule"}])),
            gpu_node(
                json!({}),
                json!([{"key": "k", "value": "v", "effect": "NoExecute"}]),
            ),
            node(json!({"metadata": {"name": "n"}, "spec": {"unschedulable": true}})),
        ];
        let pods = [
            gpu_pod(json!({})),
            gpu_pod(json!({"nodeSelector": {}})),
            gpu_pod(json!({"tolerations": [{"operator": "Exists"}]})),
            gpu_pod(json!({"tolerations": [{"key": "k", "operator": "Exists"}]})),
            gpu_pod(json!({"affinity": {"nodeAffinity": {}}})),
            gpu_pod(json!({"nodeSelector": {"zone": "b"}})),
            gpu_pod(json!({"affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}
            }}})),
        ];
        let open: Vec<bool> = nodes
            .iter()
            .map(|n| NodeClaims::of(n).admits_unclaimed())
            .collect();
        assert_eq!(open, [true, true, false, false, false]);
        let naming: Vec<bool> = pods.iter().map(names_nodes).collect();
        assert_eq!(naming, [false, false, false, false, false, true, true]);
        for node in &nodes {
            let claims = NodeClaims::of(node);
            for pod in &pods {
                if claims.admits_unclaimed() && !names_nodes(pod) {
                    assert_eq!(claims.claim_refusal(pod), None, "{node:?} {pod:?}");
                }
            }
        }
        // The two pods that name nodes are refused by the open node for their own reasons.
        let claims = NodeClaims::of(&nodes[0]);
        assert!(claims.claim_refusal(&pods[5]).is_some());
        assert!(claims.claim_refusal(&pods[6]).is_some());
    }

    #[test]
    fn a_cordoned_node_refuses_unless_the_pod_tolerates_it() {
        let cordoned = node(json!({
            "metadata": {"name": "n"},
            "spec": {"unschedulable": true},
            "status": {"allocatable": {"nvidia.com/gpu": "2"}}
        }));
        let refused = refusal(&cordoned, &gpu_pod(json!({}))).unwrap();
        assert_eq!(refused.layer, Layer::NodeUnschedulable);
        let tolerant = gpu_pod(json!({"tolerations": [
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
        ]}));
        assert_eq!(refusal(&cordoned, &tolerant), None);
    }

    #[test]
    fn node_selector_and_required_affinity_must_match() {
        let a100 = gpu_node(json!({"pool": "a100", "gen": "4"}), json!([]));
        let refused = refusal(&a100, &gpu_pod(json!({"nodeSelector": {"pool": "t4"}}))).unwrap();
        assert_eq!(refused.layer, Layer::NodeAffinity);
        assert!(refused.detail.contains("pool=t4"), "{}", refused.detail);
        assert_eq!(
            refusal(&a100, &gpu_pod(json!({"nodeSelector": {"pool": "a100"}}))),
            None
        );
        let affinity = |expressions: serde_json::Value| {
            gpu_pod(json!({"affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": expressions}]
                }
            }}}))
        };
        let refused = refusal(
            &a100,
            &affinity(json!([{"key": "pool", "operator": "In", "values": ["t4", "a10"]}])),
        )
        .unwrap();
        assert_eq!(refused.layer, Layer::NodeAffinity);
        assert!(
            refused.detail.contains("required node affinity"),
            "{}",
            refused.detail
        );
        for matching in [
            json!([{"key": "pool", "operator": "In", "values": ["a100"]}]),
            json!([{"key": "pool", "operator": "NotIn", "values": ["t4"]}]),
            json!([{"key": "gen", "operator": "Gt", "values": ["3"]}]),
            json!([{"key": "spot", "operator": "DoesNotExist"}]),
        ] {
            assert_eq!(
                refusal(&a100, &affinity(matching.clone())),
                None,
                "{matching}"
            );
        }
        assert!(
            refusal(
                &a100,
                &affinity(json!([{"key": "gen", "operator": "Lt", "values": ["4"]}]))
            )
            .is_some()
        );
    }

    #[test]
    fn a_node_that_does_not_advertise_the_resource_is_insufficient() {
        // The demo's batch-2: asks nvidia.com/gpu; a topology node advertises aliyun.com/gpu.
        let topology = node(json!({
            "metadata": {"name": "a100-nvlink"},
            "status": {"allocatable": {"aliyun.com/gpu": "8", "cpu": "64"}}
        }));
        let refused = refusal(&topology, &gpu_pod(json!({}))).unwrap();
        assert_eq!(refused.layer, Layer::NodeResourcesFit);
        assert!(
            refused.detail.starts_with("Insufficient nvidia.com/gpu"),
            "{}",
            refused.detail
        );
        assert!(refused.is_resolvable());
    }

    #[test]
    fn allocatable_counts_less_what_bound_pods_request() {
        let node = gpu_node(json!({}), json!([]));
        let bound = |name: &str, gpus: &str| {
            pod(json!({
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"nodeName": "n", "containers": [
                    {"name": "main", "resources": {"requests": {"nvidia.com/gpu": gpus}}}
                ]}
            }))
        };
        let cfg = Config::default();
        let one = [bound("a", "1")];
        let used = requested_by_node(&one, &cfg);
        assert_eq!(used["n"]["nvidia.com/gpu"], 1);
        let two = gpu_pod(json!({"containers": [
            {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}}}
        ]}));
        let refused = node_refusal(&node, &two, used.get("n"), &cfg)
            .unwrap()
            .unwrap();
        assert_eq!(refused.layer, Layer::NodeResourcesFit);
        assert!(
            refused
                .detail
                .contains("the node has 2 allocatable, its pods request 1, the pod asks 2"),
            "{}",
            refused.detail
        );
        assert_eq!(
            node_refusal(&node, &gpu_pod(json!({})), used.get("n"), &cfg).unwrap(),
            None
        );
    }
}
