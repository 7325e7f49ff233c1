//! Placement policies: how good a placement on a node is (a score on 0..=100) and which GPUs a
//! share takes. One file per policy; this file picks between them.

pub mod binpack;
pub mod fgd;
pub mod fgd_plus;
pub mod reference;
pub mod spread;
pub mod topology;

use super::allocation::PodAllocation;
use super::fit::{RejectReason, fit};
use super::model::{ComputeMilli, CpuMilli, GpuPlacement, MemMiB};
use super::request::PodRequest;
use super::state::{GpuUsage, NodeState, gpu_free_milli};
use fgd::TypicalPods;

/// How nodes are ranked for a pod.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ScoringPolicy {
    /// Prefer the fullest nodes: leaves whole nodes idle for scale-down.
    #[default]
    Binpack,
    /// Prefer the emptiest nodes.
    Spread,
    /// Prefer the placement that grows expected fragmentation least.
    Fgd,
    /// FGD plus host stranding and a look-ahead value of slivers, untruncated (see
    /// [`fgd_plus`]).
    FgdPlus,
}

impl ScoringPolicy {
    /// Every policy, for configuration parsing and documentation.
    pub const ALL: [ScoringPolicy; 4] = [Self::Binpack, Self::Spread, Self::Fgd, Self::FgdPlus];

    /// The configuration name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Binpack => "binpack",
            Self::Spread => "spread",
            Self::Fgd => "fgd",
            Self::FgdPlus => "fgd-plus",
        }
    }

    /// Whether the policy measures fragmentation against typical pods (and picks share GPUs by
    /// it).
    pub fn uses_typical(self) -> bool {
        matches!(self, Self::Fgd | Self::FgdPlus)
    }
}

/// Which GPUs of a node a share goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShareChoice {
    /// The GPU with the least free capacity that fits.
    Binpack,
    /// The GPU with the most free capacity.
    Spread,
    /// The GPU whose use grows fragmentation least.
    Fgd,
    /// The GPU picked by a uniform draw the caller made (the simulator's random baseline; the
    /// engine itself never draws).
    Drawn(u32),
}

/// Everything the engine needs to decide, built once from configuration.
#[derive(Clone, Debug)]
pub struct Policy {
    pub scoring: ScoringPolicy,
    /// At most this many pods on one shared GPU.
    pub max_shares_per_gpu: u16,
    /// The workload FGD measures fragmentation against.
    pub typical: TypicalPods,
    /// Truncate FGD scores to integers before comparing, as the reference implementation does
    /// (its many ties are part of its published behaviour).
    pub fgd_truncate: bool,
    /// The knobs of [`ScoringPolicy::FgdPlus`] (its defaults are the measured best).
    pub fgd_plus: fgd_plus::Tuning,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            scoring: ScoringPolicy::Binpack,
            max_shares_per_gpu: 20,
            typical: TypicalPods::default(),
            fgd_truncate: false,
            fgd_plus: fgd_plus::Tuning::default(),
        }
    }
}

/// A share to place: amounts per GPU, how many GPUs, and the CPU the node keeps afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShareAsk {
    pub mem: MemMiB,
    pub compute: ComputeMilli,
    pub count: usize,
    pub cpu_after: CpuMilli,
}

/// A feasible placement and its score.
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    pub allocation: PodAllocation,
    /// On 0..=100; higher is better.
    pub score: f64,
}

impl Policy {
    /// A policy with this scoring and the defaults for everything else.
    pub fn scoring(scoring: ScoringPolicy) -> Self {
        Self {
            scoring,
            ..Self::default()
        }
    }

    /// Sets the typical-pod distribution.
    pub fn with_typical(mut self, typical: TypicalPods) -> Self {
        self.typical = typical;
        self
    }

    /// How shares pick GPUs on this node for this pod: the pod's override, else FGD when it is
    /// the scoring policy, else the node's placement label.
    pub fn share_choice(&self, node: &NodeState, request: &PodRequest) -> ShareChoice {
        match request.constraints.placement {
            Some(GpuPlacement::Binpack) => ShareChoice::Binpack,
            Some(GpuPlacement::Spread) => ShareChoice::Spread,
            None if self.scoring.uses_typical() && !self.typical.is_empty() => ShareChoice::Fgd,
            None => match node.spec.placement {
                GpuPlacement::Binpack => ShareChoice::Binpack,
                GpuPlacement::Spread => ShareChoice::Spread,
            },
        }
    }

    /// Picks `ask.count` GPUs out of `pool` (all of which fit the share).
    pub fn choose_shares(
        &self,
        node: &NodeState,
        usage: &[GpuUsage],
        pool: u64,
        ask: ShareAsk,
        choice: ShareChoice,
    ) -> Vec<usize> {
        match choice {
            ShareChoice::Binpack => binpack::choose(node, usage, pool, ask.count),
            ShareChoice::Spread => spread::choose(node, usage, pool, ask.count),
            ShareChoice::Fgd if self.scoring == ScoringPolicy::FgdPlus => {
                let measure = |cpu: CpuMilli, free: &[u32], access: &[u64]| {
                    fgd_plus::fragmentation(&self.typical, &self.fgd_plus, cpu, free, access)
                };
                fgd_choose(
                    node,
                    usage,
                    pool,
                    ask,
                    &self.typical,
                    &measure,
                    self.fgd_plus.quantum > 0,
                )
            }
            ShareChoice::Fgd => {
                let measure = |cpu: CpuMilli, free: &[u32], access: &[u64]| {
                    self.typical.fragmentation(cpu, free, access)
                };
                fgd_choose(
                    node,
                    usage,
                    pool,
                    ask,
                    &self.typical,
                    &measure,
                    self.fgd_truncate,
                )
            }
            ShareChoice::Drawn(draw) => reference::drawn_gpus(pool, ask.count, draw),
        }
    }

    /// Scores a placement that [`fit`] produced on `node`.
    pub fn score(&self, node: &NodeState, allocation: &PodAllocation) -> f64 {
        let before = free_milli(node, &node.gpus);
        let after_usage = usage_after(node, allocation);
        let after = free_milli(node, &after_usage);
        let base = match self.scoring {
            ScoringPolicy::Binpack => binpack::score(node, allocation, &after),
            ScoringPolicy::Spread => spread::score(node, allocation, &after),
            ScoringPolicy::Fgd => {
                let access = self.typical.access_masks(node);
                let cpu_after = CpuMilli(node.cpu_free().0.saturating_sub(allocation.cpu.0));
                let reduction = self
                    .typical
                    .fragmentation(node.cpu_free(), &before, &access)
                    - self.typical.fragmentation(cpu_after, &after, &access);
                if self.fgd_truncate {
                    fgd::reference_score(reduction)
                } else {
                    fgd::score_from_reduction(reduction)
                }
            }
            ScoringPolicy::FgdPlus => fgd_plus::score(
                &self.typical,
                &self.fgd_plus,
                node,
                allocation,
                &before,
                &after,
            ),
        };
        (base * topology::quality(node, allocation)).clamp(0.0, 100.0)
    }

    /// Fit and score in one call: what filter and prioritize ask of every candidate node.
    pub fn evaluate(
        &self,
        node: &NodeState,
        request: &PodRequest,
    ) -> Result<Evaluation, RejectReason> {
        let allocation = fit(node, request, self)?;
        let score = self.score(node, &allocation);
        Ok(Evaluation { allocation, score })
    }
}

/// Per-GPU free milli-GPU of `node` under `usage`.
pub fn free_milli(node: &NodeState, usage: &[GpuUsage]) -> Vec<u32> {
    node.spec
        .gpus
        .iter()
        .zip(usage)
        .map(|(gpu, slot)| gpu_free_milli(gpu, slot))
        .collect()
}

/// The node's GPU usage once `allocation` is added.
pub fn usage_after(node: &NodeState, allocation: &PodAllocation) -> Vec<GpuUsage> {
    let mut usage = node.gpus.clone();
    for hold in allocation.footprint() {
        let Some(position) = node.spec.position_of(hold.gpu) else {
            continue;
        };
        let slot = &mut usage[position];
        if hold.whole {
            slot.whole_pods += 1;
        } else {
            slot.mem = MemMiB(slot.mem.0 + hold.mem.0);
            slot.compute = ComputeMilli(slot.compute.0 + hold.compute.0);
            slot.shares += 1;
        }
    }
    usage
}

/// A node's expected fragmentation from its free CPU, per-GPU free milli-GPU and the typical
/// pods' access masks: what FGD-style GPU choice minimises.
type Measure<'a> = dyn Fn(CpuMilli, &[u32], &[u64]) -> f64 + 'a;

/// FGD's GPU choice: one GPU at a time, the one whose use leaves the least expected
/// fragmentation under `measure` (lowest position on ties). With `truncate`, compares the
/// reference's integer scores instead, reproducing its tie-breaking.
fn fgd_choose(
    node: &NodeState,
    usage: &[GpuUsage],
    pool: u64,
    ask: ShareAsk,
    typical: &TypicalPods,
    measure: &Measure<'_>,
    truncate: bool,
) -> Vec<usize> {
    if typical.is_empty() {
        return binpack::choose(node, usage, pool, ask.count);
    }
    let access = typical.access_masks(node);
    let mut scratch = usage.to_vec();
    let mut remaining = pool;
    let mut chosen = Vec::with_capacity(ask.count);
    let before_free = free_milli(node, &scratch);
    let before = measure(node.cpu_free(), &before_free, &access);
    for _ in 0..ask.count {
        let mut best: Option<(usize, f64)> = None;
        for position in super::topology::positions(remaining) {
            let mut trial = free_milli(node, &scratch);
            let mut slot = scratch[position];
            slot.mem = MemMiB(slot.mem.0 + ask.mem.0);
            slot.compute = ComputeMilli(slot.compute.0 + ask.compute.0);
            trial[position] = gpu_free_milli(&node.spec.gpus[position], &slot);
            let reduction = before - measure(ask.cpu_after, &trial, &access);
            let value = if truncate {
                fgd::reference_score(reduction)
            } else {
                reduction
            };
            if best.is_none_or(|(_, best_value)| value > best_value) {
                best = Some((position, value));
            }
        }
        let Some((position, _)) = best else { break };
        chosen.push(position);
        remaining &= !(1u64 << position);
        let slot = &mut scratch[position];
        slot.mem = MemMiB(slot.mem.0 + ask.mem.0);
        slot.compute = ComputeMilli(slot.compute.0 + ask.compute.0);
    }
    chosen
}
