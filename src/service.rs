//! Composition of the running service: the [`Adapter`] that joins the HTTP layer to the
//! Kubernetes side (translation from configuration, the binder, the pod index), and `serve`,
//! which starts the watchers and both listeners and stops them on SIGTERM.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Node, Pod};
use tokio::net::TcpListener;
use tracing::info;

use crate::config::{Config, ConfigFlags};
use crate::engine::{CpuMilli, Hold, MemMiB, NodeSpec, PodKey, PodRequest, Policy};
use crate::http::server::{Adapter, AppState, admin_router, guarded_router};
use crate::http::wire::ExtenderBindingArgs;
use crate::inspect::{self, ClusterReport};
use crate::k8s::bind::{BindError, BindOutcome, BindRequest, BindTime, Binder, KubeApi, PodApi};
use crate::k8s::events::{BindEvents, KubeEvents};
use crate::k8s::learn::{self, PolicyCell};
use crate::k8s::watch::{self, ClusterState, Feed};
use crate::k8s::{requeue, translate};
use crate::telemetry::Metrics;
use crate::telemetry::metrics::CapacityGauges;

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

    fn host_request(&self, pod: &Pod) -> Result<(CpuMilli, MemMiB), String> {
        translate::pod_host_request(pod).map_err(|error| error.to_string())
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

/// How long a bind that ran out of its budget may spend finding out whether its Binding landed
/// anyway: `server.requestTimeoutMs` plus this stays below kube-scheduler's `httpTimeout`
/// (2 s + 1 s against the shipped 5 s).
pub const LATE_COMMIT_WINDOW: Duration = Duration::from_secs(1);

/// The binder the service uses, with its outcomes counted and a time budget: an answer with
/// `Error` before kube-scheduler's `httpTimeout` beats a late success it has stopped waiting for.
pub struct MeteredBinder<A> {
    binder: Binder<A>,
    /// Told of every successful bind (an Event on the pod); never fails the bind.
    events: Option<Arc<dyn BindEvents>>,
    cluster: Arc<ClusterState>,
    metrics: Metrics,
    epoch: Instant,
    budget: Duration,
}

impl<A> std::fmt::Debug for MeteredBinder<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeteredBinder")
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl<A: PodApi + 'static> MeteredBinder<A> {
    /// Wraps `binder`; reservations and bind times share `epoch` with the watch's expiry tick.
    pub fn new(
        binder: Binder<A>,
        cluster: Arc<ClusterState>,
        metrics: Metrics,
        epoch: Instant,
        budget: Duration,
    ) -> Self {
        Self {
            binder,
            events: None,
            cluster,
            metrics,
            epoch,
            budget,
        }
    }

    /// Records an event for each successful bind through `events`.
    pub fn with_events(mut self, events: Arc<dyn BindEvents>) -> Self {
        self.events = Some(events);
        self
    }
}

/// The `result` label of `gpu_extender_binds_total` for a bind error.
fn bind_error_label(error: &BindError) -> &'static str {
    match error {
        BindError::PodGone(_) | BindError::PodReplaced { .. } => "pod_gone",
        BindError::BoundElsewhere { .. } => "bound_elsewhere",
        BindError::Request { .. } => "invalid_request",
        BindError::NodeUnknown(_) => "node_gone",
        BindError::NoLongerFits { .. } | BindError::Table { .. } => "no_fit",
        BindError::Api { .. } | BindError::Read { .. } => "api_error",
    }
}

impl<A: PodApi + 'static> Bind for MeteredBinder<A> {
    fn bind(&self, args: ExtenderBindingArgs) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let request = BindRequest {
                namespace: args.pod_namespace,
                name: args.pod_name,
                uid: args.pod_uid,
                node: args.node,
            };
            let time = BindTime::now(self.epoch);
            let outcome = tokio::time::timeout(self.budget, self.binder.bind(&request, time)).await;
            let (label, result) = match outcome {
                Ok(Ok(BindOutcome::Bound(allocation))) => {
                    if let Some(events) = &self.events {
                        events.bound(&request, &allocation);
                    }
                    ("bound", Ok(()))
                }
                Ok(Ok(BindOutcome::AlreadyBound)) => ("already_bound", Ok(())),
                Ok(Err(error)) => (bind_error_label(&error), Err(error.to_string())),
                // Out of time, but the write may have landed (a slow API server answers late):
                // one read tells, so that a committed bind is not reported as a failure that
                // kube-scheduler would retry.
                Err(_) => match tokio::time::timeout(
                    LATE_COMMIT_WINDOW,
                    self.binder.confirm_late(&request),
                )
                .await
                {
                    Ok(Some(_)) => ("late_commit", Ok(())),
                    _ => (
                        "timeout",
                        Err(format!(
                            "binding pod {}/{} took longer than {} ms; its reservation lapses unless the bind completed",
                            request.namespace,
                            request.name,
                            self.budget.as_millis()
                        )),
                    ),
                },
            };
            self.metrics.binds.with_label_values(&[label]).inc();
            result
        })
    }

    fn pod_key_for_uid(&self, uid: &str) -> Option<PodKey> {
        self.cluster.pod_key_for_uid(uid)
    }
}

/// Copies the feed's health, the table's size and its allocation gauges into the metrics, at
/// scrape time: everything table-derived comes from one read snapshot, and nothing is computed
/// per watch event.
pub fn refresh_metrics(metrics: &Metrics, cluster: &ClusterState, policy: &Policy) {
    let stats = cluster.stats();
    let table = cluster.read();
    let reserved = table
        .pods()
        .filter(|(_, entry)| matches!(entry.hold, Hold::Reserved { .. }))
        .count();
    metrics.table_nodes.set(table.node_count() as i64);
    metrics.table_pods.set(table.pod_count() as i64);
    let report = inspect::report(&table);
    let capacity = inspect::capacity(&table, &policy.typical);
    drop(table);
    set_capacity(&metrics.capacity, &report, capacity);
    metrics.reservations_outstanding.set(reserved as i64);
    metrics.records_missing.set(stats.records_missing as i64);
    metrics.records_corrupt.set(stats.records_corrupt as i64);
    metrics
        .nodes_with_problems
        .set(stats.nodes_with_problems as i64);
    raise_to(&metrics.watch_errors, stats.watch_errors);
    raise_to(&metrics.reservations_expired, stats.reservations_expired);
    for took in cluster.take_rebuild_times() {
        metrics.table_rebuild_duration.observe(took.as_secs_f64());
    }
    raise_to(
        &metrics.relists.with_label_values(&["node"]),
        stats.node_lists,
    );
    raise_to(
        &metrics.relists.with_label_values(&["pod"]),
        stats.pod_lists,
    );
    for (kind, counts) in [("node", stats.node_events), ("pod", stats.pod_events)] {
        for (event, total) in [
            ("apply", counts.apply),
            ("delete", counts.delete),
            ("listed", counts.listed),
        ] {
            raise_to(
                &metrics.watch_events.with_label_values(&[kind, event]),
                total,
            );
        }
    }
}

/// Sets the allocation gauges from `report`, dropping series of nodes no longer in it.
fn set_capacity(gauges: &CapacityGauges, report: &ClusterReport, capacity: inspect::Capacity) {
    gauges.reset();
    for node in &report.nodes {
        let name = node.name.as_str();
        for gpu in &node.gpus {
            let index = gpu.index.to_string();
            let labels = [name, index.as_str()];
            gauges
                .gpu_memory_total_mib
                .with_label_values(&labels)
                .set(saturating_i64(gpu.memory_mib));
            gauges
                .gpu_memory_allocated_mib
                .with_label_values(&labels)
                .set(saturating_i64(gpu.memory_in_use_mib()));
            gauges
                .gpu_compute_allocated
                .with_label_values(&labels)
                .set(f64::from(gpu.compute_allocated_milli) / 1000.0);
            gauges
                .gpu_pods
                .with_label_values(&labels)
                .set(saturating_i64(gpu.pods.len() as u64));
            gauges
                .gpu_healthy
                .with_label_values(&[name, index.as_str(), gpu.model.as_str()])
                .set(i64::from(gpu.healthy));
        }
        let in_use = node.gpus.iter().filter(|gpu| !gpu.is_idle()).count();
        gauges
            .node_gpus
            .with_label_values(&[name])
            .set(saturating_i64(node.gpus.len() as u64));
        gauges
            .node_gpus_in_use
            .with_label_values(&[name])
            .set(saturating_i64(in_use as u64));
        gauges
            .node_gpu_occupancy
            .with_label_values(&[name])
            .set(node.occupancy());
    }
    let totals = &report.totals;
    gauges.cluster_gpus.set(saturating_i64(totals.gpus));
    gauges
        .cluster_idle_gpus
        .set(saturating_i64(totals.idle_gpus));
    gauges
        .idle_gpu_nodes
        .set(saturating_i64(totals.idle_gpu_nodes));
    gauges
        .cluster_gpu_free
        .set(capacity.free_milli as f64 / 1000.0);
    gauges
        .cluster_gpu_fragmented
        .set(capacity.fragmented_milli / 1000.0);
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Advances a counter to a total kept elsewhere (counters only go up).
fn raise_to(counter: &prometheus::IntCounter, total: u64) {
    let current = counter.get();
    if total > current {
        counter.inc_by(total - current);
    }
}

/// Command-line arguments of `serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub config: ConfigFlags,
    /// Kubeconfig to reach the API server; default: KUBECONFIG, ~/.kube/config, or in-cluster.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
}

/// Runs the extender until SIGTERM or Ctrl-C: watchers, binder, the extender listener and the
/// admin listener. Returns after both listeners have drained.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let config = Arc::new(args.config.load()?);
    if config.server.tls.is_some() {
        anyhow::bail!(
            "server.tls is set, but this build serves plain HTTP only; kube-scheduler reaches the \
             extender on loopback in the shipped deployment (see docs/install.md)"
        );
    }
    let client = kube_client(args.kubeconfig.as_deref()).await?;
    let configured = Arc::new(config.engine_policy());
    // Record-less pods are placed with the configured policy; every other decision reads the
    // policy in force, whose typical-pod distribution `learn` may replace while serving.
    let policy = PolicyCell::from(configured.clone());
    let cluster = Arc::new(ClusterState::for_config(&config));
    let metrics = Metrics::new()?;
    metrics
        .typical_pod_classes
        .set(i64::try_from(configured.typical.pods().len()).unwrap_or(i64::MAX));
    let epoch = Instant::now();

    let feed = Feed::new(cluster.clone(), config.clone(), configured.clone());
    let watchers = tokio::spawn(watch::run(client.clone(), feed, epoch));
    let requeuer = config.requeue.enabled.then(|| {
        tokio::spawn(requeue::run(
            cluster.clone(),
            config.clone(),
            policy.clone(),
            KubeApi::new(client.clone()),
            metrics.clone(),
            epoch,
        ))
    });

    let learner = config.policy.typical_pods.learn.then(|| {
        tokio::spawn(learn::run(
            cluster.clone(),
            policy.clone(),
            configured.typical.clone(),
            Duration::from_secs(config.policy.typical_pods.learn_interval_seconds),
            metrics.clone(),
        ))
    });
    let binder = Binder::new(
        cluster.clone(),
        config.clone(),
        policy.clone(),
        KubeApi::new(client.clone()),
    );
    let budget = Duration::from_millis(config.server.request_timeout_ms);
    let mut metered = MeteredBinder::new(binder, cluster.clone(), metrics.clone(), epoch, budget);
    if config.bind.events {
        metered = metered.with_events(Arc::new(KubeEvents::new(client, metrics.clone())));
    }
    let state = AppState {
        cluster: cluster.clone(),
        policy,
        adapter: Arc::new(KubeAdapter::new(config.clone(), Some(Arc::new(metered)))),
        metrics,
        body_limit: usize::try_from(config.server.body_limit_bytes).unwrap_or(usize::MAX),
    };
    let limit = usize::try_from(config.limits.max_concurrent_requests).unwrap_or(usize::MAX);
    let extender = guarded_router(state.clone(), &config.server.url_prefix, limit, budget);
    let admin = admin_router(state);

    let extender_listener = TcpListener::bind(config.server.listen)
        .await
        .with_context(|| format!("listening on {} (server.listen)", config.server.listen))?;
    let admin_listener = TcpListener::bind(config.server.admin_listen)
        .await
        .with_context(|| {
            format!(
                "listening on {} (server.adminListen)",
                config.server.admin_listen
            )
        })?;
    info!(
        extender = %config.server.listen,
        prefix = %config.server.url_prefix,
        admin = %config.server.admin_listen,
        policy = config.policy.scoring.as_str(),
        "gpu-extender serving"
    );
    let shutdown = shutdown_signal();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(());
    let extender_server =
        axum::serve(extender_listener, extender).with_graceful_shutdown(wait_for(stop_rx.clone()));
    let admin_server = axum::serve(admin_listener, admin).with_graceful_shutdown(wait_for(stop_rx));
    let servers = tokio::spawn(async move { tokio::try_join!(extender_server, admin_server) });
    shutdown.await;
    info!("shutting down: draining requests");
    drop(stop_tx);
    watchers.abort();
    if let Some(learner) = learner {
        learner.abort();
    }
    if let Some(requeuer) = requeuer {
        requeuer.abort();
    }
    servers.await??;
    info!("stopped");
    Ok(())
}

async fn wait_for(mut stop: tokio::sync::watch::Receiver<()>) {
    // The sender is dropped to signal shutdown; `changed` then returns an error.
    while stop.changed().await.is_ok() {}
}

/// Resolves on SIGTERM (how Kubernetes stops a pod) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}

/// A client from an explicit kubeconfig, or kube's default discovery.
pub async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .with_context(|| format!("using kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("finding a kubeconfig or in-cluster config")?,
    };
    kube::Client::try_from(config).context("building the API client")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on a broken fixture")]

    use super::*;
    use crate::engine::{Change, GpuDemand, GpuMode, NodeName, Table};
    use crate::inspect::fixtures::{add_node, bind};

    #[test]
    fn scrape_sets_capacity_gauges_from_the_table_and_drops_removed_nodes() {
        let mut table = Table::new(20);
        for name in ["t4", "spare"] {
            add_node(&mut table, name, GpuMode::ShareMemory, 2, "Tesla-T4", 16);
        }
        bind(&mut table, "t4", "p", GpuDemand::share(4, 1, None).unwrap());
        let cluster = ClusterState::with_table(table);
        let metrics = Metrics::new().unwrap();
        let policy = Policy::default();
        let scrape = || {
            metrics
                .render_after(|m| refresh_metrics(m, &cluster, &policy))
                .unwrap()
        };
        let text = scrape();
        for line in [
            r#"gpu_extender_gpu_memory_total_mib{gpu="0",node="t4"} 16384"#,
            r#"gpu_extender_gpu_memory_allocated_mib{gpu="0",node="t4"} 4096"#,
            r#"gpu_extender_gpu_pods{gpu="0",node="t4"} 1"#,
            r#"gpu_extender_gpu_healthy{gpu="1",model="Tesla-T4",node="spare"} 1"#,
            r#"gpu_extender_node_gpus_in_use{node="t4"} 1"#,
            r#"gpu_extender_node_gpu_occupancy{node="t4"} 0.125"#,
            "gpu_extender_cluster_gpus 4",
            "gpu_extender_cluster_idle_gpus 3",
            "gpu_extender_idle_gpu_nodes 1",
            "gpu_extender_cluster_gpu_free 3.75",
            "gpu_extender_cluster_gpu_fragmented 0.75",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
        cluster
            .write()
            .apply(Change::RemoveNode(NodeName::new("spare")));
        let text = scrape();
        assert!(!text.contains(r#"node="spare""#), "{text}");
        assert!(text.contains("gpu_extender_idle_gpu_nodes 0"), "{text}");
        // The table was given whole, not listed: no rebuild observed.
        assert!(
            text.contains("gpu_extender_table_rebuild_duration_seconds_count 0"),
            "{text}"
        );
    }

    #[test]
    fn every_family_is_named() {
        let metrics = Metrics::new().unwrap();
        let names = metrics.names();
        assert!(
            names
                .iter()
                .any(|n| n == "gpu_extender_gpu_memory_total_mib")
        );
        assert!(names.iter().any(|n| n == "gpu_extender_binds_total"));
    }
}
