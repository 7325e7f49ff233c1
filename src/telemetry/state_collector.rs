//! The metrics read from the shared state at scrape time: a Prometheus [`Collector`] that builds
//! the table's size, the allocation gauges, the feed's health and its counters from one snapshot
//! when Prometheus asks, instead of copying them into registered metrics. Nothing is computed
//! per watch event, and the counters kept by the feed are exported as they are.

use std::collections::HashMap;
use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{Histogram, HistogramOpts};

use crate::engine::Hold;
use crate::inspect::{self, ClusterReport};
use crate::state::{ClusterState, PolicyCell};

/// A family this collector exports: name, help, type and label names (sorted, as Prometheus
/// writes them).
struct Family {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    labels: &'static [&'static str],
}

const fn gauge(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Family {
    Family {
        name,
        help,
        kind: MetricType::GAUGE,
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
        kind: MetricType::COUNTER,
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
const CLUSTER_GPU_FRAGMENTED: Family = gauge(
    "gpu_extender_cluster_gpu_fragmented",
    "Free GPU capacity the typical pods could not use (FGD fragmentation), in GPUs.",
    &[],
);

const REBUILD_NAME: &str = "gpu_extender_table_rebuild_duration_seconds";
const REBUILD_HELP: &str =
    "Time to apply one full list of nodes or of pods to the allocation table.";

/// Every family built from the state, histogram aside.
const FAMILIES: [&Family; 31] = [
    &TABLE_NODES,
    &TABLE_PODS,
    &RESERVATIONS_OUTSTANDING,
    &RECORDS_MISSING,
    &RECORDS_CORRUPT,
    &NODES_WITH_PROBLEMS,
    &TYPICAL_POD_CLASSES,
    &TYPICAL_PODS_LEARNED_FROM,
    &WATCH_ERRORS,
    &RESERVATIONS_EXPIRED,
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
    &QUOTA_USED,
    &QUOTA_MIN,
    &QUOTA_MAX,
    &QUOTA_BORROWED,
    &QUOTAS_IGNORED,
    &Family {
        name: REBUILD_NAME,
        help: REBUILD_HELP,
        kind: MetricType::HISTOGRAM,
        labels: &[],
    },
];

/// The names of the families [`StateCollector`] exports (for `Metrics::names`).
pub fn family_names() -> impl Iterator<Item = &'static str> {
    FAMILIES.iter().map(|family| family.name)
}

/// Reads the shared state when Prometheus scrapes.
#[derive(Debug)]
pub struct StateCollector {
    cluster: Arc<ClusterState>,
    policy: PolicyCell,
    descs: Vec<Desc>,
    /// The table's list application times, taken from the state at each scrape (the state
    /// keeps those not yet taken).
    rebuilds: Histogram,
}

impl StateCollector {
    /// A collector over `cluster`, reporting the typical-pod distribution of `policy`.
    pub fn new(cluster: Arc<ClusterState>, policy: PolicyCell) -> Result<Self, prometheus::Error> {
        let rebuilds = Histogram::with_opts(HistogramOpts::new(REBUILD_NAME, REBUILD_HELP))?;
        let mut descs = Vec::with_capacity(FAMILIES.len());
        for family in FAMILIES.iter().filter(|f| f.kind != MetricType::HISTOGRAM) {
            descs.push(Desc::new(
                family.name.to_owned(),
                family.help.to_owned(),
                family
                    .labels
                    .iter()
                    .map(|&label| label.to_owned())
                    .collect(),
                HashMap::new(),
            )?);
        }
        descs.extend(rebuilds.desc().into_iter().cloned());
        Ok(Self {
            cluster,
            policy,
            descs,
            rebuilds,
        })
    }
}

/// A family being built: its metrics are added label values first, in `Family::labels` order.
struct Building {
    family: &'static Family,
    metrics: Vec<Metric>,
}

impl Building {
    fn of(family: &'static Family) -> Self {
        Self {
            family,
            metrics: Vec::new(),
        }
    }

    fn add(&mut self, values: &[&str], value: f64) {
        let labels = self
            .family
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
        if self.family.kind == MetricType::COUNTER {
            let mut counter = Counter::default();
            counter.set_value(value);
            metric.set_counter(counter);
        } else {
            let mut gauge = Gauge::default();
            gauge.set_value(value);
            metric.set_gauge(gauge);
        }
        self.metrics.push(metric);
    }

    fn done(self) -> MetricFamily {
        let mut family = MetricFamily::default();
        family.set_name(self.family.name.to_owned());
        family.set_help(self.family.help.to_owned());
        family.set_field_type(self.family.kind);
        family.set_metric(self.metrics);
        family
    }
}

/// One unlabelled series.
fn single(family: &'static Family, value: f64) -> MetricFamily {
    let mut building = Building::of(family);
    building.add(&[], value);
    building.done()
}

/// Counts and sizes as Prometheus integers: gauges of integer type hold `i64`, saturated.
fn whole(value: u64) -> f64 {
    i64::try_from(value).unwrap_or(i64::MAX) as f64
}

impl Collector for StateCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
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
        for took in self.cluster.take_rebuild_times() {
            self.rebuilds.observe(took.as_secs_f64());
        }
        let mut families = vec![
            single(&TABLE_NODES, whole(nodes as u64)),
            single(&TABLE_PODS, whole(pods as u64)),
            single(&RESERVATIONS_OUTSTANDING, whole(reserved as u64)),
            single(&RECORDS_MISSING, whole(stats.records_missing as u64)),
            single(&RECORDS_CORRUPT, whole(stats.records_corrupt as u64)),
            single(
                &NODES_WITH_PROBLEMS,
                whole(stats.nodes_with_problems as u64),
            ),
            single(
                &TYPICAL_POD_CLASSES,
                whole(policy.typical.pods().len() as u64),
            ),
            single(
                &TYPICAL_PODS_LEARNED_FROM,
                whole(self.policy.learned_from()),
            ),
            single(&WATCH_ERRORS, stats.watch_errors as f64),
            single(&RESERVATIONS_EXPIRED, stats.reservations_expired as f64),
        ];
        let mut relists = Building::of(&RELISTS);
        relists.add(&["node"], stats.node_lists as f64);
        relists.add(&["pod"], stats.pod_lists as f64);
        families.push(relists.done());
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
        families.push(events.done());
        families.extend(capacity_families(&report, capacity));
        families.extend(quota_families(&self.cluster));
        families.extend(self.rebuilds.collect());
        families
    }
}

/// The per-quota gauges: one series per quota and resource, in the units quotas are written in.
fn quota_families(cluster: &ClusterState) -> Vec<MetricFamily> {
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
    vec![
        used.done(),
        min.done(),
        max.done(),
        borrowed.done(),
        single(
            &QUOTAS_IGNORED,
            whole(cluster.quotas().problems.len() as u64),
        ),
    ]
}

/// The per-GPU, per-node and cluster allocation gauges of `report`: series exist only for the
/// nodes the table holds now.
fn capacity_families(report: &ClusterReport, capacity: inspect::Capacity) -> Vec<MetricFamily> {
    let mut memory_total = Building::of(&GPU_MEMORY_TOTAL);
    let mut memory_allocated = Building::of(&GPU_MEMORY_ALLOCATED);
    let mut compute_allocated = Building::of(&GPU_COMPUTE_ALLOCATED);
    let mut gpu_pods = Building::of(&GPU_PODS);
    let mut gpu_healthy = Building::of(&GPU_HEALTHY);
    let mut node_gpus = Building::of(&NODE_GPUS);
    let mut node_in_use = Building::of(&NODE_GPUS_IN_USE);
    let mut node_occupancy = Building::of(&NODE_GPU_OCCUPANCY);
    for node in &report.nodes {
        let name = node.name.as_str();
        for gpu in &node.gpus {
            let index = gpu.index.to_string();
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
    let totals = &report.totals;
    vec![
        memory_total.done(),
        memory_allocated.done(),
        compute_allocated.done(),
        gpu_pods.done(),
        gpu_healthy.done(),
        node_gpus.done(),
        node_in_use.done(),
        node_occupancy.done(),
        single(&CLUSTER_GPUS, whole(totals.gpus)),
        single(&CLUSTER_IDLE_GPUS, whole(totals.idle_gpus)),
        single(&IDLE_GPU_NODES, whole(totals.idle_gpu_nodes)),
        single(&CLUSTER_GPU_FREE, capacity.free_milli as f64 / 1000.0),
        single(&CLUSTER_GPU_FRAGMENTED, capacity.fragmented_milli / 1000.0),
    ]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on a broken fixture")]

    use super::*;
    use crate::engine::{Change, GpuDemand, GpuMode, NodeName, Policy, Table};
    use crate::inspect::fixtures::{add_node, bind};
    use crate::telemetry::Metrics;

    #[test]
    fn scrape_sets_capacity_gauges_from_the_table_and_drops_removed_nodes() {
        let mut table = Table::new(20);
        for name in ["t4", "spare"] {
            add_node(&mut table, name, GpuMode::ShareMemory, 2, "Tesla-T4", 16);
        }
        bind(&mut table, "t4", "p", GpuDemand::share(4, 1, None).unwrap());
        let cluster = Arc::new(ClusterState::with_table(table));
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
        cluster
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
        use crate::engine::quota::QuotaSet;
        use crate::objects::quota::{quota_names, read_quota};
        let mut table = Table::new(20);
        add_node(&mut table, "t4", GpuMode::ShareMemory, 2, "Tesla-T4", 16);
        bind(&mut table, "t4", "p", GpuDemand::share(4, 1, None).unwrap());
        let cluster = Arc::new(ClusterState::with_table(table));
        let metrics = Metrics::new().unwrap();
        metrics
            .watch_state(Arc::clone(&cluster), PolicyCell::from(Policy::default()))
            .unwrap();
        assert!(
            !metrics
                .render()
                .unwrap()
                .contains("gpu_extender_quota_used{")
        );
        let config = crate::config::Config::default();
        let namespace =
            crate::engine::quota::namespace_of(&cluster.read().pods().next().unwrap().0.clone())
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
