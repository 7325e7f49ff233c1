//! How many more copies of one pod a set of nodes can hold: each node takes copies one after
//! another, placed by [`fit`] exactly as bind would place them, until the next one no longer
//! fits or the policy refuses it. What a multi-cluster scheduler asks a member cluster
//! (Karmada's scheduler-estimator, served by `crate::estimator`).
//!
//! Copies placed on one node change no other node, so the count over a set of nodes is the sum
//! of the nodes' own counts, whatever order the copies arrive in and whichever node the policy
//! picks for each. Nodes of the same shape (the same spec apart from names, the same usage)
//! answer alike, so each shape is counted once: a 5,000-node cluster of a few node types costs
//! a few placements per type, not per node.

use std::collections::HashMap;

use super::fit::{fit, footprint_with};
use super::model::{CpuMilli, MemMiB};
use super::policy::Policy;
use super::policy::fgd::FgdCache;
use super::policy::fgd_plus::Taking;
use super::request::PodRequest;
use super::state::{NodeState, PerGpu};

/// How many copies of `request` `node` takes one after another, at most `limit`.
pub fn replicas_on(node: &NodeState, request: &PodRequest, policy: &Policy, limit: u64) -> u64 {
    fill(&mut node.clone(), request, policy, limit)
}

/// Places copies of `request` on `node` until the next one does not fit or `limit` are placed;
/// how many were placed. `node` is left holding them.
fn fill(node: &mut NodeState, request: &PodRequest, policy: &Policy, limit: u64) -> u64 {
    let mut placed = 0;
    // The policy may refuse a copy that fits (FGD+'s hold of a node's host for its GPUs), as
    // filter and bind would.
    let taking = Taking::asked(request);
    if node.profile.contiguous {
        // The score path's placement, which writes the usage the pod leaves in place instead
        // of building its `PodAllocation` (exactly `fit` then `add` where GPU indices are
        // positions, see `footprint_with`): no allocation per copy.
        while placed < limit && !policy.holds_host(node, taking) {
            let mut after = PerGpu::copy_of(&node.gpus);
            let placement =
                footprint_with(node, request, policy, &mut FgdCache::default(), &mut after);
            if placement.is_err() {
                break;
            }
            node.gpus = after;
            node.take_mig(&request.mig);
            node.cpu_used = CpuMilli(node.cpu_used.0.saturating_add(request.cpu.0));
            node.mem_used = MemMiB(node.mem_used.0.saturating_add(request.memory.0));
            node.pods = node.pods.saturating_add(1);
            placed += 1;
        }
        return placed;
    }
    while placed < limit && !policy.holds_host(node, taking) {
        let Ok(allocation) = fit(node, request, policy) else {
            break;
        };
        node.add(&allocation);
        placed += 1;
    }
    placed
}

/// How many copies of `request` the `nodes` take together, each node filled one copy after
/// another ([`replicas_on`]); at most `limit`. The caller passes only the nodes the pod may use
/// at all (its node selector, affinity and tolerations already applied).
pub fn max_replicas<'a>(
    nodes: impl IntoIterator<Item = &'a NodeState>,
    request: &PodRequest,
    policy: &Policy,
    limit: u64,
) -> u64 {
    // Shapes seen, by hash; equal hashes are compared in full, so a collision costs a
    // placement run, never a wrong count. Each count is capped at `limit` alike, so a cached
    // count is exactly what a fresh run would give.
    let mut counted: ShapeMap<Vec<(&'a NodeState, u64)>> = ShapeMap::default();
    // One scratch node per spec (names aside), filled from each node's usage in turn: copying
    // a node's usage costs nothing, cloning its spec (GPU list, model names, profile) a dozen
    // allocations, the larger part of an estimate over thousands of nodes.
    let mut scratch: ShapeMap<Vec<NodeState>> = ShapeMap::default();
    let mut total: u64 = 0;
    for node in nodes {
        if total >= limit {
            break;
        }
        let spec_hash = node.shape_hash();
        let same = counted.entry(node.usage_key()).or_default();
        let count = match same.iter().find(|(seen, _)| seen.placed_alike(node)) {
            Some(&(_, count)) => count,
            None => {
                let nodes_of_spec = scratch.entry(spec_hash).or_default();
                let position = match nodes_of_spec.iter().position(|s| s.same_shape(node)) {
                    Some(position) => position,
                    None => {
                        nodes_of_spec.push(node.clone());
                        nodes_of_spec.len() - 1
                    }
                };
                let work = &mut nodes_of_spec[position];
                copy_usage(work, node);
                let count = fill(work, request, policy, limit);
                same.push((node, count));
                count
            }
        };
        total = total.saturating_add(count);
    }
    total.min(limit)
}

/// Maps keyed by a hash already computed: foldhash, not the standard library's SipHash, which
/// cost more than the lookups themselves over thousands of nodes.
type ShapeMap<V> = HashMap<u64, V, foldhash::fast::RandomState>;

/// Gives `work` (a node of the same spec) `node`'s usage.
fn copy_usage(work: &mut NodeState, node: &NodeState) {
    work.gpus.clone_from(&node.gpus);
    work.cpu_used = node.cpu_used;
    work.mem_used = node.mem_used;
    work.pods = node.pods;
    work.dangling_holds = node.dangling_holds;
    work.mig_held.clone_from(&node.mig_held);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on a broken fixture")]

    use super::*;
    use crate::model::{GpuMode, NodeSpec};
    use crate::request::GpuDemand;

    fn t4(name: &str, gpus: u16) -> NodeState {
        NodeState::new(
            NodeSpec::uniform(name, GpuMode::ShareMemory, gpus, "T4", MemMiB(16_384)).with_host(
                CpuMilli(64_000),
                MemMiB(256 * 1024),
                110,
            ),
        )
    }

    #[test]
    fn a_share_pod_counts_per_gpu_not_per_summed_memory() {
        // 10 GiB of a 16 GiB GPU: one per GPU, although the node's 4 GPUs sum to 64 GiB (six
        // such pods by sum).
        let pod = PodRequest::single(
            CpuMilli(100),
            MemMiB(128),
            GpuDemand::share(10, 1, None).unwrap(),
        );
        let node = t4("a", 4);
        assert_eq!(replicas_on(&node, &pod, &Policy::default(), u64::MAX), 4);
    }

    #[test]
    fn nodes_of_one_shape_are_counted_alike_and_the_limit_caps_the_sum() {
        let pod = PodRequest::single(CpuMilli(0), MemMiB(0), GpuDemand::whole(1).unwrap());
        let nodes: Vec<NodeState> = (0..50).map(|i| t4(&format!("n{i}"), 2)).collect();
        let policy = Policy::default();
        assert_eq!(max_replicas(&nodes, &pod, &policy, u64::MAX), 100);
        assert_eq!(max_replicas(&nodes, &pod, &policy, 7), 7);
        assert_eq!(replicas_on(&nodes[0], &pod, &policy, 1), 1);
    }

    /// Copies of a pod of MIG slices count the node's free slices, on the score path's
    /// placement as on `fit`'s, and nodes of one shape with other slices held count apart.
    #[test]
    fn mig_slices_bound_the_copies_a_node_takes() {
        use crate::mig::{MigProfile, MigSlices};
        let slices = |count| vec![MigSlices::new(MigProfile::parse("1g.10gb").unwrap(), count)];
        let spec =
            NodeSpec::uniform("a", GpuMode::Exclusive, 0, "A100", MemMiB(0)).with_mig(slices(7));
        let pod = PodRequest::single(CpuMilli(0), MemMiB(0), GpuDemand::None).with_mig(slices(2));
        let empty = NodeState::new(spec.clone());
        let policy = Policy::default();
        assert_eq!(replicas_on(&empty, &pod, &policy, u64::MAX), 3);
        let mut used = NodeState::new(NodeSpec {
            name: crate::model::NodeName::new("b"),
            ..spec
        });
        let mut other = crate::allocation::PodAllocation::host_only(
            used.spec.name.clone(),
            CpuMilli(0),
            MemMiB(0),
        );
        other.mig = slices(4);
        used.add(&other);
        assert_eq!(replicas_on(&used, &pod, &policy, u64::MAX), 1);
        assert_eq!(
            max_replicas([&empty, &used, &empty], &pod, &policy, u64::MAX),
            7
        );
    }

    #[test]
    fn the_host_pod_limit_stops_a_pod_that_asks_nothing() {
        let node = NodeState::new(
            NodeSpec::uniform("a", GpuMode::Exclusive, 1, "T4", MemMiB(16_384)).with_host(
                CpuMilli(1000),
                MemMiB(1024),
                3,
            ),
        );
        let pod = PodRequest::single(CpuMilli(0), MemMiB(0), GpuDemand::None);
        assert_eq!(replicas_on(&node, &pod, &Policy::default(), u64::MAX), 3);
    }
}
