//! Fragmentation gradient descent (Weng et al., USENIX ATC '23): score a placement by how much it
//! grows the node's expected GPU fragmentation, measured against a distribution of typical pods.
//!
//! A node's fragmentation for one typical pod is the free GPU capacity that pod could not use:
//! all of it when the pod cannot run there at all (no GPU fits, CPU short, wrong model, or a
//! CPU-only pod), otherwise only the GPUs too small for it. The node's fragmentation is the
//! expectation over the typical pods, in milli-GPU.
//!
//! The classes are [`TypicalPods`] ([`super::typical`]); this module is the measure itself, its
//! incremental form for the GPU choice, the cache a replay keeps per node, and the scores.

use crate::model::{CpuMilli, MAX_GPUS_PER_NODE, MemMiB};
use crate::state::{NodeState, PerGpu};
use crate::topology::bit;

use super::typical::{TypicalPods, lost_with_memory};

impl TypicalPods {
    /// [`TypicalPods::fragmentation`] with the node's free memory counted as its free CPU is: a
    /// class that asks more memory than is free loses every free GPU. FGD's measure leaves
    /// memory out (the reference does); FGD+ counts it, so that where memory runs short before
    /// GPUs (the trace's nodes with half their memory) a placement that leaves a node's GPUs
    /// without the memory to run its classes shows as the stranding it is (docs/policies.md,
    /// "Memory counted").
    pub fn fragmentation_with_memory(
        &self,
        cpu_free: CpuMilli,
        mem_free: MemMiB,
        free_milli: &[u32],
        access: &[u64],
    ) -> f64 {
        let total: u64 = free_milli.iter().map(|&free| u64::from(free)).sum();
        let mut expected = 0.0;
        for (pod, &mask) in self.pods.iter().zip(access) {
            expected += pod.weight
                * lost_with_memory(pod, cpu_free, mem_free, free_milli, mask, total) as f64;
        }
        expected
    }

    /// Expected fragmentation in milli-GPU of a node with `cpu_free` CPU and `free_milli` per GPU.
    pub fn fragmentation(&self, cpu_free: CpuMilli, free_milli: &[u32], access: &[u64]) -> f64 {
        // FGD leaves memory out: as if the node's memory never ran short.
        self.fragmentation_with_memory(cpu_free, MemMiB(u64::MAX), free_milli, access)
    }
}

/// FGD+'s measure of a node before a placement: what every candidate placement on it is
/// compared with, so that a replay scoring the node for many pod classes measures it once
/// (`fgd_plus::score_measured`; defined here, beside the cache that keeps it, and computed by
/// `fgd_plus::measure_node`, whose module builds on this one).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct NodeMeasure {
    /// `fgd_plus::fragmentation` of the node's free capacity, CPU and memory.
    pub(crate) fragmentation: f64,
    /// Its host-stranded capacity under the tuning's host term (0 when the term is off).
    pub(crate) host_stranded: f64,
}

/// What FGD and FGD+ derive from one node as it stands, computed once per evaluation and shared
/// by the GPU choice and the score. Valid for one node in one state and one [`TypicalPods`]
/// (and FGD+ tuning) only: a replay keeps one per node across the pod classes it scores the
/// node for, and drops it when the node or the classes' scarcity changes.
#[derive(Debug, Default)]
pub struct FgdCache {
    access: Option<Vec<u64>>,
    /// Free capacity, its state, and its fragmentation with the node's free CPU.
    base: Option<(PerGpu<u32>, FragState, f64)>,
    /// The last GPU choice rated against `base`: the change, the CPU left, and the resulting
    /// fragmentation, which scoring a one-GPU placement asks for again.
    rated: Option<(FreeChange, CpuMilli, f64)>,
    /// FGD+'s measure of the node as it is.
    measure: Option<NodeMeasure>,
}

impl FgdCache {
    /// The class access masks of `node`, the fragmentation state of free capacity `free`, and
    /// its fragmentation with the node's free CPU: reused when an earlier call saw the same
    /// free capacity, computed otherwise.
    pub(crate) fn prepare(
        &mut self,
        typical: &TypicalPods,
        node: &NodeState,
        free: &[u32],
    ) -> (&[u64], &FragState, f64) {
        let Self {
            access,
            base,
            rated,
            measure: _,
        } = self;
        let access = access.get_or_insert_with(|| typical.access_masks(node));
        if !matches!(base, Some((seen, _, _)) if **seen == *free) {
            *base = None;
            *rated = None;
        }
        let (_, state, fragmentation) = base.get_or_insert_with(|| {
            let state = FragState::of(typical, free, access);
            let fragmentation = state.fragmentation_with(typical, node.cpu_free(), access, &[]);
            (PerGpu::copy_of(free), state, fragmentation)
        });
        (access, state, *fragmentation)
    }

    /// The class access masks of `node` and FGD+'s measure of it as it is (`measure`, given the
    /// masks): computed on the first call, reused after.
    pub(crate) fn node_measure(
        &mut self,
        typical: &TypicalPods,
        node: &NodeState,
        measure: impl FnOnce(&[u64]) -> NodeMeasure,
    ) -> (&[u64], NodeMeasure) {
        let access = self
            .access
            .get_or_insert_with(|| typical.access_masks(node));
        let measure = *self.measure.get_or_insert_with(|| measure(access));
        (access, measure)
    }

    /// The class access masks of `node`: computed on the first call, reused after.
    pub(crate) fn access(&mut self, typical: &TypicalPods, node: &NodeState) -> &[u64] {
        self.access
            .get_or_insert_with(|| typical.access_masks(node))
    }

    /// Remembers that `change` with `cpu_free` CPU left rates `fragmentation` against the state
    /// last prepared.
    pub(crate) fn remember(&mut self, change: FreeChange, cpu_free: CpuMilli, fragmentation: f64) {
        self.rated = Some((change, cpu_free, fragmentation));
    }

    /// The remembered fragmentation of exactly these changes with `cpu_free` CPU left, if the
    /// state it was rated against is still the one prepared.
    pub(crate) fn recall(&self, changes: &[FreeChange], cpu_free: CpuMilli) -> Option<f64> {
        match (self.rated, changes) {
            (Some((change, cpu, fragmentation)), [only]) if change == *only && cpu == cpu_free => {
                Some(fragmentation)
            }
            _ => None,
        }
    }
}

/// One GPU's free milli-GPU going from `old` to `new`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FreeChange {
    pub(crate) position: usize,
    pub(crate) old: u32,
    pub(crate) new: u32,
}

/// A node's free capacity as [`TypicalPods::fragmentation`] sees it, per class.
#[derive(Clone, Debug)]
pub(crate) struct FragState {
    total: u64,
    per_pod: Vec<PodCounts>,
}

impl FragState {
    /// Per class of `typical`, the counts [`TypicalPods::fragmentation`] derives from the
    /// node's free capacity, kept so that the fragmentation after a change to one GPU is
    /// derived per class in constant time by [`FragState::fragmentation_with`].
    pub(crate) fn of(typical: &TypicalPods, free_milli: &[u32], access: &[u64]) -> Self {
        let total: u64 = free_milli.iter().map(|&free| u64::from(free)).sum();
        // Positions past the 64th have no mask bit: they never fit a class, only strand.
        let addressable = &free_milli[..free_milli.len().min(MAX_GPUS_PER_NODE)];
        let every = addressable
            .iter()
            .enumerate()
            .fold(0u64, |mask, (position, _)| mask | bit(position));
        // Most classes see every GPU of the node: for those, the GPUs that fit are the largest
        // free parts, found in the free parts sorted once per node.
        let mut sorted = PerGpu::copy_of(addressable);
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let mut largest_sum = PerGpu::<u64>::defaults(sorted.len() + 1);
        for (i, &free) in sorted.iter().enumerate() {
            largest_sum[i + 1] = largest_sum[i] + u64::from(free);
        }
        let per_pod = typical
            .pods
            .iter()
            .zip(access)
            .map(|(pod, &mask)| {
                let (fitting, fitting_free) = if pod.milli == 0 || mask & every == 0 {
                    // CPU-only classes lose everything anyway; blind classes fit nowhere.
                    (0, 0)
                } else if mask & every == every {
                    let fitting = sorted.partition_point(|&free| free >= pod.milli);
                    (fitting as u32, largest_sum[fitting])
                } else {
                    let mut fitting = 0u32;
                    let mut fitting_free = 0u64;
                    for (position, &free) in addressable.iter().enumerate() {
                        let fits = ((mask >> position) & 1 == 1) & (free >= pod.milli);
                        fitting += u32::from(fits);
                        fitting_free += u64::from(fits) * u64::from(free);
                    }
                    (fitting, fitting_free)
                };
                PodCounts {
                    fitting,
                    stranded: total - fitting_free,
                }
            })
            .collect();
        Self { total, per_pod }
    }

    /// [`FragState::fragmentation_with`] for each of `changes` made alone, into `out`. The
    /// candidates advance together class by class: each keeps its own sum in class order (so
    /// every result is bit for bit the one-at-a-time value), and the sums no longer wait on one
    /// another.
    pub(crate) fn fragmentation_each(
        &self,
        typical: &TypicalPods,
        cpu_free: CpuMilli,
        access: &[u64],
        changes: &[FreeChange],
        out: &mut [f64],
    ) {
        out.fill(0.0);
        for ((pod, &mask), counts) in typical.pods.iter().zip(access).zip(&self.per_pod) {
            let cpu_fits = cpu_free >= pod.cpu;
            for (change, expected) in changes.iter().zip(out.iter_mut()) {
                let total = self.total - u64::from(change.old) + u64::from(change.new);
                let lost = if pod.milli == 0 {
                    total
                } else {
                    // The same arithmetic as `fragmentation_with`, without branches on data.
                    let accessible = mask & bit(change.position) != 0;
                    let fit_before = accessible & (change.old >= pod.milli);
                    let fit_after = accessible & (change.new >= pod.milli);
                    let fitting = counts.fitting - u32::from(fit_before) + u32::from(fit_after);
                    let stranded = counts.stranded - u64::from(!fit_before) * u64::from(change.old)
                        + u64::from(!fit_after) * u64::from(change.new);
                    if (fitting >= u32::from(pod.gpus)) & cpu_fits {
                        stranded
                    } else {
                        total
                    }
                };
                *expected += pod.weight * lost as f64;
            }
        }
    }

    /// [`TypicalPods::fragmentation`] of the node this state describes once `changes` are made
    /// (each at a distinct position), with `cpu_free` CPU left: the same integers per class,
    /// summed in the same order, so the result is bit for bit the full computation's.
    pub(crate) fn fragmentation_with(
        &self,
        typical: &TypicalPods,
        cpu_free: CpuMilli,
        access: &[u64],
        changes: &[FreeChange],
    ) -> f64 {
        let total = changes.iter().fold(self.total, |total, change| {
            total - u64::from(change.old) + u64::from(change.new)
        });
        let mut expected = 0.0;
        for ((pod, &mask), counts) in typical.pods.iter().zip(access).zip(&self.per_pod) {
            let lost = if pod.milli == 0 {
                total
            } else {
                let mut fitting = counts.fitting;
                let mut stranded = counts.stranded;
                for change in changes {
                    let accessible = mask & bit(change.position) != 0;
                    if accessible && change.old >= pod.milli {
                        fitting -= 1;
                    } else {
                        stranded -= u64::from(change.old);
                    }
                    if accessible && change.new >= pod.milli {
                        fitting += 1;
                    } else {
                        stranded += u64::from(change.new);
                    }
                }
                if fitting >= u32::from(pod.gpus) && cpu_free >= pod.cpu {
                    stranded
                } else {
                    total
                }
            };
            expected += pod.weight * lost as f64;
        }
        expected
    }
}

/// For one class: the accessible GPUs with room for it, and the free capacity of the others.
#[derive(Clone, Copy, Debug, Default)]
struct PodCounts {
    fitting: u32,
    stranded: u64,
}

/// Steps per milli-GPU that a fragmentation change is rounded to before it is scored (2²⁰: a
/// binary fraction, so the rounding itself adds no error).
///
/// Why: the change is a difference of two weighted sums, and two placements that change the
/// expectation by the same amount, on nodes in different states, come out of floating point
/// differing in the last bits (about 1e-10 milli-GPU). Compared exactly, those true ties were
/// broken by rounding noise instead of by the node order, which concentrated pods: the
/// untruncated FGD allocated 88.0% of gpushare40 against 93.1% once rounded (docs/policies.md).
/// Real differences are far coarser: a class of 1 pod in 10⁶ moving 1 milli-GPU is 1e-6.
const REDUCTION_GRID: f64 = (1u64 << 20) as f64;

/// FGD's score for a fragmentation change (`before - after`, milli-GPU): 50 means no change,
/// higher means the placement reduced fragmentation. On 0..=100. Changes equal to within
/// floating-point noise score exactly equal (`REDUCTION_GRID`).
pub fn score_from_reduction(reduction: f64) -> f64 {
    100.0 / (1.0 + (-on_grid(reduction) / 1000.0).exp())
}

/// [`score_from_reduction`] through `x / (1 + |x|)` instead of the logistic curve: the same
/// order, 50 for no change, on 0..100, but it keeps reductions of tens of thousands of
/// milli-GPU apart. FGD+'s weighted terms reach those (an 8-GPU pod filling an empty node
/// clears eight GPUs of look-ahead, about 40,000), and there the logistic curve rounds every
/// candidate to exactly 100 in `f64`, so the node order, not the measure, chose.
pub fn wide_score_from_reduction(reduction: f64) -> f64 {
    let x = on_grid(reduction) / 1000.0;
    50.0 + 50.0 * x / (1.0 + x.abs())
}

/// `reduction` rounded to the grid on which changes equal within floating-point noise are equal.
fn on_grid(reduction: f64) -> f64 {
    (reduction * REDUCTION_GRID).round() / REDUCTION_GRID
}

/// The reference implementation's integer score (truncated), which is what its ties come from.
/// Evaluated in the reference's order, `trunc(σ(x) × 100)`, so that values on a truncation
/// boundary fall the same way.
pub fn reference_score(reduction: f64) -> f64 {
    let sigmoid = 1.0 / (1.0 + (-(reduction / 1000.0)).exp());
    (sigmoid * 100.0).trunc()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::typical::tests::class;

    #[test]
    fn only_slivers_too_small_for_a_class_count_when_it_fits() {
        let typical = TypicalPods::new(vec![class(1000, 1, 500, 1.0)]);
        // GPU 0 has 300 free (too small), GPU 1 has 800 (fits).
        let frag = typical.fragmentation(CpuMilli(4000), &[300, 800], &[0b11]);
        assert!((frag - 300.0).abs() < 1e-9);
        // Without CPU the class cannot run: all 1100 is lost to it.
        let frag = typical.fragmentation(CpuMilli(500), &[300, 800], &[0b11]);
        assert!((frag - 1100.0).abs() < 1e-9);
        // Inaccessible model: everything is lost.
        let frag = typical.fragmentation(CpuMilli(4000), &[300, 800], &[0]);
        assert!((frag - 1100.0).abs() < 1e-9);
    }

    #[test]
    fn cpu_only_classes_count_all_idle_gpu_and_weights_mix() {
        let typical = TypicalPods::new(vec![class(1000, 0, 0, 1.0), class(1000, 2, 1000, 3.0)]);
        let frag = typical.fragmentation(CpuMilli(8000), &[1000, 1000, 400], &[0b111, 0b111]);
        // CPU-only: 2400 lost, weight 0.25. Two-GPU class fits; the 400 sliver is lost, weight 0.75.
        assert!((frag - (0.25 * 2400.0 + 0.75 * 400.0)).abs() < 1e-9);
    }

    #[test]
    fn coverage_keeps_the_shortest_prefix() {
        let typical = TypicalPods::from_counts(
            vec![
                (class(0, 1, 500, 0.0), 60),
                (class(0, 1, 250, 0.0), 36),
                (class(0, 1, 100, 0.0), 4),
            ],
            0.95,
        );
        assert_eq!(typical.pods().len(), 2);
        assert!((typical.pods()[0].weight - 60.0 / 96.0).abs() < 1e-12);
    }

    /// The incremental forms must agree with the full computation bit for bit: GPU choice and
    /// scores compare these floats, and ties are part of the behaviour.
    #[test]
    fn incremental_fragmentation_equals_the_full_computation() {
        let mut seed = 7u64;
        let mut next = move |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for _ in 0..500 {
            let classes = (0..1 + next(8))
                .map(|_| {
                    let gpus = next(4) as u16;
                    let milli = if gpus == 0 {
                        0
                    } else {
                        50 * (1 + next(20) as u32)
                    };
                    class(1000 * next(8), gpus, milli, 1.0 + next(50) as f64)
                })
                .collect();
            let typical = TypicalPods::new(classes);
            let gpus = 1 + next(8) as usize;
            let free: Vec<u32> = (0..gpus).map(|_| 50 * next(21) as u32).collect();
            let access: Vec<u64> = typical.pods().iter().map(|_| next(1 << gpus)).collect();
            let cpu = CpuMilli(1000 * next(8));
            let state = FragState::of(&typical, &free, &access);
            assert_eq!(
                state
                    .fragmentation_with(&typical, cpu, &access, &[])
                    .to_bits(),
                typical.fragmentation(cpu, &free, &access).to_bits()
            );
            let mut changes = Vec::new();
            for (position, &old) in free.iter().enumerate() {
                if next(2) == 0 {
                    let new = 50 * next(21) as u32;
                    changes.push(FreeChange { position, old, new });
                }
            }
            let mut changed = free.clone();
            for change in &changes {
                changed[change.position] = change.new;
            }
            assert_eq!(
                state
                    .fragmentation_with(&typical, cpu, &access, &changes)
                    .to_bits(),
                typical.fragmentation(cpu, &changed, &access).to_bits()
            );
            let mut each = vec![0.0; changes.len()];
            state.fragmentation_each(&typical, cpu, &access, &changes, &mut each);
            for (change, value) in changes.iter().zip(each) {
                let mut alone = free.clone();
                alone[change.position] = change.new;
                assert_eq!(
                    value.to_bits(),
                    typical.fragmentation(cpu, &alone, &access).to_bits()
                );
            }
        }
    }

    #[test]
    fn sliver_values_follow_the_fill_recursion() {
        // Half the pods take 500 of one GPU, half are CPU-only.
        let typical = TypicalPods::new(vec![class(0, 1, 500, 1.0), class(0, 0, 0, 1.0)]);
        // 400 fits nothing: all of it is left over.
        assert_eq!(typical.sliver_value(400), 400.0);
        // 500: half the time a pod fills it exactly, else 500 stay: 250.
        assert!((typical.sliver_value(500) - 250.0).abs() < 1e-9);
        // 1000: half the time 500 go, then 500 is worth 250: 0.5·1000 + 0.5·250 = 625.
        assert!((typical.sliver_value(1000) - 625.0).abs() < 1e-9);
        assert_eq!(TypicalPods::default().sliver_value(70), 70.0);
    }

    #[test]
    fn scores_are_centred_on_fifty() {
        assert_eq!(reference_score(0.0), 50.0);
        assert!(score_from_reduction(2000.0) > 85.0);
        assert!(score_from_reduction(-2000.0) < 15.0);
        assert!((0.0..=100.0).contains(&score_from_reduction(1e9)));
        assert_eq!(wide_score_from_reduction(0.0), 50.0);
        assert!(wide_score_from_reduction(2000.0) > 50.0);
        assert!(wide_score_from_reduction(-2000.0) < 50.0);
        for reduction in [1e9, -1e9, 1e15, -1e15] {
            let score = wide_score_from_reduction(reduction);
            assert!(score > 0.0 && score < 100.0, "{reduction}: {score}");
        }
    }

    #[test]
    fn the_wide_score_keeps_large_reductions_apart() {
        // Where the logistic curve has rounded both to 100, the wide one still orders them.
        assert_eq!(
            score_from_reduction(40_000.0),
            score_from_reduction(41_000.0)
        );
        assert!(wide_score_from_reduction(41_000.0) > wide_score_from_reduction(40_000.0));
        // One milli-GPU apart at 100,000 (past any reduction measured on openb) still differs
        // by more than FGD+'s tie-break between nodes (1e-6).
        let step = wide_score_from_reduction(100_001.0) - wide_score_from_reduction(100_000.0);
        assert!(step > 1e-6, "{step}");
        // The same order as the logistic curve wherever that one resolves.
        let reductions = [-9000.0, -1000.0, -17.0, 0.0, 0.5, 17.0, 1000.0, 9000.0];
        for pair in reductions.windows(2) {
            assert!(score_from_reduction(pair[0]) < score_from_reduction(pair[1]));
            assert!(wide_score_from_reduction(pair[0]) < wide_score_from_reduction(pair[1]));
        }
    }

    #[test]
    fn changes_equal_but_for_rounding_noise_score_equal() {
        // The same change of 17.17 milli-GPU, once on its own and once as the difference of two
        // expectations (a node whose fragmentation drops from 4338.87 to 4321.7).
        let on_a_busy_node = (4321.7_f64 + 17.17) - 4321.7;
        let on_an_empty_node = 17.17;
        assert_ne!(
            on_a_busy_node, on_an_empty_node,
            "the noise this guards against"
        );
        assert_eq!(
            score_from_reduction(on_a_busy_node),
            score_from_reduction(on_an_empty_node)
        );
        // Real differences still order.
        assert!(score_from_reduction(150.001) > score_from_reduction(150.0));
    }
}
