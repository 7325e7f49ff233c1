//! Spread: put pods on the emptiest GPUs and nodes, trading packing for isolation from noisy
//! neighbours.

use std::cmp::Reverse;

use crate::allocation::PodAllocation;
use crate::model::CpuMilli;
use crate::state::{GpuUsage, NodeState};

use super::binpack::{pick_smallest, utilisation_taking};
use super::pick::Picked;

/// The `count` GPUs of `pool` with the most free capacity, then the fewest pods (lowest position
/// on ties).
pub fn choose(node: &NodeState, usage: &[GpuUsage], pool: u64, count: usize) -> Vec<usize> {
    pick(node, usage, pool, count).iter().collect()
}

/// [`choose`] without allocating.
pub(crate) fn pick(node: &NodeState, usage: &[GpuUsage], pool: u64, count: usize) -> Picked {
    pick_smallest(pool, count, |position| {
        let free = node.free_milli_under(position, &usage[position]);
        (Reverse(free), usage[position].shares)
    })
}

/// How empty the node stays once the pod is placed, on 0..=100.
pub fn score(node: &NodeState, allocation: &PodAllocation, free_after: &[u32]) -> f64 {
    score_taking(node, allocation.cpu, free_after)
}

/// [`score`] of a placement that takes `cpu`: all of the allocation a score reads.
pub(crate) fn score_taking(node: &NodeState, cpu: CpuMilli, free_after: &[u32]) -> f64 {
    (1.0 - utilisation_taking(node, cpu, free_after)) * 100.0
}
