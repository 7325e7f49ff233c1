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
//! newest first, the fewest whose eviction makes the pod fit; the node is read to check that
//! kube-scheduler's node-level filters (cordon, taints, node selector, required affinity) let the
//! pod there, as the engine sees GPUs only. Each victim is evicted through
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

use k8s_openapi::api::core::v1::Pod;
use tracing::{debug, info, warn};

use super::api::PodEvict;
use super::events::ReclaimEvents;
use super::lease::Writer;
use super::requeue::{Waiting, waiting_pod};
use super::watch::is_unschedulable;
use crate::config::Config;
use crate::objects::admission::node_refusal;
use crate::state::{ApiError, ClusterState, PolicyCell, monotonic_ms};
use crate::telemetry::Metrics;
use gpu_engine::quota::{Claimant, Reclaim, choose_reclaim, namespace_of, usage};
use gpu_engine::{NodeName, PodKey};

/// Nodes a round may check against a waiting pod's node-level constraints before giving up on
/// it until the next round (each check is one read of a Node).
const NODES_CHECKED_PER_ROUND: usize = 4;

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
    /// Per waiting pod: nodes left out, and since when: a PodDisruptionBudget refused an
    /// eviction there, or the pod may not go there (a selector, a taint).
    avoid: HashMap<PodKey, BTreeMap<NodeName, u64>>,
    /// Pods evicted, and when: not chosen again while they linger in the table.
    evicted: HashMap<PodKey, u64>,
}

impl<A, E> std::fmt::Debug for Reclaimer<A, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reclaimer")
            .field("in_flight", &self.in_flight)
            .field("avoid", &self.avoid)
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
            avoid: HashMap::new(),
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
        let mut waiting: Vec<(Waiting, Arc<Pod>)> = self
            .state
            .pending_pods(is_unschedulable)
            .into_iter()
            .filter_map(|(key, pod)| Some((waiting_pod(key, &pod, &self.cfg)?, pod)))
            .collect();
        let pending: BTreeSet<PodKey> = waiting.iter().map(|(w, _)| w.key.clone()).collect();
        // A reclaim ends when its pod is placed (no longer waiting) or the cool-down passes.
        self.in_flight
            .retain(|_, (pod, at)| pending.contains(pod) && fresh(at));
        self.reclaimed_for.retain(|_, at| fresh(at));
        self.evicted.retain(|_, at| fresh(at));
        for nodes in self.avoid.values_mut() {
            nodes.retain(|_, at| fresh(at));
        }
        self.avoid
            .retain(|pod, nodes| pending.contains(pod) && !nodes.is_empty());
        let quotas = self.state.quotas();
        if quotas.is_empty() || waiting.is_empty() {
            return Outcome::Idle;
        }
        waiting.sort_by(|a, b| (a.0.created, &a.0.key).cmp(&(b.0.created, &b.0.key)));
        let policy = self.policy.load();
        // Once per round: what each namespace uses moves only with binds and ends, and a round
        // starts one reclaim at most.
        let used = usage(&self.state.read());
        for (pod, object) in &waiting {
            let namespace = namespace_of(&pod.key);
            let Some(quota) = quotas.get(namespace).map(|quota| quota.full_name()) else {
                continue;
            };
            if self.in_flight.contains_key(&quota) || self.reclaimed_for.contains_key(&pod.key) {
                continue;
            }
            let mut excluded: BTreeSet<NodeName> = self
                .avoid
                .get(&pod.key)
                .map(|nodes| nodes.keys().cloned().collect())
                .unwrap_or_default();
            for _ in 0..NODES_CHECKED_PER_ROUND {
                let chosen = {
                    let table = self.state.read();
                    let claimant = Claimant {
                        namespace,
                        request: &pod.request,
                    };
                    // Pods this replica evicted, and pods already going (whoever evicted or
                    // deleted them), are no victims: evicting them again frees nothing more.
                    let rank = |victim: &PodKey| {
                        let rank = self.state.rank(victim).unwrap_or_default();
                        (!self.evicted.contains_key(victim) && !rank.terminating)
                            .then(|| rank.eviction_order())
                    };
                    choose_reclaim(&table, &quotas, &used, claimant, &policy, &excluded, rank)
                };
                debug!(pod = %pod.key, ?chosen, ?excluded, "GPU quota reclaim: victims chosen");
                let Some(reclaim) = chosen else {
                    break;
                };
                match self.admits(object, &reclaim.node).await {
                    Ok(true) => {}
                    Ok(false) => {
                        self.avoid_node(&pod.key, &reclaim.node, now_ms);
                        excluded.insert(reclaim.node);
                        continue;
                    }
                    Err(error) => {
                        return Outcome::Failed {
                            pod: pod.key.clone(),
                            error: format!("reading node {}: {error}", reclaim.node),
                        };
                    }
                }
                let outcome = self.evict(&pod.key, &reclaim, now_ms).await;
                if let Outcome::Evicted { .. } = outcome {
                    self.in_flight.insert(quota, (pod.key.clone(), now_ms));
                    self.reclaimed_for.insert(pod.key.clone(), now_ms);
                }
                return outcome;
            }
        }
        Outcome::Idle
    }

    /// Whether kube-scheduler's node-level filters let `pod` onto `node` once GPUs are free
    /// there (cordon, taints, node selector and required affinity, allocatable counts): the
    /// engine sees GPUs only, and evicting for a pod that cannot go there would free nothing.
    async fn admits(&self, pod: &Pod, node: &NodeName) -> Result<bool, ApiError> {
        let Some(node) = self.api.get_node(node.as_str()).await? else {
            return Ok(false);
        };
        Ok(matches!(
            node_refusal(&node, pod, None, &self.cfg),
            Ok(None)
        ))
    }

    /// Leaves `node` out of reclaims for `pod` until the cool-down passes.
    fn avoid_node(&mut self, pod: &PodKey, node: &NodeName, now_ms: u64) {
        self.avoid
            .entry(pod.clone())
            .or_default()
            .insert(node.clone(), now_ms);
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
                        self.avoid_node(pod, &reclaim.node, now_ms);
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
    writer: Writer,
) {
    let every = Duration::from_secs(reclaimer.cfg.quota.reclaim.interval_seconds);
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        // Only the replica holding the writer Lease evicts (src/k8s/lease.rs).
        if !reclaimer.state.is_ready() || !writer.holds() {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test fixtures")]

    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    use super::*;
    use crate::objects::quota::quota_names;
    use crate::objects::translate::pod_request;
    use crate::state::VictimRank;
    use gpu_engine::quota::{Quota, QuotaSet};
    use gpu_engine::{GpuMode, MemMiB, NodeSpec, Policy, Table, fit};

    /// Evictions asked, as (pod, dry run); pods in `refuse` answer 429 as a PDB would; nodes in
    /// `tainted` carry a taint the waiting pod does not tolerate.
    #[derive(Default)]
    struct Api {
        calls: Mutex<Vec<(String, bool)>>,
        refuse: Vec<&'static str>,
        tainted: Vec<&'static str>,
    }

    impl PodEvict for Arc<Api> {
        async fn get_node(&self, name: &str) -> Result<Option<Node>, ApiError> {
            let taints = if self.tainted.contains(&name) {
                json!([{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}])
            } else {
                json!([])
            };
            Ok(Some(
                serde_json::from_value(json!({
                    "metadata": {"name": name},
                    "spec": {"taints": taints},
                    "status": {"allocatable": {"nvidia.com/gpu": "4"}}
                }))
                .unwrap(),
            ))
        }

        async fn evict_pod(
            &self,
            namespace: &str,
            name: &str,
            dry_run: bool,
        ) -> Result<(), ApiError> {
            let pod = format!("{namespace}/{name}");
            self.calls.lock().unwrap().push((pod.clone(), dry_run));
            if self.refuse.contains(&pod.as_str()) {
                return Err(ApiError::Other {
                    code: Some(429),
                    message: "Cannot evict pod as it would violate the pod's disruption budget."
                        .into(),
                });
            }
            Ok(())
        }
    }

    /// Events recorded, as (reason-ish kind, pod).
    #[derive(Default)]
    struct Events(Mutex<Vec<(&'static str, String)>>);

    impl ReclaimEvents for Arc<Events> {
        fn evicted(&self, victim: &PodKey, _: &PodKey, _: &NodeName) {
            self.0.lock().unwrap().push(("evicted", victim.to_string()));
        }
        fn reclaimed(&self, beneficiary: &PodKey, _: &[PodKey], _: &NodeName) {
            self.0
                .lock()
                .unwrap()
                .push(("reclaimed", beneficiary.to_string()));
        }
    }

    fn waiting_pod(name: &str, gpus: u32) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "a", "uid": name,
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {
                "cpu": "1", "nvidia.com/gpu": gpus.to_string()}}}]},
            "status": {"conditions": [{"type": "PodScheduled", "status": "False",
                                       "reason": "Unschedulable"}]}
        }))
        .unwrap()
    }

    /// Team b (min 0) fills two 4-GPU nodes with 2-GPU pods; team a (min 4) waits for 2 GPUs.
    fn cluster(cfg: &Config) -> Arc<ClusterState> {
        let policy = Policy::default();
        let mut table = Table::rebuild(
            20,
            ["n1", "n2"]
                .map(|n| NodeSpec::uniform(n, GpuMode::Exclusive, 4, "A100", MemMiB(80 * 1024))),
            [],
        );
        let two = pod_request(&waiting_pod("x", 2), cfg).unwrap().unwrap();
        let pods = [
            ("n1", "x1", 1),
            ("n1", "x2", 4),
            ("n2", "y1", 2),
            ("n2", "y2", 3),
        ];
        for (node, name, _) in pods {
            let placed = fit(table.node_by_str(node).unwrap(), &two, &policy).unwrap();
            table.reserve(PodKey::new("b", name), placed, 1).unwrap();
        }
        let state = Arc::new(ClusterState::with_table(table));
        for (_, name, created_s) in pods {
            let rank = VictimRank {
                priority: 100,
                created_s,
                terminating: false,
            };
            state.note_rank(&PodKey::new("b", name), rank);
        }
        let quota = Quota::whole_gpus_min;
        state.set_quotas(QuotaSet::build(
            vec![quota("a", 4), quota("b", 0)],
            Vec::new(),
            &quota_names(cfg),
        ));
        state.note_gpu_pod(
            PodKey::new("a", "w"),
            "w",
            Some(Arc::new(waiting_pod("w", 2))),
        );
        state
    }

    /// The newest borrower on the best node is refused by its budget in the dry run: nothing is
    /// evicted there, the next round takes the other node, and a reclaim in flight is not
    /// repeated.
    #[tokio::test]
    async fn a_budget_sends_the_reclaim_to_another_node_and_nothing_is_evicted_twice() {
        let cfg = Arc::new(Config::default());
        let state = cluster(&cfg);
        let api = Arc::new(Api {
            refuse: vec!["b/x2"],
            ..Api::default()
        });
        let events = Arc::new(Events::default());
        let policy = PolicyCell::from(Arc::new(Policy::default()));
        let mut reclaimer = Reclaimer::new(state, cfg, policy, api.clone(), events.clone());
        let blocked = reclaimer.round(1_000).await;
        assert_eq!(
            blocked,
            Outcome::PdbBlocked {
                pod: PodKey::new("a", "w"),
                node: NodeName::new("n1"),
                victim: PodKey::new("b", "x2"),
            }
        );
        let evicted = reclaimer.round(2_000).await;
        assert_eq!(
            evicted,
            Outcome::Evicted {
                pod: PodKey::new("a", "w"),
                node: NodeName::new("n2"),
                victims: vec![PodKey::new("b", "y2")],
            }
        );
        assert_eq!(reclaimer.round(3_000).await, Outcome::Idle, "in flight");
        assert_eq!(
            *api.calls.lock().unwrap(),
            [
                ("b/x2".to_owned(), true),
                ("b/y2".to_owned(), true),
                ("b/y2".to_owned(), false)
            ]
        );
        assert_eq!(
            *events.0.lock().unwrap(),
            [
                ("evicted", "b/y2".to_owned()),
                ("reclaimed", "a/w".to_owned())
            ]
        );
        assert_eq!(evicted.label(), Some("evicted"));
        assert_eq!(blocked.label(), Some("pdb_blocked"));
    }
    /// A borrower already terminating (evicted by another replica, or deleted) is no victim:
    /// evicting it again would free nothing more, and would send a second Event.
    #[tokio::test]
    async fn a_pod_already_terminating_is_not_evicted_again() {
        let cfg = Arc::new(Config::default());
        let state = cluster(&cfg);
        let going = PodKey::new("b", "x2");
        let rank = state.rank(&going).unwrap();
        state.note_rank(
            &going,
            VictimRank {
                terminating: true,
                ..rank
            },
        );
        let api = Arc::new(Api::default());
        let events = Arc::new(Events::default());
        let policy = PolicyCell::from(Arc::new(Policy::default()));
        let mut reclaimer = Reclaimer::new(state, cfg, policy, api.clone(), events);
        let outcome = reclaimer.round(1_000).await;
        let Outcome::Evicted { victims, .. } = outcome else {
            panic!("no eviction: {outcome:?}");
        };
        assert!(!victims.contains(&going), "{victims:?}");
        assert!(
            api.calls
                .lock()
                .unwrap()
                .iter()
                .all(|(pod, _)| pod != "b/x2"),
            "{:?}",
            api.calls.lock().unwrap()
        );
    }

    /// A node the waiting pod may not go to (a taint it does not tolerate) is never evicted on,
    /// however good its victims; the round moves on to the next node.
    #[tokio::test]
    async fn a_node_the_pod_may_not_go_to_is_left_out() {
        let cfg = Arc::new(Config::default());
        let state = cluster(&cfg);
        let api = Arc::new(Api {
            tainted: vec!["n1"],
            ..Api::default()
        });
        let events = Arc::new(Events::default());
        let policy = PolicyCell::from(Arc::new(Policy::default()));
        let mut reclaimer = Reclaimer::new(state, cfg, policy, api.clone(), events);
        let outcome = reclaimer.round(1_000).await;
        assert_eq!(
            outcome,
            Outcome::Evicted {
                pod: PodKey::new("a", "w"),
                node: NodeName::new("n2"),
                victims: vec![PodKey::new("b", "y2")],
            }
        );
        assert!(
            api.calls
                .lock()
                .unwrap()
                .iter()
                .all(|(pod, _)| pod.starts_with("b/y")),
            "nothing evicted on the tainted node"
        );
    }
}
