//! Quota reclaim through the Eviction API: a pod of a team under its `min` that waits because
//! borrowers (teams above their `min`) hold the GPUs gets them back by evicting the borrowers'
//! pods, where kube-scheduler cannot preempt them (it never proposes victims of equal or higher
//! priority to an extender). The capacity-scheduling plugin reclaims the same way from inside
//! kube-scheduler.
//!
//! Filter and prioritize never write, so this is a background task: every
//! `quota.reclaim.intervalSeconds` it looks at the GPU pods kube-scheduler marked unschedulable,
//! oldest first, and starts at most one reclaim per round (the rate limit). The victims are
//! the engine's choice ([`choose_reclaim`]): borrowers' pods on one node, lowest priority then
//! newest first, the fewest whose eviction makes the pod fit. Each is evicted through
//! `pods/eviction`, first as a dry run for all of them, so that a PodDisruptionBudget refusing
//! one (429) stops the reclaim before anything is evicted; that node is then left out for that
//! pod for `quota.reclaim.coolDownSeconds`, and another node or a later round is tried. Nothing
//! is ever deleted directly. One reclaim is in flight per quota at a time, a pod is reclaimed for
//! at most once per cool-down, and a pod already evicted is not chosen again while it lingers.
//! The evicted pods' GPUs come back through the watch like any pod's end; the requeue task then
//! asks kube-scheduler to retry the waiting pod.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::api::PodEvict;
use super::events::ReclaimEvents;
use super::requeue::{Waiting, waiting_pod};
use super::watch::is_unschedulable;
use crate::config::Config;
use crate::engine::quota::{Claimant, Reclaim, choose_reclaim, namespace_of};
use crate::engine::{NodeName, PodKey};
use crate::state::{ApiError, ClusterState, PolicyCell, monotonic_ms};
use crate::telemetry::Metrics;

/// What one round did, for metrics, logs and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing to reclaim.
    Idle,
    /// `victims` were evicted on `node` for `pod`.
    Evicted {
        pod: PodKey,
        node: NodeName,
        victims: Vec<PodKey>,
    },
    /// A PodDisruptionBudget refused evicting `victim`; `node` is left out for `pod` a while.
    PdbBlocked {
        pod: PodKey,
        node: NodeName,
        victim: PodKey,
    },
    /// The API server failed otherwise; the next round tries again.
    Failed { pod: PodKey, error: String },
}

impl Outcome {
    /// The `result` label of `gpu_extender_quota_reclaims_total`; `None` for an idle round.
    pub fn label(&self) -> Option<&'static str> {
        match self {
            Self::Idle => None,
            Self::Evicted { .. } => Some("evicted"),
            Self::PdbBlocked { .. } => Some("pdb_blocked"),
            Self::Failed { .. } => Some("error"),
        }
    }
}

/// The reclaim task's memory between rounds: what is in flight and what to leave alone.
pub struct Reclaimer<A, E> {
    state: Arc<ClusterState>,
    cfg: Arc<Config>,
    policy: PolicyCell,
    api: A,
    events: E,
    /// Per quota (`namespace/name`): the pod reclaimed for and when (monotonic ms).
    in_flight: HashMap<String, (PodKey, u64)>,
    /// Per waiting pod: when it was last reclaimed for.
    reclaimed_for: HashMap<PodKey, u64>,
    /// Per waiting pod: nodes where a PodDisruptionBudget refused an eviction, and when.
    refused: HashMap<PodKey, BTreeMap<NodeName, u64>>,
    /// Pods evicted, and when: not chosen again while they linger in the table.
    evicted: HashMap<PodKey, u64>,
}

impl<A, E> std::fmt::Debug for Reclaimer<A, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reclaimer")
            .field("in_flight", &self.in_flight)
            .field("refused", &self.refused)
            .finish_non_exhaustive()
    }
}

impl<A: PodEvict, E: ReclaimEvents> Reclaimer<A, E> {
    pub fn new(
        state: Arc<ClusterState>,
        cfg: Arc<Config>,
        policy: PolicyCell,
        api: A,
        events: E,
    ) -> Self {
        Self {
            state,
            cfg,
            policy,
            api,
            events,
            in_flight: HashMap::new(),
            reclaimed_for: HashMap::new(),
            refused: HashMap::new(),
            evicted: HashMap::new(),
        }
    }

    /// One round at `now_ms` (monotonic): forgets what the cool-down has passed, then starts at
    /// most one reclaim, for the oldest waiting pod that has one.
    pub async fn round(&mut self, now_ms: u64) -> Outcome {
        let cool_down = self
            .cfg
            .quota
            .reclaim
            .cool_down_seconds
            .saturating_mul(1000);
        let fresh = |at: &u64| now_ms.saturating_sub(*at) < cool_down;
        let mut waiting: Vec<Waiting> = self
            .state
            .pending_pods(is_unschedulable)
            .into_iter()
            .filter_map(|(key, pod)| waiting_pod(key, &pod, &self.cfg))
            .collect();
        let pending: BTreeSet<&PodKey> = waiting.iter().map(|w| &w.key).collect();
        // A reclaim ends when its pod is placed (no longer waiting) or the cool-down passes.
        self.in_flight
            .retain(|_, (pod, at)| pending.contains(pod) && fresh(at));
        self.reclaimed_for.retain(|_, at| fresh(at));
        self.evicted.retain(|_, at| fresh(at));
        for nodes in self.refused.values_mut() {
            nodes.retain(|_, at| fresh(at));
        }
        self.refused
            .retain(|pod, nodes| pending.contains(pod) && !nodes.is_empty());
        let quotas = self.state.quotas();
        if quotas.is_empty() || waiting.is_empty() {
            return Outcome::Idle;
        }
        waiting.sort_by(|a, b| a.created.cmp(&b.created).then_with(|| a.key.cmp(&b.key)));
        let policy = self.policy.load();
        let chosen = {
            let table = self.state.read();
            waiting.iter().find_map(|pod| {
                let namespace = namespace_of(&pod.key);
                let quota = quotas.get(namespace)?;
                if self.in_flight.contains_key(&quota.full_name())
                    || self.reclaimed_for.contains_key(&pod.key)
                {
                    return None;
                }
                let excluded: BTreeSet<NodeName> = self
                    .refused
                    .get(&pod.key)
                    .map(|nodes| nodes.keys().cloned().collect())
                    .unwrap_or_default();
                let claimant = Claimant {
                    namespace,
                    request: &pod.request,
                };
                let rank = |victim: &PodKey| {
                    (!self.evicted.contains_key(victim))
                        .then(|| self.state.rank(victim).unwrap_or_default().eviction_order())
                };
                choose_reclaim(&table, &quotas, claimant, &policy, &excluded, rank)
                    .map(|reclaim| (pod.key.clone(), quota.full_name(), reclaim))
            })
        };
        let Some((pod, quota, reclaim)) = chosen else {
            return Outcome::Idle;
        };
        let outcome = self.evict(&pod, &reclaim, now_ms).await;
        if let Outcome::Evicted { .. } = outcome {
            self.in_flight.insert(quota, (pod.clone(), now_ms));
            self.reclaimed_for.insert(pod, now_ms);
        }
        outcome
    }

    /// Evicts `reclaim`'s victims for `pod`: a dry run of each first, so a budget that refuses
    /// one stops the reclaim before any pod goes.
    async fn evict(&mut self, pod: &PodKey, reclaim: &Reclaim, now_ms: u64) -> Outcome {
        for dry_run in [true, false] {
            for victim in &reclaim.victims {
                let (namespace, name) = split(victim);
                match self.api.evict_pod(namespace, name, dry_run).await {
                    // Gone already: its GPUs are being freed anyway.
                    Ok(()) | Err(ApiError::NotFound(_)) => {
                        if !dry_run {
                            self.evicted.insert(victim.clone(), now_ms);
                            self.events.evicted(victim, pod, &reclaim.node);
                        }
                    }
                    Err(ApiError::Other {
                        code: Some(429), ..
                    }) => {
                        self.refused
                            .entry(pod.clone())
                            .or_default()
                            .insert(reclaim.node.clone(), now_ms);
                        return Outcome::PdbBlocked {
                            pod: pod.clone(),
                            node: reclaim.node.clone(),
                            victim: victim.clone(),
                        };
                    }
                    Err(error) => {
                        return Outcome::Failed {
                            pod: pod.clone(),
                            error: format!("evicting {victim}: {error}"),
                        };
                    }
                }
            }
        }
        self.events.reclaimed(pod, &reclaim.victims, &reclaim.node);
        Outcome::Evicted {
            pod: pod.clone(),
            node: reclaim.node.clone(),
            victims: reclaim.victims.clone(),
        }
    }
}

fn split(pod: &PodKey) -> (&str, &str) {
    pod.as_str()
        .split_once('/')
        .unwrap_or(("default", pod.as_str()))
}

/// Runs rounds every `quota.reclaim.intervalSeconds` until the task is dropped.
pub async fn run<A: PodEvict, E: ReclaimEvents>(
    mut reclaimer: Reclaimer<A, E>,
    metrics: Metrics,
    epoch: Instant,
) {
    let every = Duration::from_secs(reclaimer.cfg.quota.reclaim.interval_seconds);
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if !reclaimer.state.is_ready() {
            continue;
        }
        let outcome = reclaimer.round(monotonic_ms(epoch)).await;
        if let Some(label) = outcome.label() {
            metrics.quota_reclaims.with_label_values(&[label]).inc();
        }
        match outcome {
            Outcome::Idle => {}
            Outcome::Evicted { pod, node, victims } => {
                metrics.quota_evictions.inc_by(victims.len() as u64);
                info!(%pod, %node, ?victims, "GPU quota reclaim: evicted borrowers' pods");
            }
            Outcome::PdbBlocked { pod, node, victim } => info!(
                %pod, %node, %victim,
                "GPU quota reclaim: a PodDisruptionBudget refused the eviction; trying elsewhere or later"
            ),
            Outcome::Failed { pod, error } => {
                warn!(%pod, %error, "GPU quota reclaim failed; retrying next round");
            }
        }
    }
}
