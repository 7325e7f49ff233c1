//! The metrics read from the shared state at scrape time: the table's size, the allocation
//! gauges, the feed's health and its counters, built from one snapshot when Prometheus asks
//! instead of copied into registered metrics, and written straight in the text format (the
//! per-GPU series number eight per node: building the client library's objects for them, and
//! sorting them, cost ten times the writing). Nothing is computed per watch event, and the
//! counters kept by the feed are exported as they are.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use prometheus::{Histogram, HistogramOpts, Registry};

use crate::inspect::{self, ClusterReport};
use crate::state::{ClusterState, PolicyCell};
use gpu_engine::{Hold, ScoringPolicy};

/// The two kinds of family written here, as the text format names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Gauge,
    Counter,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        }
    }
}

/// A family this collector exports: name, help, type and label names (sorted, as Prometheus
/// writes them).
struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
}

const fn gauge(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Family {
    Family {
        name,
        help,
        kind: Kind::Gauge,
        labels,
    }
}

const fn counter(
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
) -> Family {
    Family {
        name,
        help,
        kind: Kind::Counter,
        labels,
    }
}

const PER_GPU: &[&str] = &["gpu", "node"];
const PER_QUOTA: &[&str] = &["namespace", "quota", "resource"];

const QUOTA_USED: Family = gauge(
    "gpu_extender_quota_used",
    "GPU resources a namespace with an ElasticQuota holds (bound pods and binds in flight), in the quota's units: GPUs, GiB of GPU memory, percent of one GPU's compute.",
    PER_QUOTA,
);
const QUOTA_MIN: Family = gauge(
    "gpu_extender_quota_min",
    "An ElasticQuota's guaranteed min, in the quota's units (0 where min does not name the resource).",
    PER_QUOTA,
);
const QUOTA_MAX: Family = gauge(
    "gpu_extender_quota_max",
    "An ElasticQuota's max, in the quota's units; no series for a resource max does not limit.",
    PER_QUOTA,
);
const QUOTA_BORROWED: Family = gauge(
    "gpu_extender_quota_borrowed",
    "What a namespace uses above its ElasticQuota's min, in the quota's units.",
    PER_QUOTA,
);
const QUOTAS_IGNORED: Family = gauge(
    "gpu_extender_quotas_ignored",
    "ElasticQuotas ignored as invalid (min above max, unknown resource, unreadable) or overlapping (two in one namespace); the log says why.",
    &[],
);
const PER_NODE: &[&str] = &["node"];

const DRA_SERVED: Family = gauge(
    "gpu_extender_dra_served",
    "1 while the extender reads Dynamic Resource Allocation (resource.k8s.io/v1 served and allowed), 0 where it cannot; no series with dra.enabled off.",
    &[],
);
const DRA_DEVICES: Family = gauge(
    "gpu_extender_dra_devices",
    "Devices complete ResourceSlice pools of the configured DRA drivers publish, by type: whole GPUs (gpu) and MIG slices (mig).",
    &["type"],
);
const DRA_CLAIMS: Family = gauge(
    "gpu_extender_dra_claims_allocated",
    "ResourceClaims allocated devices of the configured DRA drivers.",
    &[],
);
const DRA_GPUS_HELD: Family = gauge(
    "gpu_extender_dra_gpus_held",
    "GPUs in the table that DRA claims hold, whole or a MIG slice of them: the extender gives none of them out.",
    &[],
);
const DRA_BOTH_WAYS: Family = gauge(
    "gpu_extender_dra_nodes_offered_both_ways",
    "Nodes whose GPUs are offered both by the device plugin and a DRA driver.",
    &[],
);
const DRA_SLICE_PROBLEMS: Family = gauge(
    "gpu_extender_dra_slice_problems",
    "What keeps DRA devices from being counted, by kind: unknown_driver (slices of drivers dra.drivers does not list), device_unreadable (a device missing an attribute), pool_waiting (pools missing slices of their newest generation), stale_slice (slices of an older generation), not_node_local (pools naming no single node).",
    &["kind"],
);

const TABLE_NODES: Family = gauge(
    "gpu_extender_table_nodes",
    "Nodes in the allocation table.",
    &[],
);
const TABLE_PODS: Family = gauge(
    "gpu_extender_table_pods",
    "Pods holding an allocation in the table.",
    &[],
);
const RESERVATIONS_OUTSTANDING: Family = gauge(
    "gpu_extender_reservations_outstanding",
    "GPU reservations held between bind and the watch confirming the bound pod.",
    &[],
);
const RECORDS_MISSING: Family = gauge(
    "gpu_extender_records_missing",
    "Bound GPU pods without an allocation record, counted from their requests.",
    &[],
);
const RECORDS_CORRUPT: Family = gauge(
    "gpu_extender_records_corrupt",
    "Bound GPU pods whose allocation record is corrupt or copied, counted from their requests.",
    &[],
);
const NODES_WITH_PROBLEMS: Family = gauge(
    "gpu_extender_nodes_with_problems",
    "Nodes whose GPU labels, capacity or detail annotation could not be read fully.",
    &[],
);
const TYPICAL_POD_CLASSES: Family = gauge(
    "gpu_extender_typical_pod_classes",
    "Classes in the typical-pod distribution FGD scores with (configured or learned).",
    &[],
);
const TYPICAL_PODS_LEARNED_FROM: Family = gauge(
    "gpu_extender_typical_pods_learned_from",
    "Pods the typical-pod distribution was last learned from (policy.typicalPods.learn).",
    &[],
);
const FGD_PLUS_HOST_WEIGHT: Family = gauge(
    "gpu_extender_fgd_plus_host_weight",
    "Weight of FGD+'s host-stranding term in force: whole (9) from a host slack of 0.1, less in proportion below; 0 unless scoring is fgd-plus.",
    &[],
);
const WATCH_ERRORS: Family = counter(
    "gpu_extender_watch_errors_total",
    "Node and pod watch errors, each retried with backoff.",
    &[],
);
const RESERVATIONS_EXPIRED: Family = counter(
    "gpu_extender_reservations_expired_total",
    "Reservations released because the bound pod never appeared.",
    &[],
);
const RECORDS_REJECTED: Family = counter(
    "gpu_extender_records_rejected_total",
    "Allocation records the watch did not apply, by why: changed or removed after bind, not what the pod asks for, taking GPUs others hold.",
    &["reason"],
);
const RELISTS: Family = counter(
    "gpu_extender_relists_total",
    "Completed full lists of nodes or pods.",
    &["kind"],
);
const WATCH_EVENTS: Family = counter(
    "gpu_extender_watch_events_total",
    "Node and pod watch events applied to the table.",
    &["event", "kind"],
);
const GPU_MEMORY_TOTAL: Family = gauge(
    "gpu_extender_gpu_memory_total_mib",
    "GPU memory of each card, MiB.",
    PER_GPU,
);
const GPU_MEMORY_ALLOCATED: Family = gauge(
    "gpu_extender_gpu_memory_allocated_mib",
    "GPU memory allocated on each card, MiB (all of it when held whole).",
    PER_GPU,
);
const GPU_COMPUTE_ALLOCATED: Family = gauge(
    "gpu_extender_gpu_compute_allocated",
    "Compute allocated on each card, in GPUs (0 to 1; 1 when held whole).",
    PER_GPU,
);
const GPU_PODS: Family = gauge(
    "gpu_extender_gpu_pods",
    "Pods holding part or all of each card.",
    PER_GPU,
);
const GPU_HEALTHY: Family = gauge(
    "gpu_extender_gpu_healthy",
    "1 when the card is healthy, 0 when the node reports it unhealthy.",
    &["gpu", "model", "node"],
);
const NODE_GPUS: Family = gauge("gpu_extender_node_gpus", "GPUs of each node.", PER_NODE);
const NODE_GPUS_IN_USE: Family = gauge(
    "gpu_extender_node_gpus_in_use",
    "GPUs of each node with anything allocated.",
    PER_NODE,
);
const NODE_GPU_OCCUPANCY: Family = gauge(
    "gpu_extender_node_gpu_occupancy",
    "Compute allocated on each node over its GPUs (0 to 1).",
    PER_NODE,
);
const CLUSTER_GPUS: Family = gauge("gpu_extender_cluster_gpus", "GPUs in the table.", &[]);
const CLUSTER_IDLE_GPUS: Family = gauge(
    "gpu_extender_cluster_idle_gpus",
    "GPUs with nothing allocated.",
    &[],
);
const IDLE_GPU_NODES: Family = gauge(
    "gpu_extender_idle_gpu_nodes",
    "GPU nodes with nothing allocated on any GPU.",
    &[],
);
const CLUSTER_GPU_FREE: Family = gauge(
    "gpu_extender_cluster_gpu_free",
    "Free capacity of healthy GPUs, in GPUs (the scarcer of memory and compute).",
    &[],
);
const MIG_SLICES: Family = gauge(
    "gpu_extender_mig_slices",
    "MIG slices of each node by profile (the device plugin's nvidia.com/mig-<profile>, or a DRA driver's mig devices): held by pods or DRA claims (held) or not (free).",
    &["node", "profile", "state"],
);
const CLUSTER_MIG_SLICES: Family = gauge(
    "gpu_extender_cluster_mig_slices",
    "MIG slices in the table by profile: held by pods or DRA claims (held) or not (free).",
    &["profile", "state"],
);
const CLUSTER_GPU_FRAGMENTED: Family = gauge(
    "gpu_extender_cluster_gpu_fragmented",
    "Free GPU capacity the typical pods could not use (FGD fragmentation), in GPUs.",
    &[],
);

const REBUILD_NAME: &str = "gpu_extender_table_rebuild_duration_seconds";
const REBUILD_HELP: &str =
    "Time to apply one full list of nodes or of pods to the allocation table.";

/// Every family written from the state (the rebuild histogram aside: a registered metric).
const FAMILIES: [&Family; 40] = [
    &TABLE_NODES,
    &TABLE_PODS,
    &RESERVATIONS_OUTSTANDING,
    &RECORDS_MISSING,
    &RECORDS_CORRUPT,
    &NODES_WITH_PROBLEMS,
    &TYPICAL_POD_CLASSES,
    &TYPICAL_PODS_LEARNED_FROM,
    &FGD_PLUS_HOST_WEIGHT,
    &WATCH_ERRORS,
    &RESERVATIONS_EXPIRED,
    &RECORDS_REJECTED,
    &RELISTS,
    &WATCH_EVENTS,
    &GPU_MEMORY_TOTAL,
    &GPU_MEMORY_ALLOCATED,
    &GPU_COMPUTE_ALLOCATED,
    &GPU_PODS,
    &GPU_HEALTHY,
    &NODE_GPUS,
    &NODE_GPUS_IN_USE,
    &NODE_GPU_OCCUPANCY,
    &CLUSTER_GPUS,
    &CLUSTER_IDLE_GPUS,
    &IDLE_GPU_NODES,
    &CLUSTER_GPU_FREE,
    &CLUSTER_GPU_FRAGMENTED,
    &MIG_SLICES,
    &CLUSTER_MIG_SLICES,
    &QUOTA_USED,
    &QUOTA_MIN,
    &QUOTA_MAX,
    &QUOTA_BORROWED,
    &QUOTAS_IGNORED,
    &DRA_SERVED,
    &DRA_DEVICES,
    &DRA_CLAIMS,
    &DRA_GPUS_HELD,
    &DRA_BOTH_WAYS,
    &DRA_SLICE_PROBLEMS,
];

/// The names of the families the state's metrics export (for `Metrics::names`).
pub fn family_names() -> impl Iterator<Item = &'static str> {
    FAMILIES
        .iter()
        .map(|family| family.name)
        .chain(std::iter::once(REBUILD_NAME))
}

/// Reads the shared state when Prometheus scrapes.
#[derive(Debug)]
pub struct StateCollector {
    cluster: Arc<ClusterState>,
    policy: PolicyCell,
    /// The table's list application times, taken from the state at each scrape (the state
    /// keeps those not yet taken); registered with the other metrics.
    rebuilds: Histogram,
}

impl StateCollector {
    /// A collector over `cluster`, reporting the typical-pod distribution of `policy`; its
    /// rebuild histogram is registered in `registry`.
    pub fn new(
        cluster: Arc<ClusterState>,
        policy: PolicyCell,
        registry: &Registry,
    ) -> Result<Self, prometheus::Error> {
        let rebuilds = Histogram::with_opts(HistogramOpts::new(REBUILD_NAME, REBUILD_HELP))?;
        registry.register(Box::new(rebuilds.clone()))?;
        Ok(Self {
            cluster,
            policy,
            rebuilds,
        })
    }

    /// Observes the list application times noted since the last scrape (before the registry
    /// is gathered, so that they show in this scrape).
    pub fn observe_rebuilds(&self) {
        for took in self.cluster.take_rebuild_times() {
            self.rebuilds.observe(took.as_secs_f64());
        }
    }

    /// Appends every family read from the state to `out`, in the text format (version 0.0.4).
    pub fn write(&self, out: &mut String) {
        let stats = self.cluster.stats();
        let policy = self.policy.load();
        let table = self.cluster.read();
        let reserved = table
            .pods()
            .filter(|(_, entry)| matches!(entry.hold, Hold::Reserved { .. }))
            .count();
        let (nodes, pods) = (table.node_count(), table.pod_count());
        let report = inspect::report(&table);
        let capacity = inspect::capacity(&table, &policy.typical);
        drop(table);
        single(out, &TABLE_NODES, whole(nodes as u64));
        single(out, &TABLE_PODS, whole(pods as u64));
        single(out, &RESERVATIONS_OUTSTANDING, whole(reserved as u64));
        single(out, &RECORDS_MISSING, whole(stats.records_missing as u64));
        single(out, &RECORDS_CORRUPT, whole(stats.records_corrupt as u64));
        single(
            out,
            &NODES_WITH_PROBLEMS,
            whole(stats.nodes_with_problems as u64),
        );
        single(
            out,
            &TYPICAL_POD_CLASSES,
            whole(policy.typical.pods().len() as u64),
        );
        single(
            out,
            &TYPICAL_PODS_LEARNED_FROM,
            whole(self.policy.learned_from()),
        );
        let host_weight = if policy.scoring == ScoringPolicy::FgdPlus {
            policy.fgd_plus.host_weight_at(policy.typical.host_slack()) / 100.0
        } else {
            0.0
        };
        single(out, &FGD_PLUS_HOST_WEIGHT, host_weight);
        single(out, &WATCH_ERRORS, stats.watch_errors as f64);
        single(
            out,
            &RESERVATIONS_EXPIRED,
            stats.reservations_expired as f64,
        );
        let mut rejected = Building::of(&RECORDS_REJECTED);
        let counts = stats.records_rejected;
        for (reason, total) in [
            ("changed", counts.changed),
            ("removed", counts.removed),
            ("mismatch", counts.mismatch),
            ("conflict", counts.conflict),
        ] {
            rejected.add(&[reason], total as f64);
        }
        rejected.done(out);
        let mut relists = Building::of(&RELISTS);
        relists.add(&["node"], stats.node_lists as f64);
        relists.add(&["pod"], stats.pod_lists as f64);
        relists.done(out);
        let mut events = Building::of(&WATCH_EVENTS);
        for (kind, counts) in [("node", stats.node_events), ("pod", stats.pod_events)] {
            for (event, total) in [
                ("apply", counts.apply),
                ("delete", counts.delete),
                ("listed", counts.listed),
            ] {
                events.add(&[event, kind], total as f64);
            }
        }
        events.done(out);
        write_capacity(out, &report, capacity);
        write_mig(out, &report);
        write_quotas(out, &self.cluster);
        write_dra(out, &self.cluster, &report);
    }
}

/// A family being written: its series go to a buffer of their own, label values first in
/// `Family::labels` order, so that the family's lines stay together while several families
/// are filled in one pass; HELP and TYPE lead them out, and a family without series writes
/// nothing (as the client library's encoder does).
struct Building {
    family: &'static Family,
    series: String,
}

impl Building {
    fn of(family: &'static Family) -> Self {
        Self {
            family,
            series: String::new(),
        }
    }

    fn add(&mut self, values: &[&str], value: f64) {
        let series = &mut self.series;
        series.push_str(self.family.name);
        let mut separator = '{';
        for (name, value) in self.family.labels.iter().zip(values) {
            series.push(separator);
            series.push_str(name);
            series.push_str("=\"");
            push_escaped(series, value, true);
            series.push('"');
            separator = ',';
        }
        if separator == ',' {
            series.push('}');
        }
        series.push(' ');
        push_value(series, value);
        series.push('\n');
    }

    fn done(self, out: &mut String) {
        if self.series.is_empty() {
            return;
        }
        let family = self.family;
        out.push_str("# HELP ");
        out.push_str(family.name);
        out.push(' ');
        push_escaped(out, family.help, false);
        out.push_str("\n# TYPE ");
        out.push_str(family.name);
        out.push(' ');
        out.push_str(family.kind.as_str());
        out.push('\n');
        out.push_str(&self.series);
    }
}

/// Appends `text` escaped as the text format asks: backslash and line feed always, the double
/// quote in label values.
fn push_escaped(out: &mut String, text: &str, label_value: bool) {
    if !text.contains(['\\', '\n', '"']) {
        out.push_str(text);
        return;
    }
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if label_value => out.push_str("\\\""),
            _ => out.push(c),
        }
    }
}

/// Appends a sample value as the text format spells it (Go's `+Inf`, `-Inf` and `NaN` for the
/// values that are not finite).
fn push_value(out: &mut String, value: f64) {
    if value.is_nan() {
        out.push_str("NaN");
    } else if value == f64::INFINITY {
        out.push_str("+Inf");
    } else if value == f64::NEG_INFINITY {
        out.push_str("-Inf");
    } else if value.fract() == 0.0 && value.abs() < 1e15 && value.is_sign_positive() {
        // Most values are counts and MiB: an integer writes several times faster than a float,
        // and the same (below 1e15, where `f64` prints no exponent and holds every integer).
        // Writing to a String cannot fail.
        let _ = write!(out, "{}", value as i64);
    } else {
        let _ = write!(out, "{value}");
    }
}

/// One unlabelled series.
fn single(out: &mut String, family: &'static Family, value: f64) {
    let mut building = Building::of(family);
    building.add(&[], value);
    building.done(out);
}

/// Counts and sizes as Prometheus integers: gauges of integer type hold `i64`, saturated.
fn whole(value: u64) -> f64 {
    i64::try_from(value).unwrap_or(i64::MAX) as f64
}

/// The per-quota gauges: one series per quota and resource, in the units quotas are written in.
fn write_quotas(out: &mut String, cluster: &ClusterState) {
    let mut used = Building::of(&QUOTA_USED);
    let mut min = Building::of(&QUOTA_MIN);
    let mut max = Building::of(&QUOTA_MAX);
    let mut borrowed = Building::of(&QUOTA_BORROWED);
    for quota in cluster.quota_reports() {
        for line in &quota.resources {
            let labels = [
                quota.namespace.as_str(),
                quota.name.as_str(),
                line.resource.as_str(),
            ];
            used.add(&labels, line.used);
            min.add(&labels, line.min);
            if let Some(limit) = line.max {
                max.add(&labels, limit);
            }
            borrowed.add(&labels, line.borrowed);
        }
    }
    for building in [used, min, max, borrowed] {
        building.done(out);
    }
    single(
        out,
        &QUOTAS_IGNORED,
        whole(cluster.quotas().problems.len() as u64),
    );
}

/// The DRA gauges (none while DRA is not read): from the book's counts, and the GPUs `report`
/// shows held by claims.
fn write_dra(out: &mut String, cluster: &ClusterState, report: &ClusterReport) {
    let Some((served, counts, both_ways)) = cluster.dra_counts() else {
        return;
    };
    single(out, &DRA_SERVED, f64::from(u8::from(served)));
    let mut devices = Building::of(&DRA_DEVICES);
    devices.add(&["gpu"], whole(counts.gpus as u64));
    devices.add(&["mig"], whole(counts.mig_slices as u64));
    devices.done(out);
    single(out, &DRA_CLAIMS, whole(counts.claims_allocated as u64));
    let held = report
        .nodes
        .iter()
        .flat_map(|node| &node.gpus)
        .filter(|gpu| !gpu.claims.is_empty())
        .count();
    single(out, &DRA_GPUS_HELD, whole(held as u64));
    single(out, &DRA_BOTH_WAYS, whole(both_ways as u64));
    let mut problems = Building::of(&DRA_SLICE_PROBLEMS);
    for (kind, count) in [
        ("device_unreadable", counts.devices_unreadable),
        ("not_node_local", counts.pools_not_node_local),
        ("pool_waiting", counts.pools_waiting),
        ("stale_slice", counts.stale_slices),
        ("unknown_driver", counts.unknown_driver_slices),
    ] {
        problems.add(&[kind], whole(count as u64));
    }
    problems.done(out);
}

/// The per-GPU, per-node and cluster allocation gauges of `report`: series exist only for the
/// nodes the table holds now.
fn write_capacity(out: &mut String, report: &ClusterReport, capacity: inspect::Capacity) {
    let mut memory_total = Building::of(&GPU_MEMORY_TOTAL);
    let mut memory_allocated = Building::of(&GPU_MEMORY_ALLOCATED);
    let mut compute_allocated = Building::of(&GPU_COMPUTE_ALLOCATED);
    let mut gpu_pods = Building::of(&GPU_PODS);
    let mut gpu_healthy = Building::of(&GPU_HEALTHY);
    let mut node_gpus = Building::of(&NODE_GPUS);
    let mut node_in_use = Building::of(&NODE_GPUS_IN_USE);
    let mut node_occupancy = Building::of(&NODE_GPU_OCCUPANCY);
    let mut index = String::new();
    for node in &report.nodes {
        let name = node.name.as_str();
        for gpu in &node.gpus {
            index.clear();
            let _ = write!(index, "{}", gpu.index);
            let labels = [index.as_str(), name];
            memory_total.add(&labels, whole(gpu.memory_mib));
            memory_allocated.add(&labels, whole(gpu.memory_in_use_mib()));
            compute_allocated.add(&labels, f64::from(gpu.compute_allocated_milli) / 1000.0);
            gpu_pods.add(&labels, whole(gpu.pods.len() as u64));
            gpu_healthy.add(
                &[index.as_str(), gpu.model.as_str(), name],
                f64::from(u8::from(gpu.healthy)),
            );
        }
        let in_use = node.gpus.iter().filter(|gpu| !gpu.is_idle()).count();
        node_gpus.add(&[name], whole(node.gpus.len() as u64));
        node_in_use.add(&[name], whole(in_use as u64));
        node_occupancy.add(&[name], node.occupancy());
    }
    for building in [
        memory_total,
        memory_allocated,
        compute_allocated,
        gpu_pods,
        gpu_healthy,
        node_gpus,
        node_in_use,
        node_occupancy,
    ] {
        building.done(out);
    }
    let totals = &report.totals;
    single(out, &CLUSTER_GPUS, whole(totals.gpus));
    single(out, &CLUSTER_IDLE_GPUS, whole(totals.idle_gpus));
    single(out, &IDLE_GPU_NODES, whole(totals.idle_gpu_nodes));
    single(out, &CLUSTER_GPU_FREE, capacity.free_milli as f64 / 1000.0);
    single(
        out,
        &CLUSTER_GPU_FRAGMENTED,
        capacity.fragmented_milli / 1000.0,
    );
}

/// The MIG gauges of `report`: per node and profile, and per profile over the cluster, the
/// slices held and free. Series exist only for the profiles nodes advertise or pods hold.
fn write_mig(out: &mut String, report: &ClusterReport) {
    let mut per_node = Building::of(&MIG_SLICES);
    let mut cluster: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for node in &report.nodes {
        for pool in &node.mig {
            let profile = pool.profile.as_str();
            per_node.add(&[node.name.as_str(), profile, "held"], f64::from(pool.held));
            per_node.add(&[node.name.as_str(), profile, "free"], f64::from(pool.free));
            let total = cluster.entry(profile).or_default();
            total.0 += u64::from(pool.held);
            total.1 += u64::from(pool.free);
        }
    }
    per_node.done(out);
    let mut totals = Building::of(&CLUSTER_MIG_SLICES);
    for (profile, (held, free)) in cluster {
        totals.add(&[profile, "held"], whole(held));
        totals.add(&[profile, "free"], whole(free));
    }
    totals.done(out);
}

/// The metrics tests' fixture: one node of two 16 GiB T4s holding a pod's 4 GiB share, and
/// metrics that read it.
#[cfg(test)]
pub(crate) fn one_t4_watched() -> (Arc<ClusterState>, crate::telemetry::Metrics) {
    use crate::inspect::fixtures::{add_node, bind};
    use gpu_engine::{GpuDemand, GpuMode, Policy, Table};
    let mut table = Table::new(20);
    add_node(&mut table, "t4", GpuMode::ShareMemory, 2, "Tesla-T4", 16);
    let share = GpuDemand::share(4, 1, None).unwrap_or_else(|error| panic!("{error}"));
    bind(&mut table, "t4", "p", share);
    let cluster = Arc::new(ClusterState::with_table(table));
    let metrics =
        crate::telemetry::Metrics::new().unwrap_or_else(|error| panic!("metrics: {error}"));
    metrics
        .watch_state(Arc::clone(&cluster), PolicyCell::from(Policy::default()))
        .unwrap_or_else(|error| panic!("watching the state: {error}"));
    (cluster, metrics)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on a broken fixture")]

    use super::*;
    use crate::inspect::fixtures::{add_node, bind};
    use crate::telemetry::Metrics;
    use gpu_engine::{Change, GpuDemand, GpuMode, NodeName, Policy, Table};

    #[test]
    fn scrape_counts_mig_slices_held_and_free_per_node_and_profile() {
        use crate::inspect::fixtures::{add_mig_node, bind_mig};
        let mut table = Table::new(20);
        add_mig_node(&mut table, "mig-a", &[("1g.10gb", 7), ("3g.40gb", 2)]);
        add_mig_node(&mut table, "mig-b", &[("1g.10gb", 7)]);
        bind_mig(&mut table, "mig-a", "p", &[("1g.10gb", 2)]);
        let cluster = Arc::new(ClusterState::with_table(table));
        let metrics = Metrics::new().unwrap();
        metrics
            .watch_state(cluster, PolicyCell::from(Policy::default()))
            .unwrap();
        let text = metrics.render().unwrap();
        for line in [
            r#"gpu_extender_mig_slices{node="mig-a",profile="1g.10gb",state="held"} 2"#,
            r#"gpu_extender_mig_slices{node="mig-a",profile="1g.10gb",state="free"} 5"#,
            r#"gpu_extender_mig_slices{node="mig-a",profile="3g.40gb",state="free"} 2"#,
            r#"gpu_extender_mig_slices{node="mig-b",profile="1g.10gb",state="held"} 0"#,
            r#"gpu_extender_cluster_mig_slices{profile="1g.10gb",state="held"} 2"#,
            r#"gpu_extender_cluster_mig_slices{profile="1g.10gb",state="free"} 12"#,
            r#"gpu_extender_cluster_mig_slices{profile="3g.40gb",state="held"} 0"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn scrape_sets_capacity_gauges_from_the_table_and_drops_removed_nodes() {
        let mut table = Table::new(20);
        for name in ["t4", "spare"] {
            add_node(&mut table, name, GpuMode::ShareMemory, 2, "Tesla-T4", 16);
        }
        bind(&mut table, "t4", "p", GpuDemand::share(4, 1, None).unwrap());
        let writer = crate::state::TableWriter::new(ClusterState::with_table(table));
        let cluster = Arc::clone(writer.reader());
        let metrics = Metrics::new().unwrap();
        metrics
            .watch_state(Arc::clone(&cluster), PolicyCell::from(Policy::default()))
            .unwrap();
        let scrape = || metrics.render().unwrap();
        let text = scrape();
        for line in [
            r#"gpu_extender_gpu_memory_total_mib{gpu="0",node="t4"} 16384"#,
            r#"gpu_extender_gpu_memory_allocated_mib{gpu="0",node="t4"} 4096"#,
            r#"gpu_extender_gpu_pods{gpu="0",node="t4"} 1"#,
            r#"gpu_extender_gpu_healthy{gpu="1",model="Tesla-T4",node="spare"} 1"#,
            r#"gpu_extender_node_gpus_in_use{node="t4"} 1"#,
            r#"gpu_extender_node_gpu_occupancy{node="t4"} 0.125"#,
            "gpu_extender_cluster_gpus 4",
            "gpu_extender_cluster_idle_gpus 3",
            "gpu_extender_idle_gpu_nodes 1",
            "gpu_extender_cluster_gpu_free 3.75",
            "gpu_extender_cluster_gpu_fragmented 0.75",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
        writer
            .write()
            .apply(Change::RemoveNode(NodeName::new("spare")));
        let text = scrape();
        assert!(!text.contains(r#"node="spare""#), "{text}");
        assert!(text.contains("gpu_extender_idle_gpu_nodes 0"), "{text}");
        // The table was given whole, not listed: no rebuild observed.
        assert!(
            text.contains("gpu_extender_table_rebuild_duration_seconds_count 0"),
            "{text}"
        );
    }

    /// The library's objects for `values` of `family`, as the collector built them before it
    /// wrote the text itself: the oracle the text is checked against.
    fn library_family(
        family: &'static Family,
        series: &[(Vec<&str>, f64)],
    ) -> prometheus::proto::MetricFamily {
        use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
        let metrics = series
            .iter()
            .map(|(values, value)| {
                let labels = family
                    .labels
                    .iter()
                    .zip(values)
                    .map(|(&name, &value)| {
                        let mut pair = LabelPair::default();
                        pair.set_name(name.to_owned());
                        pair.set_value(value.to_owned());
                        pair
                    })
                    .collect();
                let mut metric = Metric::from_label(labels);
                if family.kind == Kind::Counter {
                    let mut counter = Counter::default();
                    counter.set_value(*value);
                    metric.set_counter(counter);
                } else {
                    let mut gauge = Gauge::default();
                    gauge.set_value(*value);
                    metric.set_gauge(gauge);
                }
                metric
            })
            .collect();
        let mut built = MetricFamily::default();
        built.set_name(family.name.to_owned());
        built.set_help(family.help.to_owned());
        built.set_field_type(match family.kind {
            Kind::Counter => MetricType::COUNTER,
            Kind::Gauge => MetricType::GAUGE,
        });
        built.set_metric(metrics);
        built
    }

    #[test]
    fn the_host_term_s_weight_in_force_is_exported() {
        use gpu_engine::policy::fgd_plus::Tuning;
        use gpu_engine::policy::typical::{TypicalPod, TypicalPods};
        use gpu_engine::{CpuMilli, MemMiB, NodeSpec, ScoringPolicy};
        let node = |name: &str, cpu: u64| {
            NodeSpec::uniform(name, GpuMode::CoreMem, 2, "T4", MemMiB(0)).with_host(
                CpuMilli(cpu),
                MemMiB(1 << 20),
                110,
            )
        };
        let scrape = |cpus: &[u64], scoring| {
            let mut table = Table::new(20);
            for (index, &cpu) in cpus.iter().enumerate() {
                table.apply(Change::UpsertNode(node(&format!("n{index}"), cpu)));
            }
            // One-GPU pods of 12 cores.
            let typical = TypicalPods::new(vec![TypicalPod {
                cpu: CpuMilli(12_000),
                memory: MemMiB(0),
                gpus: 1,
                milli: 1000,
                models: Vec::new(),
                weight: 1.0,
            }])
            .with_cluster(table.nodes());
            let policy = Policy {
                typical,
                ..Policy::scoring(scoring)
            };
            let metrics = Metrics::new().unwrap();
            let cluster = Arc::new(ClusterState::with_table(table));
            metrics
                .watch_state(cluster, PolicyCell::from(policy))
                .unwrap();
            metrics.render().unwrap()
        };
        let weight = |text: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix("gpu_extender_fgd_plus_host_weight "))
                .map(|value| value.parse::<f64>().unwrap())
        };
        // The default weight, in whole units as exported.
        let whole = f64::from(Tuning::default().host.weight) / 100.0;
        // Every node's CPU is what its GPUs ask: no slack, the term is off.
        let tight = scrape(&[24_000, 24_000], ScoringPolicy::FgdPlus);
        assert_eq!(weight(&tight), Some(0.0), "{tight}");
        // 2.4 cores beyond the ask of 96 for 8 GPUs: slack 0.025, a quarter of the weight.
        let thin = scrape(&[26_400, 24_000, 24_000, 24_000], ScoringPolicy::FgdPlus);
        assert!(
            (weight(&thin).unwrap() - whole / 4.0).abs() < 1e-9,
            "{thin}"
        );
        let ample = scrape(&[128_000, 24_000], ScoringPolicy::FgdPlus);
        assert_eq!(weight(&ample), Some(whole), "{ample}");
        // Other scoring policies have no host term.
        let binpack = scrape(&[128_000, 24_000], ScoringPolicy::Binpack);
        assert_eq!(weight(&binpack), Some(0.0), "{binpack}");
    }

    #[test]
    fn families_are_written_as_the_client_librarys_encoder_writes_them() {
        use prometheus::{Encoder, TextEncoder};
        let odd_values = [
            "Tesla-T4",
            "back\\slash",
            "quote\"d",
            "line\nfeed",
            "ünïcode",
        ];
        let numbers = [0.0, 1.0, 0.125, 16384.0, 9_007_199_254_740_992.0];
        let healthy: Vec<(Vec<&str>, f64)> = odd_values
            .iter()
            .zip(numbers)
            .map(|(&model, value)| (vec!["3", model, "node-a"], value))
            .collect();
        let events: Vec<(Vec<&str>, f64)> = odd_values
            .iter()
            .zip(numbers)
            .map(|(&event, value)| (vec![event, "pod"], value))
            .collect();
        for (family, series) in [(&GPU_HEALTHY, healthy), (&WATCH_EVENTS, events)] {
            let mut written = String::new();
            let mut building = Building::of(family);
            for (values, value) in &series {
                building.add(values, *value);
            }
            building.done(&mut written);
            let mut encoded = Vec::new();
            TextEncoder::new()
                .encode(&[library_family(family, &series)], &mut encoded)
                .unwrap();
            assert_eq!(
                written,
                String::from_utf8(encoded).unwrap(),
                "{}",
                family.name
            );
        }
        // No series, no lines (not even HELP and TYPE).
        let mut written = String::new();
        Building::of(&QUOTA_USED).done(&mut written);
        assert_eq!(written, "");
    }

    #[test]
    fn values_that_are_not_finite_are_spelled_as_prometheus_reads_them() {
        let mut text = String::new();
        for value in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN, -0.5, -0.0, -3.0] {
            push_value(&mut text, value);
            text.push(' ');
        }
        assert_eq!(text, "+Inf -Inf NaN -0.5 -0 -3 ");
        // Whole values are written as `f64` writes them, up to the largest exact integer.
        for value in [
            0.0,
            1.0,
            16384.0,
            9_007_199_254_740_992.0,
            1e15,
            1e16,
            1e21,
            0.125,
        ] {
            let mut text = String::new();
            push_value(&mut text, value);
            assert_eq!(text, value.to_string());
        }
    }

    #[test]
    fn every_family_is_named() {
        let metrics = Metrics::new().unwrap();
        let names = metrics.names();
        assert!(
            names
                .iter()
                .any(|n| n == "gpu_extender_gpu_memory_total_mib")
        );
        assert!(names.iter().any(|n| n == "gpu_extender_binds_total"));
        // The collector's families are named before it is registered.
        assert!(
            names
                .iter()
                .any(|n| n == "gpu_extender_table_rebuild_duration_seconds")
        );
    }

    #[test]
    fn scrape_reports_each_quota_in_its_units() {
        use crate::objects::quota::{quota_names, read_quota};
        use gpu_engine::quota::QuotaSet;
        let (cluster, metrics) = one_t4_watched();
        assert!(
            !metrics
                .render()
                .unwrap()
                .contains("gpu_extender_quota_used{")
        );
        let config = crate::config::Config::default();
        let namespace =
            gpu_engine::quota::namespace_of(&cluster.read().pods().next().unwrap().0.clone())
                .to_owned();
        let quota = read_quota(
            "gpus",
            &namespace,
            Some(&serde_json::json!({"min": {"aliyun.com/gpu-mem": 2}, "max": {"aliyun.com/gpu-mem": 8}})),
            None,
            &config,
        )
        .unwrap();
        cluster.set_quotas(QuotaSet::build(
            vec![quota],
            vec!["bad".into()],
            &quota_names(&config),
        ));
        let text = metrics.render().unwrap();
        for line in [
            format!(
                r#"gpu_extender_quota_used{{namespace="{namespace}",quota="gpus",resource="aliyun.com/gpu-mem"}} 4"#
            ),
            format!(
                r#"gpu_extender_quota_min{{namespace="{namespace}",quota="gpus",resource="aliyun.com/gpu-mem"}} 2"#
            ),
            format!(
                r#"gpu_extender_quota_max{{namespace="{namespace}",quota="gpus",resource="aliyun.com/gpu-mem"}} 8"#
            ),
            format!(
                r#"gpu_extender_quota_borrowed{{namespace="{namespace}",quota="gpus",resource="aliyun.com/gpu-mem"}} 2"#
            ),
            "gpu_extender_quotas_ignored 1".to_owned(),
        ] {
            assert!(text.contains(&line), "missing {line} in\n{text}");
        }
        // nvidia.com/gpu is not limited by this quota's max: no series.
        assert!(!text.contains(&format!(
            r#"gpu_extender_quota_max{{namespace="{namespace}",quota="gpus",resource="nvidia.com/gpu"}}"#
        )));
        assert!(text.contains(&format!(
            r#"gpu_extender_quota_used{{namespace="{namespace}",quota="gpus",resource="nvidia.com/gpu"}} 0"#
        )));
    }
}
