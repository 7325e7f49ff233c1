//! One node's live usage: per-GPU memory, compute and share counts, and host CPU, memory and pods.
//! Changed only by adding or removing a pod's footprint, so release is the exact inverse of allocate.

use std::hash::{BuildHasher as _, Hash as _, Hasher as _};
use std::sync::Arc;

use super::allocation::{GpuHold, PodAllocation};
use super::mig::{self, MigProfile, MigSlices};
use super::model::{ComputeMilli, CpuMilli, Gpu, GpuIndex, MemMiB, NodeSpec, WHOLE_GPU_COMPUTE};
use super::request::normalize_model;
use super::topology::bit;

/// What is taken from one GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GpuUsage {
    pub mem: MemMiB,
    pub compute: ComputeMilli,
    /// Pods holding a share of this GPU.
    pub shares: u16,
    /// Pods holding this GPU whole: 0 or 1, unless the cluster reports an over-commit.
    pub whole_pods: u16,
}

impl GpuUsage {
    /// Nothing at all is on the GPU.
    pub fn is_idle(&self) -> bool {
        self.whole_pods == 0 && self.shares == 0 && self.mem.0 == 0 && self.compute.0 == 0
    }

    /// Held whole by a pod.
    pub fn is_whole(&self) -> bool {
        self.whole_pods > 0
    }
}

/// A node and what is allocated on it.
#[derive(Clone, Debug)]
pub struct NodeState {
    pub spec: NodeSpec,
    /// Same order as `spec.gpus`; inline in the node for up to 8 GPUs.
    pub gpus: PerGpu<GpuUsage>,
    pub cpu_used: CpuMilli,
    pub mem_used: MemMiB,
    pub pods: u32,
    /// Grants that name a GPU the node no longer has (it shrank under running pods).
    pub dangling_holds: u32,
    /// MIG slices pods and external holds (DRA claims) hold, by profile (normalized); a profile
    /// the node no longer advertises stays listed, and over-committed, until its holders are gone.
    pub mig_held: Vec<MigSlices>,
    /// `spec.gpus[i].model` in comparison form, computed once.
    pub normalized_models: Vec<String>,
    /// What filter and score need to know about the GPUs, derived from `spec` once. Like
    /// `normalized_models` it follows the spec the node was built with: a changed spec makes a
    /// new `NodeState` (the table does that on every node update).
    pub(crate) profile: GpuProfile,
}

/// Facts about a node's GPUs that the hot path reads on every filter and score, packed so that
/// a node costs a few cache lines instead of a walk over `spec.gpus` (one allocation per GPU
/// model string, 70-odd bytes per GPU).
#[derive(Clone, Debug)]
pub(crate) struct GpuProfile {
    /// Positions of healthy GPUs (positions past the 64th have no bit; see `topology::bit`).
    pub(crate) healthy: u64,
    /// How many GPUs are healthy, all positions counted.
    pub(crate) healthy_count: usize,
    /// Every position that has a mask bit.
    pub(crate) all: u64,
    /// The memory every GPU has, when they all have the same (the usual case): then no
    /// per-GPU memory is read at all.
    pub(crate) uniform_memory: Option<MemMiB>,
    /// Memory of each GPU, by position.
    pub(crate) memory: Box<[MemMiB]>,
    /// `uniform_memory` and `memory` as divisors for [`free_milli_by`]: the free part of a GPU
    /// is read for every candidate GPU and again for every GPU when scoring, and a 64-bit
    /// division each time was the largest single cost of filtering a share pod.
    pub(crate) uniform_divisor: Option<MemDivisor>,
    pub(crate) divisors: Box<[MemDivisor]>,
    /// The distinct models in comparison form, each with the positions that carry it: a
    /// model constraint is matched once per model, not once per GPU.
    pub(crate) models: Box<[(String, u64)]>,
    /// Every GPU's index equals its position (the usual case): grants map to positions without
    /// a search.
    pub(crate) contiguous: bool,
    /// `spec.topology.is_uniform()`, kept here so that whole-GPU placements on uniformly
    /// connected nodes never read the topology index.
    pub(crate) uniform_topology: bool,
    /// A hash of what placement reads of the spec ([`same_shape`]): an estimate over
    /// thousands of nodes groups them by shape, and hashing eight model strings per node on
    /// every estimate was a fifth of its cost.
    pub(crate) shape: u64,
    /// The table's one spec for every node of this shape ([`crate::Table`] interns
    /// them as nodes arrive): two nodes holding the same one are of the same shape without a
    /// look at their specs, which an estimate would otherwise read from cold memory for every
    /// node. `None` for a node no table has seen.
    pub(crate) shape_peer: Option<Arc<NodeSpec>>,
}

impl GpuProfile {
    fn new(spec: &NodeSpec, normalized_models: &[String]) -> Self {
        Self {
            healthy: spec
                .gpus
                .iter()
                .enumerate()
                .filter(|(_, gpu)| gpu.healthy)
                .fold(0u64, |mask, (position, _)| mask | bit(position)),
            healthy_count: spec.gpus.iter().filter(|gpu| gpu.healthy).count(),
            all: (0..spec.gpus.len()).fold(0u64, |mask, position| mask | bit(position)),
            uniform_memory: match spec.gpus.first() {
                Some(first) if spec.gpus.iter().all(|gpu| gpu.memory == first.memory) => {
                    Some(first.memory)
                }
                _ => None,
            },
            memory: spec.gpus.iter().map(|gpu| gpu.memory).collect(),
            uniform_divisor: match spec.gpus.first() {
                Some(first) if spec.gpus.iter().all(|gpu| gpu.memory == first.memory) => {
                    Some(MemDivisor::new(first.memory))
                }
                _ => None,
            },
            divisors: spec
                .gpus
                .iter()
                .map(|gpu| MemDivisor::new(gpu.memory))
                .collect(),
            models: model_masks(normalized_models),
            contiguous: spec
                .gpus
                .iter()
                .enumerate()
                .all(|(position, gpu)| usize::from(gpu.index.0) == position),
            uniform_topology: spec.topology.is_uniform(),
            shape: shape_hash(spec),
            shape_peer: None,
        }
    }

    /// The memory of the GPU at `position`.
    pub(crate) fn memory(&self, position: usize) -> MemMiB {
        self.uniform_memory.unwrap_or_else(|| self.memory[position])
    }

    /// The memory of the GPU at `position`, as a divisor.
    pub(crate) fn divisor(&self, position: usize) -> MemDivisor {
        self.uniform_divisor
            .unwrap_or_else(|| self.divisors[position])
    }

    /// The positions of GPUs with at least `min` memory.
    pub(crate) fn memory_at_least(&self, min: MemMiB) -> u64 {
        if let Some(memory) = self.uniform_memory {
            return if memory >= min { self.all } else { 0 };
        }
        self.memory
            .iter()
            .enumerate()
            .filter(|(_, memory)| **memory >= min)
            .fold(0u64, |mask, (position, _)| mask | bit(position))
    }

    /// Whether the GPU at `position` is healthy.
    pub(crate) fn is_healthy(&self, spec: &NodeSpec, position: usize) -> bool {
        match bit(position) {
            0 => spec.gpus[position].healthy,
            position_bit => self.healthy & position_bit != 0,
        }
    }
}

/// Hashes what [`same_shape`] compares (everything of a spec placement reads, but its name and
/// GPU UUIDs), with a fixed seed so that equal shapes hash alike in every node.
pub fn shape_hash(spec: &NodeSpec) -> u64 {
    let mut state = foldhash::fast::FixedState::default().build_hasher();
    spec.cpu.hash(&mut state);
    spec.memory.hash(&mut state);
    spec.max_pods.hash(&mut state);
    spec.mode.hash(&mut state);
    spec.placement.hash(&mut state);
    for gpu in &spec.gpus {
        gpu.index.hash(&mut state);
        gpu.model.hash(&mut state);
        gpu.memory.hash(&mut state);
        gpu.numa.hash(&mut state);
        gpu.healthy.hash(&mut state);
    }
    spec.links.hash(&mut state);
    spec.mig.hash(&mut state);
    state.finish()
}

/// Whether placement treats the two specs alike: everything but the node's name and its GPUs'
/// UUIDs, which placement never reads.
pub(crate) fn same_shape(x: &NodeSpec, y: &NodeSpec) -> bool {
    x.cpu == y.cpu
        && x.memory == y.memory
        && x.max_pods == y.max_pods
        && x.mode == y.mode
        && x.placement == y.placement
        && x.gpus.len() == y.gpus.len()
        && x.gpus.iter().zip(&y.gpus).all(|(g, h)| {
            g.index == h.index
                && g.model == h.model
                && g.memory == h.memory
                && g.numa == h.numa
                && g.healthy == h.healthy
        })
        && x.links == y.links
        && x.mig == y.mig
}

/// The distinct models of `models` (by position), each with the positions that carry it, in
/// the order first seen.
fn model_masks<'a>(models: impl IntoIterator<Item = &'a String>) -> Box<[(String, u64)]> {
    let mut masks: Vec<(String, u64)> = Vec::new();
    for (position, model) in models.into_iter().enumerate() {
        match masks.iter_mut().find(|(known, _)| known == model) {
            Some((_, mask)) => *mask |= bit(position),
            None => masks.push((model.clone(), bit(position))),
        }
    }
    masks.into_boxed_slice()
}

impl NodeState {
    /// The positions of the node's healthy GPUs, one bit each (bit `i` is `spec.gpus[i]`).
    pub fn healthy_mask(&self) -> u64 {
        self.profile.healthy
    }

    /// Whether placement treats the two nodes' specs alike ([`same_shape`]). The hashes kept
    /// with each node answer most "no"s, the table's interned spec most "yes"es, without
    /// reading the specs.
    pub fn same_shape(&self, other: &Self) -> bool {
        let (x, y) = (&self.profile, &other.profile);
        x.shape == y.shape
            && match (&x.shape_peer, &y.shape_peer) {
                (Some(a), Some(b)) if Arc::ptr_eq(a, b) => true,
                _ => same_shape(&self.spec, &other.spec),
            }
    }

    /// The hash of the node's shape ([`NodeState::same_shape`]), computed once per spec.
    pub fn shape_hash(&self) -> u64 {
        self.profile.shape
    }

    /// Whether the two nodes hold the same: per-GPU usage, host CPU, memory and pods.
    fn same_usage(&self, other: &Self) -> bool {
        *self.gpus == *other.gpus
            && self.cpu_used == other.cpu_used
            && self.mem_used == other.mem_used
            && self.pods == other.pods
            && self.dangling_holds == other.dangling_holds
            && self.mig_held == other.mig_held
    }

    /// A hash of the node's shape and of what [`NodeState::same_usage`] compares: nodes
    /// [`placed_alike`](NodeState::placed_alike) have equal keys, and a map keyed by it compares
    /// in full, so a collision costs a placement, never a wrong answer. Mixed by multiply and
    /// rotate over the raw numbers: feeding the fields to a `Hasher` one by one took as long as
    /// scoring a node under `binpack`, which would have made a memo of scores a loss there.
    pub fn usage_key(&self) -> u64 {
        const ODD: u64 = 0x9E37_79B9_7F4A_7C15;
        let mix = |hash: u64, value: u64| (hash ^ value).wrapping_mul(ODD).rotate_left(29);
        let mut hash = self.profile.shape;
        for gpu in self.gpus.iter() {
            hash = mix(hash, gpu.mem.0);
            hash = mix(
                hash,
                u64::from(gpu.compute.0)
                    | u64::from(gpu.shares) << 32
                    | u64::from(gpu.whole_pods) << 48,
            );
        }
        for held in &self.mig_held {
            let profile = &held.profile;
            hash = mix(
                hash,
                (u64::from(held.count) << 32)
                    ^ profile.memory_mib()
                    ^ (u64::from(profile.compute_slices()) << 56),
            );
        }
        hash = mix(hash, self.cpu_used.0);
        hash = mix(hash, self.mem_used.0);
        mix(
            hash,
            u64::from(self.pods) | u64::from(self.dangling_holds) << 32,
        )
    }

    /// Whether placement cannot tell the two nodes apart: the same shape and the same usage
    /// (MIG slices held included).
    /// Everything fit, placement and every policy's score read of a node is one or the other
    /// (never its name), so such nodes get the same verdict and the same score for any pod.
    pub fn placed_alike(&self, other: &Self) -> bool {
        self.same_shape(other) && self.same_usage(other)
    }

    /// An empty node.
    pub fn new(spec: NodeSpec) -> Self {
        let gpus = PerGpu::defaults(spec.gpus.len());
        let normalized_models: Vec<String> = spec
            .gpus
            .iter()
            .map(|gpu| normalize_model(&gpu.model))
            .collect();
        let profile = GpuProfile::new(&spec, &normalized_models);
        Self {
            spec,
            gpus,
            cpu_used: CpuMilli(0),
            mem_used: MemMiB(0),
            pods: 0,
            dangling_holds: 0,
            mig_held: Vec::new(),
            normalized_models,
            profile,
        }
    }

    /// The index of the GPU at `position`, without touching `spec.gpus` in the usual case.
    pub(crate) fn index_at(&self, position: usize) -> GpuIndex {
        if self.profile.contiguous {
            GpuIndex(position as u16)
        } else {
            self.spec.gpus[position].index
        }
    }

    /// The position of the GPU with this index, without a search in the usual case.
    pub(crate) fn position_of(&self, index: GpuIndex) -> Option<usize> {
        let position = usize::from(index.0);
        if self.profile.contiguous {
            return (position < self.spec.gpus.len()).then_some(position);
        }
        self.spec.position_of(index)
    }

    /// Whether every GPU of the node is idle (true of a node without GPUs).
    pub fn gpus_idle(&self) -> bool {
        self.gpus.iter().all(GpuUsage::is_idle)
    }

    /// Free host CPU.
    pub fn cpu_free(&self) -> CpuMilli {
        CpuMilli(self.spec.cpu.0.saturating_sub(self.cpu_used.0))
    }

    /// Free host memory.
    pub fn mem_free(&self) -> MemMiB {
        MemMiB(self.spec.memory.0.saturating_sub(self.mem_used.0))
    }

    /// Free memory of the GPU at `position` (0 when held whole).
    pub fn gpu_mem_free(&self, position: usize) -> MemMiB {
        mem_free(self.profile.memory(position), &self.gpus[position])
    }

    /// Free compute of the GPU at `position` (0 when held whole).
    pub fn gpu_compute_free(&self, position: usize) -> ComputeMilli {
        gpu_compute_free(&self.gpus[position])
    }

    /// The free part of the GPU at `position` in milli-GPU; see [`gpu_free_milli`].
    pub fn gpu_free_milli(&self, position: usize) -> u32 {
        self.free_milli_under(position, &self.gpus[position])
    }

    /// [`gpu_free_milli`] of the GPU at `position` under scratch `usage`, from the profile.
    pub(crate) fn free_milli_under(&self, position: usize, usage: &GpuUsage) -> u32 {
        if !self.profile.is_healthy(&self.spec, position) {
            return 0;
        }
        free_milli_by(self.profile.divisor(position), usage)
    }

    /// Healthy GPUs with nothing on them, as a position mask.
    pub fn idle_mask(&self) -> u64 {
        self.gpus
            .iter()
            .enumerate()
            .filter(|(_, usage)| usage.is_idle())
            .fold(0u64, |mask, (position, _)| mask | bit(position))
            & self.profile.healthy
    }

    /// Adds a pod. The caller has checked that it fits (or accepts over-commit as a fact).
    pub fn add(&mut self, allocation: &PodAllocation) {
        self.cpu_used = CpuMilli(self.cpu_used.0.saturating_add(allocation.cpu.0));
        self.mem_used = MemMiB(self.mem_used.0.saturating_add(allocation.memory.0));
        self.pods = self.pods.saturating_add(1);
        allocation.for_each_hold(|hold| self.apply_hold(hold, true));
        self.take_mig(&allocation.mig);
    }

    /// Removes a pod that was added before: the exact inverse of [`NodeState::add`].
    pub fn remove(&mut self, allocation: &PodAllocation) {
        self.cpu_used = CpuMilli(self.cpu_used.0.saturating_sub(allocation.cpu.0));
        self.mem_used = MemMiB(self.mem_used.0.saturating_sub(allocation.memory.0));
        self.pods = self.pods.saturating_sub(1);
        allocation.for_each_hold(|hold| self.apply_hold(hold, false));
        mig::apply(&mut self.mig_held, &allocation.mig, false);
    }

    /// Counts `slices` as held (what [`NodeState::add`] does with a pod's MIG slices).
    pub(crate) fn take_mig(&mut self, slices: &[MigSlices]) {
        mig::apply(&mut self.mig_held, slices, true);
    }

    /// Slices of `profile` the node advertises.
    pub fn mig_advertised(&self, profile: &MigProfile) -> u32 {
        mig::count_of(&self.spec.mig, profile)
    }

    /// Slices of `profile` pods and external holds hold.
    pub fn mig_held_of(&self, profile: &MigProfile) -> u32 {
        mig::count_of(&self.mig_held, profile)
    }

    /// Slices of `profile` advertised and not held (0 when over-committed).
    pub fn mig_free(&self, profile: &MigProfile) -> u32 {
        self.mig_advertised(profile)
            .saturating_sub(self.mig_held_of(profile))
    }

    /// Whether pods or external holds (DRA claims) hold any MIG slice of the node: its MIG cards
    /// are partitioned and in use.
    pub fn mig_in_use(&self) -> bool {
        !self.mig_held.is_empty()
    }

    /// Adds the GPU holds and MIG slices of a holder that is not a pod
    /// ([`crate::table::ExternalHold`]): its GPUs and slices only, no host CPU, memory or pod
    /// slot (the holder's pods, if any, are counted as pods).
    pub fn add_external(&mut self, holds: &[GpuHold], slices: &[MigSlices]) {
        for hold in holds {
            self.apply_hold(hold, true);
        }
        self.take_mig(slices);
    }

    /// Removes holds added by [`NodeState::add_external`]: its exact inverse.
    pub fn remove_external(&mut self, holds: &[GpuHold], slices: &[MigSlices]) {
        for hold in holds {
            self.apply_hold(hold, false);
        }
        mig::apply(&mut self.mig_held, slices, false);
    }

    fn apply_hold(&mut self, hold: &GpuHold, adding: bool) {
        let Some(position) = self.position_of(hold.gpu) else {
            self.dangling_holds = if adding {
                self.dangling_holds.saturating_add(1)
            } else {
                self.dangling_holds.saturating_sub(1)
            };
            return;
        };
        let usage = &mut self.gpus[position];
        if hold.whole {
            usage.whole_pods = if adding {
                usage.whole_pods.saturating_add(1)
            } else {
                usage.whole_pods.saturating_sub(1)
            };
            return;
        }
        if adding {
            usage.mem = MemMiB(usage.mem.0.saturating_add(hold.mem.0));
            usage.compute = ComputeMilli(usage.compute.0.saturating_add(hold.compute.0));
            usage.shares = usage.shares.saturating_add(1);
        } else {
            usage.mem = MemMiB(usage.mem.0.saturating_sub(hold.mem.0));
            usage.compute = ComputeMilli(usage.compute.0.saturating_sub(hold.compute.0));
            usage.shares = usage.shares.saturating_sub(1);
        }
    }
}

/// Free memory of a GPU under some usage (0 when held whole).
pub fn gpu_mem_free(gpu: &Gpu, usage: &GpuUsage) -> MemMiB {
    mem_free(gpu.memory, usage)
}

/// Free memory of a GPU of `memory` under some usage (0 when held whole).
pub(crate) fn mem_free(memory: MemMiB, usage: &GpuUsage) -> MemMiB {
    if usage.is_whole() {
        return MemMiB(0);
    }
    MemMiB(memory.0.saturating_sub(usage.mem.0))
}

/// Free compute of a GPU under some usage (0 when held whole).
pub fn gpu_compute_free(usage: &GpuUsage) -> ComputeMilli {
    if usage.is_whole() {
        return ComputeMilli(0);
    }
    ComputeMilli(WHOLE_GPU_COMPUTE.0.saturating_sub(usage.compute.0))
}

/// The free part of a GPU in milli-GPU, the unit fragmentation is measured in: the scarcer of
/// memory and compute. Unhealthy GPUs have nothing free.
pub fn gpu_free_milli(gpu: &Gpu, usage: &GpuUsage) -> u32 {
    if !gpu.healthy {
        return 0;
    }
    free_milli(gpu.memory, usage)
}

/// [`gpu_free_milli`] of a healthy GPU of `memory`.
pub(crate) fn free_milli(memory: MemMiB, usage: &GpuUsage) -> u32 {
    let compute = gpu_compute_free(usage).0;
    if memory.0 == 0 {
        return compute;
    }
    let by_mem = (mem_free(memory, usage).0.saturating_mul(1000) / memory.0) as u32;
    compute.min(by_mem)
}

/// [`free_milli`] with the GPU's memory given as a prepared divisor: the same value, without a
/// division in the usual case.
pub(crate) fn free_milli_by(memory: MemDivisor, usage: &GpuUsage) -> u32 {
    let compute = gpu_compute_free(usage).0;
    if memory.memory == 0 {
        return compute;
    }
    let by_mem = memory.per_mille(mem_free(MemMiB(memory.memory), usage).0) as u32;
    compute.min(by_mem)
}

/// A GPU's memory prepared for dividing by it: `free * 1000 / memory` as a multiplication and a
/// shift (a few cycles instead of a 64-bit division), exact for every `free <= memory`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MemDivisor {
    memory: u64,
    /// `floor(2^64 / memory) + 1`, or 0 where the multiplication is not known to be exact (then
    /// [`MemDivisor::per_mille`] divides).
    magic: u64,
}

impl MemDivisor {
    /// Memory below this takes the multiplication: see [`MemDivisor::per_mille`] for why it is
    /// exact there. 2^27 MiB is 128 TiB, far above any GPU.
    const EXACT_BELOW: u64 = 1 << 27;

    pub(crate) fn new(memory: MemMiB) -> Self {
        let magic = if (2..Self::EXACT_BELOW).contains(&memory.0) {
            // At most 2^63 + 1 for memory >= 2, so it fits.
            u64::try_from((1u128 << 64) / u128::from(memory.0) + 1).unwrap_or(0)
        } else {
            0
        };
        Self {
            memory: memory.0,
            magic,
        }
    }

    /// `free.saturating_mul(1000) / memory`, the per-mille of memory that `free` is (memory > 0).
    ///
    /// Why the multiplication is exact: with `d = memory`, `n = 1000 * free` and
    /// `magic = 2^64 / d + e` (0 < e <= 1), `n * magic / 2^64 = n / d + n * e / 2^64`. The
    /// fraction of `n / d` is at most `(d - 1) / d`, so the floor is unchanged as long as
    /// `n * e / 2^64 < 1 / d`, which holds when `n * d < 2^64`. Here `free <= d` and
    /// `d < 2^27`, so `n * d <= 1000 * 2^54 < 2^64`. Anything outside that divides.
    pub(crate) fn per_mille(self, free: u64) -> u64 {
        if self.magic != 0 && free <= self.memory {
            let n = u128::from(free * 1000);
            ((n * u128::from(self.magic)) >> 64) as u64
        } else {
            free.saturating_mul(1000) / self.memory.max(1)
        }
    }
}

/// Per-GPU values of one node, read as a slice: inline for nodes of up to 8 GPUs (nearly all of
/// them), on the heap beyond. [`NodeState::gpus`] is one, so that a node's usage lies in the
/// node's own memory (filtering thousands of nodes otherwise pays a cache miss per node for a
/// separate heap block), and the engine's per-decision scratch values are too, so that judging a
/// node allocates nothing.
#[derive(Clone)]
pub struct PerGpu<T>(Repr<T>);

#[derive(Clone)]
enum Repr<T> {
    /// The values, followed by unused defaults; the count of values.
    Inline([T; INLINE_GPUS], usize),
    Heap(Vec<T>),
}

const INLINE_GPUS: usize = 8;

impl<T: Copy + Default> PerGpu<T> {
    /// A copy of `values`.
    pub fn copy_of(values: &[T]) -> Self {
        // The usual 8-GPU node as a copy of known size, which compiles to a few vector moves;
        // a copy of run-time length is a `memcpy` call, 9% of filtering a share pod (perf).
        if let Ok(full) = <[T; INLINE_GPUS]>::try_from(values) {
            return Self(Repr::Inline(full, INLINE_GPUS));
        }
        if values.len() <= INLINE_GPUS {
            let mut inline = [T::default(); INLINE_GPUS];
            inline[..values.len()].copy_from_slice(values);
            Self(Repr::Inline(inline, values.len()))
        } else {
            Self(Repr::Heap(values.to_vec()))
        }
    }

    /// `len` default values.
    pub fn defaults(len: usize) -> Self {
        if len <= INLINE_GPUS {
            Self(Repr::Inline([T::default(); INLINE_GPUS], len))
        } else {
            Self(Repr::Heap(vec![T::default(); len]))
        }
    }
}

impl<T: Copy + Default> From<Vec<T>> for PerGpu<T> {
    fn from(values: Vec<T>) -> Self {
        if values.len() <= INLINE_GPUS {
            Self::copy_of(&values)
        } else {
            Self(Repr::Heap(values))
        }
    }
}

impl<T> std::ops::Deref for PerGpu<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match &self.0 {
            Repr::Inline(values, len) => &values[..*len],
            Repr::Heap(values) => values,
        }
    }
}

impl<T> std::ops::DerefMut for PerGpu<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.0 {
            Repr::Inline(values, len) => &mut values[..*len],
            Repr::Heap(values) => values,
        }
    }
}

// Iterated like the `Vec` it replaces, so that `zip(&node.gpus)` and `for usage in &node.gpus`
// keep working.
impl<'a, T> IntoIterator for &'a PerGpu<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<'a, T> IntoIterator for &'a mut PerGpu<T> {
    type Item = &'a mut T;
    type IntoIter = std::slice::IterMut<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter_mut()
    }
}

// Compared, hashed and printed as the slice of values, whichever way they are stored: a node's
// usage prints as the `Vec` it used to be.
impl<T: PartialEq> PartialEq for PerGpu<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Eq> Eq for PerGpu<T> {}

impl<T: std::hash::Hash> std::hash::Hash for PerGpu<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (**self).hash(state);
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for PerGpu<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The division it replaces.
    fn divided(memory: u64, free: u64) -> u64 {
        free.saturating_mul(1000) / memory
    }

    #[test]
    fn the_prepared_divisor_divides_exactly_for_every_small_memory_and_free_part() {
        for memory in 1..=1500u64 {
            let divisor = MemDivisor::new(MemMiB(memory));
            for free in 0..=memory {
                assert_eq!(
                    divisor.per_mille(free),
                    divided(memory, free),
                    "{free}/{memory}"
                );
            }
        }
    }

    #[test]
    fn the_prepared_divisor_divides_exactly_near_multiples_and_at_its_limit() {
        // Real GPU sizes (MiB), powers of two and their neighbours, and both sides of the limit
        // where the multiplication stops being taken.
        let mut memories = vec![
            16_384,
            24_576,
            32_768,
            40_960,
            81_920,
            141_312,
            MemDivisor::EXACT_BELOW - 1,
            MemDivisor::EXACT_BELOW,
            MemDivisor::EXACT_BELOW + 1,
            u64::MAX / 1000,
            u64::MAX,
        ];
        memories
            .extend((1..27).flat_map(|shift| [(1u64 << shift) - 1, 1 << shift, (1 << shift) + 1]));
        for memory in memories {
            let divisor = MemDivisor::new(MemMiB(memory));
            // Just below, at and just above every free part that makes a whole per-mille, for
            // 1,000 of them spread over 0..=memory, and the ends.
            let steps = (0..=1000u64).map(|k| u128::from(memory) * u128::from(k) / 1000);
            for step in steps {
                let step = u64::try_from(step).unwrap_or(u64::MAX);
                for free in [step.saturating_sub(1), step, step.saturating_add(1)] {
                    let free = free.min(memory);
                    assert_eq!(
                        divisor.per_mille(free),
                        divided(memory, free),
                        "{free}/{memory}"
                    );
                }
            }
        }
    }

    #[test]
    fn free_milli_by_equals_free_milli() {
        let usages = [
            GpuUsage::default(),
            GpuUsage {
                mem: MemMiB(8192),
                compute: ComputeMilli(300),
                shares: 2,
                whole_pods: 0,
            },
            GpuUsage {
                mem: MemMiB(100_000),
                compute: ComputeMilli(1200),
                shares: 9,
                whole_pods: 0,
            },
            GpuUsage {
                whole_pods: 1,
                ..GpuUsage::default()
            },
        ];
        for memory in [
            0,
            1,
            7,
            16_384,
            24_576,
            81_920,
            MemDivisor::EXACT_BELOW,
            u64::MAX,
        ] {
            for usage in &usages {
                assert_eq!(
                    free_milli_by(MemDivisor::new(MemMiB(memory)), usage),
                    free_milli(MemMiB(memory), usage),
                    "{memory} {usage:?}"
                );
            }
        }
    }
}
