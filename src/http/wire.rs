//! The extender wire types, mirroring `k8s.io/kube-scheduler/extender/v1` exactly: PascalCase
//! keys (the Go structs have no json tags), nothing omitted on output, and `null` accepted for
//! every field that Go may leave nil.
//!
//! Node objects are kept as raw JSON: in non-cache mode the scheduler expects back exactly the
//! objects it sent, and re-encoding 500 full Nodes would cost more than deciding.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

/// `null` or absent reads as the type's default (Go's nil slice or map).
fn nullable<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// A `v1.NodeList` as the scheduler marshals it: `{"metadata":{},"items":[...]}`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct NodeList {
    #[serde(default, deserialize_with = "nullable")]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    #[serde(default, deserialize_with = "nullable")]
    pub items: Vec<Box<RawValue>>,
}

/// `ExtenderArgs`: the body of filter and prioritize.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderArgs {
    #[serde(default)]
    pub pod: Option<Pod>,
    /// Full nodes, sent when `nodeCacheCapable: false`.
    #[serde(default)]
    pub nodes: Option<NodeList>,
    /// Node names, sent when `nodeCacheCapable: true`.
    #[serde(default)]
    pub node_names: Option<Vec<String>>,
}

/// `FailedNodesMap`: node name to reason.
pub type FailedNodesMap = BTreeMap<String, String>;

/// `ExtenderFilterResult`.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderFilterResult {
    #[serde(default)]
    pub nodes: Option<NodeList>,
    #[serde(default)]
    pub node_names: Option<Vec<String>>,
    #[serde(default, deserialize_with = "nullable")]
    pub failed_nodes: FailedNodesMap,
    #[serde(default, deserialize_with = "nullable")]
    pub failed_and_unresolvable_nodes: FailedNodesMap,
    #[serde(default, deserialize_with = "nullable")]
    pub error: String,
}

/// `HostPriority`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct HostPriority {
    pub host: String,
    pub score: i64,
}

/// `HostPriorityList`: a bare JSON array on the wire.
pub type HostPriorityList = Vec<HostPriority>;

/// `ExtenderBindingArgs`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingArgs {
    #[serde(rename = "PodName", default, deserialize_with = "nullable")]
    pub pod_name: String,
    #[serde(rename = "PodNamespace", default, deserialize_with = "nullable")]
    pub pod_namespace: String,
    #[serde(rename = "PodUID", default, deserialize_with = "nullable")]
    pub pod_uid: String,
    #[serde(rename = "Node", default, deserialize_with = "nullable")]
    pub node: String,
}

/// `ExtenderBindingResult`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderBindingResult {
    #[serde(default, deserialize_with = "nullable")]
    pub error: String,
}

/// `MetaPod`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaPod {
    #[serde(rename = "UID", default, deserialize_with = "nullable")]
    pub uid: String,
}

/// `MetaVictims`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaVictims {
    #[serde(rename = "Pods", default, deserialize_with = "nullable")]
    pub pods: Vec<MetaPod>,
    #[serde(rename = "NumPDBViolations", default, deserialize_with = "nullable")]
    pub num_pdb_violations: i64,
}

/// `Victims`: full pods, sent in non-cache mode.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Victims {
    #[serde(rename = "Pods", default, deserialize_with = "nullable")]
    pub pods: Vec<Pod>,
    #[serde(rename = "NumPDBViolations", default, deserialize_with = "nullable")]
    pub num_pdb_violations: i64,
}

/// `ExtenderPreemptionArgs`.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderPreemptionArgs {
    #[serde(default)]
    pub pod: Option<Pod>,
    #[serde(default, deserialize_with = "nullable")]
    pub node_name_to_victims: BTreeMap<String, Option<Victims>>,
    #[serde(default, deserialize_with = "nullable")]
    pub node_name_to_meta_victims: BTreeMap<String, Option<MetaVictims>>,
}

/// `ExtenderPreemptionResult`: always meta victims, whatever the cache mode.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderPreemptionResult {
    #[serde(default, deserialize_with = "nullable")]
    pub node_name_to_meta_victims: BTreeMap<String, MetaVictims>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_result_keeps_every_key_with_pascal_case() {
        let result = ExtenderFilterResult {
            node_names: Some(vec!["gpu-a".into()]),
            failed_nodes: [("gpu-b".to_owned(), "full".to_owned())].into(),
            ..Default::default()
        };
        let json = serde_json::to_value(&result).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "Nodes": null,
                "NodeNames": ["gpu-a"],
                "FailedNodes": {"gpu-b": "full"},
                "FailedAndUnresolvableNodes": {},
                "Error": ""
            })
        );
    }

    #[test]
    fn nulls_are_accepted_everywhere_go_may_send_them() {
        let args: ExtenderArgs =
            serde_json::from_str(r#"{"Pod":null,"Nodes":null,"NodeNames":null}"#).unwrap();
        assert!(args.pod.is_none() && args.nodes.is_none() && args.node_names.is_none());
        let list: NodeList = serde_json::from_str(r#"{"metadata":null,"items":null}"#).unwrap();
        assert!(list.items.is_empty());
        let preempt: ExtenderPreemptionArgs = serde_json::from_str(
            r#"{"Pod":null,"NodeNameToVictims":null,"NodeNameToMetaVictims":{"n":{"Pods":null,"NumPDBViolations":0},"m":null}}"#,
        )
        .unwrap();
        assert_eq!(preempt.node_name_to_meta_victims.len(), 2);
        let bind: ExtenderBindingArgs =
            serde_json::from_str(r#"{"PodName":"p","PodNamespace":null,"PodUID":"u","Node":"n"}"#)
                .unwrap();
        assert_eq!(bind.pod_uid, "u");
        assert_eq!(bind.pod_namespace, "");
    }

    /// Bodies recorded from a real kube-scheduler v1.34 (see tests/fixtures/README.md).
    macro_rules! fixture {
        ($name:literal) => {
            include_str!(concat!("../../tests/fixtures/kube-scheduler-v1.34/", $name))
        };
    }

    #[test]
    fn real_scheduler_bodies_decode() {
        for body in [
            fixture!("filter-cache.json"),
            fixture!("prioritize-cache.json"),
        ] {
            let args: ExtenderArgs = serde_json::from_str(body).unwrap();
            assert!(args.pod.is_some() && args.nodes.is_none());
            assert_eq!(args.node_names.unwrap(), vec!["gpu-a", "gpu-b"]);
        }
        for body in [
            fixture!("filter-nocache.json"),
            fixture!("prioritize-nocache.json"),
        ] {
            let args: ExtenderArgs = serde_json::from_str(body).unwrap();
            assert!(args.node_names.is_none());
            assert_eq!(args.nodes.unwrap().items.len(), 2);
        }
        let cache: ExtenderPreemptionArgs =
            serde_json::from_str(fixture!("preempt-cache.json")).unwrap();
        assert!(cache.node_name_to_victims.is_empty());
        assert_eq!(
            cache.node_name_to_meta_victims["gpu-a"]
                .as_ref()
                .unwrap()
                .pods
                .len(),
            2
        );
        let full: ExtenderPreemptionArgs =
            serde_json::from_str(fixture!("preempt-nocache.json")).unwrap();
        assert!(!full.node_name_to_victims.is_empty());
        let bind: ExtenderBindingArgs = serde_json::from_str(fixture!("bind.json")).unwrap();
        assert_eq!(
            (bind.pod_name.as_str(), bind.node.as_str()),
            ("urgent2", "gpu-a")
        );
    }

    #[test]
    fn prioritize_answer_is_a_bare_array() {
        let list: HostPriorityList = vec![HostPriority {
            host: "a".into(),
            score: 10,
        }];
        assert_eq!(
            serde_json::to_string(&list).unwrap(),
            r#"[{"Host":"a","Score":10}]"#
        );
    }

    #[test]
    fn binding_and_meta_pod_keys_match_go_field_names() {
        let bind = ExtenderBindingArgs {
            pod_name: "p".into(),
            pod_namespace: "ns".into(),
            pod_uid: "u".into(),
            node: "n".into(),
        };
        assert_eq!(
            serde_json::to_string(&bind).unwrap(),
            r#"{"PodName":"p","PodNamespace":"ns","PodUID":"u","Node":"n"}"#
        );
        let victims = MetaVictims {
            pods: vec![MetaPod { uid: "x".into() }],
            num_pdb_violations: 1,
        };
        assert_eq!(
            serde_json::to_string(&victims).unwrap(),
            r#"{"Pods":[{"UID":"x"}],"NumPDBViolations":1}"#
        );
    }
}
