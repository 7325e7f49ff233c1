//! The allocation-record fixtures (`tests/fixtures/records/`, every format a build has written):
//! loaded, and turned into the bound pod each record belongs to. Shared by
//! `tests/record_formats.rs` and the end-to-end upgrade scenario.

#![allow(
    clippy::expect_used,
    reason = "test code: a fixture that does not read is a test failure with its location"
)]

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

/// Where the fixtures are.
pub const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/records");

/// The fixtures, by file name.
pub fn fixtures() -> Vec<(String, Value)> {
    let mut files: Vec<(String, Value)> = std::fs::read_dir(FIXTURES)
        .expect("a fixture")
        .map(|entry| entry.expect("a fixture").path())
        .filter(|path| path.extension().is_some_and(|e| e == "json"))
        .map(|path| {
            let name = path
                .file_name()
                .expect("a fixture")
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(&path).expect("a fixture");
            (name, serde_json::from_str(&text).expect("a fixture"))
        })
        .collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    files
}

/// The pod a fixture's record belongs to, bound to `node`, with the record filled in.
pub fn fixture_pod(fixture: &Value, name: &str, uid: &str, node: &str, annotation: &str) -> Pod {
    let container = |c: &Value| {
        json!({
            "name": c["name"],
            "image": "registry.invalid/none:1",
            "resources": {"requests": c["resources"], "limits": c["resources"]},
        })
    };
    let all = fixture["pod"].as_array().expect("a fixture");
    let (init, main): (Vec<&Value>, Vec<&Value>) =
        all.iter().partition(|c| c["init"].as_bool() == Some(true));
    let record = fixture["record"]
        .as_str()
        .expect("a fixture")
        .replace("{{uid}}", uid)
        .replace("{{node}}", node);
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": uid,
                     "labels": fixture["labels"].as_object().cloned().unwrap_or_default(),
                     "annotations": {annotation: record}},
        "spec": {
            "nodeName": node,
            "containers": main.into_iter().map(container).collect::<Vec<_>>(),
            "initContainers": init.into_iter().map(container).collect::<Vec<_>>(),
        },
    }))
    .expect("a fixture")
}
