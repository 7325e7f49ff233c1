//! The allocation record (`gpu-extender.io/allocation`, docs/annotations.md), decoded here
//! independently of the extender's own code, and the checks built on it: every bound pod's record
//! matches what the pod asked for, and no GPU anywhere is over-committed.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result, anyhow, bail, ensure};
use k8s_openapi::api::core::v1::{Container, Pod};
use serde::Deserialize;

use crate::objects::{
    GPU_CORE, GPU_COUNT, GPU_MEM, GpuNode, Mode, NVIDIA_GPU, TOPOLOGY_GPU, node_of,
};

/// The record's annotation key.
pub const ALLOCATION: &str = "gpu-extender.io/allocation";
/// At most this many pods on one shared GPU (the default `policy.maxPodsPerSharedGpu`).
pub const MAX_SHARES_PER_GPU: usize = 20;

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Record {
    pub version: u32,
    pub node: String,
    pub pod_uid: String,
    pub containers: Vec<ContainerRecord>,
    #[serde(default)]
    pub init_containers: Vec<ContainerRecord>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerRecord {
    pub name: String,
    pub gpus: Vec<GpuRecord>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuRecord {
    pub index: u16,
    #[serde(default)]
    pub uuid: Option<String>,
    #[serde(default)]
    pub whole: bool,
    #[serde(default, rename = "memoryMiB")]
    pub memory_mib: u64,
    #[serde(default, rename = "computeMilli")]
    pub compute_milli: u32,
}

impl Record {
    /// The GPU indices of the named app container, in record order.
    pub fn gpus_of(&self, container: &str) -> Vec<u16> {
        self.containers
            .iter()
            .filter(|c| c.name == container)
            .flat_map(|c| c.gpus.iter().map(|g| g.index))
            .collect()
    }

    /// Every GPU index the pod touches (app and init containers), sorted, deduplicated.
    pub fn all_gpus(&self) -> Vec<u16> {
        let set: BTreeSet<u16> = self
            .containers
            .iter()
            .chain(&self.init_containers)
            .flat_map(|c| c.gpus.iter().map(|g| g.index))
            .collect();
        set.into_iter().collect()
    }

    /// What the pod holds on each GPU: app containers summed, each init container on its own,
    /// the larger of the two per GPU (Kubernetes' init-container rule, per GPU).
    pub fn footprint(&self) -> BTreeMap<u16, Hold> {
        let mut apps: BTreeMap<u16, Hold> = BTreeMap::new();
        for gpu in self.containers.iter().flat_map(|c| &c.gpus) {
            apps.entry(gpu.index).or_default().add(gpu);
        }
        for init in &self.init_containers {
            let mut alone: BTreeMap<u16, Hold> = BTreeMap::new();
            for gpu in &init.gpus {
                alone.entry(gpu.index).or_default().add(gpu);
            }
            for (index, hold) in alone {
                let entry = apps.entry(index).or_default();
                entry.whole |= hold.whole;
                entry.mem = entry.mem.max(hold.mem);
                entry.compute = entry.compute.max(hold.compute);
            }
        }
        apps
    }
}

/// One pod's hold on one GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hold {
    pub whole: bool,
    pub mem: u64,
    pub compute: u32,
}

impl Hold {
    fn add(&mut self, gpu: &GpuRecord) {
        self.whole |= gpu.whole;
        self.mem += gpu.memory_mib;
        self.compute += gpu.compute_milli;
    }
}

/// The pod's record, decoded; fails if it is missing or malformed, or if its node or UID is not
/// the pod's.
pub fn record_of(pod: &Pod) -> Result<Record> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let raw = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ALLOCATION))
        .ok_or_else(|| anyhow!("pod {name} has no {ALLOCATION} annotation"))?;
    let record: Record = serde_json::from_str(raw)
        .with_context(|| format!("pod {name}: record {raw} is not valid"))?;
    ensure!(
        record.version == 1,
        "pod {name}: record version {}",
        record.version
    );
    ensure!(
        Some(record.node.as_str()) == node_of(pod),
        "pod {name}: record names node {} but the pod is bound to {:?}",
        record.node,
        node_of(pod)
    );
    ensure!(
        Some(record.pod_uid.as_str()) == pod.metadata.uid.as_deref(),
        "pod {name}: record UID {} is not the pod's {:?}",
        record.pod_uid,
        pod.metadata.uid
    );
    Ok(record)
}

/// A whole-number resource amount of a container (requests, else limits); 0 when absent.
fn amount(container: &Container, resource: &str) -> u64 {
    let resources = container.resources.as_ref();
    let quantity = resources
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get(resource))
        .or_else(|| {
            resources
                .and_then(|r| r.limits.as_ref())
                .and_then(|l| l.get(resource))
        });
    quantity.and_then(|q| q.0.parse().ok()).unwrap_or(0)
}

/// Whether any container of the pod asks for a GPU resource.
pub fn wants_gpu(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| {
            [NVIDIA_GPU, GPU_MEM, GPU_CORE, TOPOLOGY_GPU]
                .iter()
                .any(|r| amount(c, r) > 0)
        })
}

/// Checks that the record gives each container exactly what it asked for, on a node of the
/// right mode: n distinct whole GPUs for `nvidia.com/gpu` / `aliyun.com/gpu`, and for shares
/// G/M GiB (and P % compute) on each of M distinct GPUs.
pub fn check_matches_request(pod: &Pod, record: &Record, node: &GpuNode) -> Result<()> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let spec = pod
        .spec
        .as_ref()
        .ok_or_else(|| anyhow!("pod {name} has no spec"))?;
    let split: u64 = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(GPU_COUNT))
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let no_init = Vec::new();
    let pairs = [
        (&spec.containers, &record.containers, "container"),
        (
            spec.init_containers.as_ref().unwrap_or(&no_init),
            &record.init_containers,
            "init container",
        ),
    ];
    for (containers, records, kind) in pairs {
        for container in containers.iter() {
            let got: Vec<&GpuRecord> = records
                .iter()
                .filter(|r| r.name == container.name)
                .flat_map(|r| &r.gpus)
                .collect();
            let what = format!("pod {name} {kind} {}", container.name);
            let distinct: BTreeSet<u16> = got.iter().map(|g| g.index).collect();
            ensure!(
                distinct.len() == got.len(),
                "{what}: a GPU listed twice: {got:?}"
            );
            for gpu in &got {
                ensure!(
                    gpu.index < node.gpus,
                    "{what}: GPU {} does not exist on {} ({} GPUs)",
                    gpu.index,
                    node.name,
                    node.gpus
                );
            }
            let whole = amount(container, NVIDIA_GPU);
            let topo = amount(container, TOPOLOGY_GPU);
            let mem = amount(container, GPU_MEM);
            let core = amount(container, GPU_CORE);
            if whole > 0 || topo > 0 {
                let mode_ok = if topo > 0 {
                    node.mode == Mode::Topology
                } else {
                    true
                };
                ensure!(mode_ok, "{what}: topology GPUs on a {:?} node", node.mode);
                ensure!(
                    got.len() as u64 == whole + topo && got.iter().all(|g| g.whole),
                    "{what}: asked {} whole GPUs, record gives {got:?}",
                    whole + topo
                );
            } else if mem > 0 {
                ensure!(
                    matches!(node.mode, Mode::Share | Mode::CoreMem),
                    "{what}: a share on a {:?} node",
                    node.mode
                );
                ensure!(
                    got.len() as u64 == split,
                    "{what}: asked a share over {split} GPUs, record gives {got:?}"
                );
                for gpu in &got {
                    ensure!(
                        !gpu.whole
                            && gpu.memory_mib == mem / split * 1024
                            && u64::from(gpu.compute_milli) == core * 10,
                        "{what}: asked {mem} GiB over {split} GPUs with {core}% compute, record \
                         gives {gpu:?}"
                    );
                }
                if core > 0 {
                    ensure!(
                        node.mode == Mode::CoreMem,
                        "{what}: compute share on a {:?} node",
                        node.mode
                    );
                }
            } else {
                ensure!(got.is_empty(), "{what}: asked no GPU, record gives {got:?}");
            }
        }
    }
    for container in record.containers.iter().chain(&record.init_containers) {
        let known = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .any(|c| c.name == container.name);
        ensure!(
            known,
            "pod {name}: record names unknown container {}",
            container.name
        );
    }
    Ok(())
}

/// Per node and GPU: who holds it and how much, summed over pods.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuUse {
    pub whole: Vec<String>,
    pub shares: Vec<String>,
    pub mem: u64,
    pub compute: u32,
}

/// The cluster's GPU use according to the bound pods' records: (node, GPU index) → use.
pub type Usage = BTreeMap<(String, u16), GpuUse>;

/// Decodes every bound GPU pod's record, checks it against the pod's request, adds up every
/// GPU's use and checks that nothing is over-committed: a whole GPU has one holder and no share;
/// shares stay within the GPU's memory, 100 % compute and the per-GPU pod limit; unhealthy GPUs
/// (`unhealthy`: node → indices) hold nothing.
pub fn check_cluster(
    nodes: &[GpuNode],
    pods: &[Pod],
    unhealthy: &BTreeMap<String, Vec<u16>>,
) -> Result<Usage> {
    let by_name: BTreeMap<&str, &GpuNode> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let mut usage = Usage::new();
    for pod in pods {
        let Some(node_name) = node_of(pod) else {
            continue;
        };
        if !wants_gpu(pod) || is_finished(pod) {
            continue;
        }
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let node = by_name
            .get(node_name)
            .ok_or_else(|| anyhow!("pod {name} bound to unknown node {node_name}"))?;
        let record = record_of(pod)?;
        check_matches_request(pod, &record, node)?;
        for (index, hold) in record.footprint() {
            let entry = usage.entry((node_name.to_owned(), index)).or_default();
            if hold.whole {
                entry.whole.push(name.to_owned());
            } else {
                entry.shares.push(name.to_owned());
                entry.mem += hold.mem;
                entry.compute += hold.compute;
            }
        }
    }
    for ((node_name, index), gpu) in &usage {
        let node = by_name
            .get(node_name.as_str())
            .ok_or_else(|| anyhow!("unknown node {node_name}"))?;
        let at = format!("{node_name} GPU {index}");
        if unhealthy
            .get(node_name)
            .is_some_and(|list| list.contains(index))
        {
            bail!(
                "{at} is unhealthy but given to {:?} {:?}",
                gpu.whole,
                gpu.shares
            );
        }
        ensure!(
            gpu.whole.len() <= 1,
            "{at} held whole by several pods: {:?}",
            gpu.whole
        );
        ensure!(
            gpu.whole.is_empty() || gpu.shares.is_empty(),
            "{at} held whole by {:?} and shared by {:?}",
            gpu.whole,
            gpu.shares
        );
        ensure!(
            gpu.mem <= node.mem_mib(),
            "{at} over-committed: {} MiB of {} MiB given to {:?}",
            gpu.mem,
            node.mem_mib(),
            gpu.shares
        );
        ensure!(
            gpu.compute <= 1000,
            "{at} compute over-committed: {} milli to {:?}",
            gpu.compute,
            gpu.shares
        );
        ensure!(
            gpu.shares.len() <= MAX_SHARES_PER_GPU,
            "{at} shared by {} pods (limit {MAX_SHARES_PER_GPU})",
            gpu.shares.len()
        );
    }
    Ok(usage)
}

/// Whether the pod has finished (its GPUs are free again).
pub fn is_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The `gpu-extender.io/gpus` annotation for an `n`-GPU node whose GPUs form NVLink islands of
/// `island` GPUs (`NV12` inside an island, `SYS` across); GPUs listed in `unhealthy` are marked so.
pub fn gpus_annotation(
    n: u16,
    island: u16,
    model: &str,
    mem_mib: u64,
    unhealthy: &[u16],
) -> String {
    let gpus: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({
                "index": i,
                "uuid": format!("GPU-e2e-{i:04}"),
                "model": model,
                "memoryMiB": mem_mib,
                "numa": i / island,
                "healthy": !unhealthy.contains(&i),
            })
        })
        .collect();
    let links: Vec<Vec<String>> = (0..n)
        .map(|i| {
            (0..n)
                .map(|j| {
                    if i == j {
                        "X".to_owned()
                    } else if i / island == j / island {
                        "NV12".to_owned()
                    } else {
                        "SYS".to_owned()
                    }
                })
                .collect()
        })
        .collect();
    serde_json::json!({ "version": 1, "gpus": gpus, "links": links }).to_string()
}

/// Checks the extender's `/inspect` report against the use computed from the records: on every
/// GPU, the same holders, and for shares the same memory and compute.
pub fn check_inspect(report: &serde_json::Value, usage: &Usage) -> Result<()> {
    let nodes = report["nodes"]
        .as_array()
        .ok_or_else(|| anyhow!("/inspect has no nodes: {report}"))?;
    let mut seen = BTreeSet::new();
    for node in nodes {
        let node_name = node["name"].as_str().unwrap_or_default();
        for gpu in node["gpus"].as_array().into_iter().flatten() {
            let index = gpu["index"].as_u64().unwrap_or(u64::MAX) as u16;
            let at = format!("{node_name} GPU {index}");
            let empty = GpuUse::default();
            let want = usage.get(&(node_name.to_owned(), index)).unwrap_or(&empty);
            seen.insert((node_name.to_owned(), index));
            let holders: BTreeSet<String> = gpu["pods"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p.as_str())
                .map(|p| p.rsplit('/').next().unwrap_or(p).to_owned())
                .collect();
            let want_holders: BTreeSet<String> =
                want.whole.iter().chain(&want.shares).cloned().collect();
            ensure!(
                holders == want_holders,
                "{at}: the extender says {holders:?} hold it, the records say {want_holders:?}"
            );
            let whole = gpu["whole"].as_bool().unwrap_or(false);
            ensure!(
                whole != want.whole.is_empty(),
                "{at}: the extender says whole={whole}, the records say {:?}",
                want.whole
            );
            if !whole {
                let mem = gpu["memoryAllocatedMib"].as_u64().unwrap_or(u64::MAX);
                let compute = gpu["computeAllocatedMilli"].as_u64().unwrap_or(u64::MAX);
                ensure!(
                    mem == want.mem && compute == u64::from(want.compute),
                    "{at}: the extender has {mem} MiB / {compute} milli allocated, the records \
                     {} MiB / {} milli",
                    want.mem,
                    want.compute
                );
            }
        }
    }
    for key in usage.keys() {
        ensure!(
            seen.contains(key),
            "{} GPU {} is used by pods but missing from /inspect",
            key.0,
            key.1
        );
    }
    Ok(())
}
