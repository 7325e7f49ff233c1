//! Topology quality of a multi-GPU placement: how close the chosen group's interconnect comes to
//! the best the node could offer when empty.

use crate::allocation::{Grant, PodAllocation};
use crate::state::NodeState;
use crate::topology::bit;

/// 1.0 when every container's whole-GPU group is as well connected as the best group of its size
/// on the node; less in proportion to the weakest link otherwise. Placements of fewer than two
/// whole GPUs per container always score 1.0.
pub fn quality(node: &NodeState, allocation: &PodAllocation) -> f64 {
    // Most placements hold no group of whole GPUs: answer those without reading the node's
    // topology index (one cache miss per node when filtering thousands).
    let has_group = allocation.containers.iter().any(|container| {
        container
            .gpus
            .iter()
            .filter(|grant| grant.grant == Grant::Whole)
            .nth(1)
            .is_some()
    });
    if !has_group {
        return 1.0;
    }
    allocation
        .containers
        .iter()
        .map(|container| {
            container
                .gpus
                .iter()
                .filter(|grant| grant.grant == Grant::Whole)
                .filter_map(|grant| node.position_of(grant.gpu))
                .fold(0u64, |mask, position| mask | bit(position))
        })
        .fold(1.0, |quality: f64, group| {
            quality.min(group_quality(node, group))
        })
}

/// The score of a placement for a pod whose topology wish is `preferred`, from the policy's
/// `score` (0..=100, already scaled by `quality`): a placement whose groups are as well connected
/// as the node's best groups of their sizes (`quality` 1.0) lands in 50..=100, any other in
/// 0..50. So a node that offers the pod a best-connected group ranks above every node that does
/// not, whatever the scoring policy says; among either kind the policy's order is kept. A
/// worse-connected node still fits: the wish only ranks.
pub fn preferred_score(score: f64, quality: f64) -> f64 {
    let half = score.clamp(0.0, 100.0) / 2.0;
    if quality >= 1.0 {
        50.0 + half
    } else {
        // Strictly below 50 even for a policy score of 100.
        half.min(49.999)
    }
}

/// The quality of one container's group of whole GPUs (a position mask): 1.0 when it is as well
/// connected as the best group of its size on the node, or has fewer than two GPUs, or the node
/// connects every pair alike; the ratio of its weakest link to the best group's otherwise.
pub(crate) fn group_quality(node: &NodeState, group: u64) -> f64 {
    let size = group.count_ones() as usize;
    if size < 2 {
        return 1.0;
    }
    let topology = &node.spec.topology;
    if topology.is_uniform() {
        // Every group of a size is connected alike: each is as good as the best.
        return 1.0;
    }
    let (Some((_, chosen)), Some(best)) = (
        topology.best_group(group, size),
        topology.best_possible(size),
    ) else {
        return 1.0;
    };
    let weakest = |conn: u64| (conn >> 32) as f64;
    if weakest(best) > 0.0 {
        weakest(chosen) / weakest(best)
    } else {
        1.0
    }
}
