//! The typical pods: the workload FGD's measure and FGD+'s terms are taken against
//! ([`TypicalPods`]: classes with their shares of arrivals, and the rare classes past FGD's
//! coverage cut), and what FGD+ derives from it on a cluster: each class's scarcity
//! ([`ScarcityCensus`], [`Scarcity`]), the host slack, the idle nodes' cover of the big classes,
//! and the sliver values of the look-ahead. The paper's own measure over these classes is in
//! `fgd`.

use crate::model::{CpuMilli, MemMiB};
use crate::request::ModelPattern;
use crate::state::NodeState;
use crate::topology::bit;

/// One class of pod the cluster typically sees, with its share of arrivals.
#[derive(Clone, Debug, PartialEq)]
pub struct TypicalPod {
    pub cpu: CpuMilli,
    /// Host memory of the class (FGD itself ignores memory; FGD+ uses it for host stranding).
    pub memory: MemMiB,
    /// GPUs per pod (0 for a CPU-only pod).
    pub gpus: u16,
    /// Milli-GPU on each of those GPUs (1000 for whole GPUs, 0 for a CPU-only pod).
    pub milli: u32,
    /// Acceptable models; empty means any.
    pub models: Vec<ModelPattern>,
    /// Probability; the weights of a [`TypicalPods`] sum to 1.
    pub weight: f64,
}

impl TypicalPod {
    /// The class's GPU demand per pod in milli-GPU (0 for CPU-only pods).
    pub fn demand(&self) -> f64 {
        f64::from(self.gpus) * f64::from(self.milli)
    }
}

/// The least excess scarcity ([`TypicalPods::with_cluster`]) that makes a class scarce: at most
/// half of the cluster's GPUs can run it. Below that, many mildly constrained classes (a CPU-heavy
/// pod only the larger hosts take) pulled against the host-stranding term and cost gains at full
/// load on CPU-heavy workloads (`cpu25` in docs/policies.md), without protecting anyone.
const MIN_EXCESS_SCARCITY: f64 = 1.0;

/// GPUs per pod from which a class is big ([`TypicalPods::idle_cover`]): on the trace's 8-GPU
/// nodes, a pod of four GPUs or more needs a node that is idle or half free.
pub const BIG_CLASS_GPUS: u16 = 4;

/// [`TypicalPods::idle_cover`] is measured up to this (hundredths) and in steps of
/// [`IDLE_COVER_STEP`]: every step makes every cached score stale, and what reads the cover
/// reads it up to a whole one at most (the guard well below it, the idle credit's ramp up to
/// it).
const IDLE_COVER_CAP: u32 = 100;
/// The step (hundredths) of [`TypicalPods::idle_cover`].
const IDLE_COVER_STEP: u32 = 5;

/// The workload distribution fragmentation is measured against.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TypicalPods {
    pub(super) pods: Vec<TypicalPod>,
    /// [`TypicalPods::sliver_value`] for every free amount 0..=1000, derived once.
    pub(super) sliver_values: Vec<f64>,
    /// The classes past the coverage cut ([`TypicalPods::from_counts`]), weighted on the same
    /// scale as `pods`: FGD's measure ignores them, but the rarest classes are often the ones
    /// few nodes can run, which [`TypicalPods::with_cluster`] weighs.
    pub(super) rare: Vec<TypicalPod>,
    /// The classes, typical or rare, that only part of the cluster can run, each with its
    /// weight times its excess scarcity ([`TypicalPods::with_cluster`]); empty until a cluster
    /// is given. Their access masks follow the typical classes' in
    /// [`TypicalPods::access_masks`].
    pub(super) scarce: Vec<(TypicalPod, f64)>,
    /// The host CPU (milli-cores) and memory (MiB) the classes ask per GPU they ask, typical
    /// and rare, CPU-only pods counting their CPU and memory and no GPU; zeros when no class
    /// asks for a GPU.
    pub(super) asked_per_gpu: (f64, f64),
    /// [`TypicalPods::host_slack`]; `None` until a cluster is given.
    pub(super) host_slack: Option<f64>,
    /// The big classes' ([`BIG_CLASS_GPUS`]) share of the GPU demand, typical and rare.
    pub(super) big_share: f64,
    /// [`TypicalPods::idle_cover`]; `None` until a cluster is given.
    pub(super) idle_cover: Option<u32>,
}

impl TypicalPods {
    /// A distribution from weighted classes; weights are renormalised to sum to 1 and classes
    /// with no weight are dropped.
    pub fn new(pods: Vec<TypicalPod>) -> Self {
        Self::with_rare(pods, Vec::new())
    }

    /// [`TypicalPods::new`] with classes past a coverage cut, weighted on the same scale: FGD's
    /// measure leaves them out, the scarce classes ([`TypicalPods::with_cluster`]) count them.
    pub fn with_rare(pods: Vec<TypicalPod>, rare: Vec<TypicalPod>) -> Self {
        let usable = |pod: &TypicalPod| pod.weight.is_finite() && pod.weight > 0.0;
        let mut pods: Vec<TypicalPod> = pods.into_iter().filter(usable).collect();
        let mut rare: Vec<TypicalPod> = rare.into_iter().filter(usable).collect();
        let total: f64 = pods.iter().map(|pod| pod.weight).sum();
        if total > 0.0 {
            for pod in pods.iter_mut().chain(rare.iter_mut()) {
                pod.weight /= total;
            }
        }
        let sliver_values = sliver_values(&pods);
        let asked_per_gpu = asked_per_gpu(pods.iter().chain(&rare));
        let big_share = big_share(pods.iter().chain(&rare));
        Self {
            pods,
            sliver_values,
            rare,
            scarce: Vec::new(),
            asked_per_gpu,
            host_slack: None,
            big_share,
            idle_cover: None,
        }
    }

    /// The distribution with each class's scarcity measured on `nodes` as they are when empty:
    /// the cluster's GPU capacity over the capacity of the nodes an empty one of which could run
    /// the class (enough GPUs of an accepted model, CPU and memory), less one. A class that fits
    /// every node has none; one that only a twentieth of the GPUs can take has 19. Classes that
    /// fit no node have none either (no placement can keep room for them). The rare classes
    /// count too; only classes with at least [`MIN_EXCESS_SCARCITY`] are kept.
    pub fn with_cluster<'a>(self, nodes: impl IntoIterator<Item = &'a NodeState>) -> Self {
        self.with_scarcity(nodes, Scarcity::Empty)
    }

    /// [`TypicalPods::with_cluster`] with the nodes that can run a class judged as `how` says:
    /// as if empty, or as they are now.
    pub fn with_scarcity<'a>(
        mut self,
        nodes: impl IntoIterator<Item = &'a NodeState>,
        how: Scarcity,
    ) -> Self {
        let census = ScarcityCensus::of(&self, how, nodes);
        self.set_census(&census);
        self
    }

    /// Measures each class's scarcity from `census` (taken of this distribution's classes);
    /// returns whether the scarce classes or their weights changed.
    pub fn set_census(&mut self, census: &ScarcityCensus) -> bool {
        let total = census.total;
        let classes = self.pods.iter().chain(&self.rare);
        let counts = census.empty.iter().zip(&census.now);
        let scarce: Vec<(TypicalPod, f64)> = classes
            .zip(counts)
            .filter_map(|(pod, (&empty, &now))| {
                let empty = excess_scarcity(total, empty);
                // The classes that name models follow their nodes too: measured as if empty, a
                // model holding a large part of the cluster (T4 without the G2 nodes: 46% of
                // the GPUs, excess 1.2) was barely protected, and pods that could run anywhere
                // filled it before those that can only run there came (1 point below FGD at 96%
                // arrival). In whole doublings, not quarter-octave steps: with those every step
                // made every cached score stale (3 times the replay's time on `gpuspec10`) and
                // cost more at full load (docs/policies.md, "Model classes measured now too").
                let names_models = !pod.models.is_empty();
                let follows_nodes = match census.how {
                    Scarcity::Empty => false,
                    Scarcity::Shape => !names_models,
                    Scarcity::Now => true,
                };
                let excess = if follows_nodes && empty >= MIN_EXCESS_SCARCITY {
                    let steps_per_doubling = if names_models {
                        MODEL_SCARCITY_STEPS_PER_DOUBLING
                    } else {
                        SCARCITY_STEPS_PER_DOUBLING
                    };
                    grown(empty, excess_scarcity(total, now), steps_per_doubling)
                } else {
                    empty
                };
                (excess >= MIN_EXCESS_SCARCITY).then(|| (pod.clone(), pod.weight * excess))
            })
            .collect();
        let host_slack = self.slack_of(census);
        let idle_cover = self.cover_of(census);
        if scarce == self.scarce && host_slack == self.host_slack && idle_cover == self.idle_cover {
            return false;
        }
        self.scarce = scarce;
        self.host_slack = host_slack;
        self.idle_cover = idle_cover;
        true
    }

    /// How much of the cluster's host CPU and memory is spare beside its GPUs: over every node,
    /// what its CPU exceeds its GPUs' share of the classes' CPU ask by (the CPU they ask per GPU
    /// they ask, CPU-only pods included), as a fraction of that ask for every GPU of the
    /// cluster; the same of memory; whichever is less. FGD+'s host term steers CPU-heavy pods
    /// to that spare CPU; where a cluster has almost none, the only spare CPU is on idle nodes
    /// and the steering opens them (docs/policies.md, "Host slack"). `None` until a cluster is
    /// given ([`TypicalPods::with_cluster`]) or when no class asks for a GPU.
    pub fn host_slack(&self) -> Option<f64> {
        self.host_slack
    }

    /// How well the idle nodes cover the big classes ([`BIG_CLASS_GPUS`]), in hundredths: the
    /// share of the cluster's GPUs on idle nodes of [`BIG_CLASS_GPUS`] GPUs or more (the only
    /// idle nodes a big pod can take) over the big classes' share of the GPU demand,
    /// rounded down to a step of 5 and capped at 100. A big pod needs an idle node, or one
    /// nearly so; where pods leave and the cluster stays full, idle nodes come back one at a
    /// time, and a policy that hands each to a small pod has none left when a run of big pods
    /// arrives (docs/policies.md, "Idle nodes guarded"). `None` until a cluster is given, when
    /// no class is big, or when no node has [`BIG_CLASS_GPUS`] GPUs (no big pod runs there, so
    /// no idle node is kept for one).
    pub fn idle_cover(&self) -> Option<u32> {
        self.idle_cover
    }

    /// [`TypicalPods::idle_cover`] of the census's nodes.
    fn cover_of(&self, census: &ScarcityCensus) -> Option<u32> {
        if census.total == 0 || census.big_node_gpus == 0 || self.big_share <= 0.0 {
            return None;
        }
        let idle_share = census.idle_gpus as f64 / census.total as f64;
        let cover = (100.0 * idle_share / self.big_share).min(f64::from(IDLE_COVER_CAP)) as u32;
        Some(cover / IDLE_COVER_STEP * IDLE_COVER_STEP)
    }

    /// [`TypicalPods::host_slack`] of the census's nodes.
    fn slack_of(&self, census: &ScarcityCensus) -> Option<f64> {
        let (cpu, memory) = self.asked_per_gpu;
        if census.total == 0 || (cpu <= 0.0 && memory <= 0.0) {
            return None;
        }
        let share = |spare: u64, per_gpu: f64| {
            if per_gpu > 0.0 {
                spare as f64 / (per_gpu * census.total as f64)
            } else {
                f64::INFINITY
            }
        };
        Some(share(census.cpu_slack, cpu).min(share(census.memory_slack, memory)))
    }

    /// Each scarce class with its weight times its excess scarcity
    /// ([`TypicalPods::with_cluster`]).
    pub fn scarce(&self) -> &[(TypicalPod, f64)] {
        &self.scarce
    }

    /// The expected fragmentation with each class weighted by its excess scarcity (not
    /// renormalised, so that it adds to the plain measure): free capacity that the classes only
    /// few nodes can run could not use, in milli-GPU. Zero without a cluster. `access` is
    /// [`TypicalPods::access_masks`]'s. The classes that name GPU models are scaled by
    /// `by_model`, the others (scarce by GPU count, CPU or memory) by `by_shape`: the two kinds
    /// need different weights (docs/policies.md, part 4).
    pub fn scarce_fragmentation(
        &self,
        cpu_free: CpuMilli,
        mem_free: MemMiB,
        free_milli: &[u32],
        access: &[u64],
        by_model: f64,
        by_shape: f64,
    ) -> f64 {
        let total: u64 = free_milli.iter().map(|&free| u64::from(free)).sum();
        let masks = access.get(self.pods.len()..).unwrap_or_default();
        self.scarce
            .iter()
            .zip(masks)
            .map(|((pod, weight), &mask)| {
                let scale = if pod.models.is_empty() {
                    by_shape
                } else {
                    by_model
                };
                if scale == 0.0 {
                    return 0.0;
                }
                // Memory counts, as in the census, which counts a class scarce where the nodes
                // with the memory it asks are few.
                let lost = lost_with_memory(pod, cpu_free, mem_free, free_milli, mask, total);
                scale * weight * lost as f64
            })
            .sum()
    }

    /// The expected final leftover (milli-GPU) of one GPU with `free` milli-GPU free, if pods
    /// keep arriving from this distribution: with the probability `q` that an arriving pod is a
    /// one-GPU pod that fits, the GPU takes it (drawn by weight) and goes on from what is left;
    /// otherwise all of it is left over. A sliver only rare pods fit is worth almost its whole
    /// size, as in FGD; one that common pods fit is worth what they will leave behind in turn.
    pub fn sliver_value(&self, free: u32) -> f64 {
        self.sliver_values
            .get(free.min(1000) as usize)
            .copied()
            .unwrap_or(f64::from(free))
    }

    /// The typical GPU pod's CPU (milli-cores) and memory (MiB) per whole GPU it uses; zeros
    /// when the distribution has no GPU pods.
    pub fn host_per_gpu(&self) -> (f64, f64) {
        asked_per_gpu(self.pods.iter().filter(|pod| pod.milli > 0))
    }

    /// The reference construction: classes in the given order (most frequent first; the caller
    /// orders ties), keeping the shortest prefix that covers `coverage` of all pods, weighted by
    /// their counts.
    pub fn from_counts(classes: Vec<(TypicalPod, u64)>, coverage: f64) -> Self {
        let total: u64 = classes.iter().map(|(_, count)| count).sum();
        let mut kept = Vec::new();
        let mut rare = Vec::new();
        let mut covered = 0u64;
        for (mut pod, count) in classes {
            pod.weight = count as f64;
            if total == 0 || covered as f64 >= coverage * total as f64 {
                rare.push(pod);
                continue;
            }
            covered += count;
            kept.push(pod);
        }
        Self::with_rare(kept, rare)
    }

    /// The classes past the coverage cut.
    pub fn rare(&self) -> &[TypicalPod] {
        &self.rare
    }

    /// The classes.
    pub fn pods(&self) -> &[TypicalPod] {
        &self.pods
    }

    /// Whether there is no distribution (FGD then has nothing to measure against).
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// For each class, the GPU positions of `node` whose model it accepts: the typical classes,
    /// then the scarce ones ([`TypicalPods::with_cluster`]).
    pub fn access_masks(&self, node: &NodeState) -> Vec<u64> {
        // Patterns are matched once per distinct model of the node (nodes rarely mix models),
        // and classes that name no model accept every GPU without matching anything.
        let all = every_position(node);
        self.pods
            .iter()
            .chain(self.scarce.iter().map(|(pod, _)| pod))
            .map(|pod| access_mask(pod, node, all))
            .collect()
    }
}

/// Every GPU position of `node`, one bit each (as [`access_mask`] takes it).
fn every_position(node: &NodeState) -> u64 {
    node.profile
        .models
        .iter()
        .fold(0u64, |mask, (_, positions)| mask | positions)
}

/// The GPU positions of `node` whose model `pod` accepts; `all` is every position's bit.
fn access_mask(pod: &TypicalPod, node: &NodeState, all: u64) -> u64 {
    if pod.models.is_empty() {
        return all;
    }
    node.profile
        .models
        .iter()
        .filter(|(model, _)| pod.models.iter().any(|p| p.matches_normalized(model)))
        .fold(0u64, |mask, (_, positions)| mask | positions)
}

/// Where [`TypicalPods::with_scarcity`] judges whether a node can run a class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scarcity {
    /// On the node as if it were empty: its GPUs, CPU and memory. Measured once, it does not
    /// see the nodes able to run the big classes become fewer as the cluster fills.
    Empty,
    /// For every class scarce on the empty cluster: on the node as it is, its free CPU and
    /// memory and enough GPUs of an accepted model with room for the class, so that such a
    /// class grows scarcer as the nodes that could take it fill and less scarce as they empty:
    /// in quarter-octave steps ([`SCARCITY_STEPS_PER_DOUBLING`]) for the classes that accept any
    /// model (scarce by GPU count, CPU or memory), in whole doublings
    /// ([`MODEL_SCARCITY_STEPS_PER_DOUBLING`]) for those that name models. FGD+'s default.
    Now,
    /// [`Scarcity::Now`] for the classes that accept any model only; those that name models
    /// keep the empty measure (the default before 2026-11-28).
    Shape,
}

impl Scarcity {
    /// Every measure, in the order `policy.fgdPlus.scarcity.measured` documents them.
    pub const ALL: [Self; 3] = [Self::Now, Self::Shape, Self::Empty];

    /// The measure's name, as `policy.fgdPlus.scarcity.measured` and `simulate` write it.
    pub fn word(self) -> &'static str {
        match self {
            Self::Now => "now",
            Self::Shape => "shape",
            Self::Empty => "empty",
        }
    }

    /// The measure `word` names.
    pub fn from_word(word: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|measure| measure.word() == word)
    }
}

/// The host CPU (milli-cores) and memory (MiB) `classes` ask per GPU they ask, by weight; CPU-only
/// classes count their CPU and memory and no GPU. Zeros when none asks for a GPU.
fn asked_per_gpu<'a>(classes: impl Iterator<Item = &'a TypicalPod>) -> (f64, f64) {
    let (cpu, memory, gpus) = classes.fold((0.0, 0.0, 0.0), |(cpu, memory, gpus), pod| {
        let asked = pod.demand() / 1000.0;
        (
            cpu + pod.weight * pod.cpu.0 as f64,
            memory + pod.weight * pod.memory.0 as f64,
            gpus + pod.weight * asked,
        )
    });
    if gpus > 0.0 {
        (cpu / gpus, memory / gpus)
    } else {
        (0.0, 0.0)
    }
}

/// The big classes' ([`BIG_CLASS_GPUS`]) share of the GPU demand of `classes`, by weight; 0
/// when none asks for a GPU.
fn big_share<'a>(classes: impl Iterator<Item = &'a TypicalPod>) -> f64 {
    let (big, all) = classes.fold((0.0, 0.0), |(big, all), pod| {
        let demand = pod.weight * pod.demand();
        let big_demand = if pod.gpus >= BIG_CLASS_GPUS {
            demand
        } else {
            0.0
        };
        (big + big_demand, all + demand)
    });
    if all > 0.0 { big / all } else { 0.0 }
}

/// The cluster's GPUs over the GPUs of the nodes that can run a class, less one (0 when no
/// node can: no placement can keep room for it).
fn excess_scarcity(total: u64, capacity: u64) -> f64 {
    if capacity > 0 {
        (total as f64 / capacity as f64 - 1.0).max(0.0)
    } else {
        0.0
    }
}

/// Steps per doubling of (1 + excess scarcity) by which the current measure moves away from the
/// empty one: a replay measures scarcity again after every placement, but only a step moves the
/// scores of every node (and so makes every cached score stale).
const SCARCITY_STEPS_PER_DOUBLING: f64 = 4.0;

/// [`SCARCITY_STEPS_PER_DOUBLING`] for the classes that name models ([`Scarcity::Now`]): whole
/// doublings.
const MODEL_SCARCITY_STEPS_PER_DOUBLING: f64 = 1.0;

/// The current excess scarcity `now`, rounded down to one of `steps_per_doubling` steps per
/// doubling of (1 + excess) from the empty measure `empty`; 0 when `now` is (no node can run the
/// class now).
fn grown(empty: f64, now: f64, steps_per_doubling: f64) -> f64 {
    if now <= 0.0 {
        return 0.0;
    }
    let ratio = ((1.0 + now) / (1.0 + empty)).max(1.0);
    let steps = (ratio.log2() * steps_per_doubling).floor();
    (1.0 + empty) * (steps / steps_per_doubling).exp2() - 1.0
}

/// Per class of a [`TypicalPods`] (typical, then rare), the GPUs of the nodes that can run it
/// empty and (unless only that is asked) as they are now, and the GPUs of all nodes: what
/// [`TypicalPods::set_census`] turns into scarcity. Counted in whole GPUs, so that a replay
/// keeps it current by taking a node out before it changes and putting it back after
/// ([`ScarcityCensus::remove`], [`ScarcityCensus::add`]) instead of counting the cluster again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScarcityCensus {
    how: Scarcity,
    total: u64,
    /// The nodes' CPU (milli-cores) and memory (MiB) beyond their GPUs' share of the classes'
    /// ask, for [`TypicalPods::host_slack`].
    cpu_slack: u64,
    memory_slack: u64,
    /// The GPUs of the nodes of [`BIG_CLASS_GPUS`] GPUs or more whose GPUs are all idle, for
    /// [`TypicalPods::idle_cover`].
    idle_gpus: u64,
    /// The GPUs of the nodes of [`BIG_CLASS_GPUS`] GPUs or more, idle or not.
    big_node_gpus: u64,
    empty: Vec<u64>,
    now: Vec<u64>,
}

impl ScarcityCensus {
    /// The census of `nodes` for `typical`'s classes.
    pub fn of<'a>(
        typical: &TypicalPods,
        how: Scarcity,
        nodes: impl IntoIterator<Item = &'a NodeState>,
    ) -> Self {
        let classes = typical.pods.len() + typical.rare.len();
        let mut census = Self {
            how,
            total: 0,
            cpu_slack: 0,
            memory_slack: 0,
            idle_gpus: 0,
            big_node_gpus: 0,
            empty: vec![0; classes],
            now: vec![0; classes],
        };
        for node in nodes {
            census.add(typical, node);
        }
        census
    }

    /// Counts `node` in (as it is now too, for [`Scarcity::Now`]).
    pub fn add(&mut self, typical: &TypicalPods, node: &NodeState) {
        self.count(typical, node, true);
    }

    /// Counts `node` out: call it with the node as it was when added.
    pub fn remove(&mut self, typical: &TypicalPods, node: &NodeState) {
        self.count(typical, node, false);
    }

    fn count(&mut self, typical: &TypicalPods, node: &NodeState, add: bool) {
        let gpus = node.gpus.len() as u64;
        let apply = |value: &mut u64, amount: u64| {
            *value = if add {
                value.saturating_add(amount)
            } else {
                value.saturating_sub(amount)
            };
        };
        apply(&mut self.total, gpus);
        // Idle one- and two-GPU nodes take no big pod, so they cover none. With them counted,
        // on the trace's nodes with 90% of their CPU `fgd-plus` fell 0.53 below FGD at 82%
        // arrived on a CPU-heavy workload with departures, its 8-GPU pods turned away; without,
        // 0.11 (docs/policies.md, "Fresh draws").
        if node.gpus.len() >= usize::from(BIG_CLASS_GPUS) {
            apply(&mut self.big_node_gpus, gpus);
            if node.gpus_idle() {
                apply(&mut self.idle_gpus, gpus);
            }
        }
        let (cpu_per_gpu, memory_per_gpu) = typical.asked_per_gpu;
        // Rounded down to whole units, so that taking a node out subtracts what putting it in
        // added.
        let spare =
            |capacity: u64, per_gpu: f64| (capacity as f64 - per_gpu * gpus as f64).max(0.0) as u64;
        apply(&mut self.cpu_slack, spare(node.spec.cpu.0, cpu_per_gpu));
        apply(
            &mut self.memory_slack,
            spare(node.spec.memory.0, memory_per_gpu),
        );
        // Only the current measure looks at which GPUs have room.
        let all = (self.how != Scarcity::Empty).then(|| every_position(node));
        let classes = typical.pods.iter().chain(&typical.rare);
        let counts = self.empty.iter_mut().zip(self.now.iter_mut());
        for (pod, (empty, now)) in classes.zip(counts) {
            if runs_empty(pod, node) {
                apply(empty, gpus);
                if let Some(all) = all
                    && runs_now(pod, node, all)
                {
                    apply(now, gpus);
                }
            }
        }
    }
}

/// Whether an empty `node` can run `pod`; never a CPU-only pod (its scarcity is not GPU
/// scarcity).
fn runs_empty(pod: &TypicalPod, node: &NodeState) -> bool {
    pod.gpus > 0
        && node.spec.cpu >= pod.cpu
        && node.spec.memory >= pod.memory
        && accessible_count(pod, node) >= usize::from(pod.gpus)
}

/// Whether `node` as it is can run `pod`: free CPU and memory, and enough GPUs of an accepted
/// model with room for it. `all` is every position's bit.
fn runs_now(pod: &TypicalPod, node: &NodeState, all: u64) -> bool {
    if pod.gpus == 0 || node.cpu_free() < pod.cpu || node.mem_free() < pod.memory {
        return false;
    }
    let mask = access_mask(pod, node, all);
    let roomy = node
        .gpus
        .iter()
        .enumerate()
        .filter(|&(position, usage)| {
            mask & bit(position) != 0 && node.free_milli_under(position, usage) >= pod.milli
        })
        .count();
    roomy >= usize::from(pod.gpus)
}

/// How many GPUs of `node` accept `pod`'s models.
fn accessible_count(pod: &TypicalPod, node: &NodeState) -> usize {
    if pod.models.is_empty() {
        return node.gpus.len();
    }
    node.normalized_models
        .iter()
        .filter(|model| pod.models.iter().any(|p| p.matches_normalized(model)))
        .count()
}

/// The table behind [`TypicalPods::sliver_value`], by dynamic programming from 0 up to 1000.
fn sliver_values(pods: &[TypicalPod]) -> Vec<f64> {
    let shares: Vec<(usize, f64)> = pods
        .iter()
        .filter(|pod| pod.gpus == 1 && pod.milli > 0)
        .map(|pod| (pod.milli.min(1000) as usize, pod.weight))
        .collect();
    let mut values = vec![0.0; 1001];
    for free in 1..=1000usize {
        let fitting = shares.iter().filter(|(milli, _)| *milli <= free);
        let mass: f64 = fitting.clone().map(|(_, weight)| weight).sum();
        values[free] = if mass > 0.0 {
            let next: f64 = fitting
                .map(|(milli, weight)| weight / mass * values[free - milli])
                .sum();
            (1.0 - mass) * free as f64 + mass * next
        } else {
            free as f64
        };
    }
    values
}

/// The free GPU capacity (milli-GPU) of a node that one typical pod could not use: all of it when
/// the pod cannot run there (CPU-only pod, wrong model, no GPU fits, CPU short), otherwise only
/// the GPUs too small for it. `total` is the sum of `free_milli`.
pub(super) fn lost(
    pod: &TypicalPod,
    cpu_free: CpuMilli,
    free_milli: &[u32],
    mask: u64,
    total: u64,
) -> u64 {
    if pod.milli == 0 || mask == 0 {
        // A CPU-only pod can use none of the idle GPU capacity, nor can a class of none of the
        // node's models (most classes that name models, on most nodes).
        return total;
    }
    let mut fitting = 0u32;
    let mut stranded = 0u64;
    for (position, &free) in free_milli.iter().enumerate() {
        if mask & bit(position) != 0 && free >= pod.milli {
            fitting += 1;
        } else {
            stranded += u64::from(free);
        }
    }
    if fitting >= u32::from(pod.gpus) && cpu_free >= pod.cpu {
        stranded
    } else {
        total
    }
}

/// [`lost`] with the node's free memory counted too: all of it when the class asks for more.
pub(super) fn lost_with_memory(
    pod: &TypicalPod,
    cpu_free: CpuMilli,
    mem_free: MemMiB,
    free_milli: &[u32],
    mask: u64,
    total: u64,
) -> u64 {
    if mem_free < pod.memory {
        total
    } else {
        lost(pod, cpu_free, free_milli, mask, total)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::model::{ComputeMilli, GpuMode, NodeSpec};
    use crate::request::{GpuDemand, PodRequest};
    use crate::{Policy, ScoringPolicy, fit};

    fn mixed_cluster() -> Vec<NodeState> {
        let node = |name: &str, gpus: u16, model: &str, cpu: u64| {
            NodeState::new(
                NodeSpec::uniform(name, GpuMode::CoreMem, gpus, model, MemMiB(0)).with_host(
                    CpuMilli(cpu),
                    MemMiB(1 << 20),
                    1001,
                ),
            )
        };
        let mut nodes = vec![
            node("v0", 8, "V100", 128_000),
            node("v1", 8, "V100", 128_000),
        ];
        nodes.extend((0..4).map(|i| node(&format!("t{i}"), 8, "T4", 64_000)));
        nodes.extend((0..4).map(|i| node(&format!("s{i}"), 4, "T4", 32_000)));
        nodes
    }

    /// Classes of every kind: common small ones, a CPU-heavy 8-GPU class only the V100 hosts
    /// take, a 4-GPU class, a V100-only class, a CPU-only class.
    fn mixed_classes() -> TypicalPods {
        let mut v100_only = class(4_000, 1, 1000, 1.0);
        v100_only.models = vec![ModelPattern::parse("V100").unwrap()];
        TypicalPods::new(vec![
            class(4_000, 1, 1000, 5.0),
            class(2_000, 1, 500, 3.0),
            class(100_000, 8, 1000, 1.0),
            class(16_000, 4, 1000, 1.0),
            v100_only,
            class(8_000, 0, 0, 2.0),
        ])
    }

    /// A class's weight times excess scarcity (0 when it is not scarce).
    fn scarcity_of(typical: &TypicalPods, pod: &TypicalPod) -> f64 {
        typical
            .scarce()
            .iter()
            .find(|(scarce, _)| scarce == pod)
            .map_or(0.0, |(_, weight)| *weight)
    }

    #[test]
    fn host_slack_is_the_cpu_beyond_what_each_node_s_gpus_ask() {
        let typical = mixed_classes();
        assert_eq!(typical.host_slack(), None, "no cluster given");
        // The classes ask 162 cores per 19.5 GPUs (weights 5, 3, 1, 1, 1, 2; the CPU-only
        // class's CPU counts), 8.31 per GPU, and no memory. Beyond that ask: 61.5 cores on
        // each 128-core V100 node, none on the 8-GPU T4 nodes (64 cores), none on the 4-GPU
        // ones (32 cores); as a share of the ask for all 64 GPUs.
        let per_gpu = 162.0 / 19.5;
        let measured = typical.with_cluster(&mixed_cluster());
        let spare = 2.0 * (128.0 - 8.0 * per_gpu);
        let expected = spare / (64.0 * per_gpu);
        let slack = measured.host_slack().unwrap();
        assert!((slack - expected).abs() < 1e-5, "{slack} vs {expected}");
        // The census follows the nodes: without the V100 nodes no CPU is spare.
        let mut fewer = measured.clone();
        let census = ScarcityCensus::of(&fewer, Scarcity::Empty, &mixed_cluster()[2..]);
        assert!(fewer.set_census(&census));
        assert_eq!(fewer.host_slack(), Some(0.0));
        // A node without GPUs has all its CPU spare: CPU-only pods can go there.
        let mut with_cpu_node = mixed_cluster();
        with_cpu_node.push(NodeState::new(
            NodeSpec::uniform("cpu", GpuMode::CoreMem, 0, "", MemMiB(0)).with_host(
                CpuMilli(64_000),
                MemMiB(1 << 20),
                110,
            ),
        ));
        let widened = mixed_classes().with_cluster(&with_cpu_node);
        let expected = (spare + 64.0) / (64.0 * per_gpu);
        let slack = widened.host_slack().unwrap();
        assert!((slack - expected).abs() < 1e-5, "{slack} vs {expected}");
        // Memory decides when it is the scarcer: each GPU asks exactly its node's share.
        let mut hungry = class(4_000, 1, 1000, 1.0);
        hungry.memory = MemMiB((1 << 20) / 8);
        let hungry = TypicalPods::new(vec![hungry]).with_cluster(&mixed_cluster()[..6]);
        assert_eq!(hungry.host_slack(), Some(0.0));
        // Taking a node out of the census and putting it back restores the measure.
        let mut census = ScarcityCensus::of(&measured, Scarcity::Now, &mixed_cluster());
        let nodes = mixed_cluster();
        census.remove(&measured, &nodes[0]);
        census.add(&measured, &nodes[0]);
        assert_eq!(census, ScarcityCensus::of(&measured, Scarcity::Now, &nodes));
    }

    #[test]
    fn scarcity_now_on_an_empty_cluster_is_the_empty_measure() {
        let nodes = mixed_cluster();
        let empty = mixed_classes().with_cluster(&nodes);
        let now = mixed_classes().with_scarcity(&nodes, Scarcity::Now);
        assert!(!empty.scarce().is_empty(), "the cluster has scarce classes");
        assert_eq!(now, empty);
        assert_eq!(
            ScarcityCensus::of(&empty, Scarcity::Now, &nodes),
            ScarcityCensus {
                how: Scarcity::Now,
                now: ScarcityCensus::of(&empty, Scarcity::Now, &nodes).empty,
                ..ScarcityCensus::of(&empty, Scarcity::Empty, &nodes)
            }
        );
    }

    #[test]
    fn scarcity_now_sees_a_class_s_nodes_fill() {
        // Only the two V100 nodes can run the CPU-heavy 8-GPU class: 16 of 64 GPUs, excess 3.
        // One GPU taken on one of them leaves 8 of 64, excess 7.
        let mut nodes = mixed_cluster();
        let typical = mixed_classes();
        let big = typical.pods()[2].clone();
        let before = typical.clone().with_scarcity(&nodes, Scarcity::Now);
        assert!((scarcity_of(&before, &big) - big.weight * 3.0).abs() < 1e-9);
        let policy = Policy::scoring(ScoringPolicy::Binpack);
        let one = PodRequest::single(CpuMilli(1000), MemMiB(0), GpuDemand::Whole { count: 1 });
        let allocation = fit(&nodes[0], &one, &policy).unwrap();
        nodes[0].add(&allocation);
        let after = typical.clone().with_scarcity(&nodes, Scarcity::Now);
        assert!((scarcity_of(&after, &big) - big.weight * 7.0).abs() < 1e-9);
        assert_eq!(
            typical.clone().with_cluster(&nodes),
            before,
            "the empty measure does not move"
        );
    }

    #[test]
    fn the_idle_cover_is_the_idle_share_over_the_big_classes_share() {
        // The 8-GPU and 4-GPU classes ask 12 of the 19.5 GPUs asked (0.615).
        let typical = mixed_classes();
        assert_eq!(typical.idle_cover(), None, "no cluster given");
        let mut nodes = mixed_cluster();
        let measured = |nodes: &[NodeState]| {
            typical
                .clone()
                .with_scarcity(nodes, Scarcity::Now)
                .idle_cover()
        };
        assert_eq!(measured(&nodes), Some(100), "capped");
        let policy = Policy::scoring(ScoringPolicy::Binpack);
        let one = PodRequest::single(CpuMilli(1000), MemMiB(0), GpuDemand::Whole { count: 1 });
        let take_one = |node: &mut NodeState| {
            let allocation = fit(node, &one, &policy).unwrap();
            node.add(&allocation);
        };
        // Only the V100 nodes idle: 16 of 64 GPUs, 0.25 / 0.615 = 0.41, in steps of 0.05.
        for node in &mut nodes[2..] {
            take_one(node);
        }
        assert_eq!(measured(&nodes), Some(40));
        // Idle nodes of fewer than four GPUs take no big pod and cover none: two idle 2-GPU
        // nodes only add to the cluster, 16 of 68 GPUs, 0.235 / 0.615 = 0.38 (0.48 were their
        // GPUs counted).
        let mut with_small = nodes.clone();
        with_small.extend(["p0", "p1"].map(|name| {
            NodeState::new(
                NodeSpec::uniform(name, GpuMode::CoreMem, 2, "P100", MemMiB(0)).with_host(
                    CpuMilli(16_000),
                    MemMiB(1 << 20),
                    1001,
                ),
            )
        }));
        assert_eq!(measured(&with_small), Some(35));
        // Where no node has four GPUs no big pod runs: nothing to cover.
        let only_small: Vec<NodeState> = with_small[with_small.len() - 2..].to_vec();
        assert_eq!(measured(&only_small), None);
        take_one(&mut nodes[1]);
        assert_eq!(measured(&nodes), Some(20));
        take_one(&mut nodes[0]);
        assert_eq!(measured(&nodes), Some(0));
        // The census kept per change measures the same.
        let mut census = ScarcityCensus::of(&typical, Scarcity::Now, &mixed_cluster());
        let mut kept = typical.clone();
        for (before, after) in mixed_cluster().iter().zip(&nodes) {
            census.remove(&typical, before);
            census.add(&typical, after);
        }
        assert!(kept.set_census(&census));
        assert_eq!(kept.idle_cover(), Some(0));
        // No class of four GPUs or more: nothing to cover.
        let small = TypicalPods::new(vec![class(4_000, 1, 1000, 1.0)]).with_cluster(&nodes);
        assert_eq!(small.idle_cover(), None);
    }

    #[test]
    fn a_model_s_scarcity_now_grows_in_whole_doublings() {
        // Three V100 nodes: the V100-only class runs on 24 of 72 GPUs, excess 2.
        let mut nodes = mixed_cluster();
        // The census counts GPUs, not names: a copy of v0 is a third V100 node.
        nodes.push(nodes[0].clone());
        let typical = mixed_classes();
        let v100_only = typical.pods()[4].clone();
        assert!(!v100_only.models.is_empty());
        let weight = v100_only.weight;
        let policy = Policy::scoring(ScoringPolicy::Binpack);
        let one = PodRequest::single(CpuMilli(1000), MemMiB(0), GpuDemand::Whole { count: 1 });
        let fill = |node: &mut NodeState| {
            while let Ok(allocation) = fit(node, &one, &policy) {
                node.add(&allocation);
            }
        };
        let measured = |nodes: &[NodeState], how| {
            scarcity_of(&typical.clone().with_scarcity(nodes, how), &v100_only) / weight
        };
        assert!((measured(&nodes, Scarcity::Now) - 2.0).abs() < 1e-9);
        // One V100 node full: 16 of 72, excess 3.5, (1 + 3.5) / (1 + 2) = 1.5, under a doubling.
        fill(&mut nodes[0]);
        assert!((measured(&nodes, Scarcity::Now) - 2.0).abs() < 1e-9);
        // Two full: 8 of 72, excess 8, a ratio of 3: one doubling, (1 + 2) * 2 - 1.
        fill(&mut nodes[1]);
        assert!((measured(&nodes, Scarcity::Now) - 5.0).abs() < 1e-9);
        // `shape` keeps the empty measure for a class that names models, and `now` follows the
        // classes scarce by their shape in quarter-octave steps under both.
        assert!((measured(&nodes, Scarcity::Shape) - 2.0).abs() < 1e-9);
        let big = typical.pods()[2].clone();
        let shape_classes = |how| scarcity_of(&typical.clone().with_scarcity(&nodes, how), &big);
        assert_eq!(shape_classes(Scarcity::Now), shape_classes(Scarcity::Shape));
        assert!(
            shape_classes(Scarcity::Now) > scarcity_of(&typical.clone().with_cluster(&nodes), &big)
        );
    }

    proptest! {
        /// Kept per node change, the census equals a fresh count of the cluster; a placement
        /// never makes a class that some node can still run less scarce.
        #[test]
        fn scarcity_now_follows_placements_and_departures(
            steps in prop::collection::vec((0usize..10, 0usize..4, any::<bool>()), 1..60),
        ) {
            let mut nodes = mixed_cluster();
            let mut typical = mixed_classes();
            let mut census = ScarcityCensus::of(&typical, Scarcity::Now, &nodes);
            typical.set_census(&census);
            let policy = Policy::scoring(ScoringPolicy::FgdPlus).with_typical(typical.clone());
            let pods = [
                PodRequest::single(CpuMilli(4_000), MemMiB(0), GpuDemand::Whole { count: 1 }),
                PodRequest::single(CpuMilli(30_000), MemMiB(0), GpuDemand::Whole { count: 2 }),
                PodRequest::single(
                    CpuMilli(2_000),
                    MemMiB(0),
                    GpuDemand::Share {
                        gpus: 1,
                        mem_per_gpu: MemMiB(0),
                        compute_per_gpu: ComputeMilli(400),
                    },
                ),
                PodRequest::single(CpuMilli(20_000), MemMiB(0), GpuDemand::None),
            ];
            let mut running = Vec::new();
            for (n, kind, leave) in steps {
                let before = typical.clone();
                let placing = !leave || running.is_empty();
                if placing {
                    let Ok(allocation) = fit(&nodes[n], &pods[kind], &policy) else {
                        continue;
                    };
                    census.remove(&typical, &nodes[n]);
                    nodes[n].add(&allocation);
                    census.add(&typical, &nodes[n]);
                    running.push((n, allocation));
                } else {
                    let (n, allocation) = running.swap_remove(kind % running.len());
                    census.remove(&typical, &nodes[n]);
                    nodes[n].remove(&allocation);
                    census.add(&typical, &nodes[n]);
                }
                typical.set_census(&census);
                prop_assert_eq!(&census, &ScarcityCensus::of(&typical, Scarcity::Now, &nodes));
                if placing {
                    for (pod, &capacity) in typical.pods().iter().zip(&census.now) {
                        if capacity > 0 {
                            prop_assert!(
                                scarcity_of(&typical, pod) >= scarcity_of(&before, pod),
                                "{:?} grew less scarce", pod
                            );
                        }
                    }
                }
            }
        }
    }

    /// A mixed cluster: CPU-rich 8-GPU V100 nodes, CPU-poor 8-GPU T4 nodes, 4-GPU T4 nodes.
    pub(crate) fn class(cpu: u64, gpus: u16, milli: u32, weight: f64) -> TypicalPod {
        TypicalPod {
            cpu: CpuMilli(cpu),
            memory: MemMiB(0),
            gpus,
            milli,
            models: Vec::new(),
            weight,
        }
    }
}
