//! Binpack: fill the fullest GPUs and nodes first, so whole GPUs and whole nodes stay free for
//! large pods and for scale-down.

use crate::engine::allocation::PodAllocation;
use crate::engine::state::{GpuUsage, NodeState, gpu_free_milli};
use crate::engine::topology::positions;

/// The `count` GPUs of `pool` with the least free capacity (lowest position on ties).
pub fn choose(node: &NodeState, usage: &[GpuUsage], pool: u64, count: usize) -> Vec<usize> {
    let mut ranked: Vec<(u32, usize)> = positions(pool)
        .map(|position| {
            (
                gpu_free_milli(&node.spec.gpus[position], &usage[position]),
                position,
            )
        })
        .collect();
    ranked.sort_unstable();
    ranked
        .into_iter()
        .take(count)
        .map(|(_, position)| position)
        .collect()
}

/// How full the node's healthy GPUs are once the pod is placed, on 0..=100; nodes without GPUs
/// are ranked by CPU instead.
pub fn score(node: &NodeState, allocation: &PodAllocation, free_after: &[u32]) -> f64 {
    utilisation_after(node, allocation, free_after) * 100.0
}

/// Fraction of the node's GPU capacity (or CPU, for GPU-less nodes) in use after the placement.
pub fn utilisation_after(node: &NodeState, allocation: &PodAllocation, free_after: &[u32]) -> f64 {
    let healthy = node.spec.gpus.iter().filter(|gpu| gpu.healthy).count() as f64;
    if healthy == 0.0 {
        if node.spec.cpu.0 == 0 {
            return 0.0;
        }
        let used = node.cpu_used.0.saturating_add(allocation.cpu.0) as f64;
        return (used / node.spec.cpu.0 as f64).clamp(0.0, 1.0);
    }
    let free: f64 = node
        .spec
        .gpus
        .iter()
        .zip(free_after)
        .filter(|(gpu, _)| gpu.healthy)
        .map(|(_, &free)| f64::from(free))
        .sum();
    (1.0 - free / (healthy * 1000.0)).clamp(0.0, 1.0)
}
