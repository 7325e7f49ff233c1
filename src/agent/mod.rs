//! `gpu-extender node-agent`: runs on a GPU node (a DaemonSet), reads its GPUs from the driver
//! (NVML) or a fixture, and publishes them as the node's `gpu-extender.io/gpus` annotation, the
//! format the extender reads (`src/objects/translate/node.rs`). See docs/node-agent.md.
//!
//! A pass: read ([`source::Reader`]), then publish ([`publish::publish`]) only when the node's
//! value differs. A driver that cannot be used, a GPU that does not answer or an API error is
//! logged once per cause and retried at the next pass; the node keeps its last report.

pub mod fake;
pub mod nvml;
pub mod publish;
pub mod source;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use self::fake::FakeSource;
use self::nvml::NvmlSource;
use self::publish::{AgentMetrics, KubeNodes, NodeAnnotations, publish};
use self::source::{GpuSource, Reader, SourceError};
use crate::k8s::api::kube_client;

/// Where the agent reads GPUs from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// The NVIDIA driver, through NVML (libnvidia-ml.so.1, loaded at run time).
    Nvml,
    /// A fixture file in the format of tests/fixtures/gpus/README.md (tests and demos).
    Fake,
}

/// Command-line arguments of `node-agent`.
#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// The node to publish on: this pod's node (the DaemonSet sets it from spec.nodeName).
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: String,
    /// Where GPUs are read from.
    #[arg(long, value_enum, default_value = "nvml")]
    pub backend: Backend,
    /// The fixture file of `--backend fake`; read again on every pass.
    #[arg(long, value_name = "PATH", required_if_eq("backend", "fake"))]
    pub fixture: Option<PathBuf>,
    /// Seconds between passes (read the GPUs, publish when changed).
    #[arg(long, value_name = "SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub interval: u64,
    /// The node annotation to publish; must match the extender's `annotations.nodeGpus`.
    #[arg(long, value_name = "KEY", default_value = "gpu-extender.io/gpus")]
    pub annotation: String,
    /// Address of the `/metrics` and `/healthz` listener.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:9445")]
    pub metrics_address: SocketAddr,
    /// Kubeconfig to reach the API server; default: KUBECONFIG, ~/.kube/config, or in-cluster.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
}

/// Runs the agent until SIGTERM.
pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let metrics = AgentMetrics::new().context("registering the agent's metrics")?;
    let client = kube_client(args.kubeconfig.as_deref()).await?;
    let api = KubeNodes::new(client);
    let listener = tokio::net::TcpListener::bind(args.metrics_address)
        .await
        .with_context(|| format!("listening on {}", args.metrics_address))?;
    let router = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(metrics.clone());
    let server =
        axum::serve(listener, router).with_graceful_shutdown(crate::service::shutdown_signal());
    let server = tokio::spawn(async move { server.await });
    tracing::info!(node = %args.node_name, backend = ?args.backend, "node agent started");
    let passes = passes(&args, &api, &metrics);
    tokio::select! {
        () = passes => {},
        () = crate::service::shutdown_signal() => {},
    }
    server.abort();
    Ok(())
}

async fn render_metrics(State(metrics): State<AgentMetrics>) -> Response {
    match metrics.render() {
        Ok(text) => text.into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
    }
}

/// The source chosen on the command line; `Err` when the driver cannot be opened yet.
fn open(args: &AgentArgs) -> Result<Box<dyn GpuSource>, SourceError> {
    match (args.backend, &args.fixture) {
        (Backend::Fake, Some(path)) => Ok(Box::new(FakeSource::new(path))),
        (Backend::Fake, None) => Err(SourceError::Driver("--backend fake needs --fixture".into())),
        (Backend::Nvml, _) => Ok(Box::new(NvmlSource::open()?)),
    }
}

impl GpuSource for Box<dyn GpuSource> {
    fn device_count(&mut self) -> Result<u32, SourceError> {
        (**self).device_count()
    }
    fn device(&mut self, index: u32) -> Result<source::DeviceReading, SourceError> {
        (**self).device(index)
    }
    fn link(&mut self, a: u32, b: u32) -> Result<gpu_engine::Link, SourceError> {
        (**self).link(a, b)
    }
    fn critical_xids(&mut self) -> Vec<(u32, u64)> {
        (**self).critical_xids()
    }
}

/// Logs each distinct problem once for as long as it lasts; one that went away and comes back
/// is logged again.
#[derive(Debug, Default)]
struct OncePerCause {
    current: BTreeSet<String>,
}

impl OncePerCause {
    /// Logs what is new in `problems` and what went away since the last pass.
    fn report(&mut self, problems: &[String]) {
        let (appeared, resolved) = self.changes(problems);
        for problem in appeared {
            tracing::warn!(%problem, "node agent: GPU problem");
        }
        for problem in resolved {
            tracing::info!(%problem, "node agent: resolved");
        }
    }

    /// The problems that appeared and those that went away since the last call.
    fn changes(&mut self, problems: &[String]) -> (Vec<String>, Vec<String>) {
        let now: BTreeSet<String> = problems.iter().cloned().collect();
        let appeared = now.difference(&self.current).cloned().collect();
        let resolved = self.current.difference(&now).cloned().collect();
        self.current = now;
        (appeared, resolved)
    }
}

/// Pass after pass, forever; every failure is logged and retried at the next pass.
async fn passes(args: &AgentArgs, api: &impl NodeAnnotations, metrics: &AgentMetrics) {
    let mut reader: Option<Reader<Box<dyn GpuSource>>> = None;
    let mut causes = OncePerCause::default();
    let mut ticks = tokio::time::interval(Duration::from_secs(args.interval));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let mut problems = Vec::new();
        let mut current = match reader.take() {
            Some(reader) => Some(reader),
            None => match open(args) {
                Ok(source) => Some(Reader::new(source)),
                Err(error) => {
                    problems.push(error.to_string());
                    None
                }
            },
        };
        let reading = match current.take() {
            None => None,
            Some(mut open_reader) => {
                // NVML calls block: off the async threads.
                let done = tokio::task::spawn_blocking(move || {
                    let reading = open_reader.read();
                    (open_reader, reading)
                })
                .await;
                match done {
                    Ok((open_reader, reading)) => {
                        reader = Some(open_reader);
                        reading
                            .map_err(|error| problems.push(error.to_string()))
                            .ok()
                    }
                    Err(error) => {
                        problems.push(format!("reading the GPUs failed: {error}"));
                        None
                    }
                }
            }
        };
        let Some(reading) = reading else {
            metrics.driver_errors.inc();
            causes.report(&problems);
            continue;
        };
        problems.extend(reading.problems.iter().cloned());
        let unhealthy = reading.unhealthy();
        metrics
            .gpus
            .with_label_values(&["unhealthy"])
            .set(count(unhealthy));
        metrics
            .gpus
            .with_label_values(&["healthy"])
            .set(count(reading.gpus.len() - unhealthy));
        match publish(api, &args.node_name, &args.annotation, &reading).await {
            Ok(published) => {
                metrics
                    .publishes
                    .with_label_values(&[published.label()])
                    .inc();
                if published == publish::Published::SkippedEmpty {
                    problems.push("the driver lists no GPU; the node keeps its last report".into());
                } else {
                    metrics
                        .last_report
                        .with_label_values(&[&args.node_name])
                        .set(unix_now());
                    if published == publish::Published::Applied {
                        tracing::info!(
                            gpus = reading.gpus.len(),
                            unhealthy,
                            "node agent: report published"
                        );
                    }
                }
            }
            Err(error) => {
                metrics.publishes.with_label_values(&["error"]).inc();
                problems.push(format!("{error:#}"));
            }
        }
        causes.report(&problems);
    }
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn unix_now() -> i64 {
    #[allow(
        clippy::disallowed_methods,
        reason = "the metric is a wall-clock timestamp by definition"
    )]
    let now = SystemTime::now();
    now.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::OncePerCause;

    #[test]
    fn a_lasting_problem_is_logged_once_and_again_when_it_comes_back() {
        let mut causes = OncePerCause::default();
        let lost = vec!["GPU 2: lost".to_owned()];
        assert_eq!(causes.changes(&lost), (lost.clone(), vec![]));
        assert_eq!(causes.changes(&lost), (vec![], vec![]));
        assert_eq!(causes.changes(&[]), (vec![], lost.clone()));
        assert_eq!(causes.changes(&lost), (lost.clone(), vec![]));
    }
}
