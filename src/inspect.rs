//! The inspection report: per node and per GPU, what is allocated out of what, and which pods
//! hold it, in the shape `kubectl inspect cgpu` users expect. Built from a table snapshot; shared
//! by the `/inspect` endpoint and the `inspect` command.

use serde::{Deserialize, Serialize};

use crate::engine::{NodeState, Table, WHOLE_GPU_COMPUTE};

/// The whole cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterReport {
    pub nodes: Vec<NodeReport>,
    pub totals: Totals,
}

/// Cluster-wide sums.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    pub gpus: u64,
    pub gpu_memory_mib: u64,
    pub gpu_memory_allocated_mib: u64,
    /// Whole GPUs' worth of compute allocated (milli-GPU / 1000).
    pub gpu_compute_allocated: f64,
    pub idle_gpus: u64,
    /// GPU nodes with nothing allocated on any GPU: what a cluster-autoscaler could remove.
    pub idle_gpu_nodes: u64,
}

/// One node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    pub name: String,
    pub mode: String,
    pub placement: String,
    pub gpus: Vec<GpuReport>,
    pub pods: usize,
}

/// One GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuReport {
    pub index: u16,
    pub uuid: Option<String>,
    pub model: String,
    pub healthy: bool,
    pub memory_mib: u64,
    pub memory_allocated_mib: u64,
    /// Compute allocated in milli-GPU (1000 = the whole card).
    pub compute_allocated_milli: u32,
    pub whole: bool,
    /// `namespace/name` of each pod holding part or all of this GPU.
    pub pods: Vec<String>,
}

/// The report for every node of the table, sorted by node name.
pub fn report(table: &Table) -> ClusterReport {
    let mut nodes: Vec<NodeReport> = table.nodes().map(|node| node_report(table, node)).collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let mut totals = Totals::default();
    for node in &nodes {
        let mut node_idle = !node.gpus.is_empty();
        for gpu in &node.gpus {
            totals.gpus += 1;
            totals.gpu_memory_mib += gpu.memory_mib;
            let memory_allocated = if gpu.whole {
                gpu.memory_mib
            } else {
                gpu.memory_allocated_mib
            };
            totals.gpu_memory_allocated_mib += memory_allocated;
            totals.gpu_compute_allocated += f64::from(gpu.compute_allocated_milli) / 1000.0;
            let idle = gpu.pods.is_empty();
            totals.idle_gpus += u64::from(idle);
            node_idle &= idle;
        }
        totals.idle_gpu_nodes += u64::from(node_idle);
    }
    ClusterReport { nodes, totals }
}

fn node_report(table: &Table, node: &NodeState) -> NodeReport {
    let mut gpus: Vec<GpuReport> = node
        .spec
        .gpus
        .iter()
        .zip(&node.gpus)
        .map(|(gpu, usage)| GpuReport {
            index: gpu.index.0,
            uuid: gpu.uuid.clone(),
            model: gpu.model.clone(),
            healthy: gpu.healthy,
            memory_mib: gpu.memory.0,
            memory_allocated_mib: usage.mem.0,
            compute_allocated_milli: if usage.is_whole() {
                WHOLE_GPU_COMPUTE.0
            } else {
                usage.compute.0
            },
            whole: usage.is_whole(),
            pods: Vec::new(),
        })
        .collect();
    let mut pods = 0;
    for (key, entry) in table.pods_on(&node.spec.name) {
        pods += 1;
        for hold in entry.allocation.footprint() {
            if let Some(gpu) = gpus.iter_mut().find(|g| g.index == hold.gpu.0) {
                gpu.pods.push(key.to_string());
            }
        }
    }
    for gpu in &mut gpus {
        gpu.pods.sort();
    }
    NodeReport {
        name: node.spec.name.to_string(),
        mode: node.spec.mode.as_str().to_owned(),
        placement: node.spec.placement.as_str().to_owned(),
        gpus,
        pods,
    }
}
