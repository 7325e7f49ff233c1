//! Nodes into engine values: capacity, GPU models and memory from labels and the node agent's
//! annotation, NVLink topology.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as WireQuantity;
use serde::{Deserialize, Serialize};

use super::super::quantity::{Quantity, QuantityError};
use super::{MAX_GPUS, MIG_STRATEGY_LABEL, TranslateError, UNKNOWN_MODEL, mig_profile_of};
use crate::config::Config;
use gpu_engine::{
    CpuMilli, Gpu, GpuIndex, GpuMode, GpuPlacement, Link, LinkMatrix, MemMiB, MigSlices, NodeSpec,
};

/// A node's translation together with everything that was wrong with it. The spec is always
/// usable: whatever could not be read falls back (detail annotation to labels, labels to
/// capacity, an unreadable mode to no GPUs) so one bad node never stops the watch.
#[derive(Clone, Debug)]
pub struct NodeTranslation {
    pub spec: NodeSpec,
    pub problems: Vec<TranslateError>,
}

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
/// annotation (unless it offers more healthy GPUs than the device plugin advertises), else `count` identical GPUs with the model, memory and count from the ACK labels,
/// else the GFD labels, else capacity (the mode's GPU resource for the count, the `gpuMem`
/// capacity divided by the count for the memory). Host CPU, memory and pods from allocatable,
/// else capacity, and so are the MIG slices (`nvidia.com/mig-<profile>`). Schedulability and
/// readiness are kube-scheduler's business and ignored here.
///
/// MIG (docs/mig.md): under the device plugin's `single` strategy (GFD's label
/// `nvidia.com/mig.strategy=single`) its `nvidia.com/gpu` units are MIG slices and the GFD
/// labels describe them, so the node agent's report, which lists the cards, is not read; on a
/// node advertising MIG slices, GPUs read from labels beyond the whole GPUs the device plugin
/// advertises are its MIG cards ([`mark_mig_cards`]).
pub fn translate_node(node: &Node, cfg: &Config) -> NodeTranslation {
    let mut problems = Vec::new();
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let labels = node.metadata.labels.as_ref();
    let label = |key: &str| label(labels, key);
    let keys = &cfg.node_labels;
    let capacity = node.status.as_ref().and_then(|s| s.capacity.as_ref());
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let host = allocatable.or(capacity);
    let mig = mig_pools(host, &mut problems);
    let single_mig = label(MIG_STRATEGY_LABEL) == Some("single");

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
            let mut from_labels = label_gpus(mode, labels, capacity, cfg, &mut label_problems);
            if !mig.is_empty() {
                mark_mig_cards(&mut from_labels.0, mode, host, cfg);
            }
            let annotation = node
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(&cfg.annotations.node_gpus))
                .filter(|_| !single_mig);
            let report = annotation.map(|text| {
                parse_node_gpus(text, &from_labels.0).and_then(|detail| {
                    within_advertised(detail, advertised_gpus(mode, capacity, cfg))
                })
            });
            match report {
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

    let host_value = |name: &str| host.and_then(|h| h.get(name));
    let mut spec = NodeSpec::with_gpus(name, mode.unwrap_or(GpuMode::Exclusive), gpus, links)
        .with_placement(placement)
        .with_mig(mig);
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

/// The MIG slices the node's device plugin advertises: `nvidia.com/mig-<profile>` in `host`
/// (allocatable, else capacity), by profile. A name of the prefix that is no profile, or a
/// count that is no whole number, is a problem, and that resource is left out.
fn mig_pools(
    host: Option<&BTreeMap<String, WireQuantity>>,
    problems: &mut Vec<TranslateError>,
) -> Vec<MigSlices> {
    let mut pools = Vec::new();
    for (resource, value) in host.into_iter().flatten() {
        let profile = match mig_profile_of(resource) {
            None => continue,
            Some(Ok(profile)) => profile,
            Some(Err(problem)) => {
                problems.push(TranslateError::NodeMig {
                    resource: resource.clone(),
                    problem: problem.to_string(),
                });
                continue;
            }
        };
        match Quantity::parse(&value.0).and_then(|q| q.whole()) {
            Ok(count) => pools.push(MigSlices::new(
                profile,
                u32::try_from(count).unwrap_or(u32::MAX),
            )),
            Err(problem) => problems.push(node_quantity("allocatable", resource, value, problem)),
        }
    }
    pools
}

/// Under the device plugin's `mixed` MIG strategy a card in MIG mode is offered as slices only,
/// while GFD's `nvidia.com/gpu.count` still counts it. Of `gpus` read from labels, those past
/// the whole GPUs the device plugin advertises (the mode's count resource in `host`, the node's
/// allocatable else capacity; none when absent) are
/// marked unhealthy, as the node agent marks a MIG-enabled card: no pod gets them whole. The
/// labels do not say which cards are in MIG mode, so the last ones are marked. Whole-GPU modes
/// only: a sharing node's count resource counts cards, not what its device plugin serves whole.
fn mark_mig_cards(
    gpus: &mut [Gpu],
    mode: GpuMode,
    host: Option<&BTreeMap<String, WireQuantity>>,
    cfg: &Config,
) {
    if !matches!(mode, GpuMode::Exclusive | GpuMode::Topology) {
        return;
    }
    let whole = advertised_gpus(mode, host, cfg).map_or(0, |(count, _)| count);
    let whole = usize::try_from(whole).unwrap_or(usize::MAX);
    for gpu in gpus.iter_mut().skip(whole) {
        gpu.healthy = false;
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
        count = gpu_count_resources(mode, cfg)
            .into_iter()
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

/// The resources that count a node's GPUs, the mode's own first: that is what its device plugin
/// advertises.
fn gpu_count_resources(mode: GpuMode, cfg: &Config) -> [&str; 4] {
    let resources = &cfg.resources;
    let primary = match mode {
        GpuMode::Exclusive => &resources.whole_gpu,
        GpuMode::Topology => &resources.topology_gpu,
        GpuMode::ShareMemory | GpuMode::CoreMem => &resources.gpu_count,
    };
    [
        primary,
        &resources.whole_gpu,
        &resources.topology_gpu,
        &resources.gpu_count,
    ]
    .map(String::as_str)
}

/// How many GPUs the node's device plugin advertises: the first of [`gpu_count_resources`] in
/// the node's capacity that reads as a whole number (an unreadable one is reported by
/// [`label_gpus`]), with its name; `None` when it advertises none of them (a sharing node whose
/// device plugin advertises only the GPU memory).
fn advertised_gpus<'a>(
    mode: GpuMode,
    capacity: Option<&BTreeMap<String, WireQuantity>>,
    cfg: &'a Config,
) -> Option<(u64, &'a str)> {
    gpu_count_resources(mode, cfg)
        .into_iter()
        .find_map(|resource| {
            let value = capacity.and_then(|c| c.get(resource))?;
            let count = Quantity::parse(&value.0).and_then(|q| q.whole()).ok()?;
            Some((count, resource))
        })
}

/// The node agent's report, unless it offers more GPUs than the device plugin advertises. The
/// report is written from inside the node, by a pod; the capacity is the kubelet's count of the
/// devices its device plugin serves. Which of the GPUs listed are real cannot be told, so such a
/// report is not used at all (the node falls back to its labels and capacity). Only the GPUs the
/// report offers count: an unhealthy or MIG-enabled one is never chosen, and a GPU fallen off the
/// bus may stay listed, unhealthy, after the device plugin has dropped it. With no count
/// advertised nothing bounds the report, and it is used as it is.
fn within_advertised(
    detail: (Vec<Gpu>, LinkMatrix),
    advertised: Option<(u64, &str)>,
) -> Result<(Vec<Gpu>, LinkMatrix), String> {
    let Some((advertised, resource)) = advertised else {
        return Ok(detail);
    };
    let offered = detail.0.iter().filter(|gpu| gpu.healthy).count() as u64;
    if offered > advertised {
        return Err(format!(
            "it offers {offered} healthy GPUs, more than the {advertised} the node's device plugin \
             advertises (capacity {resource}); a report is trusted only up to that count"
        ));
    }
    Ok(detail)
}

/// `16160MiB`, `16160Mi`, `32GiB`, `32Gi`, `32G` (read as GiB, as ACK writes it), or MiB.
pub(super) fn parse_label_memory(value: &str) -> Option<u64> {
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
