//! Placement policies: how good a placement on a node is (a score on 0..=100) and which GPUs a
//! share takes. One file per policy; this file picks between them.

pub mod binpack;
pub mod fgd;
pub mod fgd_plus;
pub mod learn;
pub mod mig;
pub mod pick;
pub mod spread;
pub mod topology;
pub mod typical;

use super::allocation::PodAllocation;
use super::mig::MigSlices;
use super::model::{ComputeMilli, CpuMilli, GpuPlacement, MemMiB};
use super::request::PodRequest;
use super::state::{GpuUsage, NodeState, PerGpu};
use super::topology::positions;
use fgd::{FgdCache, FreeChange};
use fgd_plus::Taking;
pub(crate) use pick::Picked;
pub use pick::{ShareAsk, free_milli, usage_after};
use pick::{add_allocation, changes_between, free_milli_of};
use typical::TypicalPods;

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

    /// Whether the policy measures fragmentation against typical pods (and picks share GPUs by
    /// it).
    pub fn uses_typical(self) -> bool {
        matches!(self, Self::Fgd | Self::FgdPlus)
    }

    /// The configuration name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Binpack => "binpack",
            Self::Spread => "spread",
            Self::Fgd => "fgd",
            Self::FgdPlus => "fgd-plus",
        }
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
    /// Filter passes only the fitting candidates the policy scores best (all of them on a tie),
    /// so that kube-scheduler's own scores cannot overrule the policy's choice; see
    /// docs/decisions/0006-filter-keeps-the-policys-choice.md.
    pub filter_best_only: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            scoring: ScoringPolicy::Binpack,
            max_shares_per_gpu: 20,
            typical: TypicalPods::default(),
            fgd_truncate: false,
            fgd_plus: fgd_plus::Tuning::default(),
            filter_best_only: false,
        }
    }
}

/// A feasible placement and its score.
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    pub allocation: PodAllocation,
    /// On 0..=100; higher is better.
    pub score: f64,
}

impl Policy {
    /// Whether scores weigh the typical classes' scarcity on the cluster
    /// ([`TypicalPods::with_cluster`]): only FGD+ with its `scarce` or `scarce_shape` knob on. Otherwise the
    /// measure is not worth taking, nor the extra access masks it adds to every evaluation.
    pub fn weighs_scarcity(&self) -> bool {
        self.scoring == ScoringPolicy::FgdPlus && self.fgd_plus.weighs_scarcity()
    }

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
        self.pick_shares(node, usage, pool, ask, choice, &mut FgdCache::default())
            .to_vec()
    }

    /// [`Policy::choose_shares`] without allocating: what `fit` calls for every node. `cache`
    /// holds what FGD derived from this node so far in this evaluation.
    pub(crate) fn pick_shares(
        &self,
        node: &NodeState,
        usage: &[GpuUsage],
        pool: u64,
        ask: ShareAsk,
        choice: ShareChoice,
        cache: &mut FgdCache,
    ) -> Picked {
        match choice {
            ShareChoice::Binpack => binpack::pick(node, usage, pool, ask.count),
            ShareChoice::Spread => spread::pick(node, usage, pool, ask.count),
            ShareChoice::Fgd if self.scoring == ScoringPolicy::FgdPlus => {
                fgd_plus::pick(node, usage, pool, ask, &self.typical, &self.fgd_plus, cache)
            }
            ShareChoice::Fgd => fgd_pick(node, usage, pool, ask, self, cache),
            ShareChoice::Drawn(draw) => pick::drawn_pick(pool, ask.count, draw),
        }
    }

    /// Whether the policy refuses `node` a pod that takes `taking` although it fits
    /// ([`fgd_plus::holds_host`]). Asked by `evaluate` (filter, prioritize), `places` (window
    /// misses, requeue, preemption's victims) and the capacity estimate, not by `fit`: a resolvable rejection of `fit` is one the empty node would not
    /// make, and the hold makes it on an empty node (an idle node is kept for GPU pods) while
    /// it lifts as the node's GPUs fill.
    pub(super) fn holds_host(&self, node: &NodeState, taking: Taking) -> bool {
        self.scoring == ScoringPolicy::FgdPlus
            && fgd_plus::holds_host(&self.typical, &self.fgd_plus, node, taking)
    }

    /// Scores a placement that [`fit`](super::fit::fit) produced on `node`.
    pub fn score(&self, node: &NodeState, allocation: &PodAllocation) -> f64 {
        self.score_with(node, allocation, &mut FgdCache::default())
    }

    /// [`Policy::score`], reusing what the GPU choice derived from the node.
    pub(super) fn score_with(
        &self,
        node: &NodeState,
        allocation: &PodAllocation,
        cache: &mut FgdCache,
    ) -> f64 {
        let mut after_usage = PerGpu::copy_of(&node.gpus);
        add_allocation(node, &mut after_usage, allocation);
        let quality = topology::quality(node, allocation);
        let score = self.score_after(node, &after_usage, Taking::of(allocation), quality, cache);
        self.with_mig(score, node, &allocation.mig, allocation.has_gpus())
    }

    /// `grants_score` with the MIG slices `asked` weighed in ([`mig::combined`]); `grants`:
    /// whether the pod holds GPU grants besides.
    pub(super) fn with_mig(
        &self,
        grants_score: f64,
        node: &NodeState,
        asked: &[MigSlices],
        grants: bool,
    ) -> f64 {
        mig::combined(self.scoring, grants_score, node, asked, grants)
    }

    /// The score of a placement that leaves `node` with GPU usage `after_usage`, takes
    /// `taking` from its host, and has topology quality `quality`: everything a score depends
    /// on, whether it comes from an allocation or straight from the placement.
    pub(super) fn score_after(
        &self,
        node: &NodeState,
        after_usage: &[GpuUsage],
        taking: Taking,
        quality: f64,
        cache: &mut FgdCache,
    ) -> f64 {
        let cpu = taking.cpu;
        let after = free_milli_of(node, after_usage);
        let base = match self.scoring {
            ScoringPolicy::Binpack => binpack::score_taking(node, cpu, &after),
            ScoringPolicy::Spread => spread::score_taking(node, cpu, &after),
            ScoringPolicy::Fgd => {
                // One pass over the GPUs for the node as it is; the placement's effect is
                // derived from the GPUs it changes.
                let before = free_milli_of(node, &node.gpus);
                let (_, _, fragmentation) = cache.prepare(&self.typical, node, &before);
                let changes = changes_between(&before, &after);
                let cpu_after = CpuMilli(node.cpu_free().0.saturating_sub(cpu.0));
                // A one-GPU share was rated this way when its GPU was chosen.
                let after = match cache.recall(&changes, cpu_after) {
                    Some(after) => after,
                    None => {
                        let (access, state, _) = cache.prepare(&self.typical, node, &before);
                        state.fragmentation_with(&self.typical, cpu_after, access, &changes)
                    }
                };
                let reduction = fragmentation - after;
                if self.fgd_truncate {
                    fgd::reference_score(reduction)
                } else {
                    fgd::score_from_reduction(reduction)
                }
            }
            ScoringPolicy::FgdPlus => {
                let before = free_milli_of(node, &node.gpus);
                let (access, measure) = cache.node_measure(&self.typical, node, |access| {
                    fgd_plus::measure_node(&self.typical, &self.fgd_plus, node, &before, access)
                });
                fgd_plus::score_measured(
                    &self.typical,
                    &self.fgd_plus,
                    node,
                    taking,
                    access,
                    measure,
                    &after,
                )
            }
        };
        (base * quality).clamp(0.0, 100.0)
    }
}

/// FGD's GPU choice: one GPU at a time, the one whose use leaves the least expected
/// fragmentation (lowest position on ties). With `truncate`, compares the reference's integer
/// scores instead, reproducing its tie-breaking.
fn fgd_pick(
    node: &NodeState,
    usage: &[GpuUsage],
    pool: u64,
    ask: ShareAsk,
    policy: &Policy,
    cache: &mut FgdCache,
) -> Picked {
    let typical = &policy.typical;
    if typical.is_empty() {
        return binpack::pick(node, usage, pool, ask.count);
    }
    let mut scratch = PerGpu::copy_of(usage);
    let mut free = free_milli_of(node, &scratch);
    let (_, _, before) = cache.prepare(typical, node, &free);
    let mut remaining = pool;
    let mut chosen = Picked::new();
    let with_ask = |slot: GpuUsage| GpuUsage {
        mem: MemMiB(slot.mem.0 + ask.mem.0),
        compute: ComputeMilli(slot.compute.0 + ask.compute.0),
        ..slot
    };
    for _ in 0..ask.count {
        // Each candidate changes one GPU: its fragmentation is derived per typical pod from
        // the node's current state rather than recomputed over every GPU, and all candidates
        // are rated in one pass.
        let (access, state, _) = cache.prepare(typical, node, &free);
        // When every class sees all of the node's GPUs or none of them (one card model, the
        // usual case), a candidate's rating depends only on its free capacity before and
        // after: GPUs alike are rated once.
        let all = node.profile.all;
        let alike = access
            .iter()
            .all(|&mask| mask & all == 0 || mask & all == all);
        let candidates = remaining.count_ones() as usize;
        let mut changes = PerGpu::<FreeChange>::defaults(candidates);
        let mut rated_as = PerGpu::<usize>::defaults(candidates);
        let mut distinct = 0;
        for (slot, position) in rated_as.iter_mut().zip(positions(remaining)) {
            let change = FreeChange {
                position,
                old: free[position],
                new: node.free_milli_under(position, &with_ask(scratch[position])),
            };
            let same = changes[..distinct]
                .iter()
                .position(|seen| alike && (seen.old, seen.new) == (change.old, change.new));
            *slot = same.unwrap_or_else(|| {
                changes[distinct] = change;
                distinct += 1;
                distinct - 1
            });
        }
        let mut after = PerGpu::<f64>::defaults(distinct);
        state.fragmentation_each(
            typical,
            ask.cpu_after,
            access,
            &changes[..distinct],
            &mut after,
        );
        let mut best: Option<(usize, f64, usize)> = None;
        for (position, &rating) in positions(remaining).zip(rated_as.iter()) {
            let reduction = before - after[rating];
            let value = if policy.fgd_truncate {
                fgd::reference_score(reduction)
            } else {
                reduction
            };
            if best.is_none_or(|(_, best_value, _)| value > best_value) {
                best = Some((position, value, rating));
            }
        }
        let Some((position, _, rating)) = best else {
            break;
        };
        let change = FreeChange {
            position,
            ..changes[rating]
        };
        cache.remember(change, ask.cpu_after, after[rating]);
        chosen.push(position);
        remaining &= !(1u64 << position);
        scratch[position] = with_ask(scratch[position]);
        free[position] = node.free_milli_under(position, &scratch[position]);
    }
    chosen
}

/// Test fixture: FGD+ against one typical class that asks `cpu` per whole GPU and no memory,
/// with the host hold ([`fgd_plus::Tuning::hold_host`]) on, as by default, and off.
#[cfg(any(test, feature = "fixtures"))]
pub fn fgd_plus_held_and_unheld(cpu: CpuMilli) -> (Policy, Policy) {
    let typical = TypicalPods::new(vec![typical::TypicalPod {
        cpu,
        memory: MemMiB(0),
        gpus: 1,
        milli: 1000,
        models: Vec::new(),
        weight: 1.0,
    }]);
    let held = Policy::scoring(ScoringPolicy::FgdPlus).with_typical(typical);
    let unheld = Policy {
        fgd_plus: fgd_plus::Tuning {
            hold_host: false,
            ..held.fgd_plus
        },
        ..held.clone()
    };
    (held, unheld)
}
