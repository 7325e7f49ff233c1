//! The inventory vocabulary: units, GPUs, links between them and node specs. Plain values only.

use std::fmt;
use std::sync::Arc;

// The link matrix and the mask width live with the topology index built from them, so that the
// index needs nothing from here; they are part of the model all the same.
use super::mig::{MigSlices, normalized};
use super::topology::TopologyIndex;
pub use super::topology::{Link, LinkMatrix, MAX_GPUS_PER_NODE};

/// GPU or host memory in MiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MemMiB(pub u64);

/// CPU in milli-cores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CpuMilli(pub u64);

/// A share of one GPU's compute in thousandths: 1000 is the whole card. Percent requests are
/// stored ×10 so that the simulator's `gpu_milli` and the product's `gpu-core.percentage` share
/// one unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ComputeMilli(pub u32);

/// The compute of a whole GPU.
pub const WHOLE_GPU_COMPUTE: ComputeMilli = ComputeMilli(1000);

/// A GPU's index on its node (the device plugin's index, 0-based).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GpuIndex(pub u16);

/// A node's name, cheap to clone.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeName(pub Arc<str>);

impl NodeName {
    /// Makes a node name from anything string-like.
    pub fn new(name: impl AsRef<str>) -> Self {
        Self(Arc::from(name.as_ref()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

// Lets the table look nodes up by `&str` without building an `Arc` per lookup: `Arc<str>` hashes
// and compares exactly as the `str` it holds, as `Borrow` requires.
impl std::borrow::Borrow<str> for NodeName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `namespace/name` of a pod, the table's key for allocations.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodKey(pub Arc<str>);

impl PodKey {
    /// Makes the key from a namespace and a name.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self(Arc::from(format!("{namespace}/{name}")))
    }

    /// The key as `namespace/name`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who holds GPUs outside the pods the table places (a Dynamic Resource Allocation claim, say,
/// as `dra:namespace/name`): the table keeps such holds apart from pods, so that no pod is
/// placed on them and views can name the holder. Cheap to clone.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HolderKey(pub Arc<str>);

impl HolderKey {
    /// Makes a holder key from anything string-like.
    pub fn new(name: impl AsRef<str>) -> Self {
        Self(Arc::from(name.as_ref()))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for HolderKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a node shares its GPUs (the `ack.node.gpu.schedule` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuMode {
    /// Whole GPUs only (`nvidia.com/gpu`); label absent or `default`.
    Exclusive,
    /// Sharing by GPU memory (`cgpu`, `share`, `mps`).
    ShareMemory,
    /// Sharing by GPU memory and compute percentage (`core_mem`).
    CoreMem,
    /// Whole GPUs chosen by interconnect (`topology`).
    Topology,
}

impl GpuMode {
    /// The canonical label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exclusive => "default",
            Self::ShareMemory => "share",
            Self::CoreMem => "core_mem",
            Self::Topology => "topology",
        }
    }
}

/// Where shares go on a multi-GPU node (the `ack.node.gpu.placement` label).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GpuPlacement {
    /// Fill one GPU before the next.
    #[default]
    Binpack,
    /// Spread pods across GPUs.
    Spread,
}

impl GpuPlacement {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Binpack => "binpack",
            Self::Spread => "spread",
        }
    }
}

/// One GPU as the node reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    pub index: GpuIndex,
    pub uuid: Option<String>,
    pub model: String,
    pub memory: MemMiB,
    pub numa: Option<u16>,
    pub healthy: bool,
}

impl Gpu {
    /// A healthy GPU with no UUID or NUMA detail.
    pub fn new(index: u16, model: &str, memory: MemMiB) -> Self {
        Self {
            index: GpuIndex(index),
            uuid: None,
            model: model.to_owned(),
            memory,
            numa: None,
            healthy: true,
        }
    }
}

/// Everything the engine needs to know about a node, as the watchers translate it.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub name: NodeName,
    pub cpu: CpuMilli,
    pub memory: MemMiB,
    pub max_pods: u32,
    pub mode: GpuMode,
    pub placement: GpuPlacement,
    pub gpus: Vec<Gpu>,
    pub links: LinkMatrix,
    /// The interconnect groups, derived from `links` once per node.
    pub topology: Arc<TopologyIndex>,
    /// MIG slices the node's device plugin advertises, by profile (normalized): cards in MIG
    /// mode, offered as slices rather than whole (they are not among `gpus`, or are there
    /// unhealthy).
    pub mig: Vec<MigSlices>,
}

impl NodeSpec {
    /// A node of `count` identical, uniformly connected GPUs: the usual case without per-GPU detail.
    pub fn uniform(
        name: &str,
        mode: GpuMode,
        count: u16,
        model: &str,
        memory_per_gpu: MemMiB,
    ) -> Self {
        let gpus = (0..count)
            .map(|index| Gpu::new(index, model, memory_per_gpu))
            .collect();
        Self::with_gpus(name, mode, gpus, LinkMatrix::uniform(usize::from(count)))
    }

    /// A node from an explicit GPU list and link matrix; CPU and memory default to "plenty" and
    /// are usually set right after with [`NodeSpec::with_host`].
    pub fn with_gpus(name: &str, mode: GpuMode, gpus: Vec<Gpu>, links: LinkMatrix) -> Self {
        let topology = Arc::new(TopologyIndex::build(&links));
        Self {
            name: NodeName::new(name),
            cpu: CpuMilli(u64::MAX / 4),
            memory: MemMiB(u64::MAX / 4),
            max_pods: u32::MAX,
            mode,
            placement: GpuPlacement::Binpack,
            gpus,
            links,
            topology,
            mig: Vec::new(),
        }
    }

    /// Sets the node's allocatable CPU, memory and pod count.
    pub fn with_host(mut self, cpu: CpuMilli, memory: MemMiB, max_pods: u32) -> Self {
        self.cpu = cpu;
        self.memory = memory;
        self.max_pods = max_pods;
        self
    }

    /// Sets the GPU placement for shares.
    pub fn with_placement(mut self, placement: GpuPlacement) -> Self {
        self.placement = placement;
        self
    }

    /// Sets the MIG slices the node advertises (normalized here).
    pub fn with_mig(mut self, pools: Vec<MigSlices>) -> Self {
        self.mig = normalized(pools);
        self
    }

    /// Replaces the link matrix (and the topology index derived from it).
    pub fn with_links(mut self, links: LinkMatrix) -> Self {
        self.topology = Arc::new(TopologyIndex::build(&links));
        self.links = links;
        self
    }

    /// The position of the GPU with this index in `gpus`.
    pub fn position_of(&self, index: GpuIndex) -> Option<usize> {
        self.gpus.iter().position(|gpu| gpu.index == index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvlink_outranks_every_pcie_path() {
        assert!(Link::NvLink(1).rank() > Link::SameSwitch.rank());
        assert!(Link::SameSwitch.rank() > Link::HostBridge.rank());
        assert!(Link::HostBridge.rank() > Link::CrossSocket.rank());
    }

    #[test]
    fn link_matrix_is_symmetric() {
        let matrix = LinkMatrix::from_fn(3, |a, b| {
            if a + b == 1 {
                Link::NvLink(2)
            } else {
                Link::CrossSocket
            }
        });
        assert_eq!(matrix.get(0, 1), Link::NvLink(2));
        assert_eq!(matrix.get(1, 0), Link::NvLink(2));
        assert_eq!(matrix.get(2, 0), Link::CrossSocket);
        assert_eq!(
            matrix.get(5, 0),
            Link::CrossSocket,
            "out of range reads as the worst link"
        );
    }
}
