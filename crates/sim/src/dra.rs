//! `simulate --dra` and `replay --dra`: the trace with its GPU pods expressed as Dynamic Resource
//! Allocation claims, and what kube-scheduler v1.34's default profile does with such pods.
//!
//! A GPU pod becomes a pod with one ResourceClaim for whole devices of the DeviceClass
//! [`DEVICE_CLASS`]: NVIDIA's DRA driver hands out whole devices (it publishes GPU memory as a
//! device capacity, not as consumable capacity), so a pod asking N whole GPUs claims N devices
//! and a pod asking a share of one GPU claims one device. Nodes serve whole GPUs only.
//!
//! kube-scheduler then decides the node alone: its filters (CPU, memory, and the DynamicResources
//! plugin's check that the node has enough free devices matching the claim) and its scores
//! (NodeResourcesFit with the LeastAllocated strategy and NodeResourcesBalancedAllocation, both on
//! CPU and memory with weight 1; DynamicResources scores 0 for claims without `firstAvailable`
//! alternatives, and the other default plugins score every node alike for these pods). With the
//! extender's DRA stanza (docs/dra.md) its 0..10 ranking is added, times the stanza's weight and
//! 10. Among the nodes with the top total one is picked at random. The devices are the DRA
//! allocator's first free ones on that node, lowest index first: the extender ranks nodes for
//! claims, it does not choose their devices. The formulas below are kube-scheduler v1.34's
//! (`pkg/scheduler/framework/plugins/noderesources`, `schedule_one.go`), integer rounding
//! included. Documented in docs/simulate.md ("DRA mode").

use gpu_engine::{
    ContainerAllocation, CpuMilli, GpuConstraints, GpuGrant, GpuMode, Grant, MemMiB, NodeSpec,
    NodeState, PodAllocation, PodRequest, WHOLE_GPU_COMPUTE,
};

use super::go_rand::GoRand;
use super::trace::{Cluster, MAX_PODS_PER_NODE, SimNode, SimPod, Workload};

/// The DeviceClass the claims ask for: NVIDIA's DRA driver's, named after the driver.
pub const DEVICE_CLASS: &str = "gpu.nvidia.com";

/// What a DRA workload's name adds to the trace's: the outputs name the mode.
pub const TRACE_SUFFIX: &str = "-dra";

/// The weight of the extender's DRA stanza in kube-scheduler's configuration (docs/dra.md).
pub const EXTENDER_WEIGHT: i64 = 5;

/// kube-scheduler's score scale (`framework.MaxNodeScore`).
const MAX_NODE_SCORE: i64 = 100;
/// An extender's score scale (`extenderv1.MaxExtenderPriority`): kube-scheduler multiplies an
/// extender's scores by its weight and by `MaxNodeScore / MaxExtenderPriority`.
const MAX_EXTENDER_PRIORITY: i64 = 10;

/// The devices `pod`'s claim asks for: its whole GPUs, one for a share of a GPU, none for a pod
/// that asks for no GPU (a GPU count with `gpu_milli` 0 included).
pub fn claimed_devices(pod: &SimPod) -> u16 {
    if pod.gpu_total() == 0 { 0 } else { pod.gpus }
}

/// `pod` as DRA expresses it: its claim's devices as whole GPUs, its CPU, memory, models (the
/// claim's CEL selector on the devices' `productName`) and lifetime as they were.
pub fn pod_as_claim(pod: &SimPod) -> SimPod {
    let devices = claimed_devices(pod);
    SimPod {
        gpus: devices,
        milli: if devices == 0 { 0 } else { WHOLE_GPU_COMPUTE.0 },
        ..pod.clone()
    }
}

/// The workload with every GPU pod as a pod with a claim ([`pod_as_claim`]); its name ends in
/// [`TRACE_SUFFIX`].
pub fn claims_workload(workload: &Workload) -> Workload {
    Workload::new(
        format!("{}{TRACE_SUFFIX}", workload.name),
        workload.pods().iter().map(pod_as_claim).collect(),
    )
}

/// The engine's view of a node whose GPUs a DRA driver publishes: whole GPUs only (the
/// extender reads such a node as `default` mode), no GPU memory (the trace has none; the replay
/// publishes 0).
pub fn node_spec(node: &SimNode) -> NodeSpec {
    NodeSpec::uniform(
        &node.name,
        GpuMode::Exclusive,
        node.gpus,
        &node.model,
        MemMiB(0),
    )
    .with_host(node.cpu, node.memory, MAX_PODS_PER_NODE)
}

/// The engine specs of the cluster's nodes in DRA mode, in the cluster's order.
pub fn node_specs(cluster: &Cluster) -> Vec<NodeSpec> {
    cluster.nodes().iter().map(node_spec).collect()
}

/// The request the extender ranks nodes for: the whole GPUs the claim asks for, without the
/// claim's selectors (the extender reads a claim's device count only, docs/dra.md); CPU and
/// memory as asked.
pub fn ranked_request(request: &PodRequest) -> PodRequest {
    PodRequest {
        constraints: GpuConstraints::default(),
        ..request.clone()
    }
}

/// NodeResourcesFit's LeastAllocated score (`leastResourceScorer`, weights 1): per resource
/// `(allocatable − requested) × 100 / allocatable` in integers (0 when more is requested than
/// allocatable), averaged with integer division over the resources the node has.
pub fn least_allocated(requested: [i64; 2], allocatable: [i64; 2]) -> i64 {
    let (mut sum, mut weights) = (0, 0);
    for (requested, allocatable) in requested.into_iter().zip(allocatable) {
        if allocatable == 0 {
            continue;
        }
        sum += if requested > allocatable {
            0
        } else {
            (allocatable - requested) * MAX_NODE_SCORE / allocatable
        };
        weights += 1;
    }
    if weights == 0 { 0 } else { sum / weights }
}

/// NodeResourcesBalancedAllocation's score (`balancedResourceScorer`): the requested fractions
/// of CPU and memory (each at most 1), `(1 − |f_cpu − f_mem| / 2) × 100` truncated; one resource
/// alone (the other not allocatable) scores 100.
pub fn balanced_allocation(requested: [i64; 2], allocatable: [i64; 2]) -> i64 {
    let fractions: Vec<f64> = requested
        .into_iter()
        .zip(allocatable)
        .filter(|&(_, allocatable)| allocatable != 0)
        .map(|(requested, allocatable)| (requested as f64 / allocatable as f64).min(1.0))
        .collect();
    let deviation = match fractions[..] {
        [a, b] => ((a - b) / 2.0).abs(),
        _ => 0.0,
    };
    ((1.0 - deviation) * MAX_NODE_SCORE as f64) as i64
}

/// kube-scheduler's own total for a pod asking `cpu` and `memory` on `node`: LeastAllocated plus
/// BalancedAllocation, weight 1 each. Requests are counted as the replay writes them (every pod
/// states its CPU and memory, so kube-scheduler's defaults for a missing request never apply);
/// memory in MiB gives the same integers and fractions as in bytes (both are exact multiples).
/// A pod that asks for neither skips BalancedAllocation (kube-scheduler's `PreScore` skips
/// best-effort pods).
pub fn kube_score(node: &NodeState, cpu: CpuMilli, memory: MemMiB) -> i64 {
    let as_i64 = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
    let allocatable = [as_i64(node.spec.cpu.0), as_i64(node.spec.memory.0)];
    let requested = [
        as_i64(node.cpu_used.0.saturating_add(cpu.0)),
        as_i64(node.mem_used.0.saturating_add(memory.0)),
    ];
    let balanced = if cpu.0 == 0 && memory.0 == 0 {
        0
    } else {
        balanced_allocation(requested, allocatable)
    };
    least_allocated(requested, allocatable) + balanced
}

/// The extender's answer to `/dra/prioritize` for candidates whose policy scores are `raw`:
/// stretched to 0..10 between the lowest and the highest, rounded; 10 for all when they are
/// alike. The same rule as the extender's `to_extender_score` (src/state/decide.rs).
pub fn extender_scores(raw: &[f64]) -> Vec<i64> {
    let low = raw.iter().copied().fold(f64::INFINITY, f64::min);
    let high = raw.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    raw.iter()
        .map(|&score| {
            if high - low < 1e-9 {
                MAX_EXTENDER_PRIORITY
            } else {
                (MAX_EXTENDER_PRIORITY as f64 * (score - low) / (high - low))
                    .round()
                    .clamp(0.0, MAX_EXTENDER_PRIORITY as f64) as i64
            }
        })
        .collect()
}

/// kube-scheduler's totals for the candidates: its own scores `kube`, plus, when the extender
/// ranks the pod (`raw`: the policy's scores of the same candidates), the extender's 0..10 times
/// [`EXTENDER_WEIGHT`] and `MaxNodeScore / MaxExtenderPriority`.
pub fn totals(kube: &[i64], raw: Option<&[f64]>) -> Vec<i64> {
    match raw {
        None => kube.to_vec(),
        Some(raw) => kube
            .iter()
            .zip(extender_scores(raw))
            .map(|(&own, extender)| {
                own + extender * EXTENDER_WEIGHT * (MAX_NODE_SCORE / MAX_EXTENDER_PRIORITY)
            })
            .collect(),
    }
}

/// kube-scheduler's `selectHost`: one of the candidates with the top total, each as likely
/// (reservoir sampling, one draw per further top candidate); `None` without candidates. A
/// single candidate is taken without a draw (the framework does not score then).
pub fn select_host(candidates: &[usize], totals: &[i64], go: &mut GoRand) -> Option<usize> {
    if let [only] = candidates {
        return Some(*only);
    }
    let top = totals.iter().copied().max()?;
    let mut chosen = None;
    let mut count = 0;
    for (&node, &total) in candidates.iter().zip(totals) {
        if total != top {
            continue;
        }
        count += 1;
        if count == 1 || go.intn(count) == 0 {
            chosen = Some(node);
        }
    }
    chosen
}

/// What the DRA allocator gives `request` on `node`: the first free whole GPUs in the slice's
/// order (lowest index first), with the pod's CPU and memory; `None` when the node lacks them.
/// A pod that asks for no GPU holds CPU and memory only.
pub fn first_free_devices(node: &NodeState, request: &PodRequest) -> Option<PodAllocation> {
    let count = usize::from(request.primary_demand().gpu_count());
    let mut free: Vec<(u16, GpuGrant)> = node
        .spec
        .gpus
        .iter()
        .zip(&node.gpus)
        .filter(|(gpu, usage)| gpu.healthy && usage.is_idle())
        .map(|(gpu, _)| {
            (
                gpu.index.0,
                GpuGrant {
                    gpu: gpu.index,
                    grant: Grant::Whole,
                },
            )
        })
        .collect();
    if free.len() < count {
        return None;
    }
    free.sort_by_key(|&(index, _)| index);
    let mut allocation =
        PodAllocation::host_only(node.spec.name.clone(), request.cpu, request.memory);
    if count > 0 {
        allocation.containers.push(ContainerAllocation {
            name: "main".to_owned(),
            gpus: free
                .into_iter()
                .take(count)
                .map(|(_, grant)| grant)
                .collect(),
        });
    }
    Some(allocation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_engine::GpuDemand;

    fn pod(gpus: u16, milli: u32, spec: &str) -> SimPod {
        SimPod {
            name: "p".into(),
            cpu: CpuMilli(4000),
            memory: MemMiB(8192),
            gpus,
            milli,
            gpu_spec: spec.into(),
            models: crate::load::model_list(spec).unwrap(),
            lifetime: None,
        }
    }

    #[test]
    fn gpu_pods_claim_whole_devices() {
        // A share of one GPU claims one device.
        let share = pod_as_claim(&pod(1, 460, "T4"));
        assert_eq!((share.gpus, share.milli), (1, 1000));
        assert_eq!(
            share.request().primary_demand(),
            GpuDemand::Whole { count: 1 }
        );
        assert_eq!(
            share.gpu_spec, "T4",
            "the models stay: the claim selects them"
        );
        assert_eq!(share.request().constraints.include_models.len(), 1);
        // N whole GPUs claim N devices.
        let eight = pod_as_claim(&pod(8, 1000, ""));
        assert_eq!(
            eight.request().primary_demand(),
            GpuDemand::Whole { count: 8 }
        );
        assert_eq!(eight.gpu_total(), 8000);
        // No GPU, or a GPU count with no milli-GPU: no claim.
        for cpu_only in [pod(0, 0, ""), pod(1, 0, "")] {
            let mapped = pod_as_claim(&cpu_only);
            assert_eq!(
                (mapped.gpus, mapped.milli, claimed_devices(&cpu_only)),
                (0, 0, 0)
            );
            assert!(!mapped.request().wants_gpu());
        }
        let workload = claims_workload(&Workload::new("w", vec![pod(1, 250, "")]));
        assert_eq!(workload.name, "w-dra");
        assert_eq!(workload.gpu_milli(), 1000, "arrivals count whole devices");
        assert!(
            ranked_request(&share.request())
                .constraints
                .include_models
                .is_empty()
        );
    }

    #[test]
    fn kube_scheduler_s_scores_as_computed_by_hand() {
        // 64 cores, 256 GiB; 16 cores and 64 GiB requested with the pod: LeastAllocated
        // (75 + 75) / 2 = 75; fractions 0.25 and 0.25: BalancedAllocation 100.
        let half = [16_000, 65_536];
        let node = [64_000, 262_144];
        assert_eq!(least_allocated(half, node), 75);
        assert_eq!(balanced_allocation(half, node), 100);
        // 10 of 64 cores, 100 of 256 GiB: (84375/1000 → 84) and (156*100/256 → 60) → 144 / 2.
        let uneven = [10_000, 102_400];
        assert_eq!(least_allocated(uneven, node), 72);
        // Fractions 0.15625 and 0.390625: (1 − 0.1171875) × 100 = 88.28 → 88.
        assert_eq!(balanced_allocation(uneven, node), 88);
        // Over-asked: that resource scores 0, its fraction counts as 1.
        assert_eq!(least_allocated([70_000, 131_072], node), 25);
        assert_eq!(balanced_allocation([70_000, 131_072], node), 75);
        // A resource the node lacks is left out of both.
        assert_eq!(least_allocated([1_000, 0], [4_000, 0]), 75);
        assert_eq!(balanced_allocation([1_000, 0], [4_000, 0]), 100);
        assert_eq!(least_allocated([0, 0], [0, 0]), 0);
    }

    #[test]
    fn the_extender_s_scores_are_stretched_and_weighted_as_kube_scheduler_adds_them() {
        assert_eq!(extender_scores(&[1.0, 2.0, 3.0]), [0, 5, 10]);
        assert_eq!(extender_scores(&[0.2, 0.2]), [10, 10], "alike: all 10");
        assert_eq!(extender_scores(&[0.0, 0.14, 1.0]), [0, 1, 10]);
        // One point of the extender's is worth 50 of kube-scheduler's: it outweighs
        // LeastAllocated and BalancedAllocation's whole range (0..200) from 4 points on.
        assert_eq!(totals(&[180, 100], Some(&[0.0, 1.0])), [180, 600]);
        assert_eq!(totals(&[180, 100], None), [180, 100]);
    }

    #[test]
    fn kube_scheduler_picks_among_the_top_at_random() {
        let mut go = GoRand::new(1);
        let mut seen = [0; 3];
        for _ in 0..300 {
            let node = select_host(&[4, 7, 9], &[150, 150, 120], &mut go).unwrap();
            seen[[4, 7, 9].iter().position(|&n| n == node).unwrap()] += 1;
        }
        assert_eq!(seen[2], 0, "never below the top");
        assert!(seen[0] > 100 && seen[1] > 100, "{seen:?}");
        assert_eq!(select_host(&[], &[], &mut go), None);
        assert_eq!(select_host(&[3], &[0], &mut go), Some(3));
    }

    #[test]
    fn the_allocator_takes_the_first_free_devices() {
        let node = SimNode {
            name: "n".into(),
            cpu: CpuMilli(64_000),
            memory: MemMiB(262_144),
            gpus: 4,
            model: "T4".into(),
        };
        let mut state = NodeState::new(node_spec(&node));
        let two = pod_as_claim(&pod(2, 1000, "")).request();
        let first = first_free_devices(&state, &two).unwrap();
        let indices = |a: &PodAllocation| -> Vec<u16> {
            a.containers
                .iter()
                .flat_map(|c| &c.gpus)
                .map(|g| g.gpu.0)
                .collect()
        };
        assert_eq!(indices(&first), [0, 1]);
        state.add(&first);
        let one = pod_as_claim(&pod(1, 300, "")).request();
        let second = first_free_devices(&state, &one).unwrap();
        assert_eq!(indices(&second), [2]);
        state.add(&second);
        assert!(
            first_free_devices(&state, &two).is_none(),
            "one device left"
        );
        state.remove(&first);
        assert_eq!(indices(&first_free_devices(&state, &two).unwrap()), [0, 1]);
        let cpu_only = first_free_devices(&state, &pod(0, 0, "").request()).unwrap();
        assert!(cpu_only.containers.is_empty());
        assert_eq!(cpu_only.cpu, CpuMilli(4000));
        // kube-scheduler's own total on the empty node for a 4-core, 8 GiB pod:
        // LeastAllocated (93 + 96) / 2 = 94, BalancedAllocation |0.0625 − 0.03125| / 2 → 98.
        let empty = NodeState::new(node_spec(&node));
        assert_eq!(kube_score(&empty, CpuMilli(4000), MemMiB(8192)), 94 + 98);
    }
}
