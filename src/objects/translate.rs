//! Wire to domain: Kubernetes Nodes and Pods into engine values. The sole owner of label,
//! annotation and quantity parsing; pure functions of an object and the [`Config`], no I/O.
//! Formats are documented in `docs/annotations.md`.
//!
//! Errors here are shown to users (a pod's FailedScheduling event, the logs for a node), so they
//! say which container, resource, label or annotation is wrong and what would be valid.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as WireQuantity;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::quantity::{Quantity, QuantityError};
use crate::config::{Config, Sharing};
use gpu_engine::{
    ContainerRequest, CpuMilli, Gpu, GpuConstraints, GpuDemand, GpuIndex, GpuMode, GpuPlacement,
    Link, LinkMatrix, MemMiB, ModelPattern, NodeSpec, PodKey, PodRequest, RequestError,
    TopologyPreference,
};

/// The most GPUs one node may have (the engine's GPU sets are 64-bit masks).
const MAX_GPUS: u64 = 64;

/// The model name used when no label, GFD label or annotation names one.
pub const UNKNOWN_MODEL: &str = "unknown";

/// Why an object cannot be translated, in words for the pod's owner or the cluster admin.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum TranslateError {
    #[error("container {container}: {resource} quantity {value:?} {problem}")]
    Quantity {
        container: String,
        resource: String,
        value: String,
        problem: QuantityError,
    },
    #[error(
        "container {container}: {resource} is counted in {unit}; write a plain number such as {example}, not {value:?}"
    )]
    GpuMemoryUnit {
        container: String,
        resource: String,
        value: String,
        unit: &'static str,
        example: u32,
    },
    #[error("container {container}: {resource} is not supported; {instead}")]
    Unsupported {
        container: String,
        resource: String,
        instead: String,
    },
    #[error("container {container}: {source}")]
    Request {
        container: String,
        #[source]
        source: RequestError,
    },
    #[error("pod label {key}={value:?}: {problem}")]
    PodLabel {
        key: String,
        value: String,
        problem: String,
    },
    #[error("pod annotation {key}: {problem}")]
    PodAnnotation { key: String, problem: String },
    #[error(
        "node label {key}={value:?} is not a GPU mode; expected default, cgpu, share, mps, core_mem or topology"
    )]
    UnknownMode { key: String, value: String },
    #[error("node label {key}={value:?}: {problem}")]
    NodeLabel {
        key: String,
        value: String,
        problem: String,
    },
    #[error("node {field} {resource}={value:?}: {problem}")]
    NodeQuantity {
        field: &'static str,
        resource: String,
        value: String,
        problem: QuantityError,
    },
    #[error("node has {0} GPUs; at most 64 are supported, so its GPUs are ignored")]
    TooManyGpus(u64),
    #[error("node annotation {key} is not valid, GPUs are taken from labels instead: {problem}")]
    NodeGpus { key: String, problem: String },
}

impl TranslateError {
    /// Whether the error came from the per-GPU detail annotation (the node then falls back to
    /// its labels and capacity).
    pub fn is_detail_annotation(&self) -> bool {
        matches!(self, Self::NodeGpus { .. })
    }
}

/// A node's translation together with everything that was wrong with it. The spec is always
/// usable: whatever could not be read falls back (detail annotation to labels, labels to
/// capacity, an unreadable mode to no GPUs) so one bad node never stops the watch.
#[derive(Clone, Debug)]
pub struct NodeTranslation {
    pub spec: NodeSpec,
    pub problems: Vec<TranslateError>,
}

/// The `namespace/name` key of a pod.
pub fn pod_key(pod: &Pod) -> PodKey {
    PodKey::new(
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or_default(),
    )
}

// ---------------------------------------------------------------------------------------------
// Nodes
// ---------------------------------------------------------------------------------------------

/// The node as the engine sees it, or the first problem found. Strict: use [`translate_node`]
/// where a node must be usable anyway (the watch).
pub fn node_spec(node: &Node, cfg: &Config) -> Result<NodeSpec, TranslateError> {
    let translation = translate_node(node, cfg);
    match translation.problems.into_iter().next() {
        Some(problem) => Err(problem),
        None => Ok(translation.spec),
    }
}

/// The node as the engine sees it, never failing: problems are listed and the affected part
/// falls back (see [`NodeTranslation`]).
///
/// Sources, first found wins: the mode and placement labels; GPUs from the `nodeGpus`
/// annotation, else `count` identical GPUs with the model, memory and count from the ACK labels,
/// else the GFD labels, else capacity (the mode's GPU resource for the count, the `gpuMem`
/// capacity divided by the count for the memory). Host CPU, memory and pods from allocatable,
/// else capacity. Schedulability and readiness are kube-scheduler's business and ignored here.
pub fn translate_node(node: &Node, cfg: &Config) -> NodeTranslation {
    let mut problems = Vec::new();
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let labels = node.metadata.labels.as_ref();
    let label = |key: &str| label(labels, key);
    let keys = &cfg.node_labels;
    let capacity = node.status.as_ref().and_then(|s| s.capacity.as_ref());
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());

    let mode = match label(&keys.mode) {
        None | Some("") | Some("default") => Some(GpuMode::Exclusive),
        Some("cgpu" | "share" | "mps") => Some(GpuMode::ShareMemory),
        Some("core_mem") => Some(GpuMode::CoreMem),
        Some("topology") => Some(GpuMode::Topology),
        Some(other) => {
            problems.push(TranslateError::UnknownMode {
                key: keys.mode.clone(),
                value: other.to_owned(),
            });
            None
        }
    };
    let placement = match label(&keys.placement) {
        None | Some("") | Some("binpack") => GpuPlacement::Binpack,
        Some("spread") => GpuPlacement::Spread,
        Some(other) => {
            problems.push(TranslateError::NodeLabel {
                key: keys.placement.clone(),
                value: other.to_owned(),
                problem: "expected binpack or spread; using binpack".into(),
            });
            GpuPlacement::Binpack
        }
    };

    let (gpus, links) = match mode {
        // A mode we cannot read: offer no GPUs rather than serve them the wrong way.
        None => (Vec::new(), LinkMatrix::uniform(0)),
        Some(mode) => {
            let mut label_problems = Vec::new();
            let from_labels = label_gpus(mode, labels, capacity, cfg, &mut label_problems);
            let annotation = node
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(&cfg.annotations.node_gpus));
            match annotation.map(|text| parse_node_gpus(text, &from_labels.0)) {
                // Valid detail supersedes the labels, so their problems do not matter.
                Some(Ok(detail)) => detail,
                Some(Err(problem)) => {
                    problems.push(TranslateError::NodeGpus {
                        key: cfg.annotations.node_gpus.clone(),
                        problem,
                    });
                    problems.extend(label_problems);
                    from_labels
                }
                None => {
                    problems.extend(label_problems);
                    from_labels
                }
            }
        }
    };

    let host = allocatable.or(capacity);
    let host_value = |name: &str| host.and_then(|h| h.get(name));
    let mut spec = NodeSpec::with_gpus(name, mode.unwrap_or(GpuMode::Exclusive), gpus, links)
        .with_placement(placement);
    if let Some(cpu) = host_value("cpu") {
        match Quantity::parse(&cpu.0).and_then(|q| q.floor_scaled(1000, 1)) {
            Ok(milli) => spec.cpu = CpuMilli(milli),
            Err(problem) => problems.push(node_quantity("allocatable", "cpu", cpu, problem)),
        }
    }
    if let Some(memory) = host_value("memory") {
        match Quantity::parse(&memory.0).and_then(|q| q.floor_scaled(1, 1 << 20)) {
            Ok(mib) => spec.memory = MemMiB(mib),
            Err(problem) => problems.push(node_quantity("allocatable", "memory", memory, problem)),
        }
    }
    if let Some(pods) = host_value("pods") {
        match Quantity::parse(&pods.0).and_then(|q| q.whole()) {
            Ok(count) => spec.max_pods = u32::try_from(count).unwrap_or(u32::MAX),
            Err(problem) => problems.push(node_quantity("allocatable", "pods", pods, problem)),
        }
    }
    NodeTranslation { spec, problems }
}

fn label<'a>(labels: Option<&'a BTreeMap<String, String>>, key: &str) -> Option<&'a str> {
    labels.and_then(|l| l.get(key)).map(|v| v.trim())
}

fn node_quantity(
    field: &'static str,
    resource: &str,
    value: &WireQuantity,
    problem: QuantityError,
) -> TranslateError {
    TranslateError::NodeQuantity {
        field,
        resource: resource.to_owned(),
        value: value.0.clone(),
        problem,
    }
}

/// Identical, uniformly connected GPUs from labels and capacity.
fn label_gpus(
    mode: GpuMode,
    labels: Option<&BTreeMap<String, String>>,
    capacity: Option<&BTreeMap<String, WireQuantity>>,
    cfg: &Config,
    problems: &mut Vec<TranslateError>,
) -> (Vec<Gpu>, LinkMatrix) {
    let keys = &cfg.node_labels;
    let resources = &cfg.resources;
    let label = |key: &str| label(labels, key);
    let capacity_count = |resource: &str, problems: &mut Vec<TranslateError>| {
        let value = capacity.and_then(|c| c.get(resource))?;
        match Quantity::parse(&value.0).and_then(|q| q.whole()) {
            Ok(count) => Some(count),
            Err(problem) => {
                problems.push(node_quantity("capacity", resource, value, problem));
                None
            }
        }
    };

    let mut count = None;
    for key in [&keys.count, &keys.gfd_count] {
        if count.is_some() {
            break;
        }
        if let Some(value) = label(key) {
            match value.parse::<u64>() {
                Ok(n) => count = Some(n),
                Err(_) => problems.push(TranslateError::NodeLabel {
                    key: key.clone(),
                    value: value.to_owned(),
                    problem: "expected a whole number of GPUs".into(),
                }),
            }
        }
    }
    if count.is_none() {
        // The mode's own resource first: that is what its device plugin advertises.
        let primary = match mode {
            GpuMode::Exclusive => &resources.whole_gpu,
            GpuMode::Topology => &resources.topology_gpu,
            GpuMode::ShareMemory | GpuMode::CoreMem => &resources.gpu_count,
        };
        let others = [
            &resources.whole_gpu,
            &resources.topology_gpu,
            &resources.gpu_count,
        ];
        count = std::iter::once(primary)
            .chain(others)
            .find_map(|resource| capacity_count(resource, problems));
    }
    let count = count.unwrap_or(0);
    if count > MAX_GPUS {
        problems.push(TranslateError::TooManyGpus(count));
        return (Vec::new(), LinkMatrix::uniform(0));
    }

    let model = [&keys.model, &keys.gfd_product]
        .into_iter()
        .find_map(|key| label(key).filter(|v| !v.is_empty()))
        .unwrap_or(UNKNOWN_MODEL);

    let mut memory = None;
    if let Some(value) = label(&keys.memory) {
        match parse_label_memory(value) {
            Some(mib) => memory = Some(mib),
            None => problems.push(TranslateError::NodeLabel {
                key: keys.memory.clone(),
                value: value.to_owned(),
                problem: "expected memory per GPU such as 16160MiB, 32GiB or a number of MiB"
                    .into(),
            }),
        }
    }
    if memory.is_none()
        && let Some(value) = label(&keys.gfd_memory)
    {
        match value.parse::<u64>() {
            Ok(mib) => memory = Some(mib),
            Err(_) => problems.push(TranslateError::NodeLabel {
                key: keys.gfd_memory.clone(),
                value: value.to_owned(),
                problem: "expected a number of MiB".into(),
            }),
        }
    }
    if memory.is_none() && count > 0 {
        // gpushare advertises the node's total GPU memory in GiB.
        memory = capacity_count(&resources.gpu_mem, problems)
            .map(|total_gib| total_gib.saturating_mul(1024) / count);
    }
    let memory = MemMiB(memory.unwrap_or(0));
    let count = count as u16; // at most 64, checked above
    let gpus = (0..count).map(|i| Gpu::new(i, model, memory)).collect();
    (gpus, LinkMatrix::uniform(usize::from(count)))
}

/// `16160MiB`, `16160Mi`, `32GiB`, `32Gi`, `32G` (read as GiB, as ACK writes it), or MiB.
fn parse_label_memory(value: &str) -> Option<u64> {
    let value = value.trim();
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: u64 = number.parse().ok()?;
    match unit.trim() {
        "" | "MiB" | "Mi" | "M" | "MB" => Some(number),
        "GiB" | "Gi" | "G" | "GB" => number.checked_mul(1024),
        _ => None,
    }
}

/// The per-GPU detail annotation `gpu-extender.io/gpus`, read here and written by the node agent
/// (`src/agent`) through the same type. See `docs/annotations.md`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeGpusDoc {
    pub version: u32,
    pub gpus: Vec<NodeGpuDoc>,
    /// `nvidia-smi topo -m` cells, one row and column per entry of `gpus` (see [`link_cell`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub links: Option<Vec<Vec<String>>>,
}

/// One GPU of [`NodeGpusDoc`].
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeGpuDoc {
    pub index: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u16>,
    /// MIG mode enabled: the card is split into GPU instances that the device plugin serves, so
    /// the whole card is never offered (it counts with the unhealthy GPUs).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mig_enabled: bool,
    #[serde(default = "yes")]
    pub healthy: bool,
}

/// The annotation's version this build reads and writes.
pub const NODE_GPUS_VERSION: u32 = 1;

fn yes() -> bool {
    true
}

/// Parses the detail annotation; `defaults` (the label-derived GPUs) fill in a missing model or
/// memory by index.
fn parse_node_gpus(text: &str, defaults: &[Gpu]) -> Result<(Vec<Gpu>, LinkMatrix), String> {
    let doc: NodeGpusDoc = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if doc.version != NODE_GPUS_VERSION {
        return Err(format!(
            "version {} is not supported (expected 1)",
            doc.version
        ));
    }
    let n = doc.gpus.len();
    if n as u64 > MAX_GPUS {
        return Err(format!("{n} GPUs listed; at most 64 are supported"));
    }
    let mut seen = BTreeSet::new();
    let mut gpus = Vec::with_capacity(n);
    for entry in doc.gpus {
        if !seen.insert(entry.index) {
            return Err(format!("GPU index {} is listed twice", entry.index));
        }
        let fallback = defaults.iter().find(|g| g.index == GpuIndex(entry.index));
        let model = entry
            .model
            .filter(|m| !m.trim().is_empty())
            .or_else(|| fallback.map(|g| g.model.clone()))
            .unwrap_or_else(|| UNKNOWN_MODEL.to_owned());
        let memory = entry
            .memory_mib
            .or_else(|| fallback.map(|g| g.memory.0))
            .unwrap_or(0);
        gpus.push(Gpu {
            index: GpuIndex(entry.index),
            uuid: entry.uuid.filter(|u| !u.is_empty()),
            model,
            memory: MemMiB(memory),
            numa: entry.numa,
            healthy: entry.healthy && !entry.mig_enabled,
        });
    }
    let links = match doc.links {
        None => LinkMatrix::uniform(n),
        Some(rows) => {
            if rows.len() != n || rows.iter().any(|row| row.len() != n) {
                return Err(format!(
                    "links must be a {n}x{n} matrix, one row and column per listed GPU"
                ));
            }
            let mut cells = vec![Link::SameSwitch; n * n];
            for (a, row) in rows.iter().enumerate() {
                for (b, cell) in row.iter().enumerate() {
                    let cell = cell.trim();
                    if a == b {
                        if cell != "X" && cell != "-" {
                            return Err(format!("links[{a}][{b}] must be \"X\", got {cell:?}"));
                        }
                        continue;
                    }
                    cells[a * n + b] = parse_link(cell)
                        .ok_or_else(|| format!("links[{a}][{b}]: unknown link {cell:?}; expected NV<n>, PIX, PXB, PHB, NODE or SYS"))?;
                }
            }
            for a in 0..n {
                for b in (a + 1)..n {
                    if cells[a * n + b] != cells[b * n + a] {
                        return Err(format!("links is not symmetric at [{a}][{b}]"));
                    }
                }
            }
            LinkMatrix::from_fn(n, |a, b| cells[a * n + b])
        }
    };
    Ok((gpus, links))
}

/// A link as a `nvidia-smi topo -m` cell, the inverse of [`parse_link`] (`PXB`, `NODE` read
/// back as `PIX`, `PHB`: the engine ranks them alike).
pub fn link_cell(link: Link) -> String {
    match link {
        Link::NvLink(links) => format!("NV{links}"),
        Link::SameSwitch => "PIX".to_owned(),
        Link::HostBridge => "PHB".to_owned(),
        Link::CrossSocket => "SYS".to_owned(),
    }
}

/// `nvidia-smi topo -m` vocabulary.
pub fn parse_link(cell: &str) -> Option<Link> {
    match cell {
        "PIX" | "PXB" => Some(Link::SameSwitch),
        "PHB" | "NODE" => Some(Link::HostBridge),
        "SYS" => Some(Link::CrossSocket),
        _ => {
            let links: u8 = cell.strip_prefix("NV")?.parse().ok()?;
            (links > 0).then_some(Link::NvLink(links))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Pods
// ---------------------------------------------------------------------------------------------

/// What a pod asks of the GPU scheduler, or `None` when no container (app or init) asks for a
/// GPU resource. CPU and memory follow Kubernetes' rules (init containers, sidecars, overhead,
/// pod-level resources); GPU resources must be whole numbers.
///
/// Restartable init containers (sidecars) run for the pod's whole life, so their GPUs are
/// listed with the app containers; ordinary init containers run one at a time and are listed
/// as init containers.
pub fn pod_request(pod: &Pod, cfg: &Config) -> Result<Option<PodRequest>, TranslateError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(None);
    };
    // Only an error when some container actually splits GPU memory.
    let gpu_count = pod_gpu_count(pod, cfg);
    let mut containers = Vec::with_capacity(spec.containers.len());
    let mut init_containers = Vec::new();
    for container in &spec.containers {
        containers.push(container_request(container, &gpu_count, cfg)?);
    }
    for container in spec.init_containers.iter().flatten() {
        let request = container_request(container, &gpu_count, cfg)?;
        if is_sidecar(container) {
            containers.push(request);
        } else {
            init_containers.push(request);
        }
    }
    let wants_gpu = containers
        .iter()
        .chain(&init_containers)
        .any(|c| !c.gpu.is_none());
    if !wants_gpu {
        return Ok(None);
    }
    let (cpu, memory) = pod_host_request(pod)?;
    Ok(Some(PodRequest {
        cpu,
        memory,
        containers,
        init_containers,
        constraints: pod_constraints(pod, cfg)?,
    }))
}

/// Whether any container (app or init) names a GPU resource of this configuration in its
/// requests or limits, even with a zero or invalid amount: kube-scheduler's `IsInterested`.
pub fn names_gpu_resource(pod: &Pod, cfg: &Config) -> bool {
    let r = &cfg.resources;
    let names = [&r.whole_gpu, &r.gpu_mem, &r.gpu_core, &r.topology_gpu];
    pod.spec.iter().any(|spec| {
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .filter_map(|c| c.resources.as_ref())
            .any(|res| {
                names.iter().any(|name| {
                    res.requests.as_ref().is_some_and(|m| m.contains_key(*name))
                        || res.limits.as_ref().is_some_and(|m| m.contains_key(*name))
                })
            })
    })
}

/// What filter, prioritize and preempt place for `pod`: its GPU request, or, for a pod that asks
/// for no GPU while `policy.filterBestOnly` is on (`place_host_only`), its CPU and memory alone,
/// so that the policy places it too (a dedicated GPU kube-scheduler sends the extender every pod,
/// see docs/decisions/0006-filter-keeps-the-policys-choice.md). `Ok(None)`: no opinion.
pub fn placement_request(
    pod: &Pod,
    cfg: &Config,
    place_host_only: bool,
) -> Result<Option<PodRequest>, TranslateError> {
    match pod_request(pod, cfg)? {
        Some(request) => Ok(Some(request)),
        None if place_host_only => {
            let (cpu, memory) = pod_host_request(pod)?;
            Ok(Some(PodRequest::single(cpu, memory, GpuDemand::None)))
        }
        None => Ok(None),
    }
}

/// The pod's effective CPU and memory requests, as kube-scheduler computes them: the larger of
/// the app containers (plus sidecars) and the init-container peak, plus overhead; pod-level
/// resources replace the container sum when set.
pub fn pod_host_request(pod: &Pod) -> Result<(CpuMilli, MemMiB), TranslateError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok((CpuMilli(0), MemMiB(0)));
    };
    let amount = |resources: Option<&ResourceRequirements>,
                  container: &str|
     -> Result<(u64, u64), TranslateError> {
        let cpu = match resource(resources, "cpu") {
            Some(q) => parse_host(container, "cpu", q, 1000, 1)?,
            None => 0,
        };
        let mem = match resource(resources, "memory") {
            Some(q) => parse_host(container, "memory", q, 1, 1 << 20)?,
            None => 0,
        };
        Ok((cpu, mem))
    };
    let [cpu, mem] = containers_request(spec, |c| {
        amount(c.resources.as_ref(), &c.name).map(|(cpu, mem)| [cpu, mem])
    })?;
    let mut total = (cpu, mem);
    if let Some(pod_level) = spec.resources.as_ref() {
        let (cpu, mem) = amount(Some(pod_level), "(pod-level resources)")?;
        if resource(Some(pod_level), "cpu").is_some() {
            total.0 = cpu;
        }
        if resource(Some(pod_level), "memory").is_some() {
            total.1 = mem;
        }
    }
    if let Some(overhead) = spec.overhead.as_ref() {
        if let Some(q) = overhead.get("cpu") {
            total.0 = total
                .0
                .saturating_add(parse_host("(overhead)", "cpu", q, 1000, 1)?);
        }
        if let Some(q) = overhead.get("memory") {
            total.1 = total
                .1
                .saturating_add(parse_host("(overhead)", "memory", q, 1, 1 << 20)?);
        }
    }
    Ok((CpuMilli(total.0), MemMiB(total.1)))
}

/// The effective request of the pod's containers for `N` resources, by Kubernetes' rule: the
/// larger of the app containers plus sidecars and the init-container peak (a sidecar keeps
/// running, so it adds to every later init container and to the app containers). `amount` is
/// one container's request of each resource. Pod-level resources and overhead are not applied.
fn containers_request<const N: usize>(
    spec: &PodSpec,
    amount: impl Fn(&Container) -> Result<[u64; N], TranslateError>,
) -> Result<[u64; N], TranslateError> {
    let add = |a: [u64; N], b: [u64; N]| std::array::from_fn(|i| a[i].saturating_add(b[i]));
    let max = |a: [u64; N], b: [u64; N]| std::array::from_fn(|i| a[i].max(b[i]));
    let mut apps = [0; N];
    for c in &spec.containers {
        apps = add(apps, amount(c)?);
    }
    let mut sidecars = [0; N];
    let mut init_peak = [0; N];
    for c in spec.init_containers.iter().flatten() {
        let own = amount(c)?;
        if is_sidecar(c) {
            sidecars = add(sidecars, own);
            init_peak = max(init_peak, sidecars);
        } else {
            init_peak = max(init_peak, add(sidecars, own));
        }
    }
    Ok(max(add(apps, sidecars), init_peak))
}

/// The pod's effective request of an extended resource such as `nvidia.com/gpu` (a whole
/// number), as kube-scheduler's NodeResourcesFit counts it (the rule of `containers_request`); 0
/// when no container names it.
pub fn pod_resource_request(pod: &Pod, name: &str) -> Result<u64, TranslateError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(0);
    };
    containers_request(spec, |c| gpu_amount(c, name).map(|n| [n])).map(|[n]| n)
}

fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

/// A resource's request, or its limit when only the limit is set (the API server defaults the
/// request to the limit; the extender may see objects from before defaulting).
fn resource<'a>(
    resources: Option<&'a ResourceRequirements>,
    name: &str,
) -> Option<&'a WireQuantity> {
    let resources = resources?;
    resources
        .requests
        .as_ref()
        .and_then(|r| r.get(name))
        .or_else(|| resources.limits.as_ref().and_then(|l| l.get(name)))
}

/// Checks that `q` is a quantity the API server accepts for a container's `name` and not
/// negative: what the estimator asks of a template's resources that translation does not read.
pub fn check_amount(container: &str, name: &str, q: &WireQuantity) -> Result<(), TranslateError> {
    parse_host(container, name, q, 1, 1).map(drop)
}

fn parse_host(
    container: &str,
    name: &str,
    q: &WireQuantity,
    num: u128,
    den: u128,
) -> Result<u64, TranslateError> {
    Quantity::parse(&q.0)
        .and_then(|parsed| parsed.ceil_scaled(num, den))
        .map_err(|problem| TranslateError::Quantity {
            container: container.to_owned(),
            resource: name.to_owned(),
            value: q.0.clone(),
            problem,
        })
}

/// A GPU resource amount: a whole, non-negative number; 0 when absent.
fn gpu_amount(container: &Container, name: &str) -> Result<u64, TranslateError> {
    let Some(q) = resource(container.resources.as_ref(), name) else {
        return Ok(0);
    };
    let error = |problem| TranslateError::Quantity {
        container: container.name.clone(),
        resource: name.to_owned(),
        value: q.0.clone(),
        problem,
    };
    let parsed = Quantity::parse(&q.0).map_err(error)?;
    parsed.whole().map_err(error)
}

fn container_request(
    container: &Container,
    gpu_count: &Result<u64, TranslateError>,
    cfg: &Config,
) -> Result<ContainerRequest, TranslateError> {
    let r = &cfg.resources;
    let request_error = |source| TranslateError::Request {
        container: container.name.clone(),
        source,
    };
    let whole = gpu_amount(container, &r.whole_gpu)?;
    let topology = gpu_amount(container, &r.topology_gpu)?;
    let mem_gib = gpu_amount(container, &r.gpu_mem)?;
    let core = gpu_amount(container, &r.gpu_core)?;
    if mem_gib > 0
        && let Some(q) = resource(container.resources.as_ref(), &r.gpu_mem)
        && Quantity::parse(&q.0).is_ok_and(|parsed| parsed.is_binary())
    {
        let hami = r.sharing == Sharing::Hami;
        return Err(TranslateError::GpuMemoryUnit {
            container: container.name.clone(),
            resource: r.gpu_mem.clone(),
            value: q.0.clone(),
            unit: if hami { "MiB" } else { "GiB" },
            example: if hami { 3000 } else { 8 },
        });
    }
    if cfg.resources.sharing == Sharing::Hami {
        return hami_request(container, whole, topology, mem_gib, core, cfg);
    }
    let kinds = [whole > 0, topology > 0, mem_gib > 0 || core > 0]
        .iter()
        .filter(|&&k| k)
        .count();
    if kinds > 1 {
        return Err(request_error(RequestError::Conflicting(
            "ask for only one of whole GPUs, topology GPUs or a GPU share",
        )));
    }
    let gpu = if whole > 0 {
        GpuDemand::whole(whole)
    } else if topology > 0 {
        GpuDemand::topology(topology)
    } else {
        let core = if core > 0 {
            Some(u32::try_from(core).unwrap_or(u32::MAX))
        } else {
            None
        };
        let gpus = if mem_gib > 0 { gpu_count.clone()? } else { 1 };
        GpuDemand::share_under(mem_gib, gpus, core, r.share_rules())
    }
    .map_err(request_error)?;
    Ok(ContainerRequest {
        name: container.name.clone(),
        gpu,
    })
}

/// HAMi's memory share in percent of each card, which the engine cannot express: refused in
/// words under `resources.sharing: hami`.
pub const HAMI_MEM_PERCENTAGE: &str = "nvidia.com/gpumem-percentage";

/// One container's request under HAMi's semantics (`resources.sharing: hami`): `wholeGpu` is the
/// number of GPUs (1 when only memory or compute is named), `gpuMem` MiB on each, `gpuCore` a
/// percentage of each. Without memory HAMi gives the container all of each card's memory, so
/// `wholeGpu` alone, or with `gpuCore` alone unless `gpuCoreWithoutMemory`, asks for whole GPUs.
fn hami_request(
    container: &Container,
    whole: u64,
    topology: u64,
    mem_mib: u64,
    core: u64,
    cfg: &Config,
) -> Result<ContainerRequest, TranslateError> {
    let r = &cfg.resources;
    let request_error = |source| TranslateError::Request {
        container: container.name.clone(),
        source,
    };
    if gpu_amount(container, HAMI_MEM_PERCENTAGE)? > 0 {
        return Err(TranslateError::Unsupported {
            container: container.name.clone(),
            resource: HAMI_MEM_PERCENTAGE.to_owned(),
            instead: format!("ask for {} in MiB per GPU", r.gpu_mem),
        });
    }
    if topology > 0 && (whole > 0 || mem_mib > 0 || core > 0) {
        return Err(request_error(RequestError::Conflicting(
            "ask for either topology GPUs or HAMi GPUs (count, memory, cores)",
        )));
    }
    let core = (core > 0).then(|| u32::try_from(core).unwrap_or(u32::MAX));
    let gpu = if topology > 0 {
        GpuDemand::topology(topology)
    } else if mem_mib == 0 && (core.is_none() || !r.gpu_core_without_memory) {
        // A percentage alone still asks for a GPU: one, when no count is given.
        GpuDemand::whole(if core.is_some() { whole.max(1) } else { whole })
    } else {
        GpuDemand::share_per_gpu(MemMiB(mem_mib), whole.max(1), core, r.share_rules())
    }
    .map_err(request_error)?;
    Ok(ContainerRequest {
        name: container.name.clone(),
        gpu,
    })
}

/// The pod's `gpuCount` label: how many GPUs a memory share is split over (1 when absent).
fn pod_gpu_count(pod: &Pod, cfg: &Config) -> Result<u64, TranslateError> {
    let key = &cfg.resources.gpu_count;
    let Some(value) = pod.metadata.labels.as_ref().and_then(|l| l.get(key)) else {
        return Ok(1);
    };
    match value.trim().parse::<u64>() {
        Ok(0) | Err(_) => Err(TranslateError::PodLabel {
            key: key.clone(),
            value: value.clone(),
            problem: "expected a whole number of GPUs, at least 1".into(),
        }),
        Ok(n) if n > MAX_GPUS => Err(TranslateError::PodLabel {
            key: key.clone(),
            value: value.clone(),
            problem: "at most 64 GPUs".into(),
        }),
        Ok(n) => Ok(n),
    }
}

/// Model lists, minimum memory, placement override and topology wish from pod annotations.
fn pod_constraints(pod: &Pod, cfg: &Config) -> Result<GpuConstraints, TranslateError> {
    let keys = &cfg.annotations;
    let annotations = pod.metadata.annotations.as_ref();
    let get = |key: &str| {
        annotations
            .and_then(|a| a.get(key))
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    };
    let problem = |key: &str, problem: String| TranslateError::PodAnnotation {
        key: key.to_owned(),
        problem,
    };
    let models = |key: &str| -> Result<Vec<ModelPattern>, TranslateError> {
        let Some(list) = get(key) else {
            return Ok(Vec::new());
        };
        list.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| ModelPattern::parse(p).map_err(|e| problem(key, e.to_string())))
            .collect()
    };
    let min_memory = match get(&keys.min_gpu_memory) {
        None => None,
        Some(text) => {
            let parsed = Quantity::parse(text)
                .map_err(|e| problem(&keys.min_gpu_memory, format!("{text:?} {e}")))?;
            if !parsed.has_unit() {
                return Err(problem(
                    &keys.min_gpu_memory,
                    format!("{text:?} needs a unit, such as 40Gi or 40960Mi"),
                ));
            }
            let mib = parsed
                .ceil_scaled(1, 1 << 20)
                .map_err(|e| problem(&keys.min_gpu_memory, format!("{text:?} {e}")))?;
            Some(MemMiB(mib))
        }
    };
    let placement = match get(&keys.placement) {
        None => None,
        Some("binpack") => Some(GpuPlacement::Binpack),
        Some("spread") => Some(GpuPlacement::Spread),
        Some(other) => {
            return Err(problem(
                &keys.placement,
                format!("{other:?} is not a placement; expected binpack or spread"),
            ));
        }
    };
    let topology = match get(&keys.topology) {
        None => TopologyPreference::Any,
        Some("required") => TopologyPreference::Required,
        Some("preferred") => TopologyPreference::Preferred,
        Some(other) => {
            return Err(problem(
                &keys.topology,
                format!("{other:?} is not a topology wish; expected required or preferred"),
            ));
        }
    };
    Ok(GpuConstraints {
        include_models: models(&keys.model_include)?,
        exclude_models: models(&keys.model_exclude)?,
        min_memory_per_gpu: min_memory,
        placement,
        topology,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_engine::ComputeMilli;
    use serde_json::json;

    fn cfg() -> Config {
        Config::default()
    }

    fn node(value: serde_json::Value) -> Node {
        serde_json::from_value(value).unwrap()
    }

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn pod_with(containers: serde_json::Value) -> Pod {
        pod(
            json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": containers}}),
        )
    }

    fn one(resources: serde_json::Value) -> Pod {
        pod_with(json!([{"name": "c", "resources": {"requests": resources, "limits": {}}}]))
    }

    fn err(pod: &Pod) -> String {
        pod_request(pod, &cfg()).unwrap_err().to_string()
    }

    // ------------------------------------------------------------------ nodes

    #[test]
    fn ack_labels_make_identical_gpus_and_allocatable_the_host() {
        let n = node(json!({
            "metadata": {"name": "gpu-a", "labels": {
                "ack.node.gpu.schedule": "cgpu",
                "ack.node.gpu.placement": "spread",
                "aliyun.accelerator/nvidia_name": "Tesla-V100-SXM2-32GB",
                "aliyun.accelerator/nvidia_mem": "32510MiB",
                "aliyun.accelerator/nvidia_count": "4"}},
            "status": {
                "capacity": {"cpu": "64", "memory": "256Gi", "pods": "110", "aliyun.com/gpu-mem": "124"},
                "allocatable": {"cpu": "63500m", "memory": "250Gi", "pods": "110"}}
        }));
        let spec = node_spec(&n, &cfg()).unwrap();
        assert_eq!(spec.name.as_str(), "gpu-a");
        assert_eq!(spec.mode, GpuMode::ShareMemory);
        assert_eq!(spec.placement, GpuPlacement::Spread);
        assert_eq!(spec.gpus.len(), 4);
        assert_eq!(spec.gpus[3].index, GpuIndex(3));
        assert_eq!(spec.gpus[0].model, "Tesla-V100-SXM2-32GB");
        assert_eq!(spec.gpus[0].memory, MemMiB(32510));
        assert_eq!(spec.cpu, CpuMilli(63_500));
        assert_eq!(spec.memory, MemMiB(250 * 1024));
        assert_eq!(spec.max_pods, 110);
    }

    #[test]
    fn gfd_labels_are_the_fallback() {
        let n = node(json!({
            "metadata": {"name": "n", "labels": {
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "nvidia.com/gpu.memory": "81920",
                "nvidia.com/gpu.count": "8"}}
        }));
        let spec = node_spec(&n, &cfg()).unwrap();
        assert_eq!(spec.mode, GpuMode::Exclusive);
        assert_eq!(spec.gpus.len(), 8);
        assert_eq!(spec.gpus[0].model, "NVIDIA-A100-SXM4-80GB");
        assert_eq!(spec.gpus[0].memory, MemMiB(81920));
    }

    #[test]
    fn capacity_gives_the_count_and_share_memory_when_labels_are_absent() {
        let n = node(json!({
            "metadata": {"name": "n", "labels": {"ack.node.gpu.schedule": "share"}},
            "status": {"capacity": {"aliyun.com/gpu-count": "2", "aliyun.com/gpu-mem": "30"}}
        }));
        let spec = node_spec(&n, &cfg()).unwrap();
        assert_eq!(spec.gpus.len(), 2);
        assert_eq!(spec.gpus[0].memory, MemMiB(15 * 1024));
        assert_eq!(spec.gpus[0].model, UNKNOWN_MODEL);

        let n = node(
            json!({"metadata": {"name": "n"}, "status": {"capacity": {"nvidia.com/gpu": "8"}}}),
        );
        assert_eq!(node_spec(&n, &cfg()).unwrap().gpus.len(), 8);

        let n =
            node(json!({"metadata": {"name": "cpu-only"}, "status": {"capacity": {"cpu": "8"}}}));
        let spec = node_spec(&n, &cfg()).unwrap();
        assert!(spec.gpus.is_empty());
        assert_eq!(spec.cpu, CpuMilli(8000));
    }

    #[test]
    fn label_memory_forms() {
        assert_eq!(parse_label_memory("16160MiB"), Some(16160));
        assert_eq!(parse_label_memory("32GiB"), Some(32768));
        assert_eq!(parse_label_memory("15109"), Some(15109));
        assert_eq!(parse_label_memory("lots"), None);
        assert_eq!(parse_label_memory("16TB"), None);
    }

    #[test]
    fn modes() {
        for (value, mode) in [
            ("default", GpuMode::Exclusive),
            ("cgpu", GpuMode::ShareMemory),
            ("share", GpuMode::ShareMemory),
            ("mps", GpuMode::ShareMemory),
            ("core_mem", GpuMode::CoreMem),
            ("topology", GpuMode::Topology),
        ] {
            let n = node(
                json!({"metadata": {"name": "n", "labels": {"ack.node.gpu.schedule": value}}}),
            );
            assert_eq!(node_spec(&n, &cfg()).unwrap().mode, mode, "{value}");
        }
        let n = node(json!({"metadata": {"name": "n", "labels": {
            "ack.node.gpu.schedule": "shared", "aliyun.accelerator/nvidia_count": "4"}}}));
        let err = node_spec(&n, &cfg()).unwrap_err().to_string();
        assert!(err.contains("\"shared\" is not a GPU mode"), "{err}");
        let lenient = translate_node(&n, &cfg());
        assert!(
            lenient.spec.gpus.is_empty(),
            "an unreadable mode offers no GPUs"
        );
        assert_eq!(lenient.problems.len(), 1);
    }

    #[test]
    fn bad_labels_and_quantities_are_problems_not_panics() {
        let n = node(json!({
            "metadata": {"name": "n", "labels": {
                "ack.node.gpu.placement": "sideways",
                "aliyun.accelerator/nvidia_count": "four",
                "aliyun.accelerator/nvidia_mem": "lots"}},
            "status": {"allocatable": {"cpu": "many", "memory": "-1Gi", "pods": "1.5"},
                       "capacity": {"nvidia.com/gpu": "2"}}
        }));
        let t = translate_node(&n, &cfg());
        assert_eq!(t.spec.gpus.len(), 2, "count falls back to capacity");
        assert_eq!(t.spec.placement, GpuPlacement::Binpack);
        let text: Vec<String> = t.problems.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 6, "{text:#?}");
        assert!(
            text.iter()
                .any(|t| t.contains("expected binpack or spread"))
        );
        assert!(text.iter().any(|t| t.contains("allocatable cpu=\"many\"")));
        assert!(node_spec(&n, &cfg()).is_err());

        let n = node(
            json!({"metadata": {"name": "n", "labels": {"aliyun.accelerator/nvidia_count": "65"}}}),
        );
        let t = translate_node(&n, &cfg());
        assert!(t.spec.gpus.is_empty());
        assert_eq!(t.problems, vec![TranslateError::TooManyGpus(65)]);
    }

    #[test]
    fn the_detail_annotation_gives_per_gpu_facts_and_links() {
        let detail = json!({
            "version": 1,
            "gpus": [
                {"index": 0, "uuid": "GPU-a", "model": "A100", "memoryMiB": 81920, "numa": 0, "healthy": true},
                {"index": 1, "uuid": "GPU-b", "model": "A100", "memoryMiB": 81920, "numa": 0},
                {"index": 2, "uuid": "GPU-c", "numa": 1, "healthy": false}
            ],
            "links": [["X", "NV12", "SYS"], ["NV12", "X", "PHB"], ["SYS", "PHB", "X"]]
        });
        let n = node(json!({
            "metadata": {"name": "n",
                "labels": {"aliyun.accelerator/nvidia_name": "A10", "aliyun.accelerator/nvidia_mem": "24GiB",
                           "aliyun.accelerator/nvidia_count": "3"},
                "annotations": {"gpu-extender.io/gpus": detail.to_string()}}
        }));
        let spec = node_spec(&n, &cfg()).unwrap();
        assert_eq!(spec.gpus.len(), 3);
        assert_eq!(spec.gpus[0].uuid.as_deref(), Some("GPU-a"));
        assert!(spec.gpus[1].healthy);
        assert!(!spec.gpus[2].healthy);
        assert_eq!(
            spec.gpus[2].model, "A10",
            "missing model comes from the labels"
        );
        assert_eq!(spec.gpus[2].memory, MemMiB(24 * 1024));
        assert_eq!(spec.gpus[2].numa, Some(1));
        assert_eq!(spec.links.get(0, 1), Link::NvLink(12));
        assert_eq!(spec.links.get(1, 2), Link::HostBridge);
        assert_eq!(spec.links.get(2, 0), Link::CrossSocket);
    }

    #[test]
    fn a_garbage_detail_annotation_falls_back_to_labels_with_a_clear_error() {
        let labels =
            json!({"aliyun.accelerator/nvidia_count": "2", "aliyun.accelerator/nvidia_name": "T4"});
        for (garbage, expected) in [
            ("not json", "expected"),
            (r#"{"version": 2, "gpus": []}"#, "version 2"),
            (
                r#"{"version": 1, "gpus": [{"index": 0}, {"index": 0}]}"#,
                "listed twice",
            ),
            (
                r#"{"version": 1, "gpus": [{"index": 0, "colour": "red"}]}"#,
                "unknown field",
            ),
            (
                r#"{"version": 1, "gpus": [{"index": 0}, {"index": 1}], "links": [["X"]]}"#,
                "2x2",
            ),
            (
                r#"{"version": 1, "gpus": [{"index": 0}, {"index": 1}], "links": [["X","NV2"],["NV3","X"]]}"#,
                "symmetric",
            ),
            (
                r#"{"version": 1, "gpus": [{"index": 0}, {"index": 1}], "links": [["X","QPI"],["QPI","X"]]}"#,
                "unknown link",
            ),
            (
                r#"{"version": 1, "gpus": [{"index": 0}, {"index": 1}], "links": [["NV1","NV1"],["NV1","X"]]}"#,
                "must be \"X\"",
            ),
            (
                r#"{"version": 1, "gpus": [{"index": -1}]}"#,
                "invalid value",
            ),
        ] {
            let n = node(json!({"metadata": {"name": "n", "labels": labels,
                "annotations": {"gpu-extender.io/gpus": garbage}}}));
            let t = translate_node(&n, &cfg());
            assert_eq!(t.spec.gpus.len(), 2, "fell back to labels for {garbage}");
            assert_eq!(t.spec.gpus[0].model, "T4");
            assert_eq!(t.problems.len(), 1, "{garbage}");
            assert!(t.problems[0].is_detail_annotation());
            let message = t.problems[0].to_string();
            assert!(message.contains("gpu-extender.io/gpus"), "{message}");
            assert!(message.contains(expected), "{garbage}: {message}");
        }
    }

    // ------------------------------------------------------------------ pods

    #[test]
    fn no_gpu_resource_means_none() {
        assert_eq!(pod_request(&one(json!({"cpu": "1"})), &cfg()), Ok(None));
        assert_eq!(
            pod_request(&one(json!({"nvidia.com/gpu": "0"})), &cfg()),
            Ok(None)
        );
        assert!(names_gpu_resource(
            &one(json!({"nvidia.com/gpu": "0"})),
            &cfg()
        ));
        assert!(!names_gpu_resource(&one(json!({"cpu": "1"})), &cfg()));
        let no_spec = pod(json!({"metadata": {"name": "p"}}));
        assert_eq!(pod_request(&no_spec, &cfg()), Ok(None));
    }

    #[test]
    fn whole_topology_and_shared_demands() {
        let req = pod_request(
            &one(json!({"nvidia.com/gpu": "2", "cpu": "1", "memory": "2Gi"})),
            &cfg(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(req.containers[0].gpu, GpuDemand::Whole { count: 2 });
        assert_eq!(req.cpu, CpuMilli(1000));
        assert_eq!(req.memory, MemMiB(2048));

        let req = pod_request(&one(json!({"aliyun.com/gpu": "4"})), &cfg())
            .unwrap()
            .unwrap();
        assert_eq!(req.containers[0].gpu, GpuDemand::Topology { count: 4 });

        let req = pod_request(
            &one(json!({"aliyun.com/gpu-mem": "8", "aliyun.com/gpu-core.percentage": "30"})),
            &cfg(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            req.containers[0].gpu,
            GpuDemand::Share {
                gpus: 1,
                mem_per_gpu: MemMiB(8192),
                compute_per_gpu: ComputeMilli(300)
            }
        );

        // Limits alone count as the request, and "1000m" is a whole 1.
        let p =
            pod_with(json!([{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1000m"}}}]));
        let req = pod_request(&p, &cfg()).unwrap().unwrap();
        assert_eq!(req.containers[0].gpu, GpuDemand::Whole { count: 1 });
    }

    #[test]
    fn the_gpu_count_label_splits_memory() {
        let mut p = one(json!({"aliyun.com/gpu-mem": "16"}));
        p.metadata.labels = Some([("aliyun.com/gpu-count".to_owned(), "2".to_owned())].into());
        let req = pod_request(&p, &cfg()).unwrap().unwrap();
        assert_eq!(
            req.containers[0].gpu,
            GpuDemand::Share {
                gpus: 2,
                mem_per_gpu: MemMiB(8192),
                compute_per_gpu: ComputeMilli(0)
            }
        );
        p.metadata.labels = Some([("aliyun.com/gpu-count".to_owned(), "3".to_owned())].into());
        assert_eq!(
            err(&p),
            "container c: GPU memory 16 GiB cannot be split evenly over 3 GPUs"
        );
        p.metadata.labels = Some([("aliyun.com/gpu-count".to_owned(), "two".to_owned())].into());
        assert!(
            err(&p).starts_with("pod label aliyun.com/gpu-count=\"two\""),
            "{}",
            err(&p)
        );
        p.metadata.labels = Some([("aliyun.com/gpu-count".to_owned(), "0".to_owned())].into());
        assert!(err(&p).contains("at least 1"));
    }

    #[test]
    fn malformed_gpu_requests_are_clear_errors() {
        assert_eq!(
            err(&one(json!({"nvidia.com/gpu": "500m"}))),
            "container c: nvidia.com/gpu quantity \"500m\" must be a whole number"
        );
        assert_eq!(
            err(&one(json!({"nvidia.com/gpu": "-1"}))),
            "container c: nvidia.com/gpu quantity \"-1\" must not be negative"
        );
        assert!(err(&one(json!({"nvidia.com/gpu": "one"}))).contains("not a Kubernetes quantity"));
        assert!(err(&one(json!({"aliyun.com/gpu-mem": "8Gi"}))).contains("counted in GiB"));
        assert!(
            err(&one(
                json!({"aliyun.com/gpu-mem": "4", "aliyun.com/gpu-core.percentage": "33"})
            ))
            .contains("multiple of 5")
        );
        assert!(
            err(&one(json!({"aliyun.com/gpu-core.percentage": "50"})))
                .contains("needs a GPU memory")
        );
        assert!(
            err(&one(
                json!({"nvidia.com/gpu": "1", "aliyun.com/gpu-mem": "4"})
            ))
            .contains("only one of")
        );
        assert!(err(&one(json!({"nvidia.com/gpu": "65"}))).contains("too many GPUs"));
        assert!(
            err(&one(json!({"nvidia.com/gpu": "1", "cpu": "lots"})))
                .contains("container c: cpu quantity")
        );
    }

    #[test]
    fn init_containers_and_sidecars_follow_kubernetes() {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {
            "initContainers": [
                {"name": "setup", "resources": {"requests": {"cpu": "4", "memory": "1Gi", "aliyun.com/gpu-mem": "4"}}},
                {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}},
                {"name": "late", "resources": {"requests": {"cpu": "2", "memory": "8Gi"}}}
            ],
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "2Gi", "aliyun.com/gpu-mem": "8"}}},
                {"name": "b", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}
            ],
            "overhead": {"cpu": "100m", "memory": "64Mi"}
        }}));
        let req = pod_request(&p, &cfg()).unwrap().unwrap();
        // cpu: max(apps 2 + sidecar 0.5, setup 4, sidecar 0.5 + late 2) + overhead = 4.1
        assert_eq!(req.cpu, CpuMilli(4100));
        // memory: max(3Gi + 512Mi, 1Gi, 512Mi + 8Gi) + 64Mi
        assert_eq!(req.memory, MemMiB(8 * 1024 + 512 + 64));
        let names: Vec<&str> = req.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            ["a", "b", "proxy"],
            "sidecars run with the app containers"
        );
        assert_eq!(req.init_containers.len(), 2);
        assert_eq!(req.init_containers[0].gpu.gpu_count(), 1);

        // A GPU only in an init container still makes a GPU pod.
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {
            "initContainers": [{"name": "i", "resources": {"requests": {"nvidia.com/gpu": "1"}}}],
            "containers": [{"name": "c"}]}}));
        assert!(pod_request(&p, &cfg()).unwrap().is_some());
    }

    #[test]
    fn pod_level_resources_replace_the_container_sum() {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {
            "resources": {"requests": {"cpu": "8"}},
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}}}]}}));
        let req = pod_request(&p, &cfg()).unwrap().unwrap();
        assert_eq!(req.cpu, CpuMilli(8000));
        assert_eq!(req.memory, MemMiB(1024));
    }

    #[test]
    fn annotations_become_constraints() {
        let mut p = one(json!({"nvidia.com/gpu": "2"}));
        p.metadata.annotations = Some(
            [
                ("gpu-extender.io/model-include", "A100*, H100-SXM5-80GB"),
                ("gpu-extender.io/model-exclude", "A100-PCIE-40GB"),
                ("gpu-extender.io/min-gpu-memory", "40Gi"),
                ("gpu-extender.io/placement", "spread"),
                ("gpu-extender.io/topology", "required"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .into(),
        );
        let c = pod_request(&p, &cfg()).unwrap().unwrap().constraints;
        assert_eq!(c.include_models.len(), 2);
        assert!(c.include_models[0].matches("A100-SXM4-80GB"));
        assert!(c.exclude_models[0].matches("a100-pcie-40gb"));
        assert_eq!(c.min_memory_per_gpu, Some(MemMiB(40 * 1024)));
        assert_eq!(c.placement, Some(GpuPlacement::Spread));
        assert_eq!(c.topology, TopologyPreference::Required);

        for (key, value, expected) in [
            ("gpu-extender.io/model-include", "A100|H100", "not valid"),
            ("gpu-extender.io/min-gpu-memory", "40", "needs a unit"),
            (
                "gpu-extender.io/min-gpu-memory",
                "forty",
                "not a Kubernetes quantity",
            ),
            (
                "gpu-extender.io/placement",
                "pack",
                "expected binpack or spread",
            ),
            (
                "gpu-extender.io/topology",
                "must",
                "expected required or preferred",
            ),
        ] {
            p.metadata.annotations = Some([(key.to_owned(), value.to_owned())].into());
            let message = err(&p);
            assert!(
                message.starts_with(&format!("pod annotation {key}")),
                "{message}"
            );
            assert!(message.contains(expected), "{message}");
        }
    }

    #[test]
    fn configured_names_are_used() {
        let mut cfg = cfg();
        cfg.resources.gpu_mem = "nvidia.com/gpumem".into();
        cfg.resources.gpu_core = "nvidia.com/gpucores".into();
        let p = one(json!({"nvidia.com/gpumem": "4", "nvidia.com/gpucores": "50"}));
        let req = pod_request(&p, &cfg).unwrap().unwrap();
        assert_eq!(req.containers[0].gpu.gpu_count(), 1);
        assert_eq!(
            pod_request(&one(json!({"aliyun.com/gpu-mem": "4"})), &cfg),
            Ok(None)
        );
    }

    #[test]
    fn link_cells_read_back_as_the_same_link() {
        for link in [
            Link::NvLink(1),
            Link::NvLink(18),
            Link::SameSwitch,
            Link::HostBridge,
            Link::CrossSocket,
        ] {
            assert_eq!(parse_link(&link_cell(link)), Some(link));
        }
    }
}
