//! The six node-scoring rules of the FGD paper's reference simulator (Random, DotProduct,
//! GpuClustering, GpuPacking, BestFit, FGD) as pure integer functions, with their GPU-choice
//! rules and host selection. Integer truncation is kept exactly where the reference truncates,
//! because its ties decide placements. Randomness never happens here: the caller passes draws in.
//!
//! Units follow the reference: CPU in milli-cores, GPU in milli-GPU (1000 = one card); memory is
//! only ever checked by the filter ([`gpu_engine::fit()`]), never scored.

use gpu_engine::model::{CpuMilli, WHOLE_GPU_COMPUTE};
use gpu_engine::policy::fgd;
use gpu_engine::state::NodeState;

/// The reference's CPU normaliser (`MaxSpecCpu`): the largest node it was built for.
pub const MAX_SPEC_CPU: f64 = 128_000.0;
/// The reference's GPU normaliser (`MaxSpecGpu`): eight whole GPUs.
pub const MAX_SPEC_GPU: f64 = 8_000.0;
/// The reference's score range.
pub const MAX_NODE_SCORE: i64 = 100;

/// One of the paper's baseline policies (plus FGD itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReferencePolicy {
    Random,
    DotProduct,
    GpuClustering,
    GpuPacking,
    BestFit,
    Fgd,
}

/// How a sharing pod's GPU is chosen on the chosen node (`-gpusel`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuSelection {
    /// The GPU with the least free capacity that fits, lowest index on ties.
    Best,
    /// A uniformly drawn GPU among those that fit.
    Random,
    /// FGD's argmax (first index reaching the maximum truncated score).
    FgdScore,
}

impl ReferencePolicy {
    /// All six, in the paper's column order.
    pub const ALL: [Self; 6] = [
        Self::Random,
        Self::DotProduct,
        Self::GpuClustering,
        Self::GpuPacking,
        Self::BestFit,
        Self::Fgd,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Random => "random",
            Self::DotProduct => "dot-product",
            Self::GpuClustering => "gpu-clustering",
            Self::GpuPacking => "gpu-packing",
            Self::BestFit => "best-fit",
            Self::Fgd => "fgd",
        }
    }

    /// The paper's column heading.
    pub fn label(self) -> &'static str {
        match self {
            Self::Random => "Random",
            Self::DotProduct => "DotProd",
            Self::GpuClustering => "GpuClustering",
            Self::GpuPacking => "GpuPacking",
            Self::BestFit => "BestFit",
            Self::Fgd => "FGD",
        }
    }

    /// The GPU choice the paper's runs used with this policy.
    pub fn gpu_selection(self) -> GpuSelection {
        match self {
            Self::Random => GpuSelection::Random,
            Self::Fgd => GpuSelection::FgdScore,
            Self::DotProduct | Self::GpuClustering | Self::GpuPacking | Self::BestFit => {
                GpuSelection::Best
            }
        }
    }

    /// Whether the framework min-max normalises this policy's scores over the feasible nodes.
    pub fn normalizes(self) -> bool {
        self == Self::BestFit
    }
}

/// What the reference scores see of a pod: CPU, GPU count and milli-GPU per GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PodShape {
    pub cpu: CpuMilli,
    pub gpus: u16,
    /// Per GPU; 1000 for whole GPUs, 0 for CPU-only pods.
    pub milli: u32,
}

impl PodShape {
    /// A shape; a pod with no GPU count or no milli asks for no GPU (the reference skips its
    /// GPU filter when `gpu-milli` is 0).
    pub fn new(cpu: CpuMilli, gpus: u16, milli: u32) -> Self {
        if gpus == 0 || milli == 0 {
            return Self {
                cpu,
                gpus: 0,
                milli: 0,
            };
        }
        Self {
            cpu,
            gpus,
            milli: milli.min(WHOLE_GPU_COMPUTE.0),
        }
    }

    /// Total milli-GPU asked for (`num_gpu × gpu_milli`).
    pub fn gpu_total(&self) -> u64 {
        u64::from(self.gpus) * u64::from(self.milli)
    }

    /// A pod sharing one GPU (`num_gpu == 1 && gpu_milli < 1000`).
    pub fn is_share(&self) -> bool {
        self.gpus == 1 && self.milli > 0 && self.milli < WHOLE_GPU_COMPUTE.0
    }

    /// GpuClustering's class of the pod, `None` for CPU-only pods.
    pub fn class(&self) -> Option<GpuClass> {
        match self.gpus {
            0 => None,
            _ if self.milli < WHOLE_GPU_COMPUTE.0 => Some(GpuClass::Share),
            count => Some(GpuClass::Whole(count)),
        }
    }
}

/// GpuClustering's pod classes: sharing pods, and whole-GPU pods by GPU count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuClass {
    Share,
    Whole(u16),
}

/// The classes of the GPU pods on one node, with counts (GpuClustering's node "affinity").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuClassMix {
    counts: Vec<(GpuClass, u32)>,
}

impl GpuClassMix {
    /// Records a pod of `class` placed on the node.
    pub fn add(&mut self, class: GpuClass) {
        match self.counts.iter_mut().find(|(c, _)| *c == class) {
            Some((_, count)) => *count += 1,
            None => self.counts.push((class, 1)),
        }
    }

    /// Forgets a pod of `class` that left the node.
    pub fn remove(&mut self, class: GpuClass) {
        if let Some(index) = self.counts.iter().position(|(c, _)| *c == class) {
            self.counts[index].1 -= 1;
            if self.counts[index].1 == 0 {
                self.counts.swap_remove(index);
            }
        }
    }

    /// Whether the node holds a pod of `class`.
    pub fn contains(&self, class: GpuClass) -> bool {
        self.counts.iter().any(|(c, _)| *c == class)
    }

    /// How many different classes the node holds.
    pub fn distinct(&self) -> usize {
        self.counts.len()
    }
}

/// DotProduct (Tetris-style, `-dimext merge -norm max`): one minus the halved dot product of
/// the node's free (CPU, GPU) and the pod's request, both divided by the max spec, truncated.
/// Prefers the node whose free resources are least aligned with the pod.
pub fn dot_product(cpu_free: CpuMilli, gpu_free: u64, pod: PodShape) -> i64 {
    // The arithmetic follows the reference term by term so that truncation ties match.
    let node = [
        cpu_free.0 as f64 / MAX_SPEC_CPU,
        gpu_free as f64 / MAX_SPEC_GPU,
    ];
    let request = [
        pod.cpu.0 as f64 / MAX_SPEC_CPU,
        pod.gpu_total() as f64 / MAX_SPEC_GPU,
    ];
    let dot = (node[0] * request[0] + node[1] * request[1]) / 2.0;
    (MAX_NODE_SCORE as f64 * (1.0 - dot)) as i64
}

/// GpuClustering: nodes holding only the pod's class first (75 + up to 25 for fullness), then
/// nodes holding it among others (50+), then nodes with no GPU pods (25+), then the rest (0+).
/// CPU-only pods score 0 everywhere.
pub fn gpu_clustering(mix: &GpuClassMix, pod: PodShape, gpu_free: u64) -> i64 {
    let Some(class) = pod.class() else {
        return 0;
    };
    // Integer arithmetic as in the reference: 100/4 × (8000 − free) / 8000.
    let fullness =
        MAX_NODE_SCORE / 4 * (MAX_SPEC_GPU as i64 - gpu_free as i64) / MAX_SPEC_GPU as i64;
    let base = if mix.contains(class) {
        if mix.distinct() == 1 { 75 } else { 50 }
    } else if mix.distinct() == 0 {
        25
    } else {
        0
    };
    fullness + base
}

/// GpuPacking: use partly used GPUs first (50..=100, fuller is better), then fully free GPUs of
/// a used node (33..=50), then an idle node (up to 33, smaller nodes first). CPU-only pods score 0.
pub fn gpu_packing(free: &[u32], pod: PodShape) -> i64 {
    if pod.milli == 0 {
        return 0;
    }
    let whole = WHOLE_GPU_COMPUTE.0;
    let fully_free = free.iter().filter(|&&f| f == whole).count() as i64;
    if fully_free == free.len() as i64 {
        return (MAX_NODE_SCORE / 3 - fully_free).max(fully_free);
    }
    let mut order: Vec<usize> = (0..free.len()).collect();
    // Stable: equal free GPUs keep index order, as the reference's sorted index list does.
    order.sort_by_key(|&position| free[position]);
    let taken: Vec<u32> = order
        .into_iter()
        .map(|position| free[position])
        .filter(|&f| f >= pod.milli)
        .take(usize::from(pod.gpus))
        .collect();
    let fully_free_taken = taken.iter().filter(|&&f| f == whole).count() as i64;
    if fully_free_taken > 0 {
        return (MAX_NODE_SCORE / 2 - fully_free_taken).max(MAX_NODE_SCORE / 3);
    }
    let free_percent: i64 = taken.iter().map(|&f| i64::from(f) * 100 / 1000).sum();
    (MAX_NODE_SCORE - free_percent / 10).max(MAX_NODE_SCORE / 2)
}

/// BestFit's raw score: 100 × (1 − ½·CPU left over/128000 − ½·GPU left over/8000), truncated.
/// The tightest fit scores highest. Normalise over the feasible nodes with [`normalize`].
pub fn best_fit(cpu_free: CpuMilli, gpu_free: u64, pod: PodShape) -> i64 {
    let free = [cpu_free.0 as f64, gpu_free as f64];
    let request = [pod.cpu.0 as f64, pod.gpu_total() as f64];
    let max = [MAX_SPEC_CPU, MAX_SPEC_GPU];
    let mut left = 0.0;
    for i in 0..2 {
        left += (free[i] - request[i]) / max[i] * 0.5;
    }
    ((1.0 - left) * MAX_NODE_SCORE as f64) as i64
}

/// The framework's min-max normalisation to 0..=100 (integer division); all 0 when every
/// feasible node scored the same.
pub fn normalize(score: i64, lowest: i64, highest: i64) -> i64 {
    if highest == lowest {
        0
    } else {
        (score - lowest) * MAX_NODE_SCORE / (highest - lowest)
    }
}

/// FGD's integer score for a placement that moves the node's fragmentation from `before` to
/// `after` (milli-GPU): trunc(100·σ((before − after)/1000)).
pub fn fgd(before: f64, after: f64) -> i64 {
    fgd::reference_score(before - after) as i64
}

/// The reference score of a non-FGD policy for `pod` on `node`, from the node's free CPU and
/// per-GPU free milli-GPU. FGD needs the typical pods and goes through [`gpu_engine::Policy::score`];
/// Random scores nothing (the simulator draws the node from the feasible list with the run's
/// generator, `sim::replay`), so both return 0 here.
pub fn node_score(
    policy: ReferencePolicy,
    node: &NodeState,
    free: &[u32],
    mix: &GpuClassMix,
    pod: PodShape,
) -> i64 {
    let gpu_free: u64 = free.iter().map(|&f| u64::from(f)).sum();
    match policy {
        ReferencePolicy::Random | ReferencePolicy::Fgd => 0,
        ReferencePolicy::DotProduct => dot_product(node.cpu_free(), gpu_free, pod),
        ReferencePolicy::GpuClustering => gpu_clustering(mix, pod, gpu_free),
        ReferencePolicy::GpuPacking => gpu_packing(free, pod),
        ReferencePolicy::BestFit => best_fit(node.cpu_free(), gpu_free, pod),
    }
}

/// `selectHost` of the reference's scheduler fork: the highest score, ties to the node with the
/// lowest priority key (its random name prefix). Items are `(node, score, priority)`.
pub fn select_host<S: PartialOrd + Copy>(
    candidates: impl IntoIterator<Item = (usize, S, u32)>,
) -> Option<usize> {
    let mut best: Option<(usize, S, u32)> = None;
    for (node, score, priority) in candidates {
        let better = match best {
            None => true,
            Some((_, best_score, best_priority)) => {
                score > best_score || (score == best_score && priority < best_priority)
            }
        };
        if better {
            best = Some((node, score, priority));
        }
    }
    best.map(|(node, _, _)| node)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(cpu: u64, gpus: u16, milli: u32) -> PodShape {
        PodShape::new(CpuMilli(cpu), gpus, milli)
    }

    #[test]
    fn dot_product_prefers_the_least_aligned_node() {
        // Node: 64 cores, 4 GPUs free; pod: 8 cores, one whole GPU.
        // dot = ((0.5 × 0.0625) + (0.5 × 0.125)) / 2 = 0.046875 → 100 × 0.953125 = 95.3 → 95.
        assert_eq!(
            dot_product(CpuMilli(64_000), 4000, shape(8000, 1, 1000)),
            95
        );
        // An empty 8-GPU, 128-core node: dot = (1 × 0.0625 + 1 × 0.125) / 2 = 0.09375 → 90.
        assert_eq!(
            dot_product(CpuMilli(128_000), 8000, shape(8000, 1, 1000)),
            90
        );
        // Nothing requested: 100.
        assert_eq!(dot_product(CpuMilli(128_000), 8000, shape(0, 0, 0)), 100);
    }

    #[test]
    fn gpu_clustering_ranks_by_class_mix_then_fullness() {
        let share = shape(1000, 1, 500);
        let mut mix = GpuClassMix::default();
        // Idle node with 8000 free: 25 × 0 / 8000 + 25 = 25.
        assert_eq!(gpu_clustering(&mix, share, 8000), 25);
        mix.add(GpuClass::Share);
        // Only shares, 3500 free: 25 × 4500 / 8000 = 14.06 → 14, + 75.
        assert_eq!(gpu_clustering(&mix, share, 3500), 89);
        mix.add(GpuClass::Whole(2));
        assert_eq!(gpu_clustering(&mix, share, 3500), 64);
        // Other classes only: no bonus.
        assert_eq!(gpu_clustering(&mix, shape(0, 4, 1000), 3500), 14);
        mix.remove(GpuClass::Share);
        assert_eq!(gpu_clustering(&mix, share, 3500), 14);
        // CPU-only pods: 0.
        assert_eq!(gpu_clustering(&mix, shape(1000, 0, 0), 0), 0);
    }

    #[test]
    fn gpu_packing_prefers_used_gpus_then_used_nodes_then_small_idle_nodes() {
        let share = shape(1000, 1, 300);
        // Idle 8-GPU node: max(33 − 8, 8) = 25; idle 2-GPU node: 31; idle 64-GPU: max(−31, 64).
        assert_eq!(gpu_packing(&[1000; 8], share), 25);
        assert_eq!(gpu_packing(&[1000; 2], share), 31);
        // Partly used GPU 0 (free 400) fits: 100 − ⌊⌊400·100/1000⌋/10⌋ = 100 − 4 = 96.
        assert_eq!(gpu_packing(&[400, 1000], share), 96);
        // The sliver (200) is too small: a fully free GPU of a used node: 50 − 1 = 49.
        assert_eq!(gpu_packing(&[200, 1000], share), 49);
        // Two whole GPUs out of three free on a used node: max(50 − 2, 33) = 48.
        assert_eq!(gpu_packing(&[0, 1000, 1000, 1000], shape(0, 2, 1000)), 48);
        // Ascending walk: GPU 2 (free 350) is taken before GPU 0 (free 900): 100 − 3 = 97.
        assert_eq!(gpu_packing(&[900, 1000, 350], share), 97);
        assert_eq!(gpu_packing(&[900, 1000, 350], shape(1000, 0, 0)), 0);
    }

    #[test]
    fn best_fit_prefers_the_tightest_node_and_normalizes() {
        // 16 cores and 1000 milli free, pod takes 8 cores and 500:
        // 1 − ½·8000/128000 − ½·500/8000 = 1 − 0.03125 − 0.03125 = 0.9375 → 93.
        assert_eq!(best_fit(CpuMilli(16_000), 1000, shape(8000, 1, 500)), 93);
        // An exact fit scores 100.
        assert_eq!(best_fit(CpuMilli(8000), 500, shape(8000, 1, 500)), 100);
        assert_eq!(normalize(93, 40, 100), 88);
        assert_eq!(normalize(40, 40, 100), 0);
        assert_eq!(normalize(70, 70, 70), 0);
    }

    #[test]
    fn fgd_is_fifty_without_change_and_truncates() {
        assert_eq!(fgd(1000.0, 1000.0), 50);
        // σ(0.5) = 0.6225 → 62.
        assert_eq!(fgd(1500.0, 1000.0), 62);
        // σ(−0.5) = 0.3775 → 37.
        assert_eq!(fgd(1000.0, 1500.0), 37);
    }

    #[test]
    fn host_selection_breaks_ties_by_priority() {
        let picked = select_host([(0, 70, 9), (1, 80, 5), (2, 80, 3), (3, 10, 0)]);
        assert_eq!(picked, Some(2));
        assert_eq!(select_host(Vec::<(usize, i64, u32)>::new()), None);
    }

    #[test]
    fn shapes_classify_like_the_reference() {
        assert_eq!(shape(1000, 1, 460).class(), Some(GpuClass::Share));
        assert_eq!(shape(1000, 1, 1000).class(), Some(GpuClass::Whole(1)));
        assert_eq!(shape(1000, 8, 1000).class(), Some(GpuClass::Whole(8)));
        assert_eq!(
            shape(1000, 1, 0).class(),
            None,
            "gpu-milli 0 is a CPU-only pod"
        );
        assert!(shape(1000, 1, 460).is_share() && !shape(0, 1, 1000).is_share());
        assert_eq!(shape(0, 2, 1000).gpu_total(), 2000);
    }
}
