//! Composition of the running service: the [`Adapter`] that joins the HTTP layer to the
//! Kubernetes side (translation from configuration, the binder, the pod index).

use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::config::Config;
use crate::engine::{NodeSpec, PodKey, PodRequest};
use crate::http::server::Adapter;
use crate::http::wire::ExtenderBindingArgs;
use crate::k8s::translate;

/// Answers bind calls; provided by the cluster-state layer.
pub trait Bind: Send + Sync + 'static {
    /// Binds the pod with its GPU allocation; `Err` is the message for kube-scheduler.
    fn bind(&self, args: ExtenderBindingArgs) -> BoxFuture<'_, Result<(), String>>;
    /// The key of the tracked pod with this UID.
    fn pod_key_for_uid(&self, uid: &str) -> Option<PodKey>;
}

/// The production adapter: translation by the configured label, resource and annotation keys,
/// binding through the cluster-state binder when there is one.
pub struct KubeAdapter {
    config: Arc<Config>,
    binder: Option<Arc<dyn Bind>>,
}

impl std::fmt::Debug for KubeAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeAdapter")
            .field("binder", &self.binder.is_some())
            .finish_non_exhaustive()
    }
}

impl KubeAdapter {
    /// An adapter for `config`; without a binder every bind is answered with an error.
    pub fn new(config: Arc<Config>, binder: Option<Arc<dyn Bind>>) -> Self {
        Self { config, binder }
    }
}

impl Adapter for KubeAdapter {
    fn pod_request(&self, pod: &Pod) -> Result<Option<PodRequest>, String> {
        translate::pod_request(pod, &self.config).map_err(|error| error.to_string())
    }

    fn node_spec(&self, node: &Node) -> Result<NodeSpec, String> {
        translate::node_spec(node, &self.config).map_err(|error| error.to_string())
    }

    fn pod_key_for_uid(&self, uid: &str) -> Option<PodKey> {
        self.binder
            .as_ref()
            .and_then(|binder| binder.pod_key_for_uid(uid))
    }

    fn bind(&self, args: ExtenderBindingArgs) -> BoxFuture<'_, Result<(), String>> {
        match &self.binder {
            Some(binder) => binder.bind(args),
            None => Box::pin(async {
                Err("GPU extender has no binder: not connected to the API server".to_owned())
            }),
        }
    }
}
