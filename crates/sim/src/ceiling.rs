//! An upper bound on the GPU allocation any online policy can reach on one arrival order
//! (pods placed in order, a pod rejected only when no node fits it, nothing leaving): the
//! ceiling a policy's curve is measured against. Pure arithmetic over the order; no replay.
//!
//! The bound rests on one kind of pod, a *sliver class*: pods that ask for more than half of
//! one GPU (810 milli-GPU, say), all alike in CPU, memory and models. Each placed pod of such
//! a class sits alone on its GPU with the rest (190 milli-GPU) beside it, which only pods of at
//! most that share can ever use. For a policy and a class, one of two things holds after `j`
//! pods:
//!
//! - **No pod of the class has been rejected.** Then all `M` of them that arrived are placed,
//!   on `M` different GPUs, and at least `M × rest − fill` is free, `fill` being the GPU the
//!   arrived pods of at most `rest` per GPU ask for in all.
//! - **The first pod of the class was rejected at position `p`.** No node could take it then,
//!   and free capacity only shrinks, so every later pod that would fit somewhere where the
//!   class fits is rejected too: after `p` only pods that ask for less (a smaller share, less
//!   CPU or memory, or other models) can be placed. The allocation is then at most the demand
//!   that arrived before `p` plus the demand of those smaller pods after it, *and* at most the
//!   first case's bound with the class's pods before `p`.
//!
//! The ceiling is, for each class, the larger of the two cases over every possible `p`, then the
//! smallest over the classes, and never above the capacity or the demand arrived. It is a bound,
//! not a schedule: no policy is shown to reach it.

use std::collections::HashMap;

use super::metrics::{Curves, Step};
use super::report::CURVE_FROM;
use super::trace::SimPod;
use gpu_engine::WHOLE_GPU_COMPUTE;

/// A class of pods whose slivers the bound counts: one GPU each, more than half of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliverClass {
    /// A pod of the class, by its index in the workload (every pod of the class is alike).
    pub example: usize,
    /// Milli-GPU each pod takes on its one GPU.
    pub milli: u32,
    /// After each pod of the order: the most a policy can have allocated (milli-GPU) while it
    /// has rejected no pod of this class.
    pub while_placed: Vec<u64>,
}

/// The ceiling of one arrival order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ceiling {
    /// After each pod of the order: the most any online policy can have allocated (milli-GPU).
    pub any: Vec<u64>,
    /// The sliver class whose first case bounds the end of the order lowest, if the workload
    /// has one: what a policy must give up (rejecting such pods while others still fit) to go
    /// above `while_placed`.
    pub sliver: Option<SliverClass>,
}

/// What makes two pods alike for the bound: CPU, memory, GPU count, per-GPU milli, models.
type ClassKey<'a> = (u64, u64, u16, u32, &'a str);

fn key(pod: &SimPod) -> ClassKey<'_> {
    let shape = pod.shape();
    (
        shape.cpu.0,
        pod.memory.0,
        shape.gpus,
        shape.milli,
        pod.gpu_spec.as_str(),
    )
}

/// Whether every node and moment that fits `pod` also fits `sliver` (a one-GPU share): it asks
/// for at least as much on each GPU, CPU and memory, and accepts no model `sliver` refuses.
fn fitting_implies(pod: &SimPod, sliver: &SimPod) -> bool {
    let (shape, sliver_shape) = (pod.shape(), sliver.shape());
    let models = sliver.models.is_empty()
        || (!pod.models.is_empty() && pod.models.iter().all(|m| sliver.models.contains(m)));
    shape.gpus >= 1
        && shape.milli >= sliver_shape.milli
        && shape.cpu >= sliver_shape.cpu
        && pod.memory >= sliver.memory
        && models
}

/// The bound of one sliver class (the class of `pods[example]`) after each pod of `order`:
/// `(any, while_placed)`, both in milli-GPU allocated and not yet capped by capacity or demand,
/// for policies that reject no GPU pod before position `from` of the order (0: any policy).
fn class_bound(
    pods: &[SimPod],
    order: &[usize],
    example: usize,
    capacity: u64,
    from: usize,
) -> Vec<(u64, u64)> {
    let sliver = &pods[example];
    let sliver_key = key(sliver);
    let whole = u64::from(WHOLE_GPU_COMPUTE.0);
    let rest = whole - u64::from(sliver.shape().milli);
    let fits_rest = |pod: &SimPod| {
        let shape = pod.shape();
        shape.gpus >= 1 && u64::from(shape.milli) <= rest
    };
    // Per pod of the class seen so far, in order: the demand of the pods before it that could
    // not be placed once it had been rejected (`b_m` of the module's second case).
    let mut larger_before: Vec<u64> = Vec::new();
    let mut larger = 0u64; // demand so far of pods whose fitting implies the class's
    let mut smaller = 0u64; // demand so far of the others (placeable after a rejection)
    let mut fill = 0u64; // demand so far of pods that fit beside a sliver
    // Pods of the class before `from`: none of them can be the first one rejected.
    let mut placed_first = 0usize;
    let mut out = Vec::with_capacity(order.len());
    for (position, &index) in order.iter().enumerate() {
        let pod = &pods[index];
        let demand = pod.gpu_total();
        if key(pod) == sliver_key {
            larger_before.push(larger);
            if position < from {
                placed_first += 1;
            }
        }
        if fitting_implies(pod, sliver) {
            larger += demand;
        } else {
            smaller += demand;
        }
        if fits_rest(pod) {
            fill += demand;
        }
        // First case with `m` of the class placed: at most capacity − (m × rest − fill).
        let placed_bound = |m: usize| (capacity + fill).saturating_sub(m as u64 * rest);
        let arrived = larger_before.len();
        let while_placed = placed_bound(arrived);
        // Second case, first rejection at the class's m-th pod: the smaller of the first case
        // with m placed (falling in m) and the demand bound (rising in m); its largest value
        // over m is at the crossing, found by bisection, or at the first pod that may be
        // rejected where that comes after the crossing.
        let rejected_bound = |m: usize| placed_bound(m).min(larger_before[m] + smaller);
        let mut best = while_placed;
        let (mut lo, mut hi) = (0usize, arrived);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if larger_before[mid] + smaller < placed_bound(mid) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        for m in [lo.wrapping_sub(1), lo, placed_first] {
            if m < arrived && m >= placed_first {
                best = best.max(rejected_bound(m));
            }
        }
        out.push((best, while_placed));
    }
    out
}

/// The ceiling of `order` (indices into `pods`) on a cluster of `capacity` milli-GPU.
pub fn online_ceiling(pods: &[SimPod], order: &[usize], capacity: u64) -> Ceiling {
    online_ceiling_from(pods, order, capacity, 0)
}

/// The ceiling of `order` for the policies that reject no GPU pod before position `from`.
pub fn online_ceiling_from(
    pods: &[SimPod],
    order: &[usize],
    capacity: u64,
    from: usize,
) -> Ceiling {
    let half = WHOLE_GPU_COMPUTE.0 / 2;
    let mut examples: HashMap<ClassKey<'_>, usize> = HashMap::new();
    for &index in order {
        let shape = pods[index].shape();
        if shape.gpus == 1 && shape.milli > half && shape.milli < WHOLE_GPU_COMPUTE.0 {
            examples.entry(key(&pods[index])).or_insert(index);
        }
    }
    let mut arrived = Vec::with_capacity(order.len());
    let mut total = 0u64;
    for &index in order {
        total += pods[index].gpu_total();
        arrived.push(total.min(capacity));
    }
    let mut any = arrived.clone();
    let mut sliver: Option<SliverClass> = None;
    // In order of first arrival, so that ties between classes resolve the same way every run.
    let mut examples: Vec<usize> = examples.into_values().collect();
    examples.sort_unstable();
    for example in examples {
        let bounds = class_bound(pods, order, example, capacity, from);
        for (ceiling, (bound, _)) in any.iter_mut().zip(&bounds) {
            *ceiling = (*ceiling).min(*bound);
        }
        let while_placed: Vec<u64> = bounds
            .iter()
            .zip(&arrived)
            .map(|(&(_, placed), &arrived)| placed.min(arrived))
            .collect();
        let lower = match &sliver {
            Some(current) => while_placed.last() < current.while_placed.last(),
            None => true,
        };
        if lower {
            sliver = Some(SliverClass {
                example,
                milli: pods[example].shape().milli,
                while_placed,
            });
        }
    }
    Ceiling { any, sliver }
}

/// A run's ceiling as curves over arrived workload, beside its own allocation curve.
#[derive(Clone, Debug, PartialEq)]
pub struct RunCeiling {
    /// Allocation % no online policy exceeds, per arrival column (as [`Curves::alloc`]).
    pub any: Vec<Option<f64>>,
    /// The same at the last pod, unrounded.
    pub last_any: f64,
    /// The sliver class's first-case bound, when the workload has such a class.
    pub sliver: Option<RunSliver>,
    /// At the last pod: the most a policy can allocate whose curve is at or above this run's
    /// at every arrival column from [`CURVE_FROM`] on ([`rejection_free_until`]).
    pub last_at_or_above: f64,
}

/// Whether each step's pod was rejected: a step whose failure count rose over the one before.
pub fn rejected_per_step(steps: &[Step]) -> impl Iterator<Item = bool> + '_ {
    steps.iter().scan(0, |before, step| {
        let rejected = step.failed > *before;
        *before = step.failed;
        Some(rejected)
    })
}

/// The position before which a policy whose curve is at or above this run's at every arrival
/// column from [`CURVE_FROM`] on rejects no GPU pod: the first pod of the column in which this
/// run first rejects one. Before it the run placed every GPU pod, so its allocation equals the
/// arrived demand, and a curve at or above it may lose none. Runs that first reject at or
/// below [`CURVE_FROM`] constrain nothing (0); runs that never reject, everything.
pub fn rejection_free_until(
    pods: &[SimPod],
    order: &[usize],
    steps: &[Step],
    capacity: u64,
) -> usize {
    let first = rejected_per_step(steps)
        .zip(order)
        .position(|(rejected, &pod)| rejected && pods[pod].gpu_total() > 0);
    let Some(first) = first else {
        return order.len();
    };
    let column = steps[first].arrive_percent(capacity);
    if column <= CURVE_FROM as i64 {
        return 0;
    }
    steps
        .iter()
        .position(|step| step.arrive_percent(capacity) >= column)
        .unwrap_or(first)
}

/// The bound for policies that reject no pod of the sliver class, and whether this run did.
#[derive(Clone, Debug, PartialEq)]
pub struct RunSliver {
    /// Milli-GPU per pod of the class.
    pub milli: u32,
    /// Allocation % per arrival column while no pod of the class is rejected.
    pub while_placed: Vec<Option<f64>>,
    /// The same at the last pod, unrounded.
    pub last_while_placed: f64,
    /// Whether this run rejected a pod of the class (then `while_placed` bounds it only up to
    /// that pod).
    pub rejected: bool,
}

impl RunCeiling {
    /// The ceiling of a run that submitted `order` (indices into `pods`) and took `steps`, one
    /// per pod, as curves bucketed by the steps' arrival.
    pub fn of_run(pods: &[SimPod], order: &[usize], steps: &[Step], capacity: u64) -> Self {
        let ceiling = online_ceiling(pods, order, capacity);
        let from = rejection_free_until(pods, order, steps, capacity);
        let at_or_above = online_ceiling_from(pods, order, capacity, from);
        let curve = |bound: &[u64]| {
            let bounded: Vec<Step> = steps
                .iter()
                .zip(bound)
                .map(|(step, &used_milli)| Step {
                    arrived_milli: step.arrived_milli,
                    used_milli,
                    ..Step::default()
                })
                .collect();
            Curves::of_steps(&bounded, capacity).alloc
        };
        let percent = |bound: &[u64]| {
            bound
                .last()
                .map_or(0.0, |&used| 100.0 * used as f64 / capacity.max(1) as f64)
        };
        Self {
            any: curve(&ceiling.any),
            last_any: percent(&ceiling.any),
            last_at_or_above: percent(&at_or_above.any),
            sliver: ceiling.sliver.as_ref().map(|sliver| {
                let sliver_key = key(&pods[sliver.example]);
                let rejected = order
                    .iter()
                    .zip(rejected_per_step(steps))
                    .any(|(&pod, rejected)| rejected && key(&pods[pod]) == sliver_key);
                RunSliver {
                    milli: sliver.milli,
                    while_placed: curve(&sliver.while_placed),
                    last_while_placed: percent(&sliver.while_placed),
                    rejected,
                }
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use proptest::prelude::*;

    use super::*;
    use crate::SimPolicy;
    use crate::load::{parse_node_csv, parse_pod_csv};
    use crate::replay::{Prepared, engine_policies, own_policies, run};
    use crate::trace::{Cluster, Workload};

    const POD_HEADER: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n";

    fn pods(rows: &[&str]) -> Vec<SimPod> {
        let text: String = std::iter::once(POD_HEADER.to_owned())
            .chain(
                rows.iter()
                    .enumerate()
                    .map(|(i, r)| format!("p{i:03},{r}\n")),
            )
            .collect();
        parse_pod_csv(Path::new("pods.csv"), &text).unwrap()
    }

    #[test]
    fn three_slivers_on_two_gpus_bound_the_allocation_at_two() {
        let pods = pods(&["1000,1024,1,810,", "1000,1024,1,810,", "1000,1024,1,810,"]);
        let ceiling = online_ceiling(&pods, &[0, 1, 2], 2000);
        // Two of them fit, one per GPU; the third finds no GPU with 810 free.
        assert_eq!(ceiling.any, [810, 1620, 1620]);
        let sliver = ceiling.sliver.unwrap();
        assert_eq!((sliver.example, sliver.milli), (0, 810));
        // Had all three been placed, 3 × 190 would be free: a bound, reached by no policy.
        assert_eq!(sliver.while_placed, [810, 1620, 1430]);
    }

    #[test]
    fn small_shares_beside_the_slivers_lift_the_bound_and_whole_gpus_after_a_rejection_do_not() {
        // One GPU: an 810 share, then a 190 share fills its sliver exactly.
        let fill = pods(&["1000,1024,1,810,", "1000,1024,1,190,"]);
        assert_eq!(online_ceiling(&fill, &[0, 1], 1000).any, [810, 1000]);
        // Two GPUs, two slivers first, then a third sliver (rejected: no GPU has 810 free) and a
        // whole GPU that asks for as much CPU (it could never fit where the sliver did not).
        let whole = pods(&[
            "1000,1024,1,810,",
            "1000,1024,1,810,",
            "1000,1024,1,810,",
            "2000,2048,1,1000,",
        ]);
        assert_eq!(online_ceiling(&whole, &[0, 1, 2, 3], 2000).any[3], 1620);
        // With less CPU than the sliver asks for, the whole GPU might fit a node the sliver's
        // CPU could not: the bound must allow it.
        let light = pods(&[
            "1000,1024,1,810,",
            "1000,1024,1,810,",
            "1000,1024,1,810,",
            "500,2048,1,1000,",
        ]);
        assert!(online_ceiling(&light, &[0, 1, 2, 3], 3000).any[3] >= 2620);
    }

    #[test]
    fn a_policy_that_may_reject_no_early_sliver_is_held_to_the_slivers_it_placed() {
        // Two slivers, then two whole GPUs that ask for less CPU (they may fit where a sliver
        // did not). Turning the slivers away leaves both GPUs for the whole ones: 2000.
        let pods = pods(&[
            "1000,1024,1,810,",
            "1000,1024,1,810,",
            "500,1024,1,1000,",
            "500,1024,1,1000,",
        ]);
        let order = [0, 1, 2, 3];
        assert_eq!(online_ceiling(&pods, &order, 2000).any[3], 2000);
        // A policy that rejects no GPU pod before the third pod places both slivers, and two
        // times 190 is lost for good.
        assert_eq!(online_ceiling_from(&pods, &order, 2000, 2).any[3], 1620);
        // Only the first sliver held: the second may be turned away, for 810 + 1000.
        assert_eq!(online_ceiling_from(&pods, &order, 2000, 1).any[3], 1810);
    }

    #[test]
    fn a_workload_without_slivers_is_bounded_by_demand_and_capacity() {
        let pods = pods(&["1000,1024,1,1000,", "1000,1024,2,1000,", "1000,1024,1,400,"]);
        let ceiling = online_ceiling(&pods, &[0, 1, 2, 1], 4000);
        assert_eq!(ceiling.any, [1000, 3000, 3400, 4000]);
        assert_eq!(ceiling.sliver, None);
    }

    fn cluster_of(nodes: &[(u64, u16, &str)]) -> Cluster {
        let text: String = std::iter::once("sn,cpu_milli,memory_mib,gpu,model\n".to_owned())
            .chain(
                nodes
                    .iter()
                    .enumerate()
                    .map(|(i, (cpu, gpus, model))| format!("n{i},{cpu},65536,{gpus},{model}\n")),
            )
            .collect();
        Cluster::new("c", parse_node_csv(Path::new("nodes.csv"), &text).unwrap())
    }

    /// Pods drawn from a palette with slivers of two sizes and CPU, small shares, whole and
    /// multi-GPU pods, model-constrained and CPU-only ones.
    const PALETTE: [&str; 10] = [
        "3000,4096,1,810,",
        "6000,4096,1,810,",
        "2000,2048,1,650,",
        "1000,1024,1,190,",
        "2000,2048,1,330,",
        "4000,8192,1,1000,",
        "1000,8192,1,1000,",
        "8000,8192,2,1000,",
        "2000,4096,1,810,V100",
        "12000,16384,0,0,",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Soundness: no policy, on any seed, allocates more than the ceiling after any pod,
        /// nor more than the sliver bound before it first rejects a pod of the sliver class.
        #[test]
        fn no_policy_exceeds_the_ceiling(
            nodes in prop::collection::vec(
                (prop::sample::select(vec![8000u64, 16000, 32000, 64000]), 1u16..=4, prop::bool::ANY),
                1..5,
            ),
            picks in prop::collection::vec(0usize..PALETTE.len(), 1..40),
            seed in 1u64..1000,
        ) {
            let nodes: Vec<(u64, u16, &str)> = nodes
                .iter()
                .map(|&(cpu, gpus, v100)| (cpu, gpus, if v100 { "V100" } else { "T4" }))
                .collect();
            let cluster = cluster_of(&nodes);
            let rows: Vec<&str> = picks.iter().map(|&p| PALETTE[p]).collect();
            let workload = Workload::new("w", pods(&rows));
            let prepared = Prepared::new(&cluster, &workload);
            let policies: Vec<SimPolicy> = SimPolicy::references()
                .chain(own_policies())
                .chain(engine_policies())
                .collect();
            for tune in [0.0, 1.3] {
                let (arrivals, _, _) = prepared.plan(seed, tune);
                let ceiling =
                    online_ceiling(prepared.workload().pods(), &arrivals.order, cluster.gpu_milli());
                for &policy in &policies {
                    let result = run(&prepared, policy, seed, tune, true, &|_| {});
                    let steps = result.steps.unwrap_or_default();
                    prop_assert_eq!(steps.len(), ceiling.any.len());
                    // The run itself rejects no GPU pod before its first rejection, nor before
                    // the column of it: both bounds hold it.
                    let pods = prepared.workload().pods();
                    let rejected: Vec<bool> = rejected_per_step(&steps).collect();
                    let first = rejected.iter().enumerate().position(|(j, &rejected)| {
                        rejected && pods[arrivals.order[j]].gpu_total() > 0
                    }).unwrap_or(steps.len());
                    let capacity = cluster.gpu_milli();
                    let column = rejection_free_until(pods, &arrivals.order, &steps, capacity);
                    prop_assert!(column <= first);
                    for from in [first, column] {
                        let held = online_ceiling_from(pods, &arrivals.order, capacity, from);
                        for (j, step) in steps.iter().enumerate() {
                            prop_assert!(
                                step.used_milli <= held.any[j],
                                "{} step {}: {} > ceiling from {} {}", policy.name(), j, step.used_milli, from, held.any[j]
                            );
                        }
                    }
                    let mut sliver_rejected = false;
                    for (j, step) in steps.iter().enumerate() {
                        prop_assert!(
                            step.used_milli <= ceiling.any[j],
                            "{} step {}: {} > ceiling {}", policy.name(), j, step.used_milli, ceiling.any[j]
                        );
                        if let Some(sliver) = &ceiling.sliver {
                            let pod = &prepared.workload().pods()[arrivals.order[j]];
                            sliver_rejected |= rejected[j] && key(pod) == key(&prepared.workload().pods()[sliver.example]);
                            if !sliver_rejected {
                                prop_assert!(
                                    step.used_milli <= sliver.while_placed[j],
                                    "{} step {}: {} > sliver bound {}",
                                    policy.name(), j, step.used_milli, sliver.while_placed[j]
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
