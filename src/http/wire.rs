//! The extender wire types, mirroring `k8s.io/kube-scheduler/extender/v1` exactly: PascalCase
//! keys (the Go structs have no json tags), nothing omitted on output, and `null` accepted for
//! every field that Go may leave nil.
//!
//! Node objects are kept as raw JSON: in non-cache mode the scheduler expects back exactly the
//! objects it sent, and re-encoding 500 full Nodes would cost more than deciding.
//!
//! The router decodes filter and prioritize bodies into [`CandidateArgs`] and writes
//! [`FilterAnswer`] and [`HostScore`]: the same JSON as [`ExtenderArgs`],
//! [`ExtenderFilterResult`] and [`HostPriority`], but borrowing node names from the request
//! instead of allocating a `String` (and a map entry) for each of up to 500 candidates. The
//! owned types stay for whoever reads answers (tests, the fuzz harness, clients).

use std::borrow::Cow;
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

/// [`ExtenderArgs`] as the router decodes it: `NodeNames` borrows from the request body where a
/// name has no escapes. Expecting "struct ExtenderArgs", so that decoding errors read the same.
#[derive(Debug, Default, Deserialize)]
#[serde(
    rename = "ExtenderArgs",
    expecting = "struct ExtenderArgs",
    rename_all = "PascalCase"
)]
pub struct CandidateArgs<'a> {
    #[serde(default)]
    pub pod: Option<Pod>,
    #[serde(default)]
    pub nodes: Option<NodeList>,
    #[serde(default, borrow)]
    pub node_names: Option<Vec<NodeName<'a>>>,
}

/// One entry of `NodeNames`, borrowed from the body unless it had to be unescaped.
#[derive(Debug, Deserialize)]
#[serde(transparent)]
pub struct NodeName<'a>(#[serde(borrow)] pub Cow<'a, str>);

impl NodeName<'_> {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `FailedNodesMap`: node name to reason.
pub type FailedNodesMap = BTreeMap<String, String>;

/// A `FailedNodesMap` to write, from borrowed (name, reason) pairs. Kept sorted by name with one
/// entry per name, the last one given winning: exactly the map that inserting the pairs in order
/// into a [`FailedNodesMap`] gives, and so the same JSON (Go also writes map keys sorted).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeReasons<'a>(Vec<(&'a str, &'a str)>);

impl<'a> NodeReasons<'a> {
    /// The map of `pairs`, given in insertion order.
    pub fn from_pairs(mut pairs: Vec<(&'a str, &'a str)>) -> Self {
        // Stable, so that among equal names the insertion order survives and the last can win.
        pairs.sort_by(|a, b| a.0.cmp(b.0));
        pairs.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                kept.1 = later.1;
            }
            same
        });
        Self(pairs)
    }

    /// The reason given for `name`, if any.
    pub fn get(&self, name: &str) -> Option<&'a str> {
        self.0
            .binary_search_by(|(key, _)| (*key).cmp(name))
            .ok()
            .map(|index| self.0[index].1)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Bytes of the names and reasons, to size the answer's buffer.
    fn text_len(&self) -> usize {
        self.0
            .iter()
            .map(|(name, reason)| name.len() + reason.len() + 6)
            .sum()
    }
}

impl Serialize for NodeReasons<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().copied())
    }
}

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

/// [`ExtenderFilterResult`] as the router writes it: the same keys in the same order, borrowing
/// names, reasons and node objects from the request.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct FilterAnswer<'a> {
    pub nodes: Option<NodeListAnswer<'a>>,
    pub node_names: Option<Vec<&'a str>>,
    pub failed_nodes: NodeReasons<'a>,
    pub failed_and_unresolvable_nodes: NodeReasons<'a>,
    pub error: &'a str,
}

impl FilterAnswer<'_> {
    /// About how many bytes the answer encodes to (a little more, never much less for large
    /// answers), so that it is written into one buffer rather than one grown by copying.
    pub fn encoded_len_hint(&self) -> usize {
        let nodes = self.nodes.as_ref().map_or(0, |list| {
            list.items
                .iter()
                .map(|item| item.get().len() + 1)
                .sum::<usize>()
                + 64
        });
        let names: usize = self.node_names.iter().flatten().map(|n| n.len() + 3).sum();
        128 + nodes
            + names
            + self.failed_nodes.text_len()
            + self.failed_and_unresolvable_nodes.text_len()
            + self.error.len()
    }
}

/// A [`NodeList`] to write: the request's `metadata` and the chosen items, borrowed.
#[derive(Debug, Serialize)]
pub struct NodeListAnswer<'a> {
    pub metadata: &'a serde_json::Map<String, serde_json::Value>,
    pub items: Vec<&'a RawValue>,
}

/// [`HostPriority`] as the router writes it, borrowing the host name from the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct HostScore<'a> {
    pub host: &'a str,
    pub score: i64,
}

impl HostScore<'_> {
    /// About how many bytes `scores` encode to, as [`FilterAnswer::encoded_len_hint`].
    pub fn encoded_len_hint(scores: &[Self]) -> usize {
        // `{"Host":"","Score":10},` is 23 bytes around the name.
        2 + scores.iter().map(|s| s.host.len() + 23).sum::<usize>()
    }
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
    fn node_reasons_write_the_map_that_inserting_in_order_gives() {
        let pairs = [
            ("b", "full"),
            ("a", "never"),
            ("b", "later"),
            ("c", "x"),
            ("a", "last"),
        ];
        let mut map = FailedNodesMap::new();
        for (name, reason) in pairs {
            map.insert(name.to_owned(), reason.to_owned());
        }
        let reasons = NodeReasons::from_pairs(pairs.to_vec());
        assert_eq!(
            serde_json::to_string(&reasons).unwrap(),
            serde_json::to_string(&map).unwrap()
        );
        assert_eq!(
            (reasons.len(), reasons.get("a"), reasons.get("z")),
            (3, Some("last"), None)
        );
    }

    #[test]
    fn borrowed_answers_encode_as_the_wire_types() {
        let list: NodeList = serde_json::from_str(
            r#"{"metadata":{"resourceVersion":"7"},"items":[{"a":1},{"b":2}]}"#,
        )
        .unwrap();
        let answer = FilterAnswer {
            nodes: Some(NodeListAnswer {
                metadata: &list.metadata,
                items: list.items.iter().map(|raw| &**raw).collect(),
            }),
            node_names: Some(vec!["gpu-a", "gpu-\"c\""]),
            failed_nodes: NodeReasons::from_pairs(vec![("gpu-b", "full")]),
            failed_and_unresolvable_nodes: NodeReasons::default(),
            error: "",
        };
        let owned = ExtenderFilterResult {
            nodes: Some(serde_json::from_str(&serde_json::to_string(&list).unwrap()).unwrap()),
            node_names: Some(vec!["gpu-a".into(), "gpu-\"c\"".into()]),
            failed_nodes: [("gpu-b".to_owned(), "full".to_owned())].into(),
            ..Default::default()
        };
        let json = serde_json::to_string(&answer).unwrap();
        assert_eq!(json, serde_json::to_string(&owned).unwrap());
        assert!(answer.encoded_len_hint() >= json.len());
        let scores = [
            HostScore {
                host: "a",
                score: 10,
            },
            HostScore {
                host: "bb",
                score: 0,
            },
        ];
        let owned: HostPriorityList = scores
            .iter()
            .map(|s| HostPriority {
                host: s.host.to_owned(),
                score: s.score,
            })
            .collect();
        let json = serde_json::to_string(&scores).unwrap();
        assert_eq!(json, serde_json::to_string(&owned).unwrap());
        assert!(HostScore::encoded_len_hint(&scores) >= json.len());
    }

    #[test]
    fn candidate_args_borrow_names_and_fail_as_extender_args() {
        let body = fixture!("filter-cache.json");
        let args: CandidateArgs<'_> = serde_json::from_str(body).unwrap();
        let owned: ExtenderArgs = serde_json::from_str(body).unwrap();
        let names: Vec<&str> = args
            .node_names
            .iter()
            .flatten()
            .map(NodeName::as_str)
            .collect();
        assert_eq!(
            Some(names),
            owned
                .node_names
                .as_ref()
                .map(|n| n.iter().map(String::as_str).collect())
        );
        assert!(
            args.node_names
                .iter()
                .flatten()
                .all(|n| matches!(n.0, Cow::Borrowed(_)))
        );
        assert_eq!(args.pod, owned.pod);
        let escaped: CandidateArgs<'_> =
            serde_json::from_str(r#"{"NodeNames":["gpu\u002da"]}"#).unwrap();
        assert_eq!(escaped.node_names.unwrap()[0].as_str(), "gpu-a");
        for bad in [
            "[1]",
            "\"{Pod\"",
            "[]",
            "{\"NodeNames\":[1]}",
            "{\"NodeNames\":5}",
            "{\"NodeNames\":[\"a\"],\"NodeNames\":[]}",
            "{\"NodeNames\":[\"a\\ud800\"]}",
            "{\"Pod\":{\"metadata\":{\"name\":7}}}",
            "{\"Nodes\":{\"items\":{}}}",
            "{",
        ] {
            let borrowed = serde_json::from_str::<CandidateArgs<'_>>(bad).err();
            let owned = serde_json::from_str::<ExtenderArgs>(bad).err();
            assert_eq!(
                borrowed.map(|e| e.to_string()),
                owned.map(|e| e.to_string()),
                "{bad}"
            );
        }
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
