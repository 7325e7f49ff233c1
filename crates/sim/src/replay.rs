//! One run of the reference experiment: pods submitted one at a time in arrival order, each
//! filtered and placed by the engine (`fit`, `NodeState::add`), scored by a reference rule or an
//! engine policy, failures dropped and never retried; nothing ever leaves, except with
//! departures ([`Prepared::with_departures`]), where placed pods leave at their deletion time.
//!
//! Speed comes from a per-(node, pod class) cache of feasibility and score: a placement changes
//! one node, so only that node's entries go stale (a generation counter per node), and every
//! other node answers from the cache. A pod class is every pod the filter and all scores treat
//! alike (same CPU, memory, GPU count, milli-GPU and model list).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::ceiling::RunCeiling;
use super::go_rand::GoRand;
use super::metrics::{Curves, PodKind, Rejections, Step};
use super::protocol::{self, Arrivals};
use super::trace::{Cluster, SimNode, Workload};
use super::window::{SchedulerWindow, feasible_nodes_to_find};
use crate::dra;
use crate::reference::{self, GpuClass, GpuClassMix, GpuSelection, PodShape, ReferencePolicy};
use gpu_engine::policy::fgd::FgdCache;
use gpu_engine::policy::typical::{Scarcity, ScarcityCensus};
use gpu_engine::policy::{fgd_plus, free_milli};
use gpu_engine::{
    NodeSpec, NodeState, PodAllocation, PodRequest, Policy, ScoringPolicy, ShareChoice,
    TypicalPods, fit, fit_choosing,
};

/// A policy the simulator can replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SimPolicy {
    /// One of the paper's policies, with its integer scores and GPU choice.
    Reference(ReferencePolicy),
    /// An engine scoring policy exactly as the extender runs it (untruncated scores), fed the
    /// trace's typical pods; `tuning` matters to [`ScoringPolicy::FgdPlus`] only.
    Engine {
        scoring: ScoringPolicy,
        tuning: fgd_plus::Tuning,
    },
    /// kube-scheduler alone, its default profile's scores ([`crate::dra`]): the baseline of DRA
    /// mode, where pods ask for GPUs through claims and no extender ranks them.
    KubeDefault,
}

impl SimPolicy {
    /// The six reference policies.
    pub fn references() -> impl Iterator<Item = Self> {
        ReferencePolicy::ALL.into_iter().map(Self::Reference)
    }

    /// An engine policy with its default settings.
    pub fn engine(scoring: ScoringPolicy) -> Self {
        Self::Engine {
            scoring,
            tuning: fgd_plus::Tuning::default(),
        }
    }

    /// The command-line name: the reference policies by their names, engine policies as
    /// `engine-<name>`, ours as `fgd-plus` (with `:knob=value+...` when not at its defaults).
    pub fn name(self) -> String {
        match self {
            Self::Reference(policy) => policy.name().to_owned(),
            Self::Engine {
                scoring: ScoringPolicy::FgdPlus,
                tuning,
            } => {
                let knobs = tuning_knobs(&tuning);
                if knobs.is_empty() {
                    ScoringPolicy::FgdPlus.as_str().to_owned()
                } else {
                    format!("{}:{}", ScoringPolicy::FgdPlus.as_str(), knobs.join("+"))
                }
            }
            Self::Engine { scoring, .. } => format!("engine-{}", scoring.as_str()),
            Self::KubeDefault => KUBE_DEFAULT.to_owned(),
        }
    }

    /// The heading in tables and plots.
    pub fn label(self) -> String {
        match self {
            Self::Reference(policy) => policy.label().to_owned(),
            Self::Engine { .. } | Self::KubeDefault => self.name(),
        }
    }

    /// Parses a command-line name; ours takes knobs after a colon, joined by `+`, with the keys
    /// `policy.fgdPlus` names them by (`fgd_plus::Tuning::KEYS`):
    /// `fgd-plus:host.weight=0+lookahead=0` (see docs/policies.md). `Err` says what is wrong.
    pub fn parse(name: &str) -> Result<Self, String> {
        let name = name.trim();
        let lower = name.to_ascii_lowercase();
        if let Some(policy) = ReferencePolicy::ALL.into_iter().find(|p| p.name() == lower) {
            return Ok(Self::Reference(policy));
        }
        if lower == KUBE_DEFAULT {
            return Ok(Self::KubeDefault);
        }
        let (base, knobs) = match name.split_once(':') {
            Some((base, knobs)) => (base.to_ascii_lowercase(), Some(knobs)),
            None => (lower, None),
        };
        let base = base.strip_prefix("engine-").unwrap_or(&base);
        let scoring = ScoringPolicy::ALL
            .into_iter()
            .find(|p| p.as_str() == base)
            .ok_or_else(|| format!("unknown policy {name:?}"))?;
        let mut tuning = fgd_plus::Tuning::default();
        if let Some(knobs) = knobs {
            if scoring != ScoringPolicy::FgdPlus {
                return Err(format!("{name:?}: only fgd-plus takes knobs"));
            }
            for knob in knobs.split('+').map(str::trim).filter(|k| !k.is_empty()) {
                let (key, value) = knob
                    .split_once('=')
                    .ok_or_else(|| format!("{name:?}: knob {knob:?} is not KEY=VALUE"))?;
                tuning.set(key, value).map_err(|error| error.to_string())?;
            }
        }
        Ok(Self::Engine { scoring, tuning })
    }
}

/// The command-line name of [`SimPolicy::KubeDefault`].
pub const KUBE_DEFAULT: &str = "kube-default";

/// The knobs of `tuning` that differ from the defaults, in parse syntax.
fn tuning_knobs(tuning: &fgd_plus::Tuning) -> Vec<String> {
    tuning
        .changed_knobs()
        .into_iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect()
}

/// Our own policies (the ones `all` adds to the reference six).
pub fn own_policies() -> impl Iterator<Item = SimPolicy> {
    std::iter::once(SimPolicy::engine(ScoringPolicy::FgdPlus))
}

/// Every engine scoring policy, as the simulator names them.
pub fn engine_policies() -> impl Iterator<Item = SimPolicy> {
    ScoringPolicy::ALL.into_iter().map(SimPolicy::engine)
}

/// The pods the filter and every score treat alike, with their engine request.
#[derive(Clone, Debug)]
struct PodClass {
    request: PodRequest,
    /// In DRA mode, what the extender ranks nodes for: the claim's whole GPUs without its model
    /// selector ([`dra::ranked_request`]).
    ranked: PodRequest,
    shape: PodShape,
    class: Option<GpuClass>,
    kind: PodKind,
}

/// A cluster and a workload made ready for any number of runs (shared read-only by threads).
#[derive(Debug)]
pub struct Prepared {
    pub trace: String,
    nodes: Vec<NodeState>,
    capacity_milli: u64,
    classes: Vec<PodClass>,
    /// The class of each pod of the name-sorted workload.
    class_of: Vec<usize>,
    workload: Workload,
    typical: TypicalPods,
    /// Per node, the typical pods' model-access masks (they never change).
    access: Vec<Vec<u64>>,
    /// Pods arrive at their creation time and leave at their deletion time.
    departures: bool,
    /// kube-scheduler's `percentageOfNodesToScore` (0: adaptive) when each pod's choice is
    /// limited to the window kube-scheduler would send the extender; `None`: every node.
    window_percent: Option<u32>,
    /// With the window: a pod it turned away while a node outside it had room is retried with
    /// kube-scheduler's next windows until one holds such a node, as the extender's requeue
    /// nudge has kube-scheduler do ([`Prepared::with_window_retries`]).
    window_retry: bool,
    /// DRA mode ([`Prepared::new_dra`]): kube-scheduler's own scores decide, with the
    /// extender's ranking added for GPU pods under an engine policy.
    dra: bool,
}

impl Prepared {
    /// Prepares `workload` on `cluster`; FGD's typical pods come from the workload as given.
    pub fn new(cluster: &Cluster, workload: &Workload) -> Self {
        let specs = cluster.nodes().iter().map(SimNode::spec).collect();
        Self::of_specs(specs, cluster, workload, false)
    }

    /// Prepares `workload` in DRA mode ([`crate::dra`]): its GPU pods as pods with claims for
    /// whole devices ([`dra::claims_workload`], which names it), nodes serving whole GPUs, and
    /// kube-scheduler's own scores choosing the node, with the extender's DRA ranking added
    /// for GPU pods under an engine policy. FGD's typical pods are the claims workload's.
    pub fn new_dra(cluster: &Cluster, workload: &Workload) -> Self {
        let claims = dra::claims_workload(workload);
        Self::of_specs(dra::node_specs(cluster), cluster, &claims, true)
    }

    fn of_specs(specs: Vec<NodeSpec>, cluster: &Cluster, workload: &Workload, dra: bool) -> Self {
        let nodes: Vec<NodeState> = specs.into_iter().map(NodeState::new).collect();
        let typical = protocol::typical_pods(workload.pods()).with_cluster(&nodes);
        let access = nodes.iter().map(|n| typical.access_masks(n)).collect();
        let mut index: HashMap<(u64, u64, u16, u32, &str), usize> = HashMap::new();
        let mut classes = Vec::new();
        let mut class_of = Vec::with_capacity(workload.pods().len());
        for pod in workload.pods() {
            let shape = pod.shape();
            let key = (
                shape.cpu.0,
                pod.memory.0,
                shape.gpus,
                shape.milli,
                pod.gpu_spec.as_str(),
            );
            let id = *index.entry(key).or_insert_with(|| {
                let request = pod.request();
                classes.push(PodClass {
                    ranked: dra::ranked_request(&request),
                    request,
                    shape,
                    class: shape.class(),
                    kind: pod.kind(),
                });
                classes.len() - 1
            });
            class_of.push(id);
        }
        Self {
            trace: workload.name.clone(),
            nodes,
            capacity_milli: cluster.gpu_milli(),
            classes,
            class_of,
            workload: workload.clone(),
            typical,
            access,
            departures: false,
            window_percent: None,
            window_retry: false,
            dra,
        }
    }

    /// Whether runs are in DRA mode ([`Prepared::new_dra`]).
    pub fn dra(&self) -> bool {
        self.dra
    }

    /// The same, replayed with departures: pods are submitted in order of creation time (the
    /// seeded order among equal times; resampled copies keep their original's times), and
    /// before each pod every placed pod whose deletion time has come leaves. An error when a
    /// pod of the workload has no lifetime.
    pub fn with_departures(mut self) -> anyhow::Result<Self> {
        if let Some(pod) = self.workload.pods().iter().find(|p| p.lifetime.is_none()) {
            anyhow::bail!(
                "{}: pod {} has no creation_time and deletion_time, needed for departures",
                self.trace,
                pod.name
            );
        }
        self.departures = true;
        Ok(self)
    }

    /// The same, each pod choosing only among the nodes kube-scheduler's
    /// `percentageOfNodesToScore` window (`percent`, 0 for its adaptive default) would send the
    /// extender ([`SchedulerWindow`]).
    pub fn with_scheduler_window(mut self, percent: u32) -> Self {
        self.window_percent = Some(percent);
        self
    }

    /// The same, a pod the window turned away while a node outside it had room retried with
    /// kube-scheduler's next windows until one holds such a node: what the extender's requeue
    /// nudge (`requeue.enabled`) has kube-scheduler do in a cluster, where such a pod waits a
    /// moment instead of being turned away. Still counted as a window miss.
    pub fn with_window_retries(mut self) -> Self {
        self.window_retry = true;
        self
    }

    /// How many feasible nodes kube-scheduler's window holds per pod, when runs replay one.
    pub fn scheduler_window(&self) -> Option<usize> {
        self.window_percent
            .map(|percent| feasible_nodes_to_find(percent, self.nodes.len()))
    }

    /// Whether runs replay departures.
    pub fn departures(&self) -> bool {
        self.departures
    }

    /// Workload pod `pod`'s creation and deletion times (0 and never without a lifetime).
    pub fn lifetime(&self, pod: usize) -> (u64, u64) {
        self.workload.pods()[pod]
            .lifetime
            .map_or((0, u64::MAX), |l| (l.created, l.deleted))
    }

    /// GPU capacity in milli-GPU.
    pub fn capacity_milli(&self) -> u64 {
        self.capacity_milli
    }

    /// FGD's typical pods for this workload.
    pub fn typical(&self) -> &TypicalPods {
        &self.typical
    }

    /// The nodes as the run starts: empty.
    pub fn nodes(&self) -> &[NodeState] {
        &self.nodes
    }

    /// The workload, pods sorted by name (arrival orders index into it).
    pub fn workload(&self) -> &Workload {
        &self.workload
    }

    /// How many nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The arrival order and node priorities of a seed, drawn as a run draws them.
    pub fn plan(&self, seed: u64, tune: f64) -> (Arrivals, Vec<u32>, GoRand) {
        let mut go = protocol::run_generator(seed);
        let mut arrivals = protocol::arrivals(&self.workload, self.capacity_milli, tune, &mut go);
        if self.departures {
            // Stable: equal creation times keep the seeded order.
            arrivals.order.sort_by_key(|&pod| self.lifetime(pod).0);
        }
        let priority = protocol::node_priority(self.nodes.len(), &mut go);
        (arrivals, priority, go)
    }
}

/// What one run produced.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub trace: String,
    pub policy: SimPolicy,
    pub seed: u64,
    /// Pods submitted (originals plus resampled).
    pub pods: usize,
    pub added: usize,
    pub failed: usize,
    /// GPU demand of the failed pods, milli-GPU.
    pub failed_milli: u64,
    pub capacity_milli: u64,
    /// Every step, when asked for.
    pub steps: Option<Vec<Step>>,
    pub curves: Curves,
    /// Rejected pods by kind at each arrival column.
    pub rejected: Rejections,
    /// The state after the last pod.
    pub last: Step,
    /// (node, class) evaluations the cache could not answer: the run's real work.
    pub evaluations: u64,
    /// The nodes after the last pod, kept with the steps.
    pub end_nodes: Option<Vec<NodeState>>,
    /// What no online policy exceeds on this arrival order (none with departures, where the
    /// bound does not hold: freed GPUs undo its reasoning).
    pub ceiling: Option<RunCeiling>,
    /// With kube-scheduler's window replayed: the pods turned away because no node of their
    /// window had room while a node outside it had (in a cluster they would wait for another
    /// try; the extender counts them in `gpu_extender_filter_window_misses_total`).
    pub window_misses: Option<u64>,
}

/// How a run ranks nodes for a pod class.
struct Scorer {
    policy: SimPolicy,
    /// The engine policy for fit (and for scores, for FGD and engine policies).
    engine: Policy,
    /// For FGD+ with `scarcity=now`: the nodes that can run each class, kept current as nodes
    /// change, from which `engine`'s scarcity is measured again after every change.
    census: Option<ScarcityCensus>,
}

impl Scorer {
    fn new(policy: SimPolicy, typical: &TypicalPods, nodes: &[NodeState]) -> Self {
        let engine = match policy {
            SimPolicy::Reference(ReferencePolicy::Fgd) => Policy {
                scoring: ScoringPolicy::Fgd,
                fgd_truncate: true,
                ..Policy::default()
            },
            // The policy fit checks with; kube-scheduler's scores are `dra`'s.
            SimPolicy::Reference(_) | SimPolicy::KubeDefault => {
                Policy::scoring(ScoringPolicy::Binpack)
            }
            SimPolicy::Engine { scoring, tuning } => Policy {
                fgd_plus: tuning,
                ..Policy::scoring(scoring)
            },
        };
        // The reference has no per-GPU pod limit.
        let engine = Policy {
            max_shares_per_gpu: u16::MAX,
            ..engine
        }
        .with_typical(typical.clone());
        let census = (engine.weighs_scarcity()
            && engine.fgd_plus.scarcity.measured != Scarcity::Empty)
            .then(|| ScarcityCensus::of(&engine.typical, engine.fgd_plus.scarcity.measured, nodes));
        let mut scorer = Self {
            policy,
            engine,
            census,
        };
        scorer.remeasure();
        scorer
    }

    /// Takes a node that is about to change out of the census.
    fn node_changing(&mut self, node: &NodeState) {
        if let Some(census) = &mut self.census {
            census.remove(&self.engine.typical, node);
        }
    }

    /// Counts a node that just changed back into the census and measures scarcity again;
    /// returns whether that changed the scores of every node.
    fn node_changed(&mut self, node: &NodeState) -> bool {
        if let Some(census) = &mut self.census {
            census.add(&self.engine.typical, node);
        }
        self.remeasure()
    }

    /// Measures the classes' scarcity from the census (if kept); whether it changed.
    fn remeasure(&mut self) -> bool {
        match &self.census {
            Some(census) => self.engine.typical.set_census(census),
            None => false,
        }
    }

    /// Feasibility and score of a class on a node (`None`: the pod does not fit), with
    /// kube-scheduler's own score in DRA mode (`dra`; 0 otherwise). `cache` holds what FGD and
    /// FGD+ derived from the node for earlier classes since it last changed.
    ///
    /// In DRA mode the score is the one the choice ranks by: kube-scheduler's own for
    /// [`SimPolicy::KubeDefault`] and for pods without GPUs (the extender has no opinion on
    /// them), else the policy's score for what the extender reads of the claim.
    fn evaluate(
        &self,
        node: &NodeState,
        free: &[u32],
        mix: &GpuClassMix,
        class: &PodClass,
        cache: &mut FgdCache,
        dra: bool,
    ) -> Option<(f64, i64)> {
        if dra {
            fit(node, &class.request, &self.engine).ok()?;
            let kube = dra::kube_score(node, class.request.cpu, class.request.memory);
            let score = match self.policy {
                SimPolicy::Engine { .. } if class.request.wants_gpu() => self
                    .engine
                    .evaluate_score_with(node, &class.ranked, cache)
                    .ok()?,
                _ => kube as f64,
            };
            return Some((score, kube));
        }
        let score = match self.policy {
            SimPolicy::Reference(ReferencePolicy::Fgd) | SimPolicy::Engine { .. } => self
                .engine
                .evaluate_score_with(node, &class.request, cache)
                .ok()?,
            SimPolicy::Reference(policy) => {
                fit(node, &class.request, &self.engine).ok()?;
                reference::node_score(policy, node, free, mix, class.shape) as f64
            }
            // Outside DRA mode (the command line refuses it there), kube-scheduler's scores.
            SimPolicy::KubeDefault => {
                fit(node, &class.request, &self.engine).ok()?;
                dra::kube_score(node, class.request.cpu, class.request.memory) as f64
            }
        };
        Some((score, 0))
    }

    /// Whether the extender ranks pods of `class` in DRA mode: an engine policy, a GPU pod.
    fn extender_ranks(&self, class: &PodClass) -> bool {
        matches!(self.policy, SimPolicy::Engine { .. }) && class.request.wants_gpu()
    }

    /// In DRA mode, the node kube-scheduler picks among the feasible `(node, score)` whose own
    /// scores are `kube`: the top total ([`dra::totals`]), at random among equals.
    fn choose_dra(
        &self,
        class: &PodClass,
        feasible: &[(usize, f64)],
        kube: &[i64],
        go: &mut GoRand,
    ) -> Option<usize> {
        let nodes: Vec<usize> = feasible.iter().map(|&(node, _)| node).collect();
        let raw: Vec<f64> = feasible.iter().map(|&(_, score)| score).collect();
        let totals = dra::totals(kube, self.extender_ranks(class).then_some(&raw[..]));
        dra::select_host(&nodes, &totals, go)
    }

    /// The node for the pod among the feasible `(node, score)`.
    fn choose(
        &self,
        feasible: &[(usize, f64)],
        priority: &[u32],
        go: &mut GoRand,
    ) -> Option<usize> {
        match feasible {
            [] => None,
            // The framework skips scoring when only one node passes the filter.
            [(node, _)] => Some(*node),
            _ => match self.policy {
                SimPolicy::KubeDefault => reference::select_host(
                    feasible
                        .iter()
                        .map(|&(node, score)| (node, score, priority[node])),
                ),
                SimPolicy::Reference(ReferencePolicy::Random) => {
                    // `nodes[rand.Intn(len)]` of the feasible list (whose order in the
                    // reference depends on its filter goroutines; here it is node order).
                    Some(feasible[go.intn(feasible.len())].0)
                }
                SimPolicy::Reference(policy) if policy.normalizes() => {
                    let (lo, hi) = feasible
                        .iter()
                        .fold((i64::MAX, i64::MIN), |(lo, hi), &(_, s)| {
                            (lo.min(s as i64), hi.max(s as i64))
                        });
                    reference::select_host(feasible.iter().map(|&(node, score)| {
                        (
                            node,
                            reference::normalize(score as i64, lo, hi),
                            priority[node],
                        )
                    }))
                }
                _ => reference::select_host(
                    feasible
                        .iter()
                        .map(|&(node, score)| (node, score, priority[node])),
                ),
            },
        }
    }

    /// The GPU choice for shares on the chosen node.
    fn share_choice(&self, node: &NodeState, class: &PodClass, go: &mut GoRand) -> ShareChoice {
        match self.policy {
            SimPolicy::Reference(policy) => match policy.gpu_selection() {
                GpuSelection::Best => ShareChoice::Binpack,
                GpuSelection::FgdScore => ShareChoice::Fgd,
                GpuSelection::Random if class.shape.is_share() => ShareChoice::Drawn(go.uint32()),
                GpuSelection::Random => ShareChoice::Binpack,
            },
            SimPolicy::Engine { .. } | SimPolicy::KubeDefault => {
                self.engine.share_choice(node, &class.request)
            }
        }
    }
}

/// A cached answer for one (node, class).
#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    /// The node generation the answer belongs to (0: never computed).
    generation: u32,
    feasible: bool,
    score: f64,
    /// kube-scheduler's own score, in DRA mode.
    kube: i64,
}

impl Entry {
    /// Scores again with `evaluate` unless the answer is for `generation` already; whether it did.
    fn refresh(&mut self, generation: u32, evaluate: impl FnOnce() -> Option<(f64, i64)>) -> bool {
        if self.generation == generation {
            return false;
        }
        let scores = evaluate();
        let (score, kube) = scores.unwrap_or_default();
        *self = Self {
            generation,
            feasible: scores.is_some(),
            score,
            kube,
        };
        true
    }
}

/// Where a placement the real loop made ranks among every node of the cluster, as the policy
/// scores them in `simulate`'s view of the same state ([`Referee`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChoiceRank {
    /// The node scores as high as any fitting node of the cluster.
    Best,
    /// A fitting node that kube-scheduler did not send (or an older scarcity measure) would
    /// have scored higher.
    BelowBest,
    /// The policy does not fit the pod on that node in this state.
    NotFit,
}

impl ChoiceRank {
    /// The name the replay's `decisions.csv` gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Best => "best",
            Self::BelowBest => "below_best",
            Self::NotFit => "not_fit",
        }
    }
}

/// The policy's answer (fits, and how well) for every (pod class, node) of a replay, kept in
/// step with the nodes: a placement or departure changes one node, so only that node's answers
/// go stale, unless it changes the classes' scarcity and with it every score.
struct NodeAnswers {
    scorer: Scorer,
    mixes: Vec<GpuClassMix>,
    /// Per node, bumped when it changes; the cache below answers for one generation.
    generation: Vec<u32>,
    /// Per node, what the policy derived from it (its measure as it is, its classes' access)
    /// and the generation that was for: scoring a node for every pod class measures it once.
    measured: Vec<(u32, FgdCache)>,
    /// (class, node) answers, class-major, so that the scan over nodes for one pod reads
    /// contiguous memory.
    cache: Vec<Entry>,
}

impl NodeAnswers {
    fn new(policy: SimPolicy, prepared: &Prepared) -> Self {
        let node_count = prepared.nodes.len();
        Self {
            scorer: Scorer::new(policy, &prepared.typical, &prepared.nodes),
            mixes: vec![GpuClassMix::default(); node_count],
            generation: vec![1; node_count],
            measured: (0..node_count).map(|_| (0, FgdCache::default())).collect(),
            cache: vec![Entry::default(); node_count * prepared.classes.len()],
        }
    }

    /// Every node's answer for class `class_id`, scored again where stale, and how many were.
    fn row(
        &mut self,
        prepared: &Prepared,
        nodes: &[NodeState],
        live: &Live,
        class_id: usize,
    ) -> (&[Entry], u64) {
        let class = &prepared.classes[class_id];
        let count = nodes.len();
        let row = &mut self.cache[class_id * count..(class_id + 1) * count];
        let mut evaluations = 0;
        for (n, entry) in row.iter_mut().enumerate() {
            let generation = self.generation[n];
            if entry.refresh(generation, || {
                let (measured_for, cache) = &mut self.measured[n];
                if *measured_for != generation {
                    *measured_for = generation;
                    *cache = FgdCache::default();
                }
                self.scorer.evaluate(
                    &nodes[n],
                    &live.free[n],
                    &self.mixes[n],
                    class,
                    cache,
                    prepared.dra,
                )
            }) {
                evaluations += 1;
            }
        }
        (row, evaluations)
    }

    /// Takes a node that is about to change out of the scarcity census.
    fn node_changing(&mut self, node: &NodeState) {
        self.scorer.node_changing(node);
    }

    /// After node `n` gained (`added`) or lost a pod of `class_id`: its answers are stale, and
    /// every node's if the scarcity measure moved.
    fn node_changed(
        &mut self,
        prepared: &Prepared,
        nodes: &[NodeState],
        n: usize,
        class_id: usize,
        added: bool,
    ) {
        self.generation[n] += 1;
        if self.scorer.node_changed(&nodes[n]) {
            invalidate_all(&mut self.generation);
        }
        if let Some(gpu_class) = prepared.classes[class_id].class {
            if added {
                self.mixes[n].add(gpu_class);
            } else {
                self.mixes[n].remove(gpu_class);
            }
        }
    }
}

/// The placed pods that leave at their deletion times (with departures), as a run and an
/// in-cluster replay keep them.
#[derive(Debug)]
pub struct Leaving<T> {
    /// (deletion time, slot in `placed`), earliest first; equal times in placement order.
    due: BinaryHeap<Reverse<(u64, usize)>>,
    /// Every pod placed, taken out when it leaves.
    placed: Vec<Option<T>>,
}

impl<T> Default for Leaving<T> {
    fn default() -> Self {
        Self {
            due: BinaryHeap::new(),
            placed: Vec::new(),
        }
    }
}

impl<T> Leaving<T> {
    /// A pod placed now that leaves at `deleted`.
    pub fn add(&mut self, deleted: u64, pod: T) {
        self.due.push(Reverse((deleted, self.placed.len())));
        self.placed.push(Some(pod));
    }

    /// The pods whose deletion time is at or before `now`, earliest first, each once.
    pub fn due(&mut self, now: u64) -> Vec<T> {
        let mut leaving = Vec::new();
        while let Some(&Reverse((time, slot))) = self.due.peek() {
            if time > now {
                break;
            }
            self.due.pop();
            leaving.extend(self.placed.get_mut(slot).and_then(Option::take));
        }
        leaving
    }
}

/// The policy as `simulate` runs it, kept in step with the nodes of an in-cluster replay: it
/// tells whether kube-scheduler bound each pod to the node the policy scores best over the
/// whole cluster, or only to the best of the candidates it sent (`percentageOfNodesToScore`).
pub struct Referee {
    answers: NodeAnswers,
}

impl std::fmt::Debug for Referee {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The answers are a cache of the policy's scores: nothing a reader of a log needs.
        f.debug_struct("Referee").finish_non_exhaustive()
    }
}

impl Referee {
    /// `policy` (an engine policy, with its tuning) on the prepared cluster, still empty.
    pub fn new(prepared: &Prepared, policy: SimPolicy) -> Self {
        Self {
            answers: NodeAnswers::new(policy, prepared),
        }
    }

    /// How node `chosen` ranks for workload pod `pod` among all of `nodes`.
    pub fn rank(
        &mut self,
        prepared: &Prepared,
        nodes: &[NodeState],
        live: &Live,
        pod: usize,
        chosen: usize,
    ) -> ChoiceRank {
        let class_id = prepared.class_of[pod];
        let ranked = self
            .answers
            .scorer
            .extender_ranks(&prepared.classes[class_id]);
        let (row, _) = self.answers.row(prepared, nodes, live, class_id);
        if prepared.dra {
            // kube-scheduler's totals over every fitting node of the cluster.
            let fitting: Vec<usize> = (0..row.len()).filter(|&n| row[n].feasible).collect();
            let kube: Vec<i64> = fitting.iter().map(|&n| row[n].kube).collect();
            let raw: Vec<f64> = fitting.iter().map(|&n| row[n].score).collect();
            let totals = dra::totals(&kube, ranked.then_some(&raw[..]));
            let best = totals.iter().copied().max();
            let own = fitting
                .iter()
                .position(|&n| n == chosen)
                .map(|at| totals[at]);
            return match (own, best) {
                (Some(own), Some(best)) if own < best => ChoiceRank::BelowBest,
                (Some(_), Some(_)) => ChoiceRank::Best,
                _ => ChoiceRank::NotFit,
            };
        }
        let best = row
            .iter()
            .filter(|entry| entry.feasible)
            .map(|entry| entry.score)
            .reduce(f64::max);
        match (row.get(chosen), best) {
            (Some(entry), Some(best)) if entry.feasible => {
                if entry.score < best {
                    ChoiceRank::BelowBest
                } else {
                    ChoiceRank::Best
                }
            }
            _ => ChoiceRank::NotFit,
        }
    }

    /// Whether some node of `nodes` fits workload pod `pod` as the policy sees them.
    pub fn fits_somewhere(
        &mut self,
        prepared: &Prepared,
        nodes: &[NodeState],
        live: &Live,
        pod: usize,
    ) -> bool {
        let (row, _) = self
            .answers
            .row(prepared, nodes, live, prepared.class_of[pod]);
        row.iter().any(|entry| entry.feasible)
    }

    /// Takes node `node`, about to receive a pod, out of the scarcity census.
    pub fn node_changing(&mut self, node: &NodeState) {
        self.answers.node_changing(node);
    }

    /// Counts node `n` back in after workload pod `pod` was added to it (`added`) or left it.
    pub fn node_changed(
        &mut self,
        prepared: &Prepared,
        nodes: &[NodeState],
        n: usize,
        pod: usize,
        added: bool,
    ) {
        self.answers
            .node_changed(prepared, nodes, n, prepared.class_of[pod], added);
    }
}

/// Live per-node measurements, kept in step with the node states (the in-cluster replay keeps
/// them too, from the allocation records of the pods the real loop bound).
#[derive(Debug)]
pub struct Live {
    free: Vec<Vec<u32>>,
    frag: Vec<f64>,
    idle: Vec<bool>,
}

impl Live {
    /// Measurements of every node of `nodes`.
    pub fn of(prepared: &Prepared, nodes: &[NodeState]) -> Self {
        let count = nodes.len();
        let mut live = Self {
            free: vec![Vec::new(); count],
            frag: vec![0.0; count],
            idle: vec![false; count],
        };
        for n in 0..count {
            live.measure(prepared, nodes, n);
        }
        live
    }

    /// Measures node `n` again after it changed.
    pub fn measure(&mut self, prepared: &Prepared, nodes: &[NodeState], n: usize) {
        let node = &nodes[n];
        self.free[n] = free_milli(node, &node.gpus);
        self.frag[n] =
            prepared
                .typical
                .fragmentation(node.cpu_free(), &self.free[n], &prepared.access[n]);
        self.idle[n] = !node.gpus.is_empty() && node.gpus_idle();
    }

    /// The cluster-wide step after a pod.
    pub fn step(&self, arrived_milli: u64, capacity_milli: u64, failed: u32) -> Step {
        let free_milli: u64 = self
            .free
            .iter()
            .flat_map(|free| free.iter())
            .map(|&f| u64::from(f))
            .sum();
        Step {
            arrived_milli,
            used_milli: capacity_milli - free_milli.min(capacity_milli),
            frag_milli: self.frag.iter().sum(),
            free_milli,
            failed,
            idle_nodes: self.idle.iter().filter(|&&idle| idle).count() as u32,
        }
    }
}

/// Makes every cached (node, class) answer stale: a change of scarcity moves every score.
fn invalidate_all(generation: &mut [u32]) {
    for node in generation {
        *node += 1;
    }
}

/// Replays one seed of `policy` on `prepared`, resizing arrivals to `tune` × capacity.
/// `progress` is told how many pods were just submitted, every few hundred.
pub fn run(
    prepared: &Prepared,
    policy: SimPolicy,
    seed: u64,
    tune: f64,
    keep_steps: bool,
    progress: &(dyn Fn(u64) + Sync),
) -> RunResult {
    let (arrivals, priority, mut go) = prepared.plan(seed, tune);
    let mut answers = NodeAnswers::new(policy, prepared);
    let node_count = prepared.nodes.len();
    let mut nodes = prepared.nodes.clone();
    let mut live = Live::of(prepared, &nodes);
    let capacity = prepared.capacity_milli;
    let mut steps = Vec::with_capacity(arrivals.order.len());
    let mut feasible: Vec<(usize, f64)> = Vec::with_capacity(node_count);
    // In DRA mode, kube-scheduler's own score of each feasible node.
    let mut kube: Vec<i64> = Vec::with_capacity(node_count);
    let mut arrived = 0u64;
    let mut failed = 0u32;
    let mut failed_milli = 0u64;
    let mut rejected = Rejections::default();
    let mut reported = 0u64;
    let mut evaluations = 0u64;
    // With departures: the placed pods, (node, class, allocation), by deletion time.
    let mut leaving: Leaving<(usize, usize, PodAllocation)> = Leaving::default();
    let mut window = prepared
        .window_percent
        .map(|percent| SchedulerWindow::new(percent, node_count));
    let mut window_misses = 0u64;
    for (submitted, &pod) in arrivals.order.iter().enumerate() {
        let class_id = prepared.class_of[pod];
        let class = &prepared.classes[class_id];
        let (created, deleted) = prepared.lifetime(pod);
        if prepared.departures {
            for (n, left_class, allocation) in leaving.due(created) {
                answers.node_changing(&nodes[n]);
                nodes[n].remove(&allocation);
                answers.node_changed(prepared, &nodes, n, left_class, false);
                live.measure(prepared, &nodes, n);
            }
        }
        arrived += class.shape.gpu_total();
        feasible.clear();
        let (row, evaluated) = answers.row(prepared, &nodes, &live, class_id);
        evaluations += evaluated;
        let in_window = window
            .as_mut()
            .map(|window| window.select(&nodes, &class.request));
        feasible.extend(
            row.iter()
                .enumerate()
                .filter(|&(n, entry)| entry.feasible && in_window.is_none_or(|sent| sent[n]))
                .map(|(n, entry)| (n, entry.score)),
        );
        if in_window.is_some() && feasible.is_empty() && row.iter().any(|entry| entry.feasible) {
            window_misses += 1;
            if prepared.window_retry
                && let Some(window) = window.as_mut()
            {
                // kube-scheduler's next cycles for the pod, each walking on from where the last
                // stopped: one of them reaches a node with room within a lap of the node list.
                for _ in 0..window.laps(node_count) {
                    let sent = window.select(&nodes, &class.request);
                    feasible.extend(
                        row.iter()
                            .enumerate()
                            .filter(|&(n, entry)| entry.feasible && sent[n])
                            .map(|(n, entry)| (n, entry.score)),
                    );
                    if !feasible.is_empty() {
                        break;
                    }
                }
            }
        }
        kube.clear();
        if prepared.dra {
            kube.extend(feasible.iter().map(|&(n, _)| row[n].kube));
        }
        // kube-scheduler's plugin-metrics sampling draws once per pod (`rand.Intn(100)`), so the
        // Random policy's draws fall where the reference's did.
        go.intn(100);
        let scorer = &answers.scorer;
        let placed = if prepared.dra {
            // kube-scheduler picks the node; the DRA allocator its first free devices.
            scorer
                .choose_dra(class, &feasible, &kube, &mut go)
                .and_then(|n| Some((n, dra::first_free_devices(&nodes[n], &class.request)?)))
        } else {
            scorer.choose(&feasible, &priority, &mut go).and_then(|n| {
                let choice = scorer.share_choice(&nodes[n], class, &mut go);
                let allocation =
                    fit_choosing(&nodes[n], &class.request, &scorer.engine, choice).ok()?;
                Some((n, allocation))
            })
        };
        match placed {
            Some((n, allocation)) => {
                answers.node_changing(&nodes[n]);
                nodes[n].add(&allocation);
                answers.node_changed(prepared, &nodes, n, class_id, true);
                live.measure(prepared, &nodes, n);
                if prepared.departures {
                    leaving.add(deleted, (n, class_id, allocation));
                }
            }
            None => {
                failed += 1;
                failed_milli += class.shape.gpu_total();
                rejected.reject(class.kind);
            }
        }
        let step = live.step(arrived, capacity, failed);
        rejected.step(step.arrive_percent(capacity));
        steps.push(step);
        if submitted % 512 == 511 {
            progress(512);
            reported += 512;
        }
    }
    progress(arrivals.order.len() as u64 - reported);
    let curves = Curves::of_steps(&steps, capacity);
    let ceiling = (!prepared.departures)
        .then(|| RunCeiling::of_run(prepared.workload.pods(), &arrivals.order, &steps, capacity));
    let last = steps
        .last()
        .copied()
        .unwrap_or_else(|| live.step(0, capacity, 0));
    RunResult {
        trace: prepared.trace.clone(),
        policy,
        seed,
        pods: arrivals.order.len(),
        added: arrivals.added,
        failed: failed as usize,
        failed_milli,
        capacity_milli: capacity,
        steps: keep_steps.then_some(steps),
        curves,
        rejected,
        last,
        evaluations,
        end_nodes: keep_steps.then_some(nodes),
        ceiling,
        window_misses: window.is_some().then_some(window_misses),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::load::{parse_node_csv, parse_pod_csv};

    fn cluster() -> Cluster {
        let nodes = "sn,cpu_milli,memory_mib,gpu,model\nn,8000,16384,1,T4\n";
        Cluster::new("c", parse_node_csv(Path::new("nodes.csv"), nodes).unwrap())
    }

    /// Three one-GPU pods for a one-GPU cluster: `b` arrives while `a` runs, `c` after `a` left.
    fn workload() -> Workload {
        let pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time\n\
                    a,1000,1024,1,1000,,0,10\nb,1000,1024,1,1000,,5,25\nc,1000,1024,1,1000,,20,30\n";
        Workload::new("w", parse_pod_csv(Path::new("pods.csv"), pods).unwrap())
    }

    fn fgd() -> SimPolicy {
        SimPolicy::Reference(ReferencePolicy::Fgd)
    }

    #[test]
    fn pods_leave_earliest_first_equal_times_in_placement_order_each_once() {
        let mut leaving = Leaving::default();
        for (deleted, pod) in [(30, "c"), (10, "a"), (20, "b1"), (20, "b2"), (40, "d")] {
            leaving.add(deleted, pod);
        }
        assert!(leaving.due(9).is_empty());
        assert_eq!(leaving.due(20), ["a", "b1", "b2"]);
        assert!(leaving.due(20).is_empty(), "each pod leaves once");
        assert_eq!(leaving.due(u64::MAX), ["c", "d"]);
    }

    #[test]
    fn with_departures_a_freed_gpu_takes_the_next_pod() {
        let prepared = Prepared::new(&cluster(), &workload())
            .with_departures()
            .unwrap();
        for seed in 1..20 {
            let result = run(&prepared, fgd(), seed, 0.0, true, &|_| {});
            // Creation order whatever the seed: a placed, b rejected (a holds the GPU), then a
            // leaves at 10 and c takes the GPU at 20.
            assert_eq!(result.failed, 1, "seed {seed}");
            let steps = result.steps.unwrap();
            let used: Vec<u64> = steps.iter().map(|s| s.used_milli).collect();
            assert_eq!(used, [1000, 1000, 1000], "seed {seed}");
            let arrived: Vec<u64> = steps.iter().map(|s| s.arrived_milli).collect();
            assert_eq!(arrived, [1000, 2000, 3000]);
        }
        // Without departures nothing leaves: only the first pod is placed.
        let plain = Prepared::new(&cluster(), &workload());
        assert_eq!(run(&plain, fgd(), 1, 0.0, false, &|_| {}).failed, 2);
    }

    /// 150 one-GPU nodes and 150 pods of 900 milli-GPU: one pod per GPU, every node needed.
    fn one_share_per_node() -> (Cluster, Workload) {
        let mut nodes = String::from("sn,cpu_milli,memory_mib,gpu,model\n");
        let mut pods = String::from("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n");
        for i in 0..150 {
            nodes.push_str(&format!("n{i:03},8000,16384,1,T4\n"));
            pods.push_str(&format!("p{i:03},1000,1024,1,900\n"));
        }
        (
            Cluster::new("c", parse_node_csv(Path::new("nodes.csv"), &nodes).unwrap()),
            Workload::new("w", parse_pod_csv(Path::new("pods.csv"), &pods).unwrap()),
        )
    }

    #[test]
    fn kube_scheduler_s_window_can_hide_the_only_node_with_room() {
        let (cluster, workload) = one_share_per_node();
        let policy = SimPolicy::engine(ScoringPolicy::Binpack);
        let every_node = Prepared::new(&cluster, &workload);
        // Sending every node is the same as no window: kube-scheduler's own filters never
        // refuse a node the policy's placement takes.
        let all_sent = Prepared::new(&cluster, &workload).with_scheduler_window(100);
        // The adaptive window over 150 nodes holds 100 of them. Shares ask kube-scheduler for
        // no GPU, so it counts full nodes feasible, and late pods' windows can miss the last
        // free ones.
        let adaptive = Prepared::new(&cluster, &workload).with_scheduler_window(0);
        assert_eq!(every_node.scheduler_window(), None);
        assert_eq!(adaptive.scheduler_window(), Some(100));
        let mut missed = 0;
        for seed in 42..47 {
            let plain = run(&every_node, policy, seed, 0.0, true, &|_| {});
            assert_eq!(plain.failed, 0, "seed {seed}");
            let sent = run(&all_sent, policy, seed, 0.0, true, &|_| {});
            assert_eq!(sent.steps, plain.steps, "seed {seed}");
            assert_eq!(plain.window_misses, None);
            assert_eq!(sent.window_misses, Some(0), "seed {seed}");
            let windowed = run(&adaptive, policy, seed, 0.0, true, &|_| {});
            // A free node is left for every rejected pod: each rejection is a window miss.
            assert_eq!(windowed.window_misses, Some(windowed.failed as u64));
            missed += windowed.failed;
        }
        assert!(missed > 0, "no pod of five seeds missed a free node");
    }

    #[test]
    fn a_pod_the_window_turned_away_is_placed_on_kube_scheduler_s_retry() {
        let (cluster, workload) = one_share_per_node();
        let policy = SimPolicy::engine(ScoringPolicy::Binpack);
        let adaptive = Prepared::new(&cluster, &workload).with_scheduler_window(0);
        let retried = Prepared::new(&cluster, &workload)
            .with_scheduler_window(0)
            .with_window_retries();
        let (mut turned_away, mut missed) = (0, 0);
        for seed in 42..47 {
            turned_away += run(&adaptive, policy, seed, 0.0, false, &|_| {}).failed;
            let again = run(&retried, policy, seed, 0.0, false, &|_| {});
            // Every pod finds the free node its first window hid on a later walk, as the
            // requeue nudge has kube-scheduler retry it; the miss is still counted.
            assert_eq!(again.failed, 0, "seed {seed}");
            assert_eq!(again.last.used_milli, 150 * 900, "seed {seed}");
            missed += again.window_misses.unwrap_or(0);
        }
        assert!(
            turned_away > 0,
            "no pod of five seeds was turned away without the retry"
        );
        assert!(missed > 0, "no pod of five seeds missed a free node");
        // Walks that each examine at least 100 of the 150 nodes cover them in two; the bound
        // allows one more.
        let window = crate::window::SchedulerWindow::new(0, 150);
        assert_eq!(window.laps(150), 3);
    }

    #[test]
    fn in_dra_mode_the_extender_s_ranking_packs_where_kube_scheduler_alone_spreads() {
        // Two nodes of 4 GPUs; four one-GPU pods, then one of 4 GPUs (creation times fix the
        // order; nothing leaves). kube-scheduler alone spreads: after the first pod the empty
        // node scores 94 + 98 against 90 + 96, so the pods go two and two and the 4-GPU pod
        // finds no node. With the extender ranking under binpack, the busier node gets 10 of
        // its points (500 of kube-scheduler's) against 0: four on one node, the 4-GPU pod on
        // the other.
        let nodes = "sn,cpu_milli,memory_mib,gpu,model\n\
                     a,64000,262144,4,T4\nb,64000,262144,4,T4\n";
        let cluster = Cluster::new("c", parse_node_csv(Path::new("n.csv"), nodes).unwrap());
        let pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time\n\
                    p1,4000,8192,1,1000,,1,1000\np2,4000,8192,1,500,,2,1000\n\
                    p3,4000,8192,1,1000,,3,1000\np4,4000,8192,1,1000,T4,4,1000\n\
                    p5,4000,8192,4,1000,,5,1000\n";
        let workload = Workload::new("w", parse_pod_csv(Path::new("p.csv"), pods).unwrap());
        let prepared = Prepared::new_dra(&cluster, &workload)
            .with_departures()
            .unwrap();
        assert_eq!(prepared.trace, "w-dra");
        // p2's share claims one whole device: 8 devices arrive.
        let ranked = SimPolicy::engine(ScoringPolicy::Binpack);
        for seed in 42..52 {
            let alone = run(&prepared, SimPolicy::KubeDefault, seed, 0.0, true, &|_| {});
            assert_eq!(alone.failed, 1, "seed {seed}");
            assert_eq!(alone.last.used_milli, 4000, "seed {seed}");
            assert_eq!(alone.last.arrived_milli, 8000);
            let nodes = alone.end_nodes.unwrap();
            assert_eq!(
                nodes.iter().map(|n| n.pods).collect::<Vec<_>>(),
                [2, 2],
                "seed {seed}"
            );
            let packed = run(&prepared, ranked, seed, 0.0, true, &|_| {});
            assert_eq!(packed.failed, 0, "seed {seed}");
            assert_eq!(packed.last.used_milli, 8000, "seed {seed}");
            let mut pods: Vec<u32> = packed.end_nodes.unwrap().iter().map(|n| n.pods).collect();
            pods.sort_unstable();
            assert_eq!(pods, [1, 4], "seed {seed}");
        }
        // The referee ranks by kube-scheduler's totals: on a node with one pod, kube-scheduler
        // alone prefers the empty node; with the extender's ranking, the busier one.
        let mut nodes = prepared.nodes().to_vec();
        let mut live = Live::of(&prepared, &nodes);
        let request = &prepared.classes[prepared.class_of[0]].request;
        let first = dra::first_free_devices(&nodes[0], request).unwrap();
        for policy in [SimPolicy::KubeDefault, ranked] {
            let mut referee = Referee::new(&prepared, policy);
            let mut state = nodes.clone();
            referee.node_changing(&state[0]);
            state[0].add(&first);
            referee.node_changed(&prepared, &state, 0, 0, true);
            live.measure(&prepared, &state, 0);
            let ranks = [0, 1].map(|n| referee.rank(&prepared, &state, &live, 2, n));
            let expected = if policy == SimPolicy::KubeDefault {
                [ChoiceRank::BelowBest, ChoiceRank::Best]
            } else {
                [ChoiceRank::Best, ChoiceRank::BelowBest]
            };
            assert_eq!(ranks, expected, "{}", policy.name());
        }
        nodes[0].add(&first);
        assert_eq!(nodes[0].pods, 1);
    }

    #[test]
    fn departures_need_every_pod_s_lifetime() {
        let pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1024,1,1000\n";
        let workload = Workload::new("w", parse_pod_csv(Path::new("p.csv"), pods).unwrap());
        let error = Prepared::new(&cluster(), &workload)
            .with_departures()
            .unwrap_err();
        assert!(
            error.to_string().contains("pod a has no creation_time"),
            "{error}"
        );
    }

    #[test]
    fn the_referee_tells_the_best_node_from_a_worse_one_and_from_one_that_does_not_fit() {
        use ChoiceRank::{BelowBest, Best, NotFit};
        let nodes = "sn,cpu_milli,memory_mib,gpu,model\n\
                     t0,64000,262144,8,T4\nt1,64000,262144,8,T4\nv,64000,262144,8,V100\n";
        let cluster = Cluster::new("c", parse_node_csv(Path::new("n.csv"), nodes).unwrap());
        // Pods sorted by name: a and b ask for any model, c for a V100.
        let pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
                    a,4000,8192,1,1000,\nb,4000,8192,1,1000,\nc,4000,8192,1,1000,V100\n";
        let workload = Workload::new("w", parse_pod_csv(Path::new("p.csv"), pods).unwrap());
        let prepared = Prepared::new(&cluster, &workload);
        let mut nodes = prepared.nodes().to_vec();
        let mut live = Live::of(&prepared, &nodes);
        let mut referee = Referee::new(&prepared, SimPolicy::engine(ScoringPolicy::Binpack));
        // Every node's rank for pod `pod` (t0, t1, v).
        let ranks = |referee: &mut Referee, nodes: &[NodeState], live: &Live, pod: usize| {
            (0..3)
                .map(|n| referee.rank(&prepared, nodes, live, pod, n))
                .collect::<Vec<_>>()
        };
        // Empty, every node scores alike for a, which takes any model.
        assert_eq!(ranks(&mut referee, &nodes, &live, 0), [Best, Best, Best]);
        let request = &prepared.classes[prepared.class_of[0]].request;
        let allocation = fit(&nodes[0], request, &Policy::scoring(ScoringPolicy::Binpack)).unwrap();
        referee.node_changing(&nodes[0]);
        nodes[0].add(&allocation);
        referee.node_changed(&prepared, &nodes, 0, 0, true);
        live.measure(&prepared, &nodes, 0);
        // Binpack: with a on t0, t0 is b's best and the empty nodes below it.
        assert_eq!(
            ranks(&mut referee, &nodes, &live, 1),
            [Best, BelowBest, BelowBest]
        );
        // c asks for a V100: the T4 nodes do not fit it, the V100 node is its only choice.
        assert_eq!(
            ranks(&mut referee, &nodes, &live, 2),
            [NotFit, NotFit, Best]
        );
    }
}
