//! What a run measures after every pod, and the reference's discrete curves over arrived
//! workload (simulation.md §1 "Metrics"): for each whole percent k = 0..=130 of arrived GPU
//! demand, the mean over the steps whose arrival rounds to k (or to k±1 when none does).

/// The last column of the discrete curves: 130% of GPU capacity arrived.
pub const LAST_COLUMN: usize = 130;

/// The cluster after one submitted pod (placed or failed).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Step {
    /// GPU demand submitted so far, failed pods included (milli-GPU).
    pub arrived_milli: u64,
    /// GPU capacity allocated (milli-GPU, shares counted by their milli).
    pub used_milli: u64,
    /// Σ over nodes of FGD's expected fragmentation F(n), milli-GPU.
    pub frag_milli: f64,
    /// Unallocated GPU capacity (milli-GPU).
    pub free_milli: u64,
    /// Pods that found no node so far.
    pub failed: u32,
    /// GPU nodes with every GPU unallocated.
    pub idle_nodes: u32,
}

impl Step {
    /// Allocation ratio in % of capacity, rounded to 2 decimals as the reference logs it.
    pub fn alloc_percent(&self, capacity_milli: u64) -> f64 {
        round2(100.0 * self.used_milli as f64 / capacity_milli as f64)
    }

    /// Arrived workload in whole % of capacity, rounded half to even (numpy's `round`).
    pub fn arrive_percent(&self, capacity_milli: u64) -> i64 {
        (100.0 * self.arrived_milli as f64 / capacity_milli as f64).round_ties_even() as i64
    }

    /// Fragmented GPU as % of capacity ("frag amount").
    pub fn frag_percent(&self, capacity_milli: u64) -> f64 {
        100.0 * self.frag_milli / capacity_milli as f64
    }

    /// Fragmented share of the unallocated GPU, in % ("frag ratio"); none when nothing is free.
    pub fn frag_ratio(&self) -> Option<f64> {
        (self.free_milli > 0).then(|| 100.0 * self.frag_milli / self.free_milli as f64)
    }
}

/// Rounds to 2 decimals (half away from zero, like Python's formatting of these values).
pub fn round2(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

/// A run's discrete curves, indexed by arrived % (0..=130); `None` where no step is near.
#[derive(Clone, Debug, PartialEq)]
pub struct Curves {
    /// GPU allocation ratio (%), rounded to 2 decimals.
    pub alloc: Vec<Option<f64>>,
    /// Fragmentation amount (% of capacity).
    pub frag_amount: Vec<Option<f64>>,
    /// Fragmentation ratio (% of unallocated GPU).
    pub frag_ratio: Vec<Option<f64>>,
}

/// Per-bucket sums for one metric.
#[derive(Clone, Default)]
struct Buckets {
    sum: Vec<f64>,
    count: Vec<u32>,
}

impl Buckets {
    fn new(len: usize) -> Self {
        Self {
            sum: vec![0.0; len],
            count: vec![0; len],
        }
    }

    fn add(&mut self, bucket: usize, value: f64) {
        self.sum[bucket] += value;
        self.count[bucket] += 1;
    }

    /// The mean at `k`, else over `k-1..=k+1` (the reference's fallback).
    fn column(&self, k: usize) -> Option<f64> {
        if self.count[k] > 0 {
            return Some(self.sum[k] / f64::from(self.count[k]));
        }
        let range = k.saturating_sub(1)..=(k + 1).min(self.sum.len() - 1);
        let sum: f64 = self.sum[range.clone()].iter().sum();
        let count: u32 = self.count[range].iter().sum();
        (count > 0).then(|| sum / f64::from(count))
    }
}

impl Curves {
    /// The curves of a run's steps.
    pub fn of_steps(steps: &[Step], capacity_milli: u64) -> Self {
        // One bucket beyond the last column feeds its k±1 fallback.
        let len = LAST_COLUMN + 2;
        let mut alloc = Buckets::new(len);
        let mut frag = Buckets::new(len);
        let mut ratio = Buckets::new(len);
        for step in steps {
            let k = step.arrive_percent(capacity_milli);
            let Ok(k) = usize::try_from(k) else { continue };
            if k >= len {
                continue;
            }
            alloc.add(k, step.alloc_percent(capacity_milli));
            frag.add(k, step.frag_percent(capacity_milli));
            if let Some(r) = step.frag_ratio() {
                ratio.add(k, r);
            }
        }
        let columns = |b: &Buckets, round: bool| -> Vec<Option<f64>> {
            (0..=LAST_COLUMN)
                .map(|k| b.column(k).map(|v| if round { round2(v) } else { v }))
                .collect()
        };
        Self {
            alloc: columns(&alloc, true),
            frag_amount: columns(&frag, false),
            frag_ratio: columns(&ratio, false),
        }
    }
}

/// The kinds of pod whose rejections the summary counts, each pod in exactly one: a GPU pod
/// limited to some GPU models is `Constrained` whatever its shape; the others by shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodKind {
    /// A GPU pod that accepts only some GPU models (`gpu_spec` not empty).
    Constrained,
    /// A share of one GPU (`num_gpu == 1`, `gpu_milli < 1000`).
    Share,
    /// More than one whole GPU.
    MultiGpu,
    /// Exactly one whole GPU.
    OneGpu,
    /// No GPU (also a pod whose `gpu_milli` is 0).
    CpuOnly,
}

impl PodKind {
    /// Every kind, in the summary's order.
    pub const ALL: [Self; 5] = [
        Self::Constrained,
        Self::Share,
        Self::MultiGpu,
        Self::OneGpu,
        Self::CpuOnly,
    ];

    /// The kind of a pod with `gpus` GPUs of `milli` milli-GPU each, model-constrained or not.
    pub fn of(gpus: u16, milli: u32, constrained: bool) -> Self {
        let whole = gpu_engine::WHOLE_GPU_COMPUTE.0;
        if gpus == 0 || milli == 0 {
            Self::CpuOnly
        } else if constrained {
            Self::Constrained
        } else if gpus == 1 && milli < whole {
            Self::Share
        } else if gpus > 1 {
            Self::MultiGpu
        } else {
            Self::OneGpu
        }
    }

    /// The name in the summary.
    pub fn label(self) -> &'static str {
        match self {
            Self::Constrained => "model-constrained",
            Self::Share => "share",
            Self::MultiGpu => "multi-GPU",
            Self::OneGpu => "1 GPU",
            Self::CpuOnly => "CPU-only",
        }
    }

    fn index(self) -> usize {
        match self {
            Self::Constrained => 0,
            Self::Share => 1,
            Self::MultiGpu => 2,
            Self::OneGpu => 3,
            Self::CpuOnly => 4,
        }
    }
}

/// Rejected pods by kind, cumulative: at arrival column k (0..=130), the pods of each kind that
/// found no node among those submitted until the arrived workload last rounded to k or less.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejections {
    /// Rejections so far, by [`PodKind::ALL`] order.
    current: [u32; PodKind::ALL.len()],
    /// Per column, the counts at the last step that rounded to it (`None`: no step did).
    columns: Vec<Option<[u32; PodKind::ALL.len()]>>,
}

impl Default for Rejections {
    fn default() -> Self {
        Self {
            current: [0; PodKind::ALL.len()],
            columns: vec![None; LAST_COLUMN + 1],
        }
    }
}

impl Rejections {
    /// Counts one rejected pod of `kind`.
    pub fn reject(&mut self, kind: PodKind) {
        self.current[kind.index()] += 1;
    }

    /// Records the counts after a step that brought the arrived workload to `arrive_percent`.
    pub fn step(&mut self, arrive_percent: i64) {
        if let Some(column) = usize::try_from(arrive_percent)
            .ok()
            .and_then(|k| self.columns.get_mut(k))
        {
            *column = Some(self.current);
        }
    }

    /// Rejected pods of `kind` up to column `k`: the counts of the nearest column at or before
    /// `k` that a step reached, 0 before any; `None` past the last column.
    pub fn at(&self, k: usize, kind: PodKind) -> Option<u32> {
        let columns = self.columns.get(..=k)?;
        Some(
            columns
                .iter()
                .rev()
                .flatten()
                .next()
                .map_or(0, |counts| counts[kind.index()]),
        )
    }

    /// Every rejection so far, of `kind`.
    pub fn total(&self, kind: PodKind) -> u32 {
        self.current[kind.index()]
    }
}

/// The mean of the present values, if any.
pub fn mean(values: impl IntoIterator<Item = Option<f64>>) -> Option<f64> {
    let (sum, count) = values
        .into_iter()
        .flatten()
        .fold((0.0, 0u32), |(s, c), v| (s + v, c + 1));
    (count > 0).then(|| sum / f64::from(count))
}

/// The sample standard deviation of the present values, if there are two or more.
pub fn std_dev(values: impl IntoIterator<Item = Option<f64>> + Clone) -> Option<f64> {
    let mean = mean(values.clone())?;
    let (sum, count) = values
        .into_iter()
        .flatten()
        .fold((0.0, 0u32), |(s, c), v| (s + (v - mean).powi(2), c + 1));
    (count > 1).then(|| (sum / f64::from(count - 1)).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(arrived: u64, used: u64) -> Step {
        Step {
            arrived_milli: arrived,
            used_milli: used,
            frag_milli: 0.0,
            free_milli: 1000,
            failed: 0,
            idle_nodes: 0,
        }
    }

    #[test]
    fn columns_average_their_steps_and_fall_back_to_neighbours() {
        // Capacity 1000 milli: 10 milli is 1%.
        let steps = [step(0, 0), step(10, 10), step(12, 12), step(30, 20)];
        let curves = Curves::of_steps(&steps, 1000);
        assert_eq!(curves.alloc[0], Some(0.0));
        // 1.0% and 1.2% both round to column 1: mean of 1.0 and 1.2.
        assert_eq!(curves.alloc[1], Some(1.1));
        // Column 2 has no step: the mean over columns 1..=3.
        assert_eq!(curves.alloc[2], Some(round2((1.0 + 1.2 + 2.0) / 3.0)));
        assert_eq!(curves.alloc[3], Some(2.0));
        assert_eq!(curves.alloc[10], None);
    }

    #[test]
    fn arrival_rounds_half_to_even() {
        // 2.5% → 2, 3.5% → 4.
        assert_eq!(step(25, 0).arrive_percent(1000), 2);
        assert_eq!(step(35, 0).arrive_percent(1000), 4);
    }

    #[test]
    fn pods_fall_in_one_kind_each() {
        assert_eq!(PodKind::of(0, 0, true), PodKind::CpuOnly);
        assert_eq!(PodKind::of(1, 0, false), PodKind::CpuOnly);
        assert_eq!(PodKind::of(1, 500, true), PodKind::Constrained);
        assert_eq!(PodKind::of(8, 1000, true), PodKind::Constrained);
        assert_eq!(PodKind::of(1, 500, false), PodKind::Share);
        assert_eq!(PodKind::of(2, 1000, false), PodKind::MultiGpu);
        assert_eq!(PodKind::of(1, 1000, false), PodKind::OneGpu);
    }

    #[test]
    fn rejections_are_cumulative_and_carried_over_columns_no_step_reached() {
        let mut rejections = Rejections::default();
        rejections.step(0);
        rejections.reject(PodKind::Share);
        rejections.step(2);
        rejections.reject(PodKind::Share);
        rejections.reject(PodKind::Constrained);
        rejections.step(2);
        rejections.reject(PodKind::CpuOnly);
        rejections.step(5);
        // Past the last column: counted in the total, not in any column.
        rejections.reject(PodKind::CpuOnly);
        rejections.step(131);
        assert_eq!(rejections.at(1, PodKind::Share), Some(0));
        assert_eq!(rejections.at(2, PodKind::Share), Some(2));
        assert_eq!(rejections.at(2, PodKind::Constrained), Some(1));
        assert_eq!(rejections.at(4, PodKind::CpuOnly), Some(0));
        assert_eq!(rejections.at(5, PodKind::CpuOnly), Some(1));
        assert_eq!(rejections.at(LAST_COLUMN, PodKind::CpuOnly), Some(1));
        assert_eq!(rejections.at(LAST_COLUMN + 1, PodKind::CpuOnly), None);
        assert_eq!(rejections.total(PodKind::CpuOnly), 2);
        assert_eq!(rejections.at(LAST_COLUMN, PodKind::MultiGpu), Some(0));
    }

    #[test]
    fn mean_and_std_dev_skip_missing_values() {
        let values = [Some(1.0), None, Some(3.0)];
        assert_eq!(mean(values), Some(2.0));
        assert_eq!(std_dev(values), Some(2f64.sqrt()));
        assert_eq!(mean([None]), None);
    }
}
