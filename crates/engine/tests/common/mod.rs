//! Builders shared by the engine's integration tests: nodes, pods and pre-existing occupancy from
//! plain values in one line each, so every table row reads as the situation it describes.

#![allow(
    dead_code,
    reason = "each test crate includes this module and uses a different subset of the builders"
)]

use gpu_engine::{
    ComputeMilli, ContainerAllocation, ContainerRequest, CpuMilli, Gpu, GpuDemand, GpuGrant,
    GpuIndex, GpuMode, Grant, Link, LinkMatrix, MemMiB, MigProfile, MigSlices, NodeName, NodeSpec,
    NodeState, PodAllocation, PodRequest,
};

/// `n` GiB in the engine's unit.
pub fn gib(n: u64) -> MemMiB {
    MemMiB(n * 1024)
}

/// A node of `count` identical GPUs of `mem_gib` GiB each, named "n".
pub fn uniform(mode: GpuMode, count: u16, model: &str, mem_gib: u64) -> NodeSpec {
    NodeSpec::uniform("n", mode, count, model, gib(mem_gib))
}

/// A node whose GPUs are listed as (model, GiB), in index order, uniformly connected.
pub fn hetero(mode: GpuMode, gpus: &[(&str, u64)]) -> NodeSpec {
    let gpus: Vec<Gpu> = gpus
        .iter()
        .enumerate()
        .map(|(index, &(model, mem))| Gpu::new(index as u16, model, gib(mem)))
        .collect();
    let links = LinkMatrix::uniform(gpus.len());
    NodeSpec::with_gpus("n", mode, gpus, links)
}

/// Marks the GPUs at these positions unhealthy.
pub fn unhealthy(mut spec: NodeSpec, positions: &[usize]) -> NodeSpec {
    for &position in positions {
        spec.gpus[position].healthy = false;
    }
    spec
}

/// Two NVLink islands of four (0-3 and 4-7), PCIe across sockets between them.
pub fn two_islands() -> LinkMatrix {
    LinkMatrix::from_fn(8, |a, b| {
        if a / 4 == b / 4 {
            Link::NvLink(2)
        } else {
            Link::CrossSocket
        }
    })
}

/// Something another pod already holds on the node.
#[derive(Clone, Copy, Debug)]
pub enum Held {
    /// These GPU indices, whole.
    Whole(&'static [u16]),
    /// A share of one GPU: GiB and compute percent.
    Share(u16, u64, u32),
    /// Host resources only: CPU milli-cores and memory MiB.
    Host(u64, u64),
}

/// The allocation another pod would have for `held` on `node`.
pub fn held_allocation(node: &NodeName, held: Held) -> PodAllocation {
    let (gpus, cpu, memory) = match held {
        Held::Whole(indices) => (
            indices
                .iter()
                .map(|&gpu| GpuGrant {
                    gpu: GpuIndex(gpu),
                    grant: Grant::Whole,
                })
                .collect(),
            0,
            0,
        ),
        Held::Share(gpu, mem_gib, percent) => (
            vec![GpuGrant {
                gpu: GpuIndex(gpu),
                grant: Grant::Share {
                    mem: gib(mem_gib),
                    compute: ComputeMilli(percent * 10),
                },
            }],
            0,
            0,
        ),
        Held::Host(cpu, memory) => (Vec::new(), cpu, memory),
    };
    PodAllocation {
        node: node.clone(),
        cpu: CpuMilli(cpu),
        memory: MemMiB(memory),
        containers: vec![ContainerAllocation {
            name: "other".into(),
            gpus,
        }],
        init_containers: Vec::new(),
        mig: Vec::new(),
    }
}

/// The node with one other pod per entry of `held` already on it.
pub fn occupied(spec: NodeSpec, held: &[Held]) -> NodeState {
    let mut node = NodeState::new(spec);
    for &h in held {
        let allocation = held_allocation(&node.spec.name, h);
        node.add(&allocation);
    }
    node
}

/// A one-container pod with no host resources to speak of.
pub fn pod(demand: GpuDemand) -> PodRequest {
    PodRequest::single(CpuMilli(100), MemMiB(128), demand)
}

/// `n` whole GPUs.
pub fn whole(n: u64) -> PodRequest {
    pod(GpuDemand::whole(n).unwrap())
}

/// `n` GPUs by interconnect.
pub fn topo(n: u64) -> PodRequest {
    pod(GpuDemand::topology(n).unwrap())
}

/// `total_gib` GiB over `gpus` GPUs, optionally with a compute percent.
pub fn share(total_gib: u64, gpus: u64, percent: Option<u32>) -> PodRequest {
    pod(GpuDemand::share(total_gib, gpus, percent).unwrap())
}

/// A container request.
pub fn container(name: &str, demand: GpuDemand) -> ContainerRequest {
    ContainerRequest {
        name: name.to_owned(),
        gpu: demand,
    }
}

/// GPU indices each app container got, in container order.
pub fn app_gpus(allocation: &PodAllocation) -> Vec<Vec<u16>> {
    allocation
        .containers
        .iter()
        .map(|c| c.gpus.iter().map(|g| g.gpu.0).collect())
        .collect()
}

/// `(profile, count)` pairs as MIG slices.
pub fn mig(slices: &[(&str, u32)]) -> Vec<MigSlices> {
    slices
        .iter()
        .map(|&(profile, count)| MigSlices::new(MigProfile::parse(profile).unwrap(), count))
        .collect()
}

/// A node of `whole` exclusive A100s advertising the MIG slices `pools`, with other pods
/// holding the slices `held` (one pod per entry).
pub fn mig_node(whole: u16, pools: &[(&str, u32)], held: &[(&str, u32)]) -> NodeState {
    let spec = uniform(GpuMode::Exclusive, whole, "A100", 80).with_mig(mig(pools));
    let mut node = NodeState::new(spec);
    for entry in held {
        let mut other = PodAllocation::host_only(node.spec.name.clone(), CpuMilli(0), MemMiB(0));
        other.mig = mig(std::slice::from_ref(entry));
        node.add(&other);
    }
    node
}

/// A pod asking for the MIG slices `slices` and `whole` whole GPUs.
pub fn mig_pod(whole_gpus: u64, slices: &[(&str, u32)]) -> PodRequest {
    pod(GpuDemand::whole(whole_gpus).unwrap()).with_mig(mig(slices))
}
