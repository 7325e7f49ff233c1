//! Binpack: fill the fullest GPUs and nodes first, so whole GPUs and whole nodes stay free for
//! large pods and for scale-down.

use crate::allocation::PodAllocation;
use crate::model::{CpuMilli, MAX_GPUS_PER_NODE};
use crate::state::{GpuUsage, NodeState};
use crate::topology::positions;

use super::pick::Picked;

/// The `count` GPUs of `pool` with the least free capacity (lowest position on ties).
pub fn choose(node: &NodeState, usage: &[GpuUsage], pool: u64, count: usize) -> Vec<usize> {
    pick(node, usage, pool, count).iter().collect()
}

/// [`choose`] without allocating.
pub(crate) fn pick(node: &NodeState, usage: &[GpuUsage], pool: u64, count: usize) -> Picked {
    pick_smallest(pool, count, |position| {
        node.free_milli_under(position, &usage[position])
    })
}

/// The `count` positions of `pool` with the smallest keys, smallest first (keys are unique per
/// position because the position is part of the order). One GPU, the usual share, is a single
/// scan rather than a sort.
pub(crate) fn pick_smallest<K: Ord + Copy + Default>(
    pool: u64,
    count: usize,
    key: impl Fn(usize) -> K,
) -> Picked {
    let mut picked = Picked::new();
    if count == 1 {
        if let Some((_, position)) = positions(pool).map(|p| (key(p), p)).min() {
            picked.push(position);
        }
        return picked;
    }
    let mut ranked = [(K::default(), 0usize); MAX_GPUS_PER_NODE];
    let mut len = 0;
    for position in positions(pool) {
        ranked[len] = (key(position), position);
        len += 1;
    }
    let ranked = &mut ranked[..len];
    ranked.sort_unstable();
    for &(_, position) in ranked.iter().take(count) {
        picked.push(position);
    }
    picked
}

/// How full the node's healthy GPUs are once the pod is placed, on 0..=100; nodes without GPUs
/// are ranked by CPU instead.
pub fn score(node: &NodeState, allocation: &PodAllocation, free_after: &[u32]) -> f64 {
    score_taking(node, allocation.cpu, free_after)
}

/// [`score`] of a placement that takes `cpu`: all of the allocation a score reads.
pub(crate) fn score_taking(node: &NodeState, cpu: CpuMilli, free_after: &[u32]) -> f64 {
    utilisation_taking(node, cpu, free_after) * 100.0
}

/// Fraction of the node's GPU capacity (or CPU, for GPU-less nodes) in use after the placement.
pub fn utilisation_after(node: &NodeState, allocation: &PodAllocation, free_after: &[u32]) -> f64 {
    utilisation_taking(node, allocation.cpu, free_after)
}

/// [`utilisation_after`] of a placement that takes `cpu`.
pub(crate) fn utilisation_taking(node: &NodeState, cpu: CpuMilli, free_after: &[u32]) -> f64 {
    let healthy = node.profile.healthy_count as f64;
    if healthy == 0.0 {
        if node.spec.cpu.0 == 0 {
            return 0.0;
        }
        let used = node.cpu_used.0.saturating_add(cpu.0) as f64;
        return (used / node.spec.cpu.0 as f64).clamp(0.0, 1.0);
    }
    let free: f64 = free_after
        .iter()
        .take(node.spec.gpus.len())
        .enumerate()
        .filter(|&(position, _)| node.profile.is_healthy(&node.spec, position))
        .map(|(_, &free)| f64::from(free))
        .sum();
    (1.0 - free / (healthy * 1000.0)).clamp(0.0, 1.0)
}
