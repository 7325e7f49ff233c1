//! kube-scheduler's `percentageOfNodesToScore` window as `simulate` can replay it: which nodes
//! a pod's filter call would carry to the extender.
//!
//! kube-scheduler does not offer the extender every node. For each pod it walks its node list
//! from where the previous pod's walk stopped, runs its own filters (CPU, memory, whole GPUs by
//! count, node affinity), and stops once it has found enough feasible nodes
//! (`numFeasibleNodesToFind`, kube-scheduler v1.34 `schedule_one.go`); the next pod's walk
//! starts after the last node examined. The policy then chooses only among those nodes. The
//! real loop (`gpu-lab replay`) measures what that costs; this replays the same walk in
//! `simulate`, so the window's effect on a workload's curve shows without a control plane.

use gpu_engine::quota::{Amounts, QuotaResource};
use gpu_engine::{NodeState, PodRequest};

/// kube-scheduler's floor: never fewer feasible nodes than this (`minFeasibleNodesToFind`).
const MIN_FEASIBLE_NODES: usize = 100;
/// The adaptive percentage's floor (`minFeasibleNodesPercentageToFind`).
const MIN_ADAPTIVE_PERCENT: usize = 5;

/// How many feasible nodes kube-scheduler looks for among `node_count` with
/// `percentageOfNodesToScore` = `percent` (0: its adaptive default, `50 − nodes/125` %, at
/// least 5 %): kube-scheduler's `numFeasibleNodesToFind`.
pub fn feasible_nodes_to_find(percent: u32, node_count: usize) -> usize {
    if node_count < MIN_FEASIBLE_NODES {
        return node_count;
    }
    let percent = match percent as usize {
        0 => 50usize
            .saturating_sub(node_count / 125)
            .max(MIN_ADAPTIVE_PERCENT),
        given => given.min(100),
    };
    (node_count * percent / 100).max(MIN_FEASIBLE_NODES)
}

/// Whether kube-scheduler's own filters pass `node` for `request`, as the replay's objects
/// present them ([simulate.md](../../docs/simulate.md#the-mapping-from-trace-rows-to-objects)):
/// CPU and memory fit, whole GPUs fit by count (`nvidia.com/gpu`; shares ask only for the
/// ignored `aliyun.com/gpu-core.percentage`, so kube-scheduler sees none of their GPU), and a
/// pod that names GPU models is on a node of one of them (its required node affinity).
/// Per-GPU room is the extender's to check, not kube-scheduler's.
pub fn passes_scheduler_filters(node: &NodeState, request: &PodRequest) -> bool {
    passes_with(node, request, whole_gpus_requested(request))
}

/// The whole GPUs kube-scheduler counts for `request`: Kubernetes' effective request (the app
/// containers' sum or the largest init container), as quotas count it.
fn whole_gpus_requested(request: &PodRequest) -> usize {
    let whole = Amounts::requested_by(request).get(QuotaResource::WholeGpus);
    usize::try_from(whole).unwrap_or(usize::MAX)
}

/// [`passes_scheduler_filters`] with the pod's whole GPUs counted once for the whole walk.
fn passes_with(node: &NodeState, request: &PodRequest, whole_requested: usize) -> bool {
    if node.cpu_free() < request.cpu
        || node.mem_free() < request.memory
        || node.pods >= node.spec.max_pods
    {
        return false;
    }
    let whole_held = node.gpus.iter().filter(|usage| usage.is_whole()).count();
    if whole_requested > 0 && whole_held.saturating_add(whole_requested) > node.spec.gpus.len() {
        return false;
    }
    if request.wants_gpu() && !request.constraints.include_models.is_empty() {
        return node
            .normalized_models
            .iter()
            .any(|model| request.constraints.accepts_model(model));
    }
    true
}

/// The walk's state across the pods of one run.
#[derive(Clone, Debug)]
pub struct SchedulerWindow {
    to_find: usize,
    next_start: usize,
    in_window: Vec<bool>,
}

impl SchedulerWindow {
    /// A window over `node_count` nodes with `percentageOfNodesToScore` = `percent`.
    pub fn new(percent: u32, node_count: usize) -> Self {
        Self {
            to_find: feasible_nodes_to_find(percent, node_count),
            next_start: 0,
            in_window: vec![false; node_count],
        }
    }

    /// How many feasible nodes each pod's walk looks for.
    pub fn size(&self) -> usize {
        self.to_find
    }

    /// How many walks one after the other cover every node of `node_count` at least once: each
    /// examines at least as many nodes as it finds feasible, so a node that passes the filters
    /// is sent within this many.
    pub fn laps(&self, node_count: usize) -> usize {
        node_count.div_ceil(self.to_find.max(1)) + 1
    }

    /// Walks the nodes for the next pod and marks the ones its filter call carries; the next
    /// walk starts after the last node this one examined.
    pub fn select(&mut self, nodes: &[NodeState], request: &PodRequest) -> &[bool] {
        let count = nodes.len().min(self.in_window.len());
        let whole_requested = whole_gpus_requested(request);
        self.in_window.fill(false);
        let mut found = 0;
        let mut examined = 0;
        while examined < count && found < self.to_find {
            let index = (self.next_start + examined) % count;
            examined += 1;
            if passes_with(&nodes[index], request, whole_requested) {
                self.in_window[index] = true;
                found += 1;
            }
        }
        if count > 0 {
            self.next_start = (self.next_start + examined) % count;
        }
        &self.in_window
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_engine::request::{GpuConstraints, GpuDemand, ModelPattern};
    use gpu_engine::{CpuMilli, GpuMode, MemMiB, NodeSpec};

    fn node(name: &str, model: &str, gpus: u16, cpu: u64) -> NodeState {
        NodeState::new(
            NodeSpec::uniform(name, GpuMode::CoreMem, gpus, model, MemMiB(0)).with_host(
                CpuMilli(cpu),
                MemMiB(1 << 20),
                1000,
            ),
        )
    }

    fn whole(count: u16, cpu: u64) -> PodRequest {
        PodRequest::single(CpuMilli(cpu), MemMiB(1024), GpuDemand::Whole { count })
    }

    #[test]
    fn the_number_of_nodes_to_find_is_kube_scheduler_s() {
        // Adaptive: 50 − 1,213/125 = 41 % of 1,213.
        assert_eq!(feasible_nodes_to_find(0, 1213), 497);
        // 50 − 8 = 42 % of 1,000.
        assert_eq!(feasible_nodes_to_find(0, 1000), 420);
        // 50 − 160 is below the 5 % floor.
        assert_eq!(feasible_nodes_to_find(0, 20_000), 1000);
        // Never fewer than 100, and every node of a small cluster.
        assert_eq!(feasible_nodes_to_find(10, 500), 100);
        assert_eq!(feasible_nodes_to_find(10, 60), 60);
        assert_eq!(feasible_nodes_to_find(20, 1213), 242);
        assert_eq!(feasible_nodes_to_find(100, 1213), 1213);
    }

    #[test]
    fn kube_scheduler_sees_whole_gpus_by_count_and_models_by_affinity_but_not_shares() {
        let mut busy = node("a", "T4", 2, 64_000);
        let held = gpu_engine::fit(&busy, &whole(2, 1000), &gpu_engine::Policy::default())
            .expect("two whole GPUs fit an empty two-GPU node");
        busy.add(&held);
        assert!(!passes_scheduler_filters(&busy, &whole(1, 1000)));
        let share = PodRequest::single(
            CpuMilli(1000),
            MemMiB(1024),
            GpuDemand::Share {
                gpus: 1,
                mem_per_gpu: MemMiB(0),
                compute_per_gpu: gpu_engine::ComputeMilli(500),
            },
        );
        // The share asks kube-scheduler for no GPU: only the extender sees it cannot fit.
        assert!(passes_scheduler_filters(&busy, &share));
        let empty = node("b", "T4", 2, 64_000);
        assert!(!passes_scheduler_filters(&empty, &whole(1, 65_000)));
        let v100_only = whole(1, 1000).with_constraints(GpuConstraints {
            include_models: vec![ModelPattern::parse("V100M32").expect("a model name parses")],
            ..GpuConstraints::default()
        });
        assert!(!passes_scheduler_filters(&empty, &v100_only));
        assert!(passes_scheduler_filters(
            &node("c", "V100M32", 4, 64_000),
            &v100_only
        ));
    }

    #[test]
    fn each_walk_starts_after_the_last_node_the_previous_one_examined() {
        // 150 nodes: the walk looks for 100; node 1 is too small for the pod.
        let nodes: Vec<NodeState> = (0..150)
            .map(|i| {
                node(
                    &format!("n{i}"),
                    "G2",
                    8,
                    if i == 1 { 1000 } else { 96_000 },
                )
            })
            .collect();
        let pod = whole(1, 4000);
        let mut window = SchedulerWindow::new(0, nodes.len());
        assert_eq!(window.size(), 100);
        let first: Vec<usize> = selected(window.select(&nodes, &pod));
        // Nodes 0 and 2..=100: node 1 is examined and skipped, so 101 are examined.
        assert_eq!(first.len(), 100);
        assert_eq!(first[..2], [0, 2]);
        assert_eq!(*first.last().expect("100 nodes"), 100);
        let second = selected(window.select(&nodes, &pod));
        // From node 101 round to node 51 (node 1 skipped again).
        assert_eq!(second.len(), 100);
        assert!(second.contains(&101) && second.contains(&149) && second.contains(&0));
        assert!(!second.contains(&1) && !second.contains(&100));
    }

    fn selected(marks: &[bool]) -> Vec<usize> {
        marks
            .iter()
            .enumerate()
            .filter_map(|(index, &marked)| marked.then_some(index))
            .collect()
    }
}
