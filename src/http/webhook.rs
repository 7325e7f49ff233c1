//! The mutating admission webhook (`webhook.listen`, HTTPS): `POST /mutate` answers
//! kube-apiserver's `AdmissionReview` (admission.k8s.io/v1) for each pod created with the node
//! affinity of [`affinity_requirements`] added to it, as a JSON patch, so that
//! cluster-autoscaler's simulation (kube-scheduler's in-tree plugins, no extenders) sees the
//! extender's per-GPU rules. It never refuses a pod: a pod it cannot read, or one with nothing
//! to add, is allowed unchanged, and the extender still refuses wrong nodes at filter.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::config::Config;
use crate::objects::autoscaling::{affinity_requirements, with_requirements};
use crate::state::ClusterState;
use crate::telemetry::Metrics;

/// The path kube-apiserver posts reviews to (the MutatingWebhookConfiguration's `path`).
pub const MUTATE_PATH: &str = "/mutate";

#[derive(Clone)]
struct WebhookState {
    cluster: Arc<ClusterState>,
    config: Arc<Config>,
    metrics: Metrics,
}

/// The webhook's routes.
pub fn router(cluster: Arc<ClusterState>, config: Arc<Config>, metrics: Metrics) -> Router {
    let state = WebhookState {
        cluster,
        config,
        metrics,
    };
    Router::new().route(
        MUTATE_PATH,
        post(move |body: Bytes| {
            let state = state.clone();
            async move { mutate(&state, &body) }
        }),
    )
}

fn mutate(state: &WebhookState, body: &[u8]) -> Response {
    let count = |result: &str| {
        state
            .metrics
            .webhook_reviews
            .with_label_values(&[result])
            .inc()
    };
    let review: Value = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(error) => {
            count("bad_request");
            return (
                StatusCode::BAD_REQUEST,
                format!("not an AdmissionReview: {error}"),
            )
                .into_response();
        }
    };
    let Some(uid) = review["request"]["uid"].as_str() else {
        count("bad_request");
        return (
            StatusCode::BAD_REQUEST,
            "an AdmissionReview without request.uid",
        )
            .into_response();
    };
    let patch = review_patch(&review["request"], &state.config, || {
        known_models(&state.cluster)
    });
    let mut response = json!({ "uid": uid, "allowed": true });
    match patch {
        Some(patch) => {
            count("mutated");
            response["patchType"] = json!("JSONPatch");
            response["patch"] = json!(ByteString(patch.to_string().into_bytes()));
        }
        None => count("unchanged"),
    }
    axum::Json(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }))
    .into_response()
}

/// The JSON patch for a review's `request`: `spec.affinity` replaced by one that carries the
/// pod's requirements, or `None` (a create of anything but a pod, a pod that does not read, or
/// one whose affinity already says it all). `known_models` is asked only when needed.
pub fn review_patch(
    request: &Value,
    config: &Config,
    known_models: impl FnOnce() -> Vec<String>,
) -> Option<Value> {
    if request["operation"] != "CREATE" || request["kind"]["kind"] != "Pod" {
        return None;
    }
    let pod: Pod = serde_json::from_value(request["object"].clone()).ok()?;
    let annotations = pod.metadata.annotations.as_ref();
    let names_models = annotations.is_some_and(|a| {
        a.contains_key(&config.annotations.model_include)
            || a.contains_key(&config.annotations.model_exclude)
    });
    let models = if names_models {
        known_models()
    } else {
        Vec::new()
    };
    let requirements = affinity_requirements(&pod, config, &models);
    if requirements.is_empty() {
        return None;
    }
    let affinity = request["object"]["spec"].get("affinity");
    let affinity = with_requirements(affinity.filter(|a| !a.is_null()), &requirements)?;
    Some(json!([{ "op": "add", "path": "/spec/affinity", "value": affinity }]))
}

/// Every GPU model on the extender's nodes, as they name it.
fn known_models(cluster: &ClusterState) -> Vec<String> {
    let table = cluster.read();
    let models: BTreeSet<&str> = table
        .nodes()
        .flat_map(|node| node.spec.gpus.iter().map(|gpu| gpu.model.as_str()))
        .collect();
    models.into_iter().map(str::to_owned).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::autoscaling::LARGEST_FREE_LABEL;

    fn request(operation: &str, pod: Value) -> Value {
        json!({
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": operation,
            "object": pod,
        })
    }

    fn share_pod(affinity: Value) -> Value {
        json!({
            "metadata": {"name": "p", "annotations": {"gpu-extender.io/model-include": "NVIDIA-A10"}},
            "spec": {
                "containers": [{"name": "c", "resources": {"limits": {"aliyun.com/gpu-mem": "8"}}}],
                "affinity": affinity,
            },
        })
    }

    #[test]
    fn a_created_share_pod_gets_its_requirements() {
        let cfg = Config::default();
        let patch =
            review_patch(&request("CREATE", share_pod(Value::Null)), &cfg, Vec::new).unwrap();
        assert_eq!(patch[0]["op"], "add");
        assert_eq!(patch[0]["path"], "/spec/affinity");
        let expressions = &patch[0]["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchExpressions"];
        assert_eq!(
            expressions,
            &json!([
                {"key": LARGEST_FREE_LABEL, "operator": "Gt", "values": ["8191"]},
                {"key": "aliyun.accelerator/nvidia_name", "operator": "In", "values": ["NVIDIA-A10"]},
            ])
        );
        // Applied already (a reinvocation, or a pod written with it): nothing more.
        let done = share_pod(patch[0]["value"].clone());
        assert_eq!(review_patch(&request("CREATE", done), &cfg, Vec::new), None);
    }

    #[test]
    fn updates_other_kinds_and_plain_pods_are_left_alone() {
        let cfg = Config::default();
        assert_eq!(
            review_patch(&request("UPDATE", share_pod(Value::Null)), &cfg, Vec::new),
            None
        );
        let mut other = request("CREATE", share_pod(Value::Null));
        other["kind"]["kind"] = json!("Service");
        assert_eq!(review_patch(&other, &cfg, Vec::new), None);
        let plain = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}});
        assert_eq!(
            review_patch(&request("CREATE", plain), &cfg, || panic!(
                "no models needed"
            )),
            None
        );
    }
}
