//! Spread: put pods on the emptiest GPUs and nodes, trading packing for isolation from noisy
//! neighbours.

use crate::engine::allocation::PodAllocation;
use crate::engine::state::{GpuUsage, NodeState, gpu_free_milli};
use crate::engine::topology::positions;

use super::binpack::utilisation_after;

/// The `count` GPUs of `pool` with the most free capacity, then the fewest pods (lowest position
/// on ties).
pub fn choose(node: &NodeState, usage: &[GpuUsage], pool: u64, count: usize) -> Vec<usize> {
    let mut ranked: Vec<(std::cmp::Reverse<u32>, u16, usize)> = positions(pool)
        .map(|position| {
            let free = gpu_free_milli(&node.spec.gpus[position], &usage[position]);
            (std::cmp::Reverse(free), usage[position].shares, position)
        })
        .collect();
    ranked.sort_unstable();
    ranked
        .into_iter()
        .take(count)
        .map(|(_, _, position)| position)
        .collect()
}

/// How empty the node stays once the pod is placed, on 0..=100.
pub fn score(node: &NodeState, allocation: &PodAllocation, free_after: &[u32]) -> f64 {
    (1.0 - utilisation_after(node, allocation, free_after)) * 100.0
}
