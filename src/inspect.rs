//! The inspection report: per node and per GPU, what is allocated out of what, and which pods
//! and DRA claims hold it, in the shape `kubectl inspect cgpu` users expect. Built from a table snapshot; shared
//! by the `/inspect` endpoint, the `inspect` command and the capacity metrics.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use gpu_engine::quota::{Amounts, QuotaNames, QuotaResource, QuotaSet};
use gpu_engine::{
    CpuMilli, HolderKey, MemMiB, MigProfile, NodeState, Table, TypicalPod, TypicalPods,
    WHOLE_GPU_COMPUTE,
};

/// The whole cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterReport {
    pub nodes: Vec<NodeReport>,
    pub totals: Totals,
    /// GPU quotas in force (`ElasticQuota`s), by namespace; absent without any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quotas: Vec<QuotaReport>,
    /// Why `ElasticQuota`s were ignored (invalid or overlapping).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignored_quotas: Vec<String>,
    /// Allocation records the watch refused to apply (docs/annotations.md, "Who may write the
    /// record"), by pod; absent without any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected_records: Vec<RejectedRecord>,
    /// GPUs handed out by Dynamic Resource Allocation (docs/dra.md); absent when DRA is not
    /// read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dra: Option<DraReport>,
}

/// The prefix of the table's holder keys for claims (`dra:namespace/name`).
pub const CLAIM_HOLDER_PREFIX: &str = "dra:";

/// The table's holder key of a claim.
pub fn claim_holder(claim: &str) -> HolderKey {
    HolderKey::new(format!("{CLAIM_HOLDER_PREFIX}{claim}"))
}

/// The claim (`namespace/name`) a holder key names, if it names one.
pub fn holder_claim(holder: &HolderKey) -> Option<&str> {
    holder.as_str().strip_prefix(CLAIM_HOLDER_PREFIX)
}

/// Counts over the book, for the metrics and the views.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DraCounts {
    /// Slices of configured drivers.
    pub slices: usize,
    /// Slices of drivers not configured (ignored).
    pub unknown_driver_slices: usize,
    /// Pools whose devices count.
    pub pools_complete: usize,
    /// Pools waiting for slices of their newest generation.
    pub pools_waiting: usize,
    /// Pools whose slices name no single node (ignored).
    pub pools_not_node_local: usize,
    /// Slices of older generations still listed (ignored).
    pub stale_slices: usize,
    /// Whole GPUs and MIG slices offered by complete pools.
    pub gpus: usize,
    pub mig_slices: usize,
    /// Devices left out for a missing or unreadable attribute.
    pub devices_unreadable: usize,
    /// Claims with an allocation of configured drivers' devices.
    pub claims_allocated: usize,
}

/// What the extender reads of Dynamic Resource Allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DraReport {
    /// Whether the API server serves `resource.k8s.io/v1` to the extender (false: DRA GPUs are
    /// not read; the log says why).
    pub served: bool,
    pub counts: DraCounts,
    /// Nodes whose GPUs are offered both by the device plugin and by a DRA driver: claims and
    /// pods are both accounted on the same GPUs, matched by UUID or index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes_offered_both_ways: Vec<String>,
    /// What is wrong with slices and pools (unknown drivers, missing attributes, pools waiting
    /// for slices, older generations).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// Every claim allocated devices of a configured driver, by `namespace/name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<ClaimReport>,
}

impl DraReport {
    /// Nothing of DRA to show: no slice, claim, problem or node offered both ways.
    pub fn is_empty(&self) -> bool {
        self.counts == DraCounts::default()
            && self.nodes_offered_both_ways.is_empty()
            && self.problems.is_empty()
            && self.claims.is_empty()
    }
}

/// One allocated ResourceClaim.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimReport {
    /// `namespace/name`.
    pub claim: String,
    /// The node its devices are on, once they are mapped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The GPU indices it holds on that node.
    #[serde(default)]
    pub gpus: Vec<u16>,
    /// Its devices as `driver/pool/device`.
    pub devices: Vec<String>,
    /// `namespace/name` of the pods it is reserved for (`status.reservedFor`).
    #[serde(default)]
    pub pods: Vec<String>,
    /// Why some of its devices are not (yet) held in the table.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// An allocation record the watch saw on a pod and did not apply.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RejectedRecord {
    /// `namespace/name`.
    pub pod: String,
    /// The pod's UID, which the Event about it names.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// `changed`, `removed`, `mismatch` or `conflict` (the `reason` of
    /// `gpu_extender_records_rejected_total`).
    pub reason: String,
    /// What was wrong, in words.
    pub detail: String,
    /// Updates of the pod seen carrying the refused record.
    pub times: u64,
}

/// One namespace's GPU quota and what it uses, in the units quotas are written in (GPUs, GiB of
/// GPU memory, percent of one GPU's compute).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QuotaReport {
    pub namespace: String,
    /// The `ElasticQuota`'s name.
    pub name: String,
    /// The other namespaces the quota covers (a group), whose use `resources` counts too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<String>,
    pub resources: Vec<QuotaLine>,
}

/// One resource of a quota.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QuotaLine {
    /// The resource name, as pods request it (`nvidia.com/gpu`).
    pub resource: String,
    pub used: f64,
    pub min: f64,
    /// `None` when the quota does not limit the resource.
    pub max: Option<f64>,
    /// Used above `min`.
    pub borrowed: f64,
}

/// The quota part of a report: every quota of `quotas` with what `usage` says its namespaces
/// hold together.
pub fn quota_reports(quotas: &QuotaSet, usage: &BTreeMap<String, Amounts>) -> Vec<QuotaReport> {
    let names = &quotas.names;
    quotas
        .quotas()
        .map(|quota| {
            let used = quota.used(usage);
            let borrowed = quota.borrowed(&used);
            let units = QuotaNames::in_user_units;
            QuotaReport {
                namespace: quota.namespace.clone(),
                name: quota.name.clone(),
                also: quota.also.clone(),
                resources: QuotaResource::ALL
                    .iter()
                    .map(|&r| QuotaLine {
                        resource: names.name(r).to_owned(),
                        used: units(r, used.get(r)),
                        min: units(r, quota.min.get(r)),
                        max: quota.max(r).map(|max| units(r, max)),
                        borrowed: units(r, borrowed.get(r)),
                    })
                    .collect(),
            }
        })
        .collect()
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
    /// GPU nodes with nothing allocated on any GPU and no MIG slice held: what a
    /// cluster-autoscaler could remove.
    pub idle_gpu_nodes: u64,
    /// MIG slices the nodes advertise, of every profile.
    #[serde(default)]
    pub mig_slices: u64,
    /// MIG slices pods hold.
    #[serde(default)]
    pub mig_slices_held: u64,
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
    /// MIG slices by profile: what the device plugin advertises or the node's DRA
    /// ResourceSlices publish, and which pods and DRA claims hold them (docs/mig.md); absent on
    /// a node without any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<MigReport>,
}

/// The slices of one MIG profile on one node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigReport {
    /// The profile as its resource names it after `nvidia.com/mig-` (`3g.20gb`, `1g.10gb.me`).
    pub profile: String,
    /// Memory of one slice as the profile names it, MiB.
    pub memory_mib: u64,
    /// Slices the device plugin advertises (the node's allocatable), or the `mig` devices of
    /// the profile the node's DRA ResourceSlices publish.
    pub advertised: u32,
    /// Slices pods (bound, and binds in flight) and DRA claims hold; above `advertised` when
    /// over-committed.
    pub held: u32,
    /// Slices advertised and not held.
    pub free: u32,
    /// The pods holding slices of the profile, by `namespace/name`.
    #[serde(default)]
    pub pods: Vec<MigHolder>,
    /// The DRA claims holding slices of the profile; absent when none does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<MigClaim>,
}

/// A DRA claim holding MIG slices of one profile.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigClaim {
    /// `namespace/name` of the ResourceClaim.
    pub claim: String,
    /// How many slices of the profile it holds.
    pub slices: u32,
}

/// A pod holding MIG slices of one profile.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigHolder {
    /// `namespace/name`.
    pub pod: String,
    /// How many slices of the profile it holds.
    pub slices: u32,
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
    /// The DRA claims holding this GPU, whole or a MIG slice of it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<GpuClaim>,
}

/// A DRA claim holding a GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuClaim {
    /// `namespace/name` of the ResourceClaim.
    pub claim: String,
    /// The pods it is reserved for.
    #[serde(default)]
    pub pods: Vec<String>,
    /// GPU memory of a MIG slice it holds; absent when it holds the GPU whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_memory_mib: Option<u64>,
}

impl GpuReport {
    /// Memory taken from the card: all of it when a pod holds it whole.
    pub fn memory_in_use_mib(&self) -> u64 {
        if self.whole {
            self.memory_mib
        } else {
            self.memory_allocated_mib
        }
    }

    /// The larger of the memory and compute fractions allocated, 0..=1.
    pub fn occupancy(&self) -> f64 {
        let memory = if self.memory_mib == 0 {
            0.0
        } else {
            self.memory_in_use_mib() as f64 / self.memory_mib as f64
        };
        memory
            .max(f64::from(self.compute_allocated_milli) / 1000.0)
            .min(1.0)
    }

    /// Whether nothing is allocated on the card, by a pod or a claim.
    pub fn is_idle(&self) -> bool {
        self.pods.is_empty() && self.claims.is_empty()
    }
}

impl NodeReport {
    /// How full the node's GPUs are, 0..=1: per GPU the larger of the memory and compute
    /// fractions allocated (memory-sharing modes allocate no compute), averaged over the GPUs;
    /// 0 for a node without GPUs.
    pub fn occupancy(&self) -> f64 {
        if self.gpus.is_empty() {
            return 0.0;
        }
        let sum: f64 = self.gpus.iter().map(GpuReport::occupancy).sum();
        sum / self.gpus.len() as f64
    }
}

impl Totals {
    /// The sums over `nodes`.
    pub fn of(nodes: &[NodeReport]) -> Self {
        let mut totals = Totals::default();
        for node in nodes {
            let mut node_idle = !node.gpus.is_empty() || !node.mig.is_empty();
            for gpu in &node.gpus {
                totals.gpus += 1;
                totals.gpu_memory_mib += gpu.memory_mib;
                totals.gpu_memory_allocated_mib += gpu.memory_in_use_mib();
                totals.gpu_compute_allocated += f64::from(gpu.compute_allocated_milli) / 1000.0;
                totals.idle_gpus += u64::from(gpu.is_idle());
                node_idle &= gpu.is_idle();
            }
            for pool in &node.mig {
                totals.mig_slices += u64::from(pool.advertised);
                totals.mig_slices_held += u64::from(pool.held);
                node_idle &= pool.held == 0;
            }
            totals.idle_gpu_nodes += u64::from(node_idle);
        }
        totals
    }
}

/// The report for every node of the table, sorted by node name.
pub fn report(table: &Table) -> ClusterReport {
    let mut nodes: Vec<NodeReport> = table.nodes().map(|node| node_report(table, node)).collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let totals = Totals::of(&nodes);
    ClusterReport {
        nodes,
        totals,
        ..ClusterReport::default()
    }
}

/// Which part of a report to show.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only the node of this exact name.
    pub node: Option<String>,
    /// Only nodes with a GPU whose model contains this text (case-insensitive), and only
    /// those GPUs.
    pub model: Option<String>,
}

impl ClusterReport {
    /// The part of the report `filter` selects, with totals over that part only.
    pub fn filtered(&self, filter: &Filter) -> ClusterReport {
        let nodes: Vec<NodeReport> = self
            .nodes
            .iter()
            .filter(|node| filter.node.as_ref().is_none_or(|name| node.name == *name))
            .filter_map(|node| match &filter.model {
                None => Some(node.clone()),
                Some(text) => {
                    let text = text.to_lowercase();
                    let gpus: Vec<GpuReport> = node
                        .gpus
                        .iter()
                        .filter(|gpu| gpu.model.to_lowercase().contains(&text))
                        .cloned()
                        .collect();
                    (!gpus.is_empty()).then(|| NodeReport {
                        gpus,
                        ..node.clone()
                    })
                }
            })
            .collect();
        let totals = Totals::of(&nodes);
        ClusterReport {
            nodes,
            totals,
            quotas: self.quotas.clone(),
            ignored_quotas: self.ignored_quotas.clone(),
            rejected_records: self.rejected_records.clone(),
            dra: self.dra.clone(),
        }
    }

    /// Keeps `dra` in the report, with each claim's node and GPUs from the report's GPUs and
    /// each GPU's claims' pods from `dra`.
    pub fn with_dra(mut self, mut dra: DraReport) -> Self {
        let mut index: BTreeMap<String, usize> = BTreeMap::new();
        for (position, claim) in dra.claims.iter().enumerate() {
            index.insert(claim.claim.clone(), position);
        }
        for node in &mut self.nodes {
            for gpu in &mut node.gpus {
                for held in &mut gpu.claims {
                    let Some(claim) = index.get(&held.claim).map(|&i| &mut dra.claims[i]) else {
                        continue;
                    };
                    held.pods.clone_from(&claim.pods);
                    claim.node = Some(node.name.clone());
                    if !claim.gpus.contains(&gpu.index) {
                        claim.gpus.push(gpu.index);
                    }
                }
            }
        }
        self.dra = Some(dra);
        self
    }

    /// The report as a table in the style of `kubectl inspect cgpu`: one row per node, one
    /// column per GPU index with allocated/total memory in GiB and the compute allocated,
    /// then, with `details`, the pods on each GPU; cluster totals last.
    pub fn to_text(&self, details: bool) -> String {
        let columns = self
            .nodes
            .iter()
            .flat_map(|node| node.gpus.iter().map(|gpu| gpu.index))
            .max()
            .map_or(0, |max| usize::from(max) + 1);
        let mut header = vec!["NAME".to_owned(), "MODE".to_owned(), "MODEL".to_owned()];
        header.extend((0..columns).map(|i| format!("GPU{i}(Allocated/Total)")));
        header.push("GPU Memory(GiB)".to_owned());
        header.push("GPU Compute".to_owned());
        let mut rows = vec![header];
        for node in &self.nodes {
            let mut row = vec![node.name.clone(), node.mode.clone(), node_models(node)];
            for index in 0..columns {
                let cell = node
                    .gpus
                    .iter()
                    .find(|gpu| usize::from(gpu.index) == index)
                    .map_or_else(|| "-".to_owned(), gpu_cell);
                row.push(cell);
            }
            let totals = Totals::of(std::slice::from_ref(node));
            row.push(format!(
                "{}/{}",
                gib(totals.gpu_memory_allocated_mib),
                gib(totals.gpu_memory_mib)
            ));
            row.push(format!(
                "{:.2}/{}",
                totals.gpu_compute_allocated, totals.gpus
            ));
            rows.push(row);
        }
        let mut out = String::new();
        write_aligned(&mut out, &rows);
        write_mig(&mut out, &self.nodes, details);
        if details {
            for node in &self.nodes {
                for gpu in &node.gpus {
                    if gpu.is_idle() {
                        continue;
                    }
                    let holders: Vec<String> = gpu
                        .pods
                        .iter()
                        .cloned()
                        .chain(gpu.claims.iter().map(claim_cell))
                        .collect();
                    let _ = writeln!(
                        out,
                        "{} GPU{}: {}",
                        node.name,
                        gpu.index,
                        holders.join(", ")
                    );
                }
            }
        }
        let totals = &self.totals;
        let _ = writeln!(out, "{}", "-".repeat(86));
        let _ = writeln!(out, "Allocated/Total GPU Memory In Cluster:");
        let _ = writeln!(
            out,
            "{}/{} ({})",
            gib(totals.gpu_memory_allocated_mib),
            gib(totals.gpu_memory_mib),
            percent(
                totals.gpu_memory_allocated_mib as f64,
                totals.gpu_memory_mib as f64
            )
        );
        let _ = writeln!(out, "Allocated/Total GPU Compute In Cluster:");
        let _ = writeln!(
            out,
            "{:.2}/{} ({})",
            totals.gpu_compute_allocated,
            totals.gpus,
            percent(totals.gpu_compute_allocated, totals.gpus as f64)
        );
        let _ = writeln!(
            out,
            "Idle GPUs: {}/{}  Idle GPU nodes: {}",
            totals.idle_gpus, totals.gpus, totals.idle_gpu_nodes
        );
        if totals.mig_slices > 0 || totals.mig_slices_held > 0 {
            let _ = writeln!(
                out,
                "Held/Advertised MIG slices In Cluster: {}/{} ({})",
                totals.mig_slices_held,
                totals.mig_slices,
                percent(totals.mig_slices_held as f64, totals.mig_slices as f64)
            );
        }
        if !self.quotas.is_empty() {
            let _ = writeln!(out, "GPU quotas (ElasticQuota):");
            let mut rows = vec![
                [
                    "NAMESPACE",
                    "QUOTA",
                    "RESOURCE",
                    "USED",
                    "MIN",
                    "MAX",
                    "BORROWED",
                ]
                .map(str::to_owned)
                .to_vec(),
            ];
            for quota in &self.quotas {
                for line in &quota.resources {
                    let namespaces = std::iter::once(&quota.namespace)
                        .chain(&quota.also)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(",");
                    rows.push(vec![
                        namespaces,
                        quota.name.clone(),
                        line.resource.clone(),
                        number(line.used),
                        number(line.min),
                        line.max.map_or_else(|| "-".to_owned(), number),
                        number(line.borrowed),
                    ]);
                }
            }
            write_aligned(&mut out, &rows);
        }
        for problem in &self.ignored_quotas {
            let _ = writeln!(out, "Ignored: {problem}");
        }
        if let Some(dra) = &self.dra
            && !dra.served
        {
            let _ = writeln!(
                out,
                "DRA: not read (the API server does not serve resource.k8s.io/v1, or refuses; see the log)"
            );
        }
        if let Some(dra) = self
            .dra
            .as_ref()
            .filter(|dra| dra.served && !dra.is_empty())
        {
            let counts = &dra.counts;
            let _ = writeln!(
                out,
                "DRA: {} GPUs and {} MIG slices in {} ResourceSlices, {} claims allocated",
                counts.gpus, counts.mig_slices, counts.slices, counts.claims_allocated
            );
            for node in &dra.nodes_offered_both_ways {
                let _ = writeln!(
                    out,
                    "DRA: node {node} offers its GPUs both through the device plugin and a DRA driver"
                );
            }
            for problem in &dra.problems {
                let _ = writeln!(out, "DRA: {problem}");
            }
            for claim in dra.claims.iter().filter(|claim| !claim.problems.is_empty()) {
                let _ = writeln!(
                    out,
                    "DRA: claim {} not fully held: {}",
                    claim.claim,
                    claim.problems.join("; ")
                );
            }
        }
        for rejected in &self.rejected_records {
            let _ = writeln!(
                out,
                "Record not applied on pod {} ({}, seen {} times): {}",
                rejected.pod, rejected.reason, rejected.times, rejected.detail
            );
        }
        out
    }
}

/// The MIG slices of every node that has any, one row per node of `profile held/advertised`
/// cells, then, with `details`, one line per profile with the pods and claims holding it
/// (`ns/p x2` for a pod holding two slices, `claim ns/c` for a DRA claim).
fn write_mig(out: &mut String, nodes: &[NodeReport], details: bool) {
    let with_mig: Vec<&NodeReport> = nodes.iter().filter(|node| !node.mig.is_empty()).collect();
    if with_mig.is_empty() {
        return;
    }
    let _ = writeln!(out, "MIG slices (held/advertised):");
    let rows: Vec<Vec<String>> = with_mig
        .iter()
        .map(|node| {
            std::iter::once(node.name.clone())
                .chain(
                    node.mig
                        .iter()
                        .map(|pool| format!("{} {}/{}", pool.profile, pool.held, pool.advertised)),
                )
                .collect()
        })
        .collect();
    write_aligned(out, &rows);
    if !details {
        return;
    }
    for node in with_mig {
        for pool in node
            .mig
            .iter()
            .filter(|pool| !pool.pods.is_empty() || !pool.claims.is_empty())
        {
            let times = |name: String, slices: u32| match slices {
                1 => name,
                n => format!("{name} x{n}"),
            };
            let holders: Vec<String> = pool
                .pods
                .iter()
                .map(|holder| times(holder.pod.clone(), holder.slices))
                .chain(
                    pool.claims
                        .iter()
                        .map(|held| times(format!("claim {}", held.claim), held.slices)),
                )
                .collect();
            let _ = writeln!(
                out,
                "{} MIG {}: {}",
                node.name,
                pool.profile,
                holders.join(", ")
            );
        }
    }
}

/// A claim on a GPU, in the detail lines: `claim team/c (pods team/p)`, with the MIG slice's
/// memory when it holds a slice.
fn claim_cell(claim: &GpuClaim) -> String {
    let mut cell = format!("claim {}", claim.claim);
    if let Some(mib) = claim.mig_memory_mib {
        let _ = write!(cell, " [MIG {} GiB]", gib(mib));
    }
    if !claim.pods.is_empty() {
        let _ = write!(cell, " (pods {})", claim.pods.join(", "));
    }
    cell
}

/// A quota amount: whole numbers without a fraction, others to two places.
fn number(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

/// The distinct models of a node, `/`-joined.
fn node_models(node: &NodeReport) -> String {
    let mut models: Vec<&str> = node.gpus.iter().map(|gpu| gpu.model.as_str()).collect();
    models.dedup();
    if models.is_empty() {
        return "-".to_owned();
    }
    models.join("/")
}

/// One GPU's cell: memory allocated/total in GiB, `*` for a card held whole, `!` unhealthy.
fn gpu_cell(gpu: &GpuReport) -> String {
    let mut cell = format!("{}/{}", gib(gpu.memory_in_use_mib()), gib(gpu.memory_mib));
    if gpu.whole {
        cell.push('*');
    }
    if !gpu.healthy {
        cell.push('!');
    }
    cell
}

/// MiB as GiB, without decimals when whole.
fn gib(mib: u64) -> String {
    if mib.is_multiple_of(1024) {
        (mib / 1024).to_string()
    } else {
        format!("{:.1}", mib as f64 / 1024.0)
    }
}

fn percent(part: f64, whole: f64) -> String {
    if whole <= 0.0 {
        return "0%".to_owned();
    }
    format!("{:.0}%", 100.0 * part / whole)
}

/// Writes `rows` as space-aligned columns.
fn write_aligned(out: &mut String, rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = Vec::new();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if widths.len() <= i {
                widths.push(0);
            }
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            let _ = write!(line, "{cell:<width$}  ", width = widths[i]);
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

/// Free and stranded GPU capacity of the whole table, in milli-GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Capacity {
    /// Free capacity of healthy GPUs (per GPU, the scarcer of free memory and compute).
    pub free_milli: u64,
    /// The part of it the typical pods could not use: the FGD policy's fragmentation measure,
    /// summed over nodes.
    pub fragmented_milli: f64,
}

/// Free and fragmented capacity of `table`, measured against `typical`; with no typical pods
/// configured, against one class asking for a single whole GPU, so that what counts as
/// fragmented is the free capacity of partly used GPUs (and all of a node's when its CPU is
/// gone).
pub fn capacity(table: &Table, typical: &TypicalPods) -> Capacity {
    let fallback;
    let typical = if typical.is_empty() {
        fallback = TypicalPods::new(vec![TypicalPod {
            cpu: CpuMilli(0),
            memory: MemMiB(0),
            gpus: 1,
            milli: WHOLE_GPU_COMPUTE.0,
            models: Vec::new(),
            weight: 1.0,
        }]);
        &fallback
    } else {
        typical
    };
    let mut capacity = Capacity::default();
    for node in table.nodes() {
        if node.spec.gpus.is_empty() {
            continue;
        }
        let free: Vec<u32> = (0..node.gpus.len())
            .map(|position| node.gpu_free_milli(position))
            .collect();
        capacity.free_milli += free.iter().map(|&milli| u64::from(milli)).sum::<u64>();
        let access = typical.access_masks(node);
        capacity.fragmented_milli += typical.fragmentation(node.cpu_free(), &free, &access);
    }
    capacity
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
            claims: Vec::new(),
        })
        .collect();
    let mut pods = 0;
    let mut mig: BTreeMap<MigProfile, MigReport> = BTreeMap::new();
    for pool in &node.spec.mig {
        mig_report(&mut mig, &pool.profile).advertised = pool.count;
    }
    for held in &node.mig_held {
        mig_report(&mut mig, &held.profile).held = held.count;
    }
    for (key, entry) in table.pods_on(&node.spec.name) {
        pods += 1;
        for hold in entry.allocation.footprint() {
            if let Some(gpu) = gpus.iter_mut().find(|g| g.index == hold.gpu.0) {
                gpu.pods.push(key.to_string());
            }
        }
        for slices in &entry.allocation.mig {
            mig_report(&mut mig, &slices.profile).pods.push(MigHolder {
                pod: key.to_string(),
                slices: slices.count,
            });
        }
    }
    for (holder, entry) in table.externals_on(&node.spec.name) {
        let claim = holder_claim(holder).unwrap_or(holder.as_str());
        for slices in &entry.mig {
            mig_report(&mut mig, &slices.profile).claims.push(MigClaim {
                claim: claim.to_owned(),
                slices: slices.count,
            });
        }
    }
    let mig = mig
        .into_values()
        .map(|mut report| {
            report.free = report.advertised.saturating_sub(report.held);
            report.pods.sort_by(|a, b| a.pod.cmp(&b.pod));
            report.claims.sort_by(|a, b| a.claim.cmp(&b.claim));
            report
        })
        .collect();
    for (holder, entry) in table.externals_on(&node.spec.name) {
        let claim = holder_claim(holder).unwrap_or(holder.as_str());
        for hold in &entry.holds {
            if let Some(gpu) = gpus.iter_mut().find(|g| g.index == hold.gpu.0) {
                gpu.claims.push(GpuClaim {
                    claim: claim.to_owned(),
                    pods: Vec::new(),
                    mig_memory_mib: (!hold.whole).then_some(hold.mem.0),
                });
            }
        }
    }
    for gpu in &mut gpus {
        gpu.pods.sort();
        gpu.claims.sort_by(|a, b| a.claim.cmp(&b.claim));
    }
    NodeReport {
        name: node.spec.name.to_string(),
        mode: node.spec.mode.as_str().to_owned(),
        placement: node.spec.placement.as_str().to_owned(),
        gpus,
        pods,
        mig,
    }
}

/// The report of `profile` in `reports`, made empty when it is not there yet.
fn mig_report<'a>(
    reports: &'a mut BTreeMap<MigProfile, MigReport>,
    profile: &MigProfile,
) -> &'a mut MigReport {
    reports.entry(profile.clone()).or_insert_with(|| MigReport {
        profile: profile.to_string(),
        memory_mib: profile.memory_mib(),
        ..MigReport::default()
    })
}

/// Table fixtures shared by the unit tests of the report, the explanation and the metrics.
#[cfg(test)]
pub(crate) mod fixtures {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on a broken fixture")]

    use gpu_engine::{
        Change, CpuMilli, GpuDemand, GpuMode, MemMiB, MigProfile, MigSlices, NodeSpec, PodKey,
        PodRequest, Policy, Table, fit,
    };

    /// Adds a node of `count` GPUs of `model` with `gib` GiB each.
    pub(crate) fn add_node(
        table: &mut Table,
        name: &str,
        mode: GpuMode,
        count: u16,
        model: &str,
        gib: u64,
    ) {
        table.apply(Change::UpsertNode(NodeSpec::uniform(
            name,
            mode,
            count,
            model,
            MemMiB(gib * 1024),
        )));
    }

    /// `(profile, count)` pairs as MIG slices.
    pub(crate) fn mig(slices: &[(&str, u32)]) -> Vec<MigSlices> {
        slices
            .iter()
            .map(|&(profile, count)| MigSlices::new(MigProfile::parse(profile).unwrap(), count))
            .collect()
    }

    /// Adds a node of MIG cards only, advertising the slices `pools`.
    pub(crate) fn add_mig_node(table: &mut Table, name: &str, pools: &[(&str, u32)]) {
        let spec = NodeSpec::uniform(name, GpuMode::Exclusive, 0, "A100", MemMiB(0));
        table.apply(Change::UpsertNode(spec.with_mig(mig(pools))));
    }

    /// Places a pod `ns/name` asking the MIG slices `slices` on `node` with the default policy,
    /// and records it bound.
    pub(crate) fn bind_mig(table: &mut Table, node: &str, name: &str, slices: &[(&str, u32)]) {
        let request =
            PodRequest::single(CpuMilli(0), MemMiB(0), GpuDemand::None).with_mig(mig(slices));
        let allocation = fit(
            table.node_by_str(node).unwrap(),
            &request,
            &Policy::default(),
        )
        .unwrap();
        table.apply(Change::PodBound {
            pod: PodKey::new("ns", name),
            allocation,
        });
    }

    /// Places a one-container pod `ns/name` asking `demand` on `node` with the default policy,
    /// and records it bound.
    pub(crate) fn bind(table: &mut Table, node: &str, name: &str, demand: GpuDemand) {
        let request = PodRequest::single(CpuMilli(0), MemMiB(0), demand);
        let allocation = fit(
            table.node_by_str(node).unwrap(),
            &request,
            &Policy::default(),
        )
        .unwrap();
        table.apply(Change::PodBound {
            pod: PodKey::new("ns", name),
            allocation,
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on a broken fixture")]

    use super::fixtures::{add_mig_node, add_node, bind, bind_mig, mig};
    use super::*;
    use gpu_engine::{GpuDemand, GpuMode};

    /// Two 16 GiB T4s sharing by memory and one A100 node for whole GPUs; 8 GiB on T4 GPU0 and
    /// the first A100 held whole.
    fn table() -> Table {
        let mut table = Table::new(20);
        add_node(&mut table, "t4", GpuMode::ShareMemory, 2, "Tesla-T4", 16);
        add_node(&mut table, "a100", GpuMode::Exclusive, 2, "NVIDIA-A100", 40);
        add_node(&mut table, "idle", GpuMode::Exclusive, 1, "NVIDIA-A100", 40);
        bind(&mut table, "t4", "s", GpuDemand::share(8, 1, None).unwrap());
        bind(&mut table, "a100", "w", GpuDemand::whole(1).unwrap());
        table
    }

    #[test]
    fn totals_count_whole_gpus_as_fully_allocated() {
        let report = report(&table());
        let totals = &report.totals;
        assert_eq!(totals.gpus, 5);
        assert_eq!(totals.gpu_memory_allocated_mib, (8 + 40) * 1024);
        // Memory shares allocate no compute: only the whole A100 counts.
        assert!((totals.gpu_compute_allocated - 1.0).abs() < 1e-9);
        assert_eq!(totals.idle_gpus, 3);
        assert_eq!(totals.idle_gpu_nodes, 1);
        let t4 = report.nodes.iter().find(|n| n.name == "t4").unwrap();
        assert_eq!(t4.gpus[0].pods, vec!["ns/s".to_owned()]);
        assert!((t4.occupancy() - 0.25).abs() < 1e-9);
    }

    #[test]
    fn filters_select_nodes_and_gpus_and_recompute_totals() {
        let report = report(&table());
        let by_node = report.filtered(&Filter {
            node: Some("t4".into()),
            model: None,
        });
        assert_eq!(by_node.nodes.len(), 1);
        assert_eq!(by_node.totals.gpus, 2);
        let by_model = report.filtered(&Filter {
            node: None,
            model: Some("a100".into()),
        });
        let names: Vec<&str> = by_model.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["a100", "idle"]);
        assert_eq!(by_model.totals.gpus, 3);
        let none = report.filtered(&Filter {
            node: Some("nope".into()),
            model: None,
        });
        assert!(none.nodes.is_empty());
        assert_eq!(none.totals, Totals::default());
    }

    #[test]
    fn text_has_a_column_per_gpu_and_cluster_totals() {
        let text = report(&table()).to_text(true);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("NAME"), "{text}");
        assert!(lines[0].contains("GPU1(Allocated/Total)"), "{text}");
        let t4 = lines.iter().find(|l| l.starts_with("t4 ")).unwrap();
        assert!(t4.contains("8/16"), "{t4}");
        let a100 = lines.iter().find(|l| l.starts_with("a100 ")).unwrap();
        assert!(a100.contains("40/40*"), "{a100}");
        assert!(text.contains("t4 GPU0: ns/s"), "{text}");
        assert!(
            text.contains("Allocated/Total GPU Memory In Cluster:\n48/152 (32%)"),
            "{text}"
        );
    }

    /// MIG pools are reported per node and profile with the pods holding them, in the JSON of
    /// `/inspect`, the text and the totals; an untouched MIG node is idle, a used one is not.
    #[test]
    fn mig_slices_are_shown_with_their_holders() {
        let mut table = table();
        add_mig_node(&mut table, "mig-a", &[("1g.10gb", 7), ("3g.40gb", 2)]);
        add_mig_node(&mut table, "mig-b", &[("1g.10gb", 7)]);
        bind_mig(&mut table, "mig-a", "p1", &[("1g.10gb", 2)]);
        bind_mig(&mut table, "mig-a", "p2", &[("1g.10gb", 1), ("3g.40gb", 1)]);
        // A DRA claim holding three slices of mig-b.
        table.apply(gpu_engine::Change::HoldExternal {
            holder: claim_holder("team/c"),
            node: gpu_engine::NodeName::new("mig-b"),
            holds: Vec::new(),
            mig: mig(&[("1g.10gb", 3)]),
        });
        let report = report(&table);
        let json = serde_json::to_value(&report).unwrap();
        let mig_a = json["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|node| node["name"] == "mig-a")
            .unwrap();
        assert_eq!(
            mig_a["mig"],
            serde_json::json!([
                {"profile": "1g.10gb", "memoryMib": 10240, "advertised": 7, "held": 3, "free": 4,
                 "pods": [{"pod": "ns/p1", "slices": 2}, {"pod": "ns/p2", "slices": 1}]},
                {"profile": "3g.40gb", "memoryMib": 40960, "advertised": 2, "held": 1, "free": 1,
                 "pods": [{"pod": "ns/p2", "slices": 1}]},
            ])
        );
        assert!(
            json["nodes"][0].get("mig").is_none(),
            "a node without MIG slices has no mig field"
        );
        let mig_b = json["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|node| node["name"] == "mig-b")
            .unwrap();
        assert_eq!(
            mig_b["mig"],
            serde_json::json!([
                {"profile": "1g.10gb", "memoryMib": 10240, "advertised": 7, "held": 3, "free": 4,
                 "pods": [], "claims": [{"claim": "team/c", "slices": 3}]},
            ])
        );
        assert_eq!(
            (report.totals.mig_slices, report.totals.mig_slices_held),
            (16, 7)
        );
        // `idle` (one A100) is idle; mig-a and mig-b (a claim's slices) are not.
        assert_eq!(report.totals.idle_gpu_nodes, 1);
        let back: ClusterReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
        let text = report.to_text(true);
        for line in [
            "MIG slices (held/advertised):",
            "mig-a  1g.10gb 3/7  3g.40gb 1/2",
            "mig-b  1g.10gb 3/7",
            "mig-a MIG 1g.10gb: ns/p1 x2, ns/p2",
            "mig-a MIG 3g.40gb: ns/p2",
            "mig-b MIG 1g.10gb: claim team/c x3",
            "Held/Advertised MIG slices In Cluster: 7/16 (44%)",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(!report.to_text(false).contains("mig-a MIG"));
    }

    #[test]
    fn fragmentation_without_typical_pods_is_the_free_part_of_used_gpus() {
        let capacity = capacity(&table(), &TypicalPods::default());
        // Free: 8 GiB of a 16 GiB T4 (500), one idle T4, one idle A100 on each A100 node.
        assert_eq!(capacity.free_milli, 500 + 1000 + 1000 + 1000);
        // Only the half-used T4 cannot take a whole-GPU pod.
        assert!((capacity.fragmented_milli - 500.0).abs() < 1e-9);
    }
}
