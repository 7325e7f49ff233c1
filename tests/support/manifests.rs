//! Reading the Kubernetes manifests in `deploy/`: the objects of a kustomization (its plain
//! `resources`, without running kustomize) or of `kubectl kustomize` output, and the few fields
//! the tests look at.

use std::path::Path;

use serde_yaml_ng::Value;

use super::api_calls::Permission;

/// The objects of a multi-document YAML text (empty documents skipped).
pub fn parse_documents(text: &str, origin: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| {
            Value::deserialize(doc).unwrap_or_else(|e| panic!("{origin}: not valid YAML: {e}"))
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// The objects a kustomization directory lists under `resources` (files, or directories that
/// are kustomizations themselves), in order. Generators and transformers are not applied: the
/// RBAC objects are plain resources, and `tests/deploy_manifests.rs` checks the real rendering.
pub fn kustomization_resources(dir: &Path) -> Vec<Value> {
    let path = dir.join("kustomization.yaml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let kustomization: Value = serde_yaml_ng::from_str(&text)
        .unwrap_or_else(|e| panic!("{}: not valid YAML: {e}", path.display()));
    let mut objects = Vec::new();
    for resource in kustomization["resources"]
        .as_sequence()
        .into_iter()
        .flatten()
    {
        let name = resource.as_str().expect("resources entries are strings");
        let target = dir.join(name);
        if target.is_dir() {
            objects.extend(kustomization_resources(&target));
        } else {
            let text = std::fs::read_to_string(&target)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", target.display()));
            objects.extend(parse_documents(&text, &target.display().to_string()));
        }
    }
    objects
}

pub fn kind(object: &Value) -> &str {
    object["kind"].as_str().unwrap_or_default()
}

pub fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

pub fn namespace(object: &Value) -> &str {
    object["metadata"]["namespace"].as_str().unwrap_or_default()
}

pub fn label<'a>(object: &'a Value, key: &str) -> Option<&'a str> {
    object["metadata"]["labels"][key].as_str()
}

/// `Kind namespace/name`, for messages.
pub fn describe(object: &Value) -> String {
    match namespace(object) {
        "" => format!("{} {}", kind(object), name(object)),
        ns => format!("{} {ns}/{}", kind(object), name(object)),
    }
}

/// The objects of one kind.
pub fn of_kind<'a>(objects: &'a [Value], wanted: &'a str) -> impl Iterator<Item = &'a Value> {
    objects.iter().filter(move |o| kind(o) == wanted)
}

/// The one object of a kind and name; panics naming what is missing.
pub fn find<'a>(objects: &'a [Value], wanted_kind: &str, wanted_name: &str) -> &'a Value {
    let found: Vec<&Value> = objects
        .iter()
        .filter(|o| kind(o) == wanted_kind && name(o) == wanted_name)
        .collect();
    match found.as_slice() {
        [one] => one,
        [] => panic!("no {wanted_kind} {wanted_name} in the manifests"),
        _ => panic!("{} objects {wanted_kind} {wanted_name}", found.len()),
    }
}

pub fn strings(value: &Value) -> Vec<String> {
    value
        .as_sequence()
        .into_iter()
        .flatten()
        .map(|v| match v {
            Value::String(s) => s.clone(),
            other => panic!("expected a string, found {other:?}"),
        })
        .collect()
}

/// One RBAC rule, expanded: every (group, resource, verb) it grants, and the resourceNames it
/// is limited to (empty: any name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub permission: Permission,
    pub resource_names: Vec<String>,
}

/// The grants of a Role or ClusterRole. Wildcards and nonResourceURLs are refused: least
/// privilege names every verb and resource.
pub fn grants(role: &Value) -> Vec<Grant> {
    let mut out = Vec::new();
    for rule in role["rules"].as_sequence().into_iter().flatten() {
        let who = describe(role);
        assert!(
            rule["nonResourceURLs"].is_null(),
            "{who}: nonResourceURLs are not expected: {rule:?}"
        );
        let groups = strings(&rule["apiGroups"]);
        let resources = strings(&rule["resources"]);
        let verbs = strings(&rule["verbs"]);
        let names = strings(&rule["resourceNames"]);
        for list in [&groups, &resources, &verbs] {
            assert!(
                !list.iter().any(|s| s.contains('*')),
                "{who}: wildcards grant more than any code uses: {rule:?}"
            );
            assert!(
                !list.is_empty(),
                "{who}: a rule with an empty list grants nothing: {rule:?}"
            );
        }
        for group in &groups {
            for resource in &resources {
                for verb in &verbs {
                    out.push(Grant {
                        permission: Permission::new(group, resource, verb),
                        resource_names: names.clone(),
                    });
                }
            }
        }
    }
    out
}
