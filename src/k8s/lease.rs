//! The writer Lease: of the replicas, only the one holding a `coordination.k8s.io/v1` Lease runs
//! the tasks that write to the API on their own (requeue, quota reclaim), so two replicas never
//! evict the same pod or send the same Event twice. The holder renews it every third of its
//! duration; another replica takes it over once it has seen no renewal for a whole duration,
//! measured on its own clock from when it last saw the Lease change (as client-go's leader
//! election does, so clocks that disagree between nodes do not matter). Updates carry the
//! `resourceVersion` they read, so two replicas racing for it cannot both win.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use tracing::{info, warn};

use crate::config::WriterLeaseConfig;
use crate::telemetry::Metrics;

/// Where the pod's service account says its namespace is.
const NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Whether this replica holds the writer Lease now: the tasks that write ask before each round.
#[derive(Clone, Debug, Default)]
pub struct Writer(Arc<AtomicBool>);

impl Writer {
    /// A writer flag that always holds: one replica alone, or tests.
    pub fn always() -> Self {
        Self(Arc::new(AtomicBool::new(true)))
    }

    /// Whether this replica may write now.
    pub fn holds(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn set(&self, holds: bool) {
        self.0.store(holds, Ordering::Release);
    }
}

/// The Lease's namespace: configured, else the pod's, else `default`.
pub fn namespace(config: &WriterLeaseConfig) -> String {
    if !config.namespace.is_empty() {
        return config.namespace.clone();
    }
    std::fs::read_to_string(NAMESPACE_FILE)
        .ok()
        .map(|text| text.trim().to_owned())
        .filter(|text| !text.is_empty())
        .unwrap_or_else(|| "default".to_owned())
}

/// This replica's identity in the Lease: the pod's name (its hostname) and the process.
pub fn identity() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "gpu-extender".to_owned());
    format!("{host}_{}", std::process::id())
}

/// What the last look at the Lease saw, and when (on this replica's clock).
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    holder: Option<String>,
    renewed: Option<Timestamp>,
    at: Instant,
}

/// Keeps trying to hold the Lease and keeps `writer` saying whether it does, until the task is
/// dropped; then gives it up.
pub async fn run(
    api: Api<Lease>,
    config: WriterLeaseConfig,
    identity: String,
    writer: Writer,
    metrics: Metrics,
) {
    let duration = Duration::from_secs(config.duration_seconds);
    let every = duration / 3;
    let mut seen: Option<Seen> = None;
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_renewal: Option<Instant> = None;
    loop {
        ticks.tick().await;
        let held = match try_hold(&api, &config, &identity, duration, &mut seen).await {
            Ok(held) => {
                if held {
                    last_renewal = Some(Instant::now());
                }
                held
            }
            Err(error) => {
                warn!(%error, lease = %config.name, "writer lease: cannot read or renew it");
                // Keep writing only while the last renewal is surely still in force.
                last_renewal.is_some_and(|at| at.elapsed() < duration - every)
            }
        };
        if held != writer.holds() {
            if held {
                info!(lease = %config.name, %identity, "writer lease held: requeue and reclaim run here");
            } else {
                info!(lease = %config.name, %identity, "writer lease lost: requeue and reclaim stop here");
            }
            writer.set(held);
            metrics.writer.set(i64::from(held));
        }
    }
}

/// One look at the Lease: takes it if it is free or expired, renews it if it is ours. `Ok(true)`
/// when this replica holds it afterwards.
async fn try_hold(
    api: &Api<Lease>,
    config: &WriterLeaseConfig,
    identity: &str,
    duration: Duration,
    seen: &mut Option<Seen>,
) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    let duration_seconds = i32::try_from(duration.as_secs()).unwrap_or(i32::MAX);
    let Some(mut lease) = api.get_opt(&config.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                labels: Some(
                    [(
                        "app.kubernetes.io/name".to_owned(),
                        "gpu-extender".to_owned(),
                    )]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(identity.to_owned()),
                lease_duration_seconds: Some(duration_seconds),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            // Another replica created it first.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(error) => Err(error),
        };
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    let renewed = spec.renew_time.as_ref().map(|t| t.0);
    let current = Seen {
        holder: holder.clone(),
        renewed,
        at: Instant::now(),
    };
    // The local time the Lease was last seen to change: a holder that renews moves it.
    let observed = match seen.as_ref() {
        Some(before) if before.holder == current.holder && before.renewed == current.renewed => {
            before.at
        }
        _ => {
            *seen = Some(current.clone());
            current.at
        }
    };
    let ours = holder.as_deref() == Some(identity);
    let expired = holder.is_none() || observed.elapsed() >= duration;
    if !ours && !expired {
        return Ok(false);
    }
    if !ours {
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        spec.acquire_time = Some(MicroTime(now));
        spec.holder_identity = Some(identity.to_owned());
    }
    spec.renew_time = Some(MicroTime(now));
    spec.lease_duration_seconds = Some(duration_seconds);
    // `replace` sends the resourceVersion read above: a replica that raced us gets a conflict.
    match api
        .replace(&config.name, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => {
            *seen = None;
            Ok(true)
        }
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(error) => Err(error),
    }
}

/// Gives the Lease up if this replica holds it (on shutdown), so another takes it at its next
/// look instead of after a whole duration.
pub async fn release(api: &Api<Lease>, config: &WriterLeaseConfig, identity: &str) {
    let Ok(Some(mut lease)) = api.get_opt(&config.name).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else {
        return;
    };
    if spec.holder_identity.as_deref() != Some(identity) {
        return;
    }
    spec.holder_identity = None;
    if let Err(error) = api
        .replace(&config.name, &PostParams::default(), &lease)
        .await
    {
        warn!(%error, lease = %config.name, "writer lease: cannot give it up; it expires instead");
    }
}
