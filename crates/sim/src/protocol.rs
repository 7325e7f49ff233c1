//! The reference experiment's protocol (simulation.md §1): the seeded arrival order (shuffled
//! originals, then inflation to a target share of GPU capacity), the seeded node-priority
//! permutation that breaks score ties, and FGD's typical pods from the original trace (§3).
//! Every random draw of a run comes from one generator, Go's `math/rand` seeded with the run's
//! seed, in the reference's order, so a seed draws the same run as the paper's seed.

use std::collections::HashMap;

use super::go_rand::GoRand;
use super::trace::{SimPod, Workload};
use gpu_engine::{CpuMilli, MemMiB, TypicalPod, TypicalPods, typical_from_classes};

/// The share of all pods the typical-pod prefix must cover (`PodPopularityThreshold` 95): the
/// engine's constant, shared with the extender's learning.
pub use gpu_engine::TYPICAL_COVERAGE;

/// The order in which a run submits pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arrivals {
    /// Indices into the name-sorted workload, in submission order (resampled pods repeat).
    pub order: Vec<usize>,
    /// Pods resampled and appended to reach the target (0 when none).
    pub added: usize,
    /// Pods removed to get down to the target (0 when none).
    pub removed: usize,
}

/// The generator of a run: Go's `math/rand` seeded with `seed` (`rand.Seed(tuneseed)`), after
/// the one `rand.Int()` the reference consumes at once (inside a log call's arguments).
pub fn run_generator(seed: u64) -> GoRand {
    let mut go = GoRand::new(seed as i64);
    go.int();
    go
}

/// Builds a run's arrival order: the name-sorted originals, shuffled, then resized towards
/// `tune × capacity_milli` of GPU demand (no resizing when `tune` is not positive).
///
/// Growing (`tuneUpPods`): draw a uniformly random original (with replacement, CPU-only pods
/// included) and append it, until the first draw whose **per-GPU** milli would take the total
/// past the target. The check uses per-GPU milli while the total adds `num × milli`, so the
/// last multi-GPU pod may overshoot by up to 7000: the reference's behaviour, kept on purpose.
/// Shrinking (`tuneDownPods`): remove uniformly random positions until the total is within the
/// target, keeping the order of the rest.
pub fn arrivals(workload: &Workload, capacity_milli: u64, tune: f64, go: &mut GoRand) -> Arrivals {
    let pods = workload.pods();
    let mut order: Vec<usize> = (0..pods.len()).collect();
    go.shuffle(order.len(), |i, j| order.swap(i, j));
    let mut total: u64 = order.iter().map(|&i| pods[i].gpu_total()).sum();
    let target = tune * capacity_milli as f64;
    let mut added = 0;
    let mut removed = 0;
    // Without GPU demand the growing loop could never reach the target.
    if tune > 0.0 && workload.gpu_milli() > 0 {
        if (total as f64) < target {
            loop {
                let pick = go.intn(pods.len());
                let pod = &pods[pick];
                if total as f64 + f64::from(pod.shape().milli) > target {
                    break;
                }
                order.push(pick);
                total += pod.gpu_total();
                added += 1;
            }
        } else {
            while total as f64 > target && !order.is_empty() {
                let position = go.intn(order.len());
                total -= pods[order.remove(position)].gpu_total();
                removed += 1;
            }
        }
    }
    Arrivals {
        order,
        added,
        removed,
    }
}

/// The node-priority key of each node (by name order): a uniformly random permutation of
/// `0..nodes` (`rand.Perm`; node i is renamed `"%04d-"` of `perm[i]`). Ties in score go to the
/// lowest key, as the reference's name prefixes do.
pub fn node_priority(nodes: usize, go: &mut GoRand) -> Vec<u32> {
    go.perm(nodes).into_iter().map(|key| key as u32).collect()
}

/// A typical-pod class: (CPU, milli-GPU, GPU count, model list as written).
type ClassKey<'a> = (u64, u32, u16, &'a str);

/// Per class: the index of an example pod, the count, and the total memory.
type ClassTally = (usize, u64, u64);

/// FGD's typical pods (`GetTypicalPods`): the original trace's pods, CPU-only ones included,
/// grouped by (CPU, milli-GPU, GPU count, model list as written), memory ignored, counted once
/// each; most frequent first, ties by (CPU, milli, count, model list) descending; the shortest
/// prefix covering 95% of pods, renormalised.
pub fn typical_pods(pods: &[SimPod]) -> TypicalPods {
    // Per class: an example pod, the count, and the memory total (for the class's mean).
    let mut counts: HashMap<ClassKey<'_>, ClassTally> = HashMap::new();
    for (index, pod) in pods.iter().enumerate() {
        let shape = pod.shape();
        let key = (shape.cpu.0, shape.milli, shape.gpus, pod.gpu_spec.as_str());
        let entry = counts.entry(key).or_insert((index, 0, 0));
        entry.1 += 1;
        entry.2 += pod.memory.0;
    }
    let classes = counts.into_iter().map(|(key, (example, count, memory))| {
        let (cpu, milli, gpus, _) = key;
        let pod = TypicalPod {
            cpu: CpuMilli(cpu),
            memory: MemMiB(0),
            gpus,
            milli,
            models: pods[example].models.clone(),
            weight: 0.0,
        };
        (key, pod, count, memory)
    });
    typical_from_classes(classes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_engine::ModelPattern;

    fn pod(name: &str, gpus: u16, milli: u32) -> SimPod {
        SimPod {
            name: name.into(),
            cpu: CpuMilli(1000),
            memory: MemMiB(1),
            gpus,
            milli,
            gpu_spec: String::new(),
            models: Vec::new(),
            lifetime: None,
        }
    }

    fn workload() -> Workload {
        Workload::new(
            "w",
            vec![
                pod("a", 1, 500),
                pod("b", 8, 1000),
                pod("c", 0, 0),
                pod("d", 1, 1000),
            ],
        )
    }

    #[test]
    fn inflation_stops_at_the_first_per_gpu_overshoot() {
        let workload = workload();
        for seed in 0..50 {
            let mut rng = run_generator(seed);
            // Capacity 16 GPUs, target 1.3 × 16000 = 20800.
            let arrivals = arrivals(&workload, 16_000, 1.3, &mut rng);
            let pods = workload.pods();
            let mut shuffled: Vec<usize> = arrivals.order[..4].to_vec();
            shuffled.sort_unstable();
            assert_eq!(shuffled, [0, 1, 2, 3], "originals first, each once");
            let total: u64 = arrivals.order.iter().map(|&i| pods[i].gpu_total()).sum();
            // Every appended pod passed the per-GPU check when it was drawn.
            let mut running: u64 = 9_500;
            for &i in &arrivals.order[4..] {
                assert!(running as f64 + f64::from(pods[i].milli) <= 20_800.0);
                running += pods[i].gpu_total();
            }
            assert_eq!(running, total);
            // The check is per GPU, so an 8-GPU pod can overshoot by up to 7000.
            assert!(total as f64 <= 20_800.0 + 7000.0, "seed {seed}: {total}");
            assert_eq!(arrivals.added, arrivals.order.len() - 4);
        }
    }

    #[test]
    fn deflation_removes_until_within_target() {
        let workload = workload();
        let mut rng = run_generator(7);
        // Capacity 8 GPUs × 1.0 = 8000 < 9500 of demand.
        let arrivals = arrivals(&workload, 8000, 1.0, &mut rng);
        let total: u64 = arrivals
            .order
            .iter()
            .map(|&i| workload.pods()[i].gpu_total())
            .sum();
        assert!(total <= 8000);
        assert_eq!(arrivals.removed + arrivals.order.len(), 4);
    }

    #[test]
    fn the_same_seed_gives_the_same_run_and_another_does_not() {
        let workload = workload();
        let draw = |seed| {
            let mut rng = run_generator(seed);
            let a = arrivals(&workload, 16_000, 1.3, &mut rng);
            (a, node_priority(50, &mut rng))
        };
        assert_eq!(draw(42), draw(42));
        assert_ne!(draw(42), draw(43));
        let (_, priority) = draw(42);
        let mut sorted = priority.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<u32>>(), "a permutation");
    }

    #[test]
    fn no_gpu_demand_means_no_inflation() {
        let workload = Workload::new("w", vec![pod("c", 0, 0)]);
        let mut rng = run_generator(1);
        assert_eq!(arrivals(&workload, 8000, 1.3, &mut rng).order, [0]);
    }

    #[test]
    fn typical_pods_count_classes_and_order_ties_descending() {
        let mut pods = Vec::new();
        for i in 0..50 {
            pods.push(pod(&format!("share{i}"), 1, 500));
        }
        for i in 0..25 {
            pods.push(pod(&format!("whole{i}"), 1, 1000));
            pods.push(pod(&format!("cpu{i}"), 0, 0));
        }
        let mut t4 = pod("t4", 1, 500);
        t4.gpu_spec = "T4".into();
        t4.models = vec![ModelPattern::parse("T4").unwrap()];
        pods.push(t4);
        let typical = typical_pods(&pods);
        // 101 pods: 50 + 25 + 25 = 100 ≥ 95.95 so the T4 class is cut.
        assert_eq!(typical.pods().len(), 3);
        let milli: Vec<u32> = typical.pods().iter().map(|p| p.milli).collect();
        // The 25/25 tie orders by milli descending: whole (1000) before CPU-only (0).
        assert_eq!(milli, [500, 1000, 0]);
        assert!((typical.pods()[0].weight - 0.5).abs() < 1e-12);
    }
}
