//! The `ElasticQuota` watcher (scheduler-plugins' `scheduling.x-k8s.io/v1alpha1`, an optional
//! CRD): every quota in the cluster, read through [`crate::objects::quota`] and built into the
//! [`QuotaSet`] the shared state enforces. Without the CRD the extender runs without quotas and
//! says so once; bad quotas are logged once each and ignored.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_stream};
use kube::{Api, ResourceExt};
use tracing::{info, warn};

use crate::config::Config;
use crate::objects::quota::{GROUP_ANNOTATION, quota_names, read_quota};
use crate::state::ClusterState;
use gpu_engine::quota::QuotaSet;

/// The API group of `ElasticQuota`.
pub const GROUP: &str = "scheduling.x-k8s.io";

/// `ElasticQuota` as a dynamic resource.
pub fn elastic_quota_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, "v1alpha1", "ElasticQuota"),
        "elasticquotas",
    )
}

/// The quotas in force from `objects` (every `ElasticQuota` seen).
pub fn quota_set<'a>(
    objects: impl IntoIterator<Item = &'a DynamicObject>,
    cfg: &Config,
) -> QuotaSet {
    let mut quotas = Vec::new();
    let mut unreadable = Vec::new();
    for object in objects {
        let namespace = object.namespace().unwrap_or_default();
        let group = object.annotations().get(GROUP_ANNOTATION);
        match read_quota(
            &object.name_any(),
            &namespace,
            object.data.get("spec"),
            group.map(String::as_str),
            cfg,
        ) {
            Ok(quota) => quotas.push(quota),
            Err(problem) => unreadable.push(problem),
        }
    }
    QuotaSet::build(quotas, unreadable, &quota_names(cfg))
}

/// Whether `error` says the API does not serve `ElasticQuota` (the CRD is not installed). For a
/// group it does not serve, kube-apiserver answers a plain-text "404 page not found", which
/// kube-rs turns into a Status with code 404 and no `NotFound` reason, so the code decides.
fn crd_missing(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.is_not_found() || status.code == 404)
}

/// The quotas in the cluster now (the `inspect` and `explain` commands); `None` without the CRD.
pub async fn list(client: kube::Client, cfg: &Config) -> anyhow::Result<Option<QuotaSet>> {
    let api: Api<DynamicObject> = Api::all_with(client, &elastic_quota_resource());
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(Some(quota_set(&list.items, cfg))),
        Err(error) if crd_missing(&error) => Ok(None),
        Err(error) => Err(anyhow::Error::new(error).context("listing ElasticQuotas")),
    }
}

/// Watches every `ElasticQuota` into `state`'s quota set until the stream ends. Returns at once,
/// logging it once, when the CRD is not installed: the extender then runs without quotas (a
/// CRD installed later takes effect at the next restart).
pub async fn run(client: kube::Client, state: Arc<ClusterState>, cfg: Arc<Config>) {
    let api: Api<DynamicObject> = Api::all_with(client, &elastic_quota_resource());
    match api.list(&ListParams::default().limit(1)).await {
        Err(error) if crd_missing(&error) => {
            info!(
                "the ElasticQuota CRD ({GROUP}/v1alpha1) is not installed: running without GPU quotas"
            );
            return;
        }
        // Other errors (RBAC, the API server briefly away) are the watcher's to retry.
        _ => {}
    }
    let mut store: BTreeMap<(String, String), DynamicObject> = BTreeMap::new();
    let mut listing: Option<BTreeMap<(String, String), DynamicObject>> = None;
    let mut told: BTreeSet<String> = BTreeSet::new();
    let stream = watch_stream(api, watcher::Config::default())
        .default_backoff()
        .modify(|quota| quota.managed_fields_mut().clear());
    let mut events = std::pin::pin!(stream);
    while let Some(item) = events.next().await {
        let event = match item {
            Ok(event) => event,
            Err(error) => {
                warn!(%error, "ElasticQuota watch failed; retrying with backoff");
                continue;
            }
        };
        let key = |o: &DynamicObject| (o.namespace().unwrap_or_default(), o.name_any());
        match event {
            Event::Init => {
                listing = Some(BTreeMap::new());
                continue;
            }
            Event::InitApply(object) => {
                if let Some(listing) = listing.as_mut() {
                    listing.insert(key(&object), object);
                }
                continue;
            }
            Event::InitDone => {
                if let Some(listed) = listing.take() {
                    store = listed;
                }
            }
            Event::Apply(object) => {
                store.insert(key(&object), object);
            }
            Event::Delete(object) => {
                store.remove(&key(&object));
            }
        }
        let set = quota_set(store.values(), &cfg);
        for problem in &set.problems {
            if told.insert(problem.clone()) {
                warn!(%problem, "ElasticQuota ignored");
            }
        }
        told.retain(|problem| set.problems.contains(problem));
        info!(
            quotas = set.quotas().count(),
            ignored = set.problems.len(),
            "GPU quotas updated"
        );
        state.set_quotas(set);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test fixtures")]
    use super::*;
    use gpu_engine::quota::QuotaResource;
    use serde_json::json;

    fn quota(namespace: &str, name: &str, spec: serde_json::Value) -> DynamicObject {
        let mut object = DynamicObject::new(name, &elastic_quota_resource()).within(namespace);
        object.data = json!({ "spec": spec });
        object
    }

    /// What kube-rs makes of kube-apiserver's answer for an API group it does not serve (seen
    /// from v1.34.4: plain text "404 page not found"), and of a real NotFound Status.
    #[test]
    fn a_group_the_api_does_not_serve_counts_as_a_missing_crd() {
        let unparsed: kube::core::Status = serde_json::from_value(json!({
            "status": "Failure", "code": 404, "message": "404 page not found",
            "reason": "Failed to parse error data"
        }))
        .unwrap();
        assert!(crd_missing(&kube::Error::Api(Box::new(unparsed))));
        let not_found: kube::core::Status = serde_json::from_value(json!({
            "status": "Failure", "code": 404, "message": "not found", "reason": "NotFound"
        }))
        .unwrap();
        assert!(crd_missing(&kube::Error::Api(Box::new(not_found))));
        let forbidden: kube::core::Status = serde_json::from_value(json!({
            "status": "Failure", "code": 403, "message": "forbidden", "reason": "Forbidden"
        }))
        .unwrap();
        assert!(!crd_missing(&kube::Error::Api(Box::new(forbidden))));
    }

    #[test]
    fn builds_the_set_and_ignores_bad_quotas() {
        let objects = [
            quota(
                "a",
                "qa",
                json!({"min": {"nvidia.com/gpu": 2}, "max": {"nvidia.com/gpu": 4}}),
            ),
            quota(
                "b",
                "inverted",
                json!({"min": {"nvidia.com/gpu": 5}, "max": {"nvidia.com/gpu": 4}}),
            ),
            quota("c", "odd", json!({"max": {"example.com/fpga": 1}})),
            quota("d", "one", json!({"max": {"nvidia.com/gpu": 1}})),
            quota("d", "two", json!({"max": {"nvidia.com/gpu": 2}})),
        ];
        let set = quota_set(&objects, &Config::default());
        assert_eq!(set.quotas().count(), 1);
        let a = set.get("a").unwrap();
        assert_eq!(a.max(QuotaResource::WholeGpus), Some(4));
        assert_eq!(set.problems.len(), 3, "{:?}", set.problems);
        assert!(
            set.problems
                .iter()
                .any(|p| p.contains("b/inverted: min nvidia.com/gpu 5 is above max 4"))
        );
        assert!(
            set.problems
                .iter()
                .any(|p| p.contains("c/odd: unknown resource"))
        );
        assert!(
            set.problems
                .iter()
                .any(|p| p.contains("d/two: namespace d already has ElasticQuota one"))
        );
    }
}
