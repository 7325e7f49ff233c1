//! Composition of the running service, and nothing else: `serve` builds the shared state, the
//! watchers, the binder and both listeners, wires them together, and stops them on SIGTERM.
//! Every decision lives in the layers below ([`crate::state`], [`crate::k8s`], [`crate::http`]).

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::serve::ListenerExt as _;
use futures::FutureExt as _;
use futures::future::BoxFuture;
use tokio::net::TcpListener;
use tracing::info;

use crate::config::{ConfigFlags, ServeFlags};
use crate::estimator::{self, CachedWorkloads, EstimatorService, EstimatorThread, KubeWorkloads};
use crate::http::auth::{AdminAuth, KubeReview};
use crate::http::listen::{self, DoorLimits};
use crate::http::server::{AppState, admin_router, guarded_admin_router, guarded_router, no_delay};
use crate::http::tls;
use crate::http::webhook;
use crate::k8s::api::{KubeApi, kube_client, kube_client_without_retries};
use crate::k8s::bind::{Binder, MeteredBinder};
use crate::k8s::events::{self, KubeEvents};
use crate::k8s::lease::{self, Writer};
use crate::k8s::node_label;
use crate::k8s::quota;
use crate::k8s::reclaim::{self, Reclaimer};
use crate::k8s::requeue;
use crate::k8s::watch::{self, Feed};
use crate::state::{ClusterState, PolicyCell, TableWriter, policy as learn};
use crate::telemetry::Metrics;

/// Command-line arguments of `serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub config: ConfigFlags,
    #[command(flatten)]
    pub shortcuts: ServeFlags,
    /// Kubeconfig to reach the API server; default: KUBECONFIG, ~/.kube/config, or in-cluster.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
}

/// Runs the extender until SIGTERM or Ctrl-C: watchers, binder, the extender listener and the
/// admin listener. Returns after both listeners have drained.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let config = Arc::new(args.config.load_with(args.shortcuts.overrides())?);
    // Read before anything starts, so that a missing or bad certificate stops the start-up with
    // a message naming the key.
    let tls = config
        .server
        .tls
        .as_ref()
        .map(|files| {
            Ok::<_, anyhow::Error>((tls::Reloader::load(files, tls::Served::Extender)?, files))
        })
        .transpose()?;
    let admin_tls = config
        .server
        .admin_tls
        .as_ref()
        .map(|files| {
            Ok::<_, anyhow::Error>((tls::Reloader::load(files, tls::Served::Admin)?, files))
        })
        .transpose()?;
    let webhook_tls = config
        .webhook
        .tls
        .as_ref()
        .map(|files| {
            Ok::<_, anyhow::Error>((tls::Reloader::load(files, tls::Served::Webhook)?, files))
        })
        .transpose()?;
    let estimator_tls = config
        .estimator
        .tls
        .as_ref()
        .map(|files| {
            let interval = Duration::from_secs(files.reload_interval_seconds);
            Ok::<_, anyhow::Error>((
                tls::Reloader::load(files, tls::Served::Estimator)?,
                interval,
            ))
        })
        .transpose()?;
    let client = kube_client(args.kubeconfig.as_deref()).await?;
    let configured = Arc::new(config.engine_policy());
    // Record-less pods are placed with the configured policy; every other decision reads the
    // policy in force, whose typical-pod distribution `learn` may replace while serving.
    let policy = PolicyCell::from(configured.clone());
    // The table's one writer handle goes to the feed and the binder; everything else reads.
    let writer = TableWriter::new(ClusterState::for_config(&config));
    let cluster = Arc::clone(writer.reader());
    let metrics = Metrics::new()?;
    metrics.watch_state(cluster.clone(), policy.clone())?;
    let epoch = Instant::now();

    let feed = Feed::new(writer.clone(), config.clone(), configured.clone());
    let watchers = tokio::spawn(watch::run(client.clone(), feed, epoch));
    // Runs on its own: a missing CRD ends it at once (no quotas), and it never gates readiness.
    tokio::spawn(quota::run(client.clone(), cluster.clone(), config.clone()));
    // One writer: of the replicas, only the holder of the writer Lease runs requeue and
    // reclaim, the tasks that write to the API on their own (src/k8s/lease.rs).
    let lease_writer = Writer::default();
    let lease_api: Api<Lease> =
        Api::namespaced(client.clone(), &lease::namespace(&config.writer_lease));
    let identity = lease::identity();
    // Always held by one replica: besides requeue and reclaim, the writer tells pods whose
    // allocation record the watch refused (an Event each).
    let lease_holder = tokio::spawn(lease::run(
        lease_api.clone(),
        config.writer_lease.clone(),
        identity.clone(),
        lease_writer.clone(),
        metrics.clone(),
    ));
    let teller = tokio::spawn(events::tell_rejected_records(
        cluster.clone(),
        KubeEvents::new(client.clone(), metrics.clone()),
        lease_writer.clone(),
    ));
    // The largest-free-share label that the webhook's node affinity reads (writer only).
    let labeler = config.webhook.label_nodes.then(|| {
        tokio::spawn(node_label::run(
            cluster.clone(),
            client.clone(),
            lease_writer.clone(),
            metrics.clone(),
        ))
    });
    let requeuer = config.requeue.enabled.then(|| {
        tokio::spawn(requeue::run(
            cluster.clone(),
            config.clone(),
            policy.clone(),
            KubeApi::new(client.clone()),
            metrics.clone(),
            epoch,
            lease_writer.clone(),
        ))
    });
    let reclaimer = if config.quota.reclaim.enabled {
        // A budget's 429 is an answer for the reclaimer, not a failure to retry.
        let evictions = kube_client_without_retries(args.kubeconfig.as_deref()).await?;
        let reclaimer = Reclaimer::new(
            cluster.clone(),
            config.clone(),
            policy.clone(),
            KubeApi::new(evictions),
            KubeEvents::new(client.clone(), metrics.clone()),
        );
        Some(tokio::spawn(reclaim::run(
            reclaimer,
            metrics.clone(),
            epoch,
            lease_writer.clone(),
        )))
    } else {
        None
    };

    // Learning, and FGD+'s measure of how scarce each typical class's nodes are, both follow
    // the cluster.
    let typical = &config.policy.typical_pods;
    let learner = (typical.learn || configured.weighs_scarcity()).then(|| {
        tokio::spawn(learn::run(
            cluster.clone(),
            policy.clone(),
            configured.typical.clone(),
            typical.learn,
            Duration::from_secs(typical.learn_interval_seconds),
        ))
    });
    let binder = Binder::new(
        writer,
        config.clone(),
        policy.clone(),
        KubeApi::new(client.clone()),
    );
    let budget = Duration::from_millis(config.server.request_timeout_ms);
    let mut metered = MeteredBinder::new(binder, metrics.clone(), epoch, budget);
    let admin_auth = &config.server.admin_auth;
    let auth = (!admin_auth.paths.is_empty()).then(|| {
        Arc::new(
            AdminAuth::new(
                admin_auth.paths.clone(),
                Duration::from_secs(admin_auth.cache_ttl_seconds),
                Arc::new(KubeReview::new(
                    client.clone(),
                    admin_auth.audiences.clone(),
                )),
            )
            .with_failure_limit(admin_auth.failed_tokens_per_minute, metrics.clone()),
        )
    });
    if config.bind.events {
        metered = metered.with_events(Arc::new(KubeEvents::new(client.clone(), metrics.clone())));
    }
    let estimator = EstimatorService::new(
        cluster.clone(),
        policy.clone(),
        config.clone(),
        metrics.clone(),
    );
    let webhook = webhook::router(cluster.clone(), config.clone(), metrics.clone());
    let state = AppState::new(cluster.clone(), config.clone(), metrics)
        .with_policy(policy)
        .with_binder(Arc::new(metered));
    let limit = usize::try_from(config.limits.max_concurrent_requests).unwrap_or(usize::MAX);
    let extender = guarded_router(state.clone(), &config.server.url_prefix, limit, budget);
    let admin = match auth {
        Some(auth) => guarded_admin_router(state, auth),
        None => admin_router(state),
    };

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
    let webhook_listener = match config.webhook.listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("listening on {addr} (webhook.listen)"))?,
        ),
        None => None,
    };
    info!(
        extender = %config.server.listen,
        scheme = if tls.is_some() { "https" } else { "http" },
        prefix = %config.server.url_prefix,
        admin = %config.server.admin_listen,
        admin_scheme = if admin_tls.is_some() { "https" } else { "http" },
        policy = config.policy.scoring.as_str(),
        "gpu-extender serving"
    );
    let shutdown = shutdown_signal();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(());
    let stop_extender = wait_for(stop_rx.clone());
    let limits = DoorLimits::of(&config);
    let extender_server: BoxFuture<'static, std::io::Result<()>> = match tls {
        None => listen::serve(
            extender_listener.tap_io(no_delay),
            extender,
            limits,
            "server.listen",
            stop_extender,
        )
        .boxed(),
        Some((reloader, files)) => {
            let interval = Duration::from_secs(files.reload_interval_seconds);
            let listener = tls::TlsListener::new(extender_listener, reloader, interval)
                .context("serving TLS on server.listen")?;
            listen::serve(listener, extender, limits, "server.listen", stop_extender).boxed()
        }
    };
    let estimator_server = match config.estimator.listen {
        None => None,
        Some(addr) => {
            let stop = wait_for(stop_rx.clone());
            let kubeconfig = args.kubeconfig.clone();
            let cluster_name = config.estimator.cluster.clone();
            let connections = limits.max_connections;
            // On a thread and runtime of its own, with an API client of its own: its calls
            // neither hold the verbs' workers nor queue on the binder's client.
            Some(
                EstimatorThread::start(async move {
                    let listener = TcpListener::bind(addr)
                        .await
                        .with_context(|| format!("listening on {addr} (estimator.listen)"))?;
                    let client = kube_client(kubeconfig.as_deref()).await?;
                    let workloads = CachedWorkloads::new(KubeWorkloads::new(client));
                    let estimator = estimator.with_workloads(Arc::new(workloads));
                    info!(listen = %addr, cluster = %cluster_name, tls = estimator_tls.is_some(),
                        "Karmada scheduler-estimator serving");
                    let server = match estimator_tls {
                        None => estimator::serve(listener, estimator, connections, stop).boxed(),
                        Some((reloader, interval)) => {
                            let listener = tls::TlsListener::new(listener, reloader, interval)
                                .context("serving TLS on estimator.listen")?;
                            estimator::serve_tls(
                                listener.into_stream(),
                                estimator,
                                connections,
                                stop,
                            )
                            .boxed()
                        }
                    };
                    Ok(server
                        .map(|served| served.context("serving estimator.listen"))
                        .boxed())
                })
                .await?,
            )
        }
    };
    // Validation makes webhook.listen come with webhook.tls: kube-apiserver calls HTTPS only.
    let webhook_server = match (webhook_listener, webhook_tls) {
        (Some(listener), Some((reloader, files))) => {
            let interval = Duration::from_secs(files.reload_interval_seconds);
            let listener = tls::TlsListener::new(listener, reloader, interval)
                .context("serving TLS on webhook.listen")?;
            info!(listen = %config.webhook.listen.map(|a| a.to_string()).unwrap_or_default(),
                "admission webhook serving");
            let stop = wait_for(stop_rx.clone());
            Some(tokio::spawn(listen::serve(
                listener,
                webhook,
                limits,
                "webhook.listen",
                stop,
            )))
        }
        _ => None,
    };
    let stop_admin = wait_for(stop_rx);
    let admin_server: BoxFuture<'static, std::io::Result<()>> = match admin_tls {
        None => listen::serve(
            admin_listener,
            admin,
            limits,
            "server.adminListen",
            stop_admin,
        )
        .boxed(),
        Some((reloader, files)) => {
            let interval = Duration::from_secs(files.reload_interval_seconds);
            let listener = tls::TlsListener::new(admin_listener, reloader, interval)
                .context("serving TLS on server.adminListen")?;
            listen::serve(listener, admin, limits, "server.adminListen", stop_admin).boxed()
        }
    };
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
    if let Some(labeler) = labeler {
        labeler.abort();
    }
    if let Some(reclaimer) = reclaimer {
        reclaimer.abort();
    }
    teller.abort();
    lease_holder.abort();
    // Handed over now rather than after a lease duration.
    lease::release(&lease_api, &config.writer_lease, &identity).await;
    servers.await??;
    if let Some(estimator_server) = estimator_server {
        estimator_server.stopped().await?;
    }
    if let Some(webhook_server) = webhook_server {
        webhook_server.await??;
    }
    info!("stopped");
    Ok(())
}

async fn wait_for(mut stop: tokio::sync::watch::Receiver<()>) {
    // The sender is dropped to signal shutdown; `changed` then returns an error.
    while stop.changed().await.is_ok() {}
}

/// Resolves on SIGTERM (how Kubernetes stops a pod) or Ctrl-C.
pub async fn shutdown_signal() {
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
