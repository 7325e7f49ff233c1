//! One node's live usage: per-GPU memory, compute and share counts, and host CPU, memory and pods.
//! Changed only by adding or removing a pod's footprint, so release is the exact inverse of allocate.

use super::allocation::{GpuHold, PodAllocation};
use super::model::{ComputeMilli, CpuMilli, Gpu, MemMiB, NodeSpec, WHOLE_GPU_COMPUTE};
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
    /// Same order as `spec.gpus`.
    pub gpus: Vec<GpuUsage>,
    pub cpu_used: CpuMilli,
    pub mem_used: MemMiB,
    pub pods: u32,
    /// Grants that name a GPU the node no longer has (it shrank under running pods).
    pub dangling_holds: u32,
    /// `spec.gpus[i].model` in comparison form, computed once.
    pub normalized_models: Vec<String>,
}

impl NodeState {
    /// An empty node.
    pub fn new(spec: NodeSpec) -> Self {
        let gpus = vec![GpuUsage::default(); spec.gpus.len()];
        let normalized_models = spec
            .gpus
            .iter()
            .map(|gpu| normalize_model(&gpu.model))
            .collect();
        Self {
            spec,
            gpus,
            cpu_used: CpuMilli(0),
            mem_used: MemMiB(0),
            pods: 0,
            dangling_holds: 0,
            normalized_models,
        }
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
        gpu_mem_free(&self.spec.gpus[position], &self.gpus[position])
    }

    /// Free compute of the GPU at `position` (0 when held whole).
    pub fn gpu_compute_free(&self, position: usize) -> ComputeMilli {
        gpu_compute_free(&self.gpus[position])
    }

    /// The free part of the GPU at `position` in milli-GPU; see [`gpu_free_milli`].
    pub fn gpu_free_milli(&self, position: usize) -> u32 {
        gpu_free_milli(&self.spec.gpus[position], &self.gpus[position])
    }

    /// Healthy GPUs with nothing on them, as a position mask.
    pub fn idle_mask(&self) -> u64 {
        self.gpus
            .iter()
            .zip(&self.spec.gpus)
            .enumerate()
            .filter(|(_, (usage, gpu))| gpu.healthy && usage.is_idle())
            .fold(0u64, |mask, (position, _)| mask | bit(position))
    }

    /// Adds a pod. The caller has checked that it fits (or accepts over-commit as a fact).
    pub fn add(&mut self, allocation: &PodAllocation) {
        self.cpu_used = CpuMilli(self.cpu_used.0.saturating_add(allocation.cpu.0));
        self.mem_used = MemMiB(self.mem_used.0.saturating_add(allocation.memory.0));
        self.pods = self.pods.saturating_add(1);
        for hold in allocation.footprint() {
            self.apply_hold(&hold, true);
        }
    }

    /// Removes a pod that was added before: the exact inverse of [`NodeState::add`].
    pub fn remove(&mut self, allocation: &PodAllocation) {
        self.cpu_used = CpuMilli(self.cpu_used.0.saturating_sub(allocation.cpu.0));
        self.mem_used = MemMiB(self.mem_used.0.saturating_sub(allocation.memory.0));
        self.pods = self.pods.saturating_sub(1);
        for hold in allocation.footprint() {
            self.apply_hold(&hold, false);
        }
    }

    fn apply_hold(&mut self, hold: &GpuHold, adding: bool) {
        let Some(position) = self.spec.position_of(hold.gpu) else {
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
    if usage.is_whole() {
        return MemMiB(0);
    }
    MemMiB(gpu.memory.0.saturating_sub(usage.mem.0))
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
    let compute = gpu_compute_free(usage).0;
    if gpu.memory.0 == 0 {
        return compute;
    }
    let by_mem = (gpu_mem_free(gpu, usage).0.saturating_mul(1000) / gpu.memory.0) as u32;
    compute.min(by_mem)
}
