//! Fragmentation gradient descent (Weng et al., USENIX ATC '23): score a placement by how much it
//! grows the node's expected GPU fragmentation, measured against a distribution of typical pods.
//!
//! A node's fragmentation for one typical pod is the free GPU capacity that pod could not use:
//! all of it when the pod cannot run there at all (no GPU fits, CPU short, wrong model, or a
//! CPU-only pod), otherwise only the GPUs too small for it. The node's fragmentation is the
//! expectation over the typical pods, in milli-GPU.

use crate::engine::model::{CpuMilli, MemMiB};
use crate::engine::request::ModelPattern;
use crate::engine::state::NodeState;

/// One class of pod the cluster typically sees, with its share of arrivals.
#[derive(Clone, Debug, PartialEq)]
pub struct TypicalPod {
    pub cpu: CpuMilli,
    /// Mean host memory of the class (FGD itself ignores memory).
    pub memory: MemMiB,
    /// GPUs per pod (0 for a CPU-only pod).
    pub gpus: u16,
    /// Milli-GPU on each of those GPUs (1000 for whole GPUs, 0 for a CPU-only pod).
    pub milli: u32,
    /// Acceptable models; empty means any.
    pub models: Vec<ModelPattern>,
    /// Probability; the weights of a [`TypicalPods`] sum to 1.
    pub weight: f64,
}

/// The workload distribution fragmentation is measured against.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TypicalPods {
    pods: Vec<TypicalPod>,
    /// [`TypicalPods::sliver_value`] for every free amount 0..=1000, derived once.
    sliver_values: Vec<f64>,
}

impl TypicalPods {
    /// A distribution from weighted classes; weights are renormalised to sum to 1 and classes
    /// with no weight are dropped.
    pub fn new(pods: Vec<TypicalPod>) -> Self {
        let mut pods: Vec<TypicalPod> = pods
            .into_iter()
            .filter(|pod| pod.weight.is_finite() && pod.weight > 0.0)
            .collect();
        let total: f64 = pods.iter().map(|pod| pod.weight).sum();
        if total > 0.0 {
            for pod in &mut pods {
                pod.weight /= total;
            }
        }
        let sliver_values = sliver_values(&pods);
        Self {
            pods,
            sliver_values,
        }
    }

    /// The expected final leftover (milli-GPU) of one GPU with `free` milli-GPU free, if pods
    /// keep arriving from this distribution: with the probability `q` that an arriving pod is a
    /// one-GPU pod that fits, the GPU takes it (drawn by weight) and goes on from what is left;
    /// otherwise all of it is left over. A sliver only rare pods fit is worth almost its whole
    /// size, as in FGD; one that common pods fit is worth what they will leave behind in turn.
    pub fn sliver_value(&self, free: u32) -> f64 {
        self.sliver_values
            .get(free.min(1000) as usize)
            .copied()
            .unwrap_or(f64::from(free))
    }

    /// The typical GPU pod's CPU (milli-cores) and memory (MiB) per whole GPU it uses; zeros
    /// when the distribution has no GPU pods.
    pub fn host_per_gpu(&self) -> (f64, f64) {
        let (cpu, mem, gpu) = self.pods.iter().filter(|pod| pod.milli > 0).fold(
            (0.0, 0.0, 0.0),
            |(cpu, mem, gpu), pod| {
                let gpus = f64::from(pod.gpus) * f64::from(pod.milli) / 1000.0;
                (
                    cpu + pod.weight * pod.cpu.0 as f64,
                    mem + pod.weight * pod.memory.0 as f64,
                    gpu + pod.weight * gpus,
                )
            },
        );
        if gpu > 0.0 {
            (cpu / gpu, mem / gpu)
        } else {
            (0.0, 0.0)
        }
    }

    /// The reference construction: classes in the given order (most frequent first; the caller
    /// orders ties), keeping the shortest prefix that covers `coverage` of all pods, weighted by
    /// their counts.
    pub fn from_counts(classes: Vec<(TypicalPod, u64)>, coverage: f64) -> Self {
        let total: u64 = classes.iter().map(|(_, count)| count).sum();
        let mut kept = Vec::new();
        let mut covered = 0u64;
        for (mut pod, count) in classes {
            if total == 0 || covered as f64 >= coverage * total as f64 {
                break;
            }
            covered += count;
            pod.weight = count as f64;
            kept.push(pod);
        }
        Self::new(kept)
    }

    /// The classes.
    pub fn pods(&self) -> &[TypicalPod] {
        &self.pods
    }

    /// Whether there is no distribution (FGD then has nothing to measure against).
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// For each class, the GPU positions of `node` whose model it accepts.
    pub fn access_masks(&self, node: &NodeState) -> Vec<u64> {
        self.pods
            .iter()
            .map(|pod| {
                node.normalized_models
                    .iter()
                    .enumerate()
                    .filter(|(_, model)| {
                        pod.models.is_empty()
                            || pod.models.iter().any(|p| p.matches_normalized(model))
                    })
                    .fold(0u64, |mask, (position, _)| mask | (1u64 << position))
            })
            .collect()
    }

    /// Expected fragmentation in milli-GPU of a node with `cpu_free` CPU and `free_milli` per GPU.
    pub fn fragmentation(&self, cpu_free: CpuMilli, free_milli: &[u32], access: &[u64]) -> f64 {
        let total: u64 = free_milli.iter().map(|&free| u64::from(free)).sum();
        self.pods
            .iter()
            .zip(access)
            .map(|(pod, &mask)| pod.weight * lost(pod, cpu_free, free_milli, mask, total) as f64)
            .sum()
    }

    /// Like [`TypicalPods::fragmentation`], with each class's weight multiplied by `scale` and
    /// the result renormalised: the expectation under a reweighted distribution, in milli-GPU.
    /// Zero when every scaled weight is zero.
    pub fn fragmentation_scaled(
        &self,
        cpu_free: CpuMilli,
        free_milli: &[u32],
        access: &[u64],
        scale: impl Fn(&TypicalPod) -> f64,
    ) -> f64 {
        let total: u64 = free_milli.iter().map(|&free| u64::from(free)).sum();
        let mut expected = 0.0;
        let mut weights = 0.0;
        for (pod, &mask) in self.pods.iter().zip(access) {
            let weight = pod.weight * scale(pod);
            if weight > 0.0 {
                expected += weight * lost(pod, cpu_free, free_milli, mask, total) as f64;
                weights += weight;
            }
        }
        if weights > 0.0 {
            expected / weights
        } else {
            0.0
        }
    }
}

/// The table behind [`TypicalPods::sliver_value`], by dynamic programming from 0 up to 1000.
fn sliver_values(pods: &[TypicalPod]) -> Vec<f64> {
    let shares: Vec<(usize, f64)> = pods
        .iter()
        .filter(|pod| pod.gpus == 1 && pod.milli > 0)
        .map(|pod| (pod.milli.min(1000) as usize, pod.weight))
        .collect();
    let mut values = vec![0.0; 1001];
    for free in 1..=1000usize {
        let fitting = shares.iter().filter(|(milli, _)| *milli <= free);
        let mass: f64 = fitting.clone().map(|(_, weight)| weight).sum();
        values[free] = if mass > 0.0 {
            let next: f64 = fitting
                .map(|(milli, weight)| weight / mass * values[free - milli])
                .sum();
            (1.0 - mass) * free as f64 + mass * next
        } else {
            free as f64
        };
    }
    values
}

/// The free GPU capacity (milli-GPU) of a node that one typical pod could not use: all of it when
/// the pod cannot run there (CPU-only pod, wrong model, no GPU fits, CPU short), otherwise only
/// the GPUs too small for it. `total` is the sum of `free_milli`.
fn lost(pod: &TypicalPod, cpu_free: CpuMilli, free_milli: &[u32], mask: u64, total: u64) -> u64 {
    if pod.milli == 0 {
        // A CPU-only pod can use none of the idle GPU capacity.
        return total;
    }
    let mut fitting = 0u16;
    let mut stranded = 0u64;
    for (position, &free) in free_milli.iter().enumerate() {
        if mask & (1u64 << position) != 0 && free >= pod.milli {
            fitting += 1;
        } else {
            stranded += u64::from(free);
        }
    }
    if fitting >= pod.gpus && cpu_free >= pod.cpu {
        stranded
    } else {
        total
    }
}

/// FGD's score for a fragmentation change (`before - after`, milli-GPU): 50 means no change,
/// higher means the placement reduced fragmentation. On 0..=100.
pub fn score_from_reduction(reduction: f64) -> f64 {
    100.0 / (1.0 + (-reduction / 1000.0).exp())
}

/// The reference implementation's integer score (truncated), which is what its ties come from.
/// Evaluated in the reference's order, `trunc(σ(x) × 100)`, so that values on a truncation
/// boundary fall the same way.
pub fn reference_score(reduction: f64) -> f64 {
    let sigmoid = 1.0 / (1.0 + (-(reduction / 1000.0)).exp());
    (sigmoid * 100.0).trunc()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(cpu: u64, gpus: u16, milli: u32, weight: f64) -> TypicalPod {
        TypicalPod {
            cpu: CpuMilli(cpu),
            memory: MemMiB(0),
            gpus,
            milli,
            models: Vec::new(),
            weight,
        }
    }

    #[test]
    fn only_slivers_too_small_for_a_class_count_when_it_fits() {
        let typical = TypicalPods::new(vec![class(1000, 1, 500, 1.0)]);
        // GPU 0 has 300 free (too small), GPU 1 has 800 (fits).
        let frag = typical.fragmentation(CpuMilli(4000), &[300, 800], &[0b11]);
        assert!((frag - 300.0).abs() < 1e-9);
        // Without CPU the class cannot run: all 1100 is lost to it.
        let frag = typical.fragmentation(CpuMilli(500), &[300, 800], &[0b11]);
        assert!((frag - 1100.0).abs() < 1e-9);
        // Inaccessible model: everything is lost.
        let frag = typical.fragmentation(CpuMilli(4000), &[300, 800], &[0]);
        assert!((frag - 1100.0).abs() < 1e-9);
    }

    #[test]
    fn cpu_only_classes_count_all_idle_gpu_and_weights_mix() {
        let typical = TypicalPods::new(vec![class(1000, 0, 0, 1.0), class(1000, 2, 1000, 3.0)]);
        let frag = typical.fragmentation(CpuMilli(8000), &[1000, 1000, 400], &[0b111, 0b111]);
        // CPU-only: 2400 lost, weight 0.25. Two-GPU class fits; the 400 sliver is lost, weight 0.75.
        assert!((frag - (0.25 * 2400.0 + 0.75 * 400.0)).abs() < 1e-9);
    }

    #[test]
    fn coverage_keeps_the_shortest_prefix() {
        let typical = TypicalPods::from_counts(
            vec![
                (class(0, 1, 500, 0.0), 60),
                (class(0, 1, 250, 0.0), 36),
                (class(0, 1, 100, 0.0), 4),
            ],
            0.95,
        );
        assert_eq!(typical.pods().len(), 2);
        assert!((typical.pods()[0].weight - 60.0 / 96.0).abs() < 1e-12);
    }

    #[test]
    fn sliver_values_follow_the_fill_recursion() {
        // Half the pods take 500 of one GPU, half are CPU-only.
        let typical = TypicalPods::new(vec![class(0, 1, 500, 1.0), class(0, 0, 0, 1.0)]);
        // 400 fits nothing: all of it is left over.
        assert_eq!(typical.sliver_value(400), 400.0);
        // 500: half the time a pod fills it exactly, else 500 stay: 250.
        assert!((typical.sliver_value(500) - 250.0).abs() < 1e-9);
        // 1000: half the time 500 go, then 500 is worth 250: 0.5·1000 + 0.5·250 = 625.
        assert!((typical.sliver_value(1000) - 625.0).abs() < 1e-9);
        assert_eq!(TypicalPods::default().sliver_value(70), 70.0);
    }

    #[test]
    fn scores_are_centred_on_fifty() {
        assert_eq!(reference_score(0.0), 50.0);
        assert!(score_from_reduction(2000.0) > 85.0);
        assert!(score_from_reduction(-2000.0) < 15.0);
        assert!((0.0..=100.0).contains(&score_from_reduction(1e9)));
    }
}
