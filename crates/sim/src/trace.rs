//! The simulator's input: a cluster (nodes) and a workload (pods) in the reference's units, and
//! their translation into engine values. Owns no parsing (see `load`) and no replay.

use gpu_engine::{
    CpuMilli, GpuConstraints, GpuDemand, GpuMode, MemMiB, ModelPattern, NodeSpec, PodRequest,
    WHOLE_GPU_COMPUTE,
};

use crate::reference::PodShape;

/// The reference gives every node `pods: 1001`.
pub const MAX_PODS_PER_NODE: u32 = 1001;

/// One node of a simulated cluster: whole GPUs of one model, CPU and memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimNode {
    pub name: String,
    pub cpu: CpuMilli,
    pub memory: MemMiB,
    pub gpus: u16,
    /// The GPU card model (the `alibabacloud.com/gpu-card-model` label).
    pub model: String,
}

impl SimNode {
    /// The engine's view of the node. GPUs share compute in milli-GPU (`core_mem`); GPU memory
    /// is not modelled, as in the reference, so the GPUs report none and shares ask for none.
    pub fn spec(&self) -> NodeSpec {
        NodeSpec::uniform(
            &self.name,
            GpuMode::CoreMem,
            self.gpus,
            &self.model,
            MemMiB(0),
        )
        .with_host(self.cpu, self.memory, MAX_PODS_PER_NODE)
    }

    /// GPU capacity in milli-GPU.
    pub fn gpu_milli(&self) -> u64 {
        u64::from(self.gpus) * u64::from(WHOLE_GPU_COMPUTE.0)
    }
}

/// One pod of a workload, as a trace row describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimPod {
    pub name: String,
    pub cpu: CpuMilli,
    pub memory: MemMiB,
    /// GPUs asked for; 0 for a CPU-only pod.
    pub gpus: u16,
    /// Milli-GPU on each of those GPUs (1000 = whole GPUs), already clipped to 0..=1000.
    pub milli: u32,
    /// Acceptable GPU models as written (`|`-separated; empty = any): the typical-pod key.
    pub gpu_spec: String,
    /// The same list, parsed.
    pub models: Vec<ModelPattern>,
    /// When the trace created and deleted the pod (its `creation_time`, `deletion_time`,
    /// seconds), where it gives both: what `simulate --departures` replays.
    pub lifetime: Option<Lifetime>,
}

/// A pod's creation and deletion time in a trace (seconds; deletion ≥ creation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    pub created: u64,
    pub deleted: u64,
}

impl SimPod {
    /// What the reference scores see of the pod.
    pub fn shape(&self) -> PodShape {
        PodShape::new(self.cpu, self.gpus, self.milli)
    }

    /// The pod's kind in the summary's rejection counts.
    pub fn kind(&self) -> super::metrics::PodKind {
        super::metrics::PodKind::of(self.gpus, self.milli, !self.models.is_empty())
    }

    /// Total milli-GPU requested (`num_gpu × gpu_milli`), the unit of arrival and inflation.
    pub fn gpu_total(&self) -> u64 {
        self.shape().gpu_total()
    }

    /// The engine request: a compute share of one GPU for a sharing pod, whole GPUs otherwise,
    /// limited to the listed models.
    pub fn request(&self) -> PodRequest {
        let shape = self.shape();
        let demand = if shape.gpus == 0 {
            GpuDemand::None
        } else if shape.milli >= WHOLE_GPU_COMPUTE.0 {
            GpuDemand::Whole { count: shape.gpus }
        } else {
            GpuDemand::Share {
                gpus: shape.gpus,
                mem_per_gpu: MemMiB(0),
                compute_per_gpu: gpu_engine::ComputeMilli(shape.milli),
            }
        };
        // The model list constrains GPU pods only: the reference skips its GPU filter otherwise.
        let include_models = if shape.gpus == 0 {
            Vec::new()
        } else {
            self.models.clone()
        };
        PodRequest::single(self.cpu, self.memory, demand).with_constraints(GpuConstraints {
            include_models,
            ..GpuConstraints::default()
        })
    }
}

/// A cluster: nodes sorted by name (the reference's node order before its random renaming).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cluster {
    pub name: String,
    nodes: Vec<SimNode>,
}

impl Cluster {
    /// A cluster from nodes in any order.
    pub fn new(name: impl Into<String>, mut nodes: Vec<SimNode>) -> Self {
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        Self {
            name: name.into(),
            nodes,
        }
    }

    /// The nodes, sorted by name.
    pub fn nodes(&self) -> &[SimNode] {
        &self.nodes
    }

    /// Total GPU capacity in milli-GPU: the 100% of arrival and allocation ratios.
    pub fn gpu_milli(&self) -> u64 {
        self.nodes.iter().map(SimNode::gpu_milli).sum()
    }

    /// Total number of GPUs.
    pub fn gpu_count(&self) -> u64 {
        self.nodes.iter().map(|n| u64::from(n.gpus)).sum()
    }
}

/// A workload: pods sorted by name (the order the reference shuffles from).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub name: String,
    pods: Vec<SimPod>,
}

impl Workload {
    /// A workload from pods in any order; equal names keep their given order.
    pub fn new(name: impl Into<String>, mut pods: Vec<SimPod>) -> Self {
        pods.sort_by(|a, b| a.name.cmp(&b.name));
        Self {
            name: name.into(),
            pods,
        }
    }

    /// The pods, sorted by name.
    pub fn pods(&self) -> &[SimPod] {
        &self.pods
    }

    /// Total GPU demand in milli-GPU.
    pub fn gpu_milli(&self) -> u64 {
        self.pods.iter().map(SimPod::gpu_total).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(gpus: u16, milli: u32, spec: &str) -> SimPod {
        SimPod {
            name: "p".into(),
            cpu: CpuMilli(1000),
            memory: MemMiB(100),
            gpus,
            milli,
            gpu_spec: spec.into(),
            models: crate::load::model_list(spec).unwrap(),
            lifetime: None,
        }
    }

    #[test]
    fn requests_follow_the_reference_pod_kinds() {
        assert!(matches!(
            pod(1, 460, "").request().primary_demand(),
            GpuDemand::Share {
                gpus: 1,
                compute_per_gpu: gpu_engine::ComputeMilli(460),
                ..
            }
        ));
        assert_eq!(
            pod(1, 1000, "").request().primary_demand(),
            GpuDemand::Whole { count: 1 }
        );
        assert_eq!(
            pod(8, 1000, "").request().primary_demand(),
            GpuDemand::Whole { count: 8 }
        );
        assert_eq!(pod(0, 0, "T4").request().primary_demand(), GpuDemand::None);
        assert!(
            pod(0, 0, "T4")
                .request()
                .constraints
                .include_models
                .is_empty()
        );
        assert_eq!(pod(1, 0, "").gpu_total(), 0, "gpu-milli 0 asks for no GPU");
        assert_eq!(
            pod(1, 500, "T4|P100")
                .request()
                .constraints
                .include_models
                .len(),
            2
        );
    }
}
