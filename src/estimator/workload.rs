//! Which pods make up the workload a `GetUnschedulableReplicas` request names, found as
//! Karmada's own estimator finds them (v1.18's `replica.GetUnschedulablePodsOfWorkload`): only
//! Deployments; a Deployment's pods are those of its current ReplicaSet, the one it controls
//! whose pod template is the Deployment's own (the `pod-template-hash` label aside), the oldest
//! if several are. The Deployment and its ReplicaSets are read from the API server (read-only,
//! `get` deployments and `list` replicasets); the pods come from the watch.

use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use kube::Api;
use kube::api::ListParams;

/// The label the Deployment controller adds to a ReplicaSet's template (and its pods).
const POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// Why a workload's current ReplicaSet could not be found.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WorkloadError {
    /// The Deployment does not exist (gRPC `NotFound`).
    #[error("deployment {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    /// The API server could not be asked or refused (gRPC `Unavailable`).
    #[error("reading deployment {namespace}/{name} from the API server: {problem}")]
    Api {
        namespace: String,
        name: String,
        problem: String,
    },
}

/// Finds a Deployment's current ReplicaSet.
pub trait Workloads: Send + Sync {
    /// The UID of the current ReplicaSet of Deployment `namespace/name`; `None` when it has none
    /// yet (the Deployment controller has not caught up with a new template).
    fn current_replica_set<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, WorkloadError>>;
}

/// [`Workloads`] read from the API server.
#[derive(Clone)]
pub struct KubeWorkloads {
    client: kube::Client,
}

impl std::fmt::Debug for KubeWorkloads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeWorkloads").finish_non_exhaustive()
    }
}

impl KubeWorkloads {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    async fn find(&self, namespace: &str, name: &str) -> Result<Option<String>, WorkloadError> {
        let api_error = |e: kube::Error| WorkloadError::Api {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            problem: e.to_string(),
        };
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), namespace);
        let deployment = deployments
            .get_opt(name)
            .await
            .map_err(api_error)?
            .ok_or_else(|| WorkloadError::NotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            })?;
        let replica_sets: Api<ReplicaSet> = Api::namespaced(self.client.clone(), namespace);
        let listed = replica_sets
            .list(&ListParams::default())
            .await
            .map_err(api_error)?;
        Ok(current_replica_set(&deployment, &listed.items))
    }
}

impl Workloads for KubeWorkloads {
    fn current_replica_set<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, WorkloadError>> {
        Box::pin(self.find(namespace, name))
    }
}

/// The UID of `deployment`'s current ReplicaSet among `replica_sets`: one it controls whose
/// template equals its own but for the `pod-template-hash` label, the oldest if several
/// (Kubernetes' `deploymentutil.FindNewReplicaSet`, which Karmada lifts).
pub fn current_replica_set(deployment: &Deployment, replica_sets: &[ReplicaSet]) -> Option<String> {
    let uid = deployment.metadata.uid.as_deref()?;
    let template = deployment.spec.as_ref().map(|spec| &spec.template);
    let mut candidates: Vec<&ReplicaSet> = replica_sets
        .iter()
        .filter(|rs| controlled_by(rs.metadata.owner_references.as_deref(), uid))
        .filter(|rs| {
            let theirs = rs.spec.as_ref().and_then(|spec| spec.template.as_ref());
            match (template, theirs) {
                (Some(ours), Some(theirs)) => equal_but_hash(ours, theirs),
                _ => false,
            }
        })
        .collect();
    // Oldest first, then by name, as Kubernetes' `ReplicaSetsByCreationTimestamp`.
    candidates.sort_by(|a, b| {
        let key = |rs: &ReplicaSet| {
            (
                rs.metadata.creation_timestamp.as_ref().map(|t| t.0),
                rs.metadata.name.clone(),
            )
        };
        key(a).cmp(&key(b))
    });
    candidates.first().and_then(|rs| rs.metadata.uid.clone())
}

/// Whether `pod`'s controller is the object with UID `owner`.
pub fn pod_controlled_by(pod: &Pod, owner: &str) -> bool {
    controlled_by(pod.metadata.owner_references.as_deref(), owner)
}

fn controlled_by(
    owners: Option<&[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference]>,
    uid: &str,
) -> bool {
    owners
        .unwrap_or(&[])
        .iter()
        .any(|owner| owner.controller == Some(true) && owner.uid == uid)
}

/// Kubernetes' `EqualIgnoreHash`: the templates are equal once the `pod-template-hash` label is
/// removed from both.
fn equal_but_hash(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    let without_hash = |template: &PodTemplateSpec| {
        let mut template = template.clone();
        if let Some(metadata) = template.metadata.as_mut()
            && let Some(labels) = metadata.labels.as_mut()
        {
            labels.remove(POD_TEMPLATE_HASH);
            if labels.is_empty() {
                metadata.labels = None;
            }
        }
        template
    };
    without_hash(a) == without_hash(b)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on a broken fixture")]

    use serde_json::json;

    use super::*;

    fn deployment(image: &str) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "d-1"},
            "spec": {
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "main", "image": image}]}
                }
            }
        }))
        .unwrap()
    }

    fn replica_set(name: &str, uid: &str, owner: &str, image: &str, created: &str) -> ReplicaSet {
        serde_json::from_value(json!({
            "metadata": {
                "name": name, "namespace": "default", "uid": uid,
                "creationTimestamp": created,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": "web", "uid": owner, "controller": true}]
            },
            "spec": {
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web", "pod-template-hash": name}},
                    "spec": {"containers": [{"name": "main", "image": image}]}
                }
            }
        }))
        .unwrap()
    }

    #[test]
    fn the_current_replica_set_has_the_deployments_template_and_is_controlled_by_it() {
        let sets = [
            replica_set("old", "rs-old", "d-1", "v1", "2026-01-01T00:00:00Z"),
            replica_set("new", "rs-new", "d-1", "v2", "2026-01-02T00:00:00Z"),
            // Same template, another owner.
            replica_set("other", "rs-other", "d-2", "v2", "2025-01-01T00:00:00Z"),
            // Same template and owner, newer: the oldest wins.
            replica_set("newer", "rs-newer", "d-1", "v2", "2026-01-03T00:00:00Z"),
        ];
        assert_eq!(
            current_replica_set(&deployment("v2"), &sets).as_deref(),
            Some("rs-new")
        );
        assert_eq!(
            current_replica_set(&deployment("v1"), &sets).as_deref(),
            Some("rs-old")
        );
        // A template no ReplicaSet has yet.
        assert_eq!(current_replica_set(&deployment("v3"), &sets), None);
    }
}
