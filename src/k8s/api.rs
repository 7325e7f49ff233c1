//! The Kubernetes API writes and reads of the binder, the requeue task and the quota reclaimer,
//! behind small traits that tests script ([`PodApi`], [`PodTouch`], [`PodEvict`]), with
//! [`KubeApi`] implementing them over a kube client; and the moment of a bind ([`BindTime`]),
//! the one read of the wall clock.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, EvictParams, Patch, PatchParams, PostParams};

use crate::state::{ApiError, monotonic_ms};

/// The moment of a bind, on both clocks: `monotonic_ms` for the reservation's TTL (the same
/// time base as the expiry tick, see [`monotonic_ms`]) and `unix_nanos` for the gpushare
/// device plugin's assume time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindTime {
    pub monotonic_ms: u64,
    pub unix_nanos: u128,
}

impl BindTime {
    /// Now, for the service (tests build `BindTime` from plain numbers).
    pub fn now(epoch: Instant) -> Self {
        // The one read of the wall clock, for the device plugin's annotation and the requeue
        // stamp only; decisions use the monotonic clock.
        #[allow(
            clippy::disallowed_methods,
            reason = "the gpushare assume time is wall-clock by definition"
        )]
        let wall = SystemTime::now();
        Self {
            monotonic_ms: monotonic_ms(epoch),
            unix_nanos: wall
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        }
    }
}

/// The write the binder asks of the API server: `POST pods/{name}/binding`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindingWrite {
    pub namespace: String,
    pub name: String,
    /// Precondition: the API server refuses (409) if the pod's UID differs.
    pub uid: String,
    pub node: String,
    /// Copied by the API server onto the pod.
    pub annotations: BTreeMap<String, String>,
}

/// The API calls bind needs. Implemented by [`KubeApi`]; tests script it.
pub trait PodApi: Send + Sync {
    /// Creates the pod's Binding.
    fn create_binding(
        &self,
        binding: &BindingWrite,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;

    /// Reads a pod; `Ok(None)` when it does not exist.
    fn get_pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Pod>, ApiError>> + Send;
}

/// The one write requeueing needs: set an annotation on a pod (a metadata-only update).
pub trait PodTouch: Send + Sync {
    /// Sets `annotation` to `value` on the pod `namespace/name`.
    fn touch_pod(
        &self,
        namespace: &str,
        name: &str,
        annotation: &str,
        value: &str,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;
}

/// What reclaiming needs: evict a pod through the Eviction API (`pods/eviction`), so
/// PodDisruptionBudgets are respected (a budget that forbids it answers 429), and read the node
/// it would free, to check the waiting pod may go there at all.
pub trait PodEvict: Send + Sync {
    /// Reads a node; `Ok(None)` when it does not exist.
    fn get_node(&self, name: &str) -> impl Future<Output = Result<Option<Node>, ApiError>> + Send;

    /// Evicts `namespace/name`. With `dry_run` the API server checks everything, budgets
    /// included, and changes nothing.
    fn evict_pod(
        &self,
        namespace: &str,
        name: &str,
        dry_run: bool,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;
}

/// [`PodApi`] over a kube client.
#[derive(Clone)]
pub struct KubeApi {
    client: kube::Client,
}

impl std::fmt::Debug for KubeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeApi")
    }
}

impl KubeApi {
    /// Wraps a client.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl PodApi for KubeApi {
    async fn create_binding(&self, write: &BindingWrite) -> Result<(), ApiError> {
        // In protobuf, as kube-scheduler writes its own (see `proto`).
        super::proto::create_binding(&self.client, write)
            .await
            .map_err(api_error)
    }

    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, ApiError> {
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(api_error)
    }
}

impl PodTouch for KubeApi {
    async fn touch_pod(
        &self,
        namespace: &str,
        name: &str,
        annotation: &str,
        value: &str,
    ) -> Result<(), ApiError> {
        let patch = serde_json::json!({ "metadata": { "annotations": { annotation: value } } });
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(api_error)
    }
}

impl PodEvict for KubeApi {
    async fn get_node(&self, name: &str) -> Result<Option<Node>, ApiError> {
        Api::<Node>::all(self.client.clone())
            .get_opt(name)
            .await
            .map_err(api_error)
    }

    async fn evict_pod(&self, namespace: &str, name: &str, dry_run: bool) -> Result<(), ApiError> {
        let params = EvictParams {
            delete_options: Some(DeleteParams {
                dry_run,
                ..DeleteParams::default()
            }),
            post_options: PostParams {
                dry_run,
                ..PostParams::default()
            },
        };
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .evict(name, &params)
            .await
            .map(|_| ())
            .map_err(api_error)
    }
}

fn api_error(error: kube::Error) -> ApiError {
    match error {
        kube::Error::Api(status) => match status.code {
            409 => ApiError::Conflict(status.message),
            404 => ApiError::NotFound(status.message),
            code => ApiError::Other {
                code: Some(code),
                message: status.message,
            },
        },
        other => ApiError::Other {
            code: None,
            message: other.to_string(),
        },
    }
}

/// A client from an explicit kubeconfig, or kube's default discovery (`KUBECONFIG`, else
/// `~/.kube/config`, else the pod's service account). A kubeconfig that cannot be read is one
/// line naming its path (kube's own message repeats the cause and quotes the path twice).
pub async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    kube::Client::try_from(kube_config(kubeconfig).await?).context("building the API client")
}

/// A client as [`kube_client`] builds it, without kube's retries of 429, 503 and 504: for the
/// Eviction API, whose 429 means a PodDisruptionBudget refuses, an answer to act on at once
/// (kube would retry it, honouring `Retry-After`, for minutes).
pub async fn kube_client_without_retries(
    kubeconfig: Option<&std::path::Path>,
) -> anyhow::Result<kube::Client> {
    let mut config = kube_config(kubeconfig).await?;
    config.default_retry = false;
    kube::Client::try_from(config).context("building the API client")
}

/// The client configuration [`kube_client`] uses.
async fn kube_config(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Config> {
    let config = match kubeconfig {
        Some(path) => {
            readable_kubeconfig(path, "--kubeconfig")?;
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|error| anyhow::anyhow!("kubeconfig {}: {error}", path.display()))?;
            kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(|error| anyhow::anyhow!("kubeconfig {}: {error}", path.display()))?
        }
        None => {
            match std::env::var_os("KUBECONFIG").filter(|paths| !paths.is_empty()) {
                Some(paths) => {
                    for path in std::env::split_paths(&paths) {
                        readable_kubeconfig(&path, "KUBECONFIG")?;
                    }
                }
                None => {
                    let default = std::env::var_os("HOME")
                        .map(|home| std::path::PathBuf::from(home).join(".kube/config"));
                    let in_pod = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
                    if !in_pod && default.as_ref().is_none_or(|path| !path.exists()) {
                        anyhow::bail!(
                            "no kubeconfig: KUBECONFIG is unset, {} does not exist, and this is \
                             not a pod; give --kubeconfig PATH or set KUBECONFIG",
                            default.map_or("~/.kube/config".into(), |p| p.display().to_string())
                        );
                    }
                }
            }
            kube::Config::infer()
                .await
                .map_err(|error| anyhow::anyhow!("finding a kubeconfig: {error}"))?
        }
    };
    Ok(config)
}

/// Fails with one line when the kubeconfig at `path` (named by `source`) cannot be read.
fn readable_kubeconfig(path: &std::path::Path, source: &str) -> anyhow::Result<()> {
    std::fs::File::open(path).map(drop).map_err(|error| {
        anyhow::anyhow!(
            "cannot read kubeconfig {} ({source}): {error}",
            path.display()
        )
    })
}
