//! The Grafana dashboard in `deploy/monitoring/` queries only metrics the service really exports
//! (every panel, those in collapsed rows too, has queries and each names one; its legends name
//! only labels its queries keep), and every exported metric is documented: the names come from the registry `Metrics::new()`
//! builds, not from a list kept by hand.

#![allow(
    clippy::expect_used,
    reason = "test helpers: a missing or malformed file is a test failure"
)]

use std::collections::BTreeSet;
use std::sync::Arc;

use gpu_engine::Policy;
use gpu_extender::state::{ClusterState, PolicyCell};
use gpu_extender::telemetry::Metrics;
use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const PREFIX: &str = "gpu_extender_";

/// Every name Prometheus would store for the registered families: histograms add the
/// `_bucket`, `_sum` and `_count` series. The state collector is registered as `serve` does, so
/// the families it builds at scrape time are rendered too.
fn exported() -> BTreeSet<String> {
    let metrics = Metrics::new().expect("the registry builds");
    metrics
        .watch_state(
            Arc::new(ClusterState::new(1)),
            PolicyCell::from(Policy::default()),
        )
        .expect("the state collector registers");
    let text = metrics.render().expect("the registry renders");
    let histograms: BTreeSet<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" histogram"))
        .collect();
    let mut names: BTreeSet<String> = metrics.names().iter().cloned().collect();
    for histogram in histograms {
        for suffix in ["_bucket", "_sum", "_count"] {
            names.insert(format!("{histogram}{suffix}"));
        }
    }
    names
}

/// The `gpu_extender_*` identifiers in `text`.
fn metric_names(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(PREFIX) {
        let preceded_by_ident = rest[..start]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(tail.len());
        if !preceded_by_ident {
            found.push(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    found
}

/// Every string in a JSON document, with its path for messages.
fn strings<'a>(value: &'a Value, path: String, out: &mut Vec<(String, &'a str)>) {
    match value {
        Value::String(text) => out.push((path, text)),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                strings(item, format!("{path}[{i}]"), out);
            }
        }
        Value::Object(fields) => {
            for (key, item) in fields {
                strings(item, format!("{path}.{key}"), out);
            }
        }
        _ => {}
    }
}

fn dashboard() -> Value {
    let path = format!("{ROOT}/deploy/monitoring/grafana-dashboard.json");
    let text = std::fs::read_to_string(&path).expect("the dashboard exists");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

#[test]
fn every_dashboard_query_uses_only_exported_metrics() {
    let exported = exported();
    let dashboard = dashboard();
    let mut all = Vec::new();
    strings(&dashboard, String::new(), &mut all);
    let mut unknown = Vec::new();
    let mut queries = 0;
    for (path, text) in &all {
        let is_query = path.ends_with(".expr") || path.ends_with(".query.query");
        let names = metric_names(text);
        if is_query {
            queries += 1;
            assert!(
                !names.is_empty(),
                "{path}: a query with no gpu_extender metric: {text}"
            );
        }
        for name in names {
            if !exported.contains(&name) {
                unknown.push(format!("{path}: {name}"));
            }
        }
    }
    assert!(
        queries >= 10,
        "only {queries} queries found: is the dashboard's shape right?"
    );
    assert!(
        unknown.is_empty(),
        "not exported by the service:\n{}",
        unknown.join("\n")
    );
}

#[test]
fn every_panel_has_a_description_and_a_unique_id() {
    let dashboard = dashboard();
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for panel in panels {
        assert!(
            ids.insert(panel["id"].as_u64().expect("numeric id")),
            "duplicate id"
        );
        if panel["type"] != "row" {
            assert!(
                panel["description"].as_str().is_some_and(|d| !d.is_empty()),
                "panel {} has no description",
                panel["title"]
            );
        }
    }
}

#[test]
fn every_exported_metric_is_documented() {
    let docs = std::fs::read_to_string(format!("{ROOT}/docs/metrics.md")).expect("docs/metrics.md");
    let documented: BTreeSet<String> = metric_names(&docs).into_iter().collect();
    let metrics = Metrics::new().expect("the registry builds");
    let missing: Vec<&String> = metrics
        .names()
        .iter()
        .filter(|name| !documented.contains(*name))
        .collect();
    assert!(missing.is_empty(), "not in docs/metrics.md: {missing:?}");
}

/// Every panel, those inside collapsed rows too.
fn all_panels(panels: &[Value], out: &mut Vec<Value>) {
    for panel in panels {
        out.push(panel.clone());
        if let Some(inner) = panel["panels"].as_array() {
            all_panels(inner, out);
        }
    }
}

/// The `{{label}}` names of a legend format.
fn legend_labels(format: &str) -> Vec<&str> {
    format
        .split("{{")
        .skip(1)
        .filter_map(|part| part.split_once("}}").map(|(label, _)| label.trim()))
        .collect()
}

/// Each panel, rows' children included, draws something: it has queries, each names at least
/// one metric the service exports, and every `{{label}}` its legend shows is a label the query
/// keeps (named in its `by (...)` or selector), so no series is drawn with a blank legend.
#[test]
fn every_panel_queries_exported_metrics_and_its_legends_name_kept_labels() {
    let exported = exported();
    let mut panels = Vec::new();
    all_panels(
        dashboard()["panels"].as_array().expect("panels"),
        &mut panels,
    );
    let mut ids = BTreeSet::new();
    let mut drawn = 0;
    for panel in &panels {
        let title = panel["title"].as_str().unwrap_or_default();
        assert!(
            ids.insert(panel["id"].as_u64().expect("numeric id")),
            "panel {title}: duplicate id"
        );
        if panel["type"] == "row" {
            continue;
        }
        drawn += 1;
        let targets = panel["targets"].as_array().expect("a panel has targets");
        assert!(!targets.is_empty(), "panel {title} has no query");
        for target in targets {
            let expr = target["expr"].as_str().unwrap_or_default();
            let names = metric_names(expr);
            assert!(
                names.iter().any(|name| exported.contains(name)),
                "panel {title}: query {expr:?} names no exported metric"
            );
            for label in legend_labels(target["legendFormat"].as_str().unwrap_or_default()) {
                assert!(
                    expr.contains(label),
                    "panel {title}: its legend shows {{{{{label}}}}}, which {expr:?} does not keep"
                );
            }
        }
    }
    assert!(
        drawn >= 10,
        "only {drawn} panels: is the dashboard's shape right?"
    );
}

#[test]
fn legend_labels_are_read_from_the_format() {
    assert_eq!(
        legend_labels("{{verb}} {{ outcome }} p99"),
        ["verb", "outcome"]
    );
    assert!(legend_labels("free").is_empty());
}

#[test]
fn the_name_scanner_finds_whole_identifiers() {
    assert_eq!(
        metric_names("sum(rate(gpu_extender_binds_total{a=\"b\"}[5m])) / x_gpu_extender_no"),
        ["gpu_extender_binds_total"]
    );
}
