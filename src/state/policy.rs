//! The policy the service decides with ([`PolicyCell`]), and `policy.typicalPods.learn`:
//! relearning FGD's typical-pod distribution from the pods the cluster runs.
//!
//! Filter, prioritize, bind and the requeue task read the policy once per decision; the learning
//! task swaps in a policy with a new distribution every `policy.typicalPods.learnIntervalSeconds`
//! when what the table holds has changed it. Until the table holds [`MIN_LEARNED_PODS`] pods the
//! configured distribution (`policy.typicalPods.pods`, possibly empty) stays in force: a handful
//! of pods is no distribution. With `policy.typicalPods.scarcity: now` (or `shape`) the same task
//! measures FGD+'s scarce classes again on the nodes as they are, within 100 ms of a change to
//! the table.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use tracing::info;

use super::cluster::ClusterState;
use gpu_engine::policy::typical::{Scarcity, ScarcityCensus};
use gpu_engine::{Policy, TypicalPods, learn_typical};

/// Pods the table must hold before a learned distribution replaces the configured one.
pub const MIN_LEARNED_PODS: u64 = 20;

/// The policy in force, shared by every part of the service; cheap to clone (one `Arc`).
/// Reading it is a lock-free load (`arc-swap`): every filter and prioritize call reads it, and
/// the learner's rare swap must not make them wait.
#[derive(Clone, Debug)]
pub struct PolicyCell(Arc<Cell>);

#[derive(Debug)]
struct Cell {
    policy: ArcSwap<Policy>,
    /// Pods the distribution was last learned from (0 until the learner has run).
    learned_from: AtomicU64,
}

impl PolicyCell {
    /// The policy to decide with now. Hold the returned `Arc` for one decision, so that a
    /// decision never mixes two distributions.
    pub fn load(&self) -> Arc<Policy> {
        self.0.policy.load_full()
    }

    /// Puts `policy` in force for every decision that starts from now on.
    pub fn store(&self, policy: Policy) {
        self.0.policy.store(Arc::new(policy));
    }

    /// Puts `current` with the distribution `typical` in force: what learning and measuring
    /// scarcity swap in.
    fn store_typical(&self, current: &Policy, typical: TypicalPods) {
        self.store(Policy {
            typical,
            ..current.clone()
        });
    }

    /// Pods the typical-pod distribution was last learned from (for the metrics).
    pub fn learned_from(&self) -> u64 {
        self.0.learned_from.load(Ordering::Relaxed)
    }
}

impl From<Arc<Policy>> for PolicyCell {
    fn from(policy: Arc<Policy>) -> Self {
        Self(Arc::new(Cell {
            policy: ArcSwap::new(policy),
            learned_from: AtomicU64::new(0),
        }))
    }
}

impl From<Policy> for PolicyCell {
    fn from(policy: Policy) -> Self {
        Arc::new(policy).into()
    }
}

/// One round of learning: the distribution of the pods the table holds, or `configured` while
/// there are fewer than [`MIN_LEARNED_PODS`]; stored only if it differs from the one in force.
/// Returns (classes in force, pods learned from).
pub fn relearn(
    cluster: &ClusterState,
    cell: &PolicyCell,
    configured: &TypicalPods,
    learn: bool,
) -> (usize, u64) {
    let table = cluster.read();
    let (learned, counted) = if learn {
        learn_typical(&table)
    } else {
        (TypicalPods::default(), 0)
    };
    cell.0.learned_from.store(counted, Ordering::Relaxed);
    let wanted = if counted >= MIN_LEARNED_PODS {
        learned
    } else {
        configured.clone()
    };
    let current = cell.load();
    // FGD+ weighs the classes few nodes can run by how scarce their nodes are in this cluster
    // (as if empty, or as they are now: `fgd_plus.scarcity.measured`).
    let wanted = if current.weighs_scarcity() {
        wanted.with_scarcity(table.nodes(), current.fgd_plus.scarcity.measured)
    } else {
        wanted
    };
    drop(table);
    if current.typical != wanted {
        info!(
            classes = wanted.pods().len(),
            pods = counted,
            "typical-pod distribution relearned"
        );
        let classes = wanted.pods().len();
        cell.store_typical(&current, wanted);
        return (classes, counted);
    }
    (current.typical.pods().len(), counted)
}

/// Measures the scarce classes of the distribution in force again on the nodes as they are,
/// keeping the distribution itself: with `scarcity: now` a class's weight follows the nodes
/// able to run it as they fill, which a learning interval of 30 s would leave thousands of
/// placements behind. Stores a new policy only when a weight moved a step. Whether it did.
pub fn remeasure_scarcity(cluster: &ClusterState, cell: &PolicyCell) -> bool {
    let current = cell.load();
    let how = current.fgd_plus.scarcity.measured;
    if !current.weighs_scarcity() || how == Scarcity::Empty {
        return false;
    }
    let census = ScarcityCensus::of(&current.typical, how, cluster.read().nodes());
    let mut measured = current.typical.clone();
    if !measured.set_census(&census) {
        return false;
    }
    cell.store_typical(&current, measured);
    true
}

/// How often the table is checked for changes between two learning rounds, and
/// [`remeasure_scarcity`] run when it changed. In the real loop `simulate` is compared with
/// (docs/benchmarks.md), a 1 s period left about 90 placements measured late and cost a
/// CPU-heavy workload 0.34 points against `simulate`'s measure after every placement.
pub const SCARCITY_REMEASURE: Duration = Duration::from_millis(100);

/// Relearns (with `learn`; otherwise only measures the classes' scarcity on the cluster's
/// nodes) as soon as the initial lists are applied, then every `every`, forever; in between,
/// measures the scarce classes again every [`SCARCITY_REMEASURE`] if the table was written
/// since (when measured now).
pub async fn run(
    cluster: Arc<ClusterState>,
    cell: PolicyCell,
    configured: TypicalPods,
    learn: bool,
    every: Duration,
) {
    while !cluster.is_ready() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut learning = tokio::time::interval(every);
    learning.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut measuring = tokio::time::interval(SCARCITY_REMEASURE);
    measuring.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut measured_at = cluster.writes();
    loop {
        tokio::select! {
            _ = learning.tick() => {
                measured_at = cluster.writes();
                relearn(&cluster, &cell, &configured, learn);
            }
            _ = measuring.tick() => {
                let writes = cluster.writes();
                if writes != measured_at {
                    measured_at = writes;
                    remeasure_scarcity(&cluster, &cell);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_engine::model::GpuMode;
    use gpu_engine::{
        Change, ComputeMilli, CpuMilli, GpuDemand, MemMiB, NodeSpec, PodKey, PodRequest, Table,
        TypicalPod, fit,
    };

    fn cluster_with(pods: usize) -> ClusterState {
        let mut table = Table::new(20);
        let node = NodeSpec::uniform("n", GpuMode::ShareMemory, 8, "Tesla-T4", MemMiB(16_384));
        table.apply(Change::UpsertNode(node.clone()));
        let request = PodRequest::single(
            CpuMilli(500),
            MemMiB(512),
            GpuDemand::Share {
                gpus: 1,
                mem_per_gpu: MemMiB(2048),
                compute_per_gpu: ComputeMilli(0),
            },
        );
        for i in 0..pods {
            let Some(state) = table.node(&node.name).cloned() else {
                panic!("node n is missing");
            };
            let allocation = fit(&state, &request, &Policy::default())
                .unwrap_or_else(|reason| panic!("pod {i} does not fit: {reason:?}"));
            table.apply(Change::PodBound {
                pod: PodKey::new("ns", &format!("p{i}")),
                allocation,
            });
        }
        ClusterState::with_table(table)
    }

    fn configured() -> TypicalPods {
        TypicalPods::new(vec![TypicalPod {
            cpu: CpuMilli(1000),
            memory: MemMiB(0),
            gpus: 1,
            milli: 1000,
            models: Vec::new(),
            weight: 1.0,
        }])
    }

    #[test]
    fn the_configured_distribution_holds_until_enough_pods_are_seen() {
        let cell = PolicyCell::from(Policy {
            typical: configured(),
            ..Policy::scoring(gpu_engine::ScoringPolicy::FgdPlus)
        });
        let few = cluster_with(5);
        assert_eq!(relearn(&few, &cell, &configured(), true), (1, 5));
        assert_eq!(cell.load().typical.pods(), configured().pods());

        let many = cluster_with(30);
        assert_eq!(relearn(&many, &cell, &configured(), true), (1, 30));
        let learned = cell.load();
        // 2 GiB of a 16 GiB card: 125 milli-GPU, every pod alike.
        assert_eq!(learned.typical.pods()[0].milli, 125);
        assert_eq!(learned.typical.pods()[0].cpu, CpuMilli(500));

        // Fewer pods again: back to the configured distribution.
        assert_eq!(relearn(&few, &cell, &configured(), true), (1, 5));
        assert_eq!(cell.load().typical.pods(), configured().pods());

        // Without learning only the classes' scarcity is measured: the configured classes stay.
        assert_eq!(relearn(&many, &cell, &configured(), false), (1, 0));
        assert_eq!(cell.load().typical.pods(), configured().pods());
        assert_eq!(
            cell.load().typical,
            configured().with_cluster(many.read().nodes())
        );
    }

    #[test]
    fn scarcity_measured_now_follows_a_placement_without_relearning() {
        // Two 128-core nodes can run the 120-core 8-GPU class, six 64-core ones cannot: excess
        // scarcity 64/16 - 1 = 3 while both are free, 64/8 - 1 = 7 once one is taken.
        let mut table = Table::new(20);
        let node = |name: &str, cpu: u64| {
            NodeSpec::uniform(name, GpuMode::CoreMem, 8, "G2", MemMiB(0)).with_host(
                CpuMilli(cpu),
                MemMiB(1 << 30),
                110,
            )
        };
        for (i, cpu) in [
            128_000, 128_000, 64_000, 64_000, 64_000, 64_000, 64_000, 64_000,
        ]
        .into_iter()
        .enumerate()
        {
            table.apply(Change::UpsertNode(node(&format!("n{i}"), cpu)));
        }
        let cluster = ClusterState::with_table(table);
        let class = |cpu: u64, gpus: u16, weight: f64| TypicalPod {
            cpu: CpuMilli(cpu),
            memory: MemMiB(0),
            gpus,
            milli: 1000,
            models: Vec::new(),
            weight,
        };
        let configured = TypicalPods::new(vec![class(8_000, 1, 9.0), class(120_000, 8, 1.0)]);
        let policy = |how| Policy {
            typical: configured.clone(),
            fgd_plus: {
                let mut tuning = gpu_engine::policy::fgd_plus::Tuning::default();
                tuning.scarcity.measured = how;
                tuning
            },
            ..Policy::scoring(gpu_engine::ScoringPolicy::FgdPlus)
        };
        let now = PolicyCell::from(policy(Scarcity::Now));
        let empty = PolicyCell::from(policy(Scarcity::Empty));
        for cell in [&now, &empty] {
            relearn(&cluster, cell, &configured, false);
            assert!(!remeasure_scarcity(&cluster, cell), "nothing moved yet");
        }
        let weight = |cell: &PolicyCell| cell.load().typical.scarce()[0].1;
        assert!((weight(&now) - 0.1 * 3.0).abs() < 1e-9, "{}", weight(&now));

        // A one-GPU pod with 16 cores on a 128-core node: only one node can run the class now.
        let request =
            PodRequest::single(CpuMilli(16_000), MemMiB(0), GpuDemand::Whole { count: 1 });
        let allocation = {
            let table = cluster.read();
            let Some(state) = table.node_by_str("n0") else {
                panic!("node n0 is missing");
            };
            fit(state, &request, &Policy::default())
                .unwrap_or_else(|reason| panic!("the pod does not fit: {reason:?}"))
        };
        let writes = cluster.writes();
        cluster.write_table().apply(Change::PodBound {
            pod: PodKey::new("ns", "p"),
            allocation,
        });
        assert_eq!(
            cluster.writes(),
            writes + 1,
            "the loop sees the table changed"
        );
        assert!(remeasure_scarcity(&cluster, &now));
        assert!((weight(&now) - 0.1 * 7.0).abs() < 1e-9, "{}", weight(&now));
        assert_eq!(now.load().typical.pods(), configured.pods(), "same classes");
        assert!(!remeasure_scarcity(&cluster, &now), "measured already");
        // Measured as if empty, a placement changes nothing.
        assert!(!remeasure_scarcity(&cluster, &empty));
        assert!(
            (weight(&empty) - 0.1 * 3.0).abs() < 1e-9,
            "{}",
            weight(&empty)
        );
    }

    #[test]
    fn the_idle_cover_follows_the_nodes_without_relearning() {
        // Four idle 8-GPU nodes and a distribution whose 4-GPU class asks half the GPU demand:
        // idle share 1 over 0.5, capped at 1. One pod on each of three nodes leaves 8 of 32
        // GPUs idle: 0.25 / 0.5 = 0.5, under 1, where FGD+'s idle-node guard reads it.
        let mut table = Table::new(20);
        for i in 0..4 {
            table.apply(Change::UpsertNode(
                NodeSpec::uniform(&format!("n{i}"), GpuMode::CoreMem, 8, "G2", MemMiB(0))
                    .with_host(CpuMilli(128_000), MemMiB(1 << 30), 110),
            ));
        }
        let cluster = ClusterState::with_table(table);
        let class = |gpus: u16, weight: f64| TypicalPod {
            cpu: CpuMilli(8_000),
            memory: MemMiB(0),
            gpus,
            milli: 1000,
            models: Vec::new(),
            weight,
        };
        let configured = TypicalPods::new(vec![class(1, 4.0), class(4, 1.0)]);
        let cell = PolicyCell::from(Policy {
            typical: configured.clone(),
            ..Policy::scoring(gpu_engine::ScoringPolicy::FgdPlus)
        });
        relearn(&cluster, &cell, &configured, false);
        assert_eq!(cell.load().typical.idle_cover(), Some(100));
        let request = PodRequest::single(CpuMilli(1_000), MemMiB(0), GpuDemand::Whole { count: 1 });
        for i in 0..3 {
            let allocation = {
                let table = cluster.read();
                let Some(state) = table.node_by_str(&format!("n{i}")) else {
                    panic!("node n{i} is missing");
                };
                fit(state, &request, &Policy::default())
                    .unwrap_or_else(|reason| panic!("the pod does not fit: {reason:?}"))
            };
            cluster.write_table().apply(Change::PodBound {
                pod: PodKey::new("ns", &format!("p{i}")),
                allocation,
            });
        }
        assert!(remeasure_scarcity(&cluster, &cell));
        assert_eq!(cell.load().typical.idle_cover(), Some(50));
        assert_eq!(
            cell.load().typical.pods(),
            configured.pods(),
            "same classes"
        );
    }

    #[test]
    fn a_decision_keeps_the_policy_it_loaded() {
        let cell = PolicyCell::from(Policy::default());
        let held = cell.load();
        cell.store(Policy {
            typical: configured(),
            ..Policy::default()
        });
        assert!(held.typical.is_empty());
        assert_eq!(cell.load().typical, configured());
    }
}
