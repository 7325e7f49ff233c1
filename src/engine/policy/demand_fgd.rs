//! Demand-weighted fragmentation descent: FGD's measure of expected stranded GPU capacity, with
//! each typical pod weighted by the GPU capacity it asks for rather than counted once, compared
//! without truncation, plus a charge for opening a fully idle node and a packing tie-break.
//!
//! Why: the goal is GPU capacity allocated, not pods placed. Counting pods makes a rare 8-GPU job
//! weigh as little as one small share, so FGD happily breaks up the last idle 8-GPU nodes; weighted
//! by demand, losing the ability to host it costs what it would have allocated. See
//! docs/policies.md for the measured ablation.

use crate::engine::allocation::PodAllocation;
use crate::engine::model::{CpuMilli, WHOLE_GPU_COMPUTE};
use crate::engine::state::NodeState;

use super::fgd::{self, TypicalPod, TypicalPods};

/// The knobs of the policy; [`Tuning::default`] is the measured best.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tuning {
    /// Weight typical pods by their GPU demand (count × GPUs × milli) instead of by count.
    pub demand_weighted: bool,
    /// Extra fragmentation (milli-GPU) charged for placing a GPU pod on a node whose GPUs are all
    /// idle: keeps whole nodes for the pods that need them.
    pub idle_node_penalty: u32,
    /// Among placements of equal fragmentation, prefer the one that leaves the node fullest
    /// (best fit on GPU, then CPU) instead of leaving the choice to node order.
    pub pack_ties: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            demand_weighted: true,
            idle_node_penalty: 0,
            pack_ties: true,
        }
    }
}

/// A typical pod's GPU demand in milli-GPU (0 for CPU-only pods).
pub fn demand(pod: &TypicalPod) -> f64 {
    f64::from(pod.gpus) * f64::from(pod.milli)
}

/// The expected fragmentation the policy minimises, in milli-GPU.
pub fn fragmentation(
    typical: &TypicalPods,
    tuning: &Tuning,
    cpu_free: CpuMilli,
    free_milli: &[u32],
    access: &[u64],
) -> f64 {
    if tuning.demand_weighted {
        typical.fragmentation_scaled(cpu_free, free_milli, access, demand)
    } else {
        typical.fragmentation(cpu_free, free_milli, access)
    }
}

/// Scale of the packing tie-break: far below any fragmentation difference that matters
/// (scores move by about 0.025 per milli-GPU of fragmentation near the centre).
const TIE_BREAK: f64 = 1e-6;

/// The score of `allocation` on `node` (0..=100, 50 = no change in fragmentation), given the
/// node's per-GPU free milli-GPU before and after it.
pub fn score(
    typical: &TypicalPods,
    tuning: &Tuning,
    node: &NodeState,
    allocation: &PodAllocation,
    before: &[u32],
    after: &[u32],
) -> f64 {
    let access = typical.access_masks(node);
    let cpu_after = CpuMilli(node.cpu_free().0.saturating_sub(allocation.cpu.0));
    let mut reduction = fragmentation(typical, tuning, node.cpu_free(), before, &access)
        - fragmentation(typical, tuning, cpu_after, after, &access);
    let opens_idle_node = allocation.has_gpus()
        && !node.gpus.is_empty()
        && node.gpus.iter().all(|usage| usage.is_idle());
    if opens_idle_node {
        reduction -= f64::from(tuning.idle_node_penalty);
    }
    let mut score = fgd::score_from_reduction(reduction);
    if tuning.pack_ties {
        score += TIE_BREAK * fullness(node, cpu_after, after);
    }
    score
}

/// How full the node is left, on 0..=1: half GPU, half CPU, like the reference's best fit.
fn fullness(node: &NodeState, cpu_after: CpuMilli, after: &[u32]) -> f64 {
    let gpu_capacity = after.len() as f64 * f64::from(WHOLE_GPU_COMPUTE.0);
    let gpu_free: f64 = after.iter().map(|&f| f64::from(f)).sum();
    let gpu = if gpu_capacity > 0.0 {
        1.0 - gpu_free / gpu_capacity
    } else {
        1.0
    };
    let cpu = if node.spec.cpu.0 > 0 {
        1.0 - cpu_after.0 as f64 / node.spec.cpu.0 as f64
    } else {
        1.0
    };
    (gpu + cpu) / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{GpuDemand, GpuMode, MemMiB, NodeSpec, PodRequest, Policy, ScoringPolicy};

    fn class(cpu: u64, gpus: u16, milli: u32, weight: f64) -> TypicalPod {
        TypicalPod {
            cpu: CpuMilli(cpu),
            gpus,
            milli,
            models: Vec::new(),
            weight,
        }
    }

    #[test]
    fn demand_weighting_makes_big_pods_count_for_their_gpus() {
        // 90% of pods are 100-milli shares, 10% take 8 whole GPUs.
        let typical = TypicalPods::new(vec![class(0, 1, 100, 9.0), class(0, 8, 1000, 1.0)]);
        let tuning = Tuning::default();
        let access = [0xFF, 0xFF];
        // One GPU half used: the 8-GPU pod can no longer run, all 7500 is lost to it.
        let free = [500, 1000, 1000, 1000, 1000, 1000, 1000, 1000];
        let counted = typical.fragmentation(CpuMilli(64_000), &free, &access);
        let weighted = fragmentation(&typical, &tuning, CpuMilli(64_000), &free, &access);
        assert!((counted - 0.1 * 7500.0).abs() < 1e-9);
        // Weights 9 × 100 = 900 and 1 × 8000 = 8000: 8000/8900 of 7500.
        assert!((weighted - 7500.0 * 8000.0 / 8900.0).abs() < 1e-6);
    }

    #[test]
    fn opening_an_idle_node_costs_the_penalty_and_ties_pack() {
        let node = NodeState::new(NodeSpec::uniform("n", GpuMode::CoreMem, 2, "T4", MemMiB(0)));
        let typical = TypicalPods::new(vec![class(0, 1, 1000, 1.0)]);
        let policy = Policy::scoring(ScoringPolicy::DemandFgd).with_typical(typical.clone());
        let pod = PodRequest::single(CpuMilli(0), MemMiB(0), GpuDemand::Whole { count: 1 });
        let plain = policy.evaluate(&node, &pod).unwrap().score;
        let penalised = Policy {
            demand_fgd: Tuning {
                idle_node_penalty: 1000,
                ..Tuning::default()
            },
            ..policy.clone()
        }
        .evaluate(&node, &pod)
        .unwrap()
        .score;
        assert!(plain > penalised);
        // A whole GPU on an empty 2-GPU node strands nothing: 50 plus the packing tie-break.
        assert!(plain > 50.0 && plain < 50.0 + 1e-5, "{plain}");
    }
}
