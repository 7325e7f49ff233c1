//! The metric families, built once in a registry owned by the caller (no global registry), with
//! bounded label sets: verbs, outcomes and reason codes, and node names and GPU indices for the
//! allocation gauges (bounded by the cluster's size); never pod names.

use std::sync::{Arc, Mutex, PoisonError};

use prometheus::core::Collector;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::engine::RejectReason;

/// Extender verbs, the `verb` label's values.
pub const VERBS: [&str; 4] = ["filter", "prioritize", "bind", "preempt"];

/// Every metric the service exports.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Registry,
    /// Time to answer one extender call, by verb.
    pub request_duration: HistogramVec,
    /// Extender calls by verb and outcome (`ok`, `error`, `bad_request`).
    pub requests: IntCounterVec,
    /// Filter verdicts per candidate node (`passed`, `failed`, `unresolvable`, `unknown`).
    pub filter_nodes: IntCounterVec,
    /// Node rejections by reason code.
    pub rejections: IntCounterVec,
    /// Requests answered 503 because they waited too long for a turn under the concurrency limit.
    pub requests_shed: IntCounter,
    /// Pods whose GPU request could not be read (malformed quantities, uneven splits...).
    pub invalid_requests: IntCounter,
    /// Bind outcomes (`bound`, `already_bound`, `no_fit`, `pod_gone`, `node_gone`, `api_error`).
    pub binds: IntCounterVec,
    /// Reservations held between bind and the watch confirming the pod.
    pub reservations_outstanding: IntGauge,
    /// Reservations released because the pod never appeared bound.
    pub reservations_expired: IntCounter,
    /// Classes in the typical-pod distribution FGD scores with (configured or learned).
    pub typical_pod_classes: IntGauge,
    /// Pods the typical-pod distribution was last learned from (`policy.typicalPods.learn`).
    pub typical_pods_learned_from: IntGauge,
    /// Nodes and pods in the allocation table.
    pub table_nodes: IntGauge,
    pub table_pods: IntGauge,
    /// Time to rebuild the table from a full list.
    pub table_rebuild_duration: Histogram,
    /// Bound GPU pods without an allocation record (bound by someone else), and with a corrupt
    /// or copied one: both counted as using what their requests say.
    pub records_missing: IntGauge,
    pub records_corrupt: IntGauge,
    /// Nodes whose labels, capacity or GPU annotation had problems (see the logs).
    pub nodes_with_problems: IntGauge,
    /// Watch errors (each retried with backoff) and completed lists, by kind.
    pub watch_errors: IntCounter,
    pub relists: IntCounterVec,
    /// Waiting pods touched so kube-scheduler retries them after capacity was freed, by result
    /// (`touched`, `gone`, `error`).
    pub requeue_touches: IntCounterVec,
    /// Watch events applied to the table, by `kind` (node, pod) and `event` (apply, delete,
    /// listed: objects of a full list).
    pub watch_events: IntCounterVec,
    /// Kubernetes Events published on pods for bind decisions, by result (`sent`, `error`).
    pub pod_events: IntCounterVec,
    /// The capacity gauges below are set from one table snapshot at scrape time (see
    /// `service::refresh_metrics`); per-GPU and per-node series are labelled by node name and GPU
    /// index only, so their number is bounded by the cluster's size.
    pub capacity: CapacityGauges,
    /// Every family's name, in registration order.
    names: Arc<Vec<String>>,
    /// Serialises refresh and gather, so two concurrent scrapes never see each other's reset.
    scrape: Arc<Mutex<()>>,
}

/// Registers `collector` and notes the names of its families (the registry cannot list the
/// families that have no series yet).
fn register<C: Collector + 'static>(
    registry: &Registry,
    names: &mut Vec<String>,
    collector: C,
) -> Result<(), prometheus::Error> {
    names.extend(collector.desc().iter().map(|desc| desc.fq_name.clone()));
    registry.register(Box::new(collector))
}

/// Allocation gauges derived from the table.
#[derive(Clone, Debug)]
pub struct CapacityGauges {
    /// Per GPU (`node`, `gpu`): memory of the card and memory allocated (a whole-GPU pod
    /// allocates all of it).
    pub gpu_memory_total_mib: IntGaugeVec,
    pub gpu_memory_allocated_mib: IntGaugeVec,
    /// Per GPU: compute allocated, in GPUs (0..=1; a whole-GPU pod allocates 1).
    pub gpu_compute_allocated: GaugeVec,
    /// Per GPU: pods holding part or all of it.
    pub gpu_pods: IntGaugeVec,
    /// Per GPU (`node`, `gpu`, `model`): 1 when healthy, 0 when not.
    pub gpu_healthy: IntGaugeVec,
    /// Per node: GPUs, GPUs with any allocation, and compute allocated over GPUs (0..=1).
    pub node_gpus: IntGaugeVec,
    pub node_gpus_in_use: IntGaugeVec,
    pub node_gpu_occupancy: GaugeVec,
    /// Cluster: GPUs, GPUs with nothing allocated, GPU nodes with nothing allocated.
    pub cluster_gpus: IntGauge,
    pub cluster_idle_gpus: IntGauge,
    pub idle_gpu_nodes: IntGauge,
    /// Cluster: free capacity of healthy GPUs, in GPUs, and the part of it the typical pods
    /// could not use (the fragmentation measure of the FGD policy).
    pub cluster_gpu_free: Gauge,
    pub cluster_gpu_fragmented: Gauge,
}

impl CapacityGauges {
    fn new(registry: &Registry, names: &mut Vec<String>) -> Result<Self, prometheus::Error> {
        let per_gpu = ["node", "gpu"];
        let gauges = Self {
            gpu_memory_total_mib: IntGaugeVec::new(
                Opts::new(
                    "gpu_extender_gpu_memory_total_mib",
                    "GPU memory of each card, MiB.",
                ),
                &per_gpu,
            )?,
            gpu_memory_allocated_mib: IntGaugeVec::new(
                Opts::new(
                    "gpu_extender_gpu_memory_allocated_mib",
                    "GPU memory allocated on each card, MiB (all of it when held whole).",
                ),
                &per_gpu,
            )?,
            gpu_compute_allocated: GaugeVec::new(
                Opts::new(
                    "gpu_extender_gpu_compute_allocated",
                    "Compute allocated on each card, in GPUs (0 to 1; 1 when held whole).",
                ),
                &per_gpu,
            )?,
            gpu_pods: IntGaugeVec::new(
                Opts::new(
                    "gpu_extender_gpu_pods",
                    "Pods holding part or all of each card.",
                ),
                &per_gpu,
            )?,
            gpu_healthy: IntGaugeVec::new(
                Opts::new(
                    "gpu_extender_gpu_healthy",
                    "1 when the card is healthy, 0 when the node reports it unhealthy.",
                ),
                &["node", "gpu", "model"],
            )?,
            node_gpus: IntGaugeVec::new(
                Opts::new("gpu_extender_node_gpus", "GPUs of each node."),
                &["node"],
            )?,
            node_gpus_in_use: IntGaugeVec::new(
                Opts::new(
                    "gpu_extender_node_gpus_in_use",
                    "GPUs of each node with anything allocated.",
                ),
                &["node"],
            )?,
            node_gpu_occupancy: GaugeVec::new(
                Opts::new(
                    "gpu_extender_node_gpu_occupancy",
                    "Compute allocated on each node over its GPUs (0 to 1).",
                ),
                &["node"],
            )?,
            cluster_gpus: IntGauge::new("gpu_extender_cluster_gpus", "GPUs in the table.")?,
            cluster_idle_gpus: IntGauge::new(
                "gpu_extender_cluster_idle_gpus",
                "GPUs with nothing allocated.",
            )?,
            idle_gpu_nodes: IntGauge::new(
                "gpu_extender_idle_gpu_nodes",
                "GPU nodes with nothing allocated on any GPU.",
            )?,
            cluster_gpu_free: Gauge::new(
                "gpu_extender_cluster_gpu_free",
                "Free capacity of healthy GPUs, in GPUs (the scarcer of memory and compute).",
            )?,
            cluster_gpu_fragmented: Gauge::new(
                "gpu_extender_cluster_gpu_fragmented",
                "Free GPU capacity the typical pods could not use (FGD fragmentation), in GPUs.",
            )?,
        };
        register(registry, names, gauges.gpu_memory_total_mib.clone())?;
        register(registry, names, gauges.gpu_memory_allocated_mib.clone())?;
        register(registry, names, gauges.gpu_compute_allocated.clone())?;
        register(registry, names, gauges.gpu_pods.clone())?;
        register(registry, names, gauges.gpu_healthy.clone())?;
        register(registry, names, gauges.node_gpus.clone())?;
        register(registry, names, gauges.node_gpus_in_use.clone())?;
        register(registry, names, gauges.node_gpu_occupancy.clone())?;
        register(registry, names, gauges.cluster_gpus.clone())?;
        register(registry, names, gauges.cluster_idle_gpus.clone())?;
        register(registry, names, gauges.idle_gpu_nodes.clone())?;
        register(registry, names, gauges.cluster_gpu_free.clone())?;
        register(registry, names, gauges.cluster_gpu_fragmented.clone())?;
        Ok(gauges)
    }

    /// Drops every per-GPU and per-node series, so nodes gone from the table disappear.
    pub fn reset(&self) {
        self.gpu_memory_total_mib.reset();
        self.gpu_memory_allocated_mib.reset();
        self.gpu_compute_allocated.reset();
        self.gpu_pods.reset();
        self.gpu_healthy.reset();
        self.node_gpus.reset();
        self.node_gpus_in_use.reset();
        self.node_gpu_occupancy.reset();
    }
}

impl Metrics {
    /// Registers every family in a new registry.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let mut names = Vec::new();
        let latency_buckets = vec![
            0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
            0.25, 0.5, 1.0, 2.5, 5.0,
        ];
        let request_duration = HistogramVec::new(
            HistogramOpts::new(
                "gpu_extender_request_duration_seconds",
                "Time to answer one extender call from kube-scheduler, by verb.",
            )
            .buckets(latency_buckets),
            &["verb"],
        )?;
        let requests = IntCounterVec::new(
            Opts::new(
                "gpu_extender_requests_total",
                "Extender calls by verb and outcome.",
            ),
            &["verb", "outcome"],
        )?;
        let filter_nodes = IntCounterVec::new(
            Opts::new(
                "gpu_extender_filter_nodes_total",
                "Candidate nodes judged by filter, by verdict.",
            ),
            &["verdict"],
        )?;
        let rejections = IntCounterVec::new(
            Opts::new(
                "gpu_extender_rejections_total",
                "Candidate nodes rejected, by reason code.",
            ),
            &["reason"],
        )?;
        let invalid_requests = IntCounter::new(
            "gpu_extender_invalid_requests_total",
            "Filter calls for pods whose GPU request could not be read.",
        )?;
        let binds = IntCounterVec::new(
            Opts::new("gpu_extender_binds_total", "Bind calls by result."),
            &["result"],
        )?;
        let reservations_outstanding = IntGauge::new(
            "gpu_extender_reservations_outstanding",
            "GPU reservations held between bind and the watch confirming the bound pod.",
        )?;
        let requests_shed = IntCounter::new(
            "gpu_extender_requests_shed_total",
            "Requests answered 503 after waiting server.requestTimeoutMs for a turn under limits.maxConcurrentRequests.",
        )?;
        let reservations_expired = IntCounter::new(
            "gpu_extender_reservations_expired_total",
            "Reservations released because the bound pod never appeared.",
        )?;
        let typical_pod_classes = IntGauge::new(
            "gpu_extender_typical_pod_classes",
            "Classes in the typical-pod distribution FGD scores with (configured or learned).",
        )?;
        let typical_pods_learned_from = IntGauge::new(
            "gpu_extender_typical_pods_learned_from",
            "Pods the typical-pod distribution was last learned from (policy.typicalPods.learn).",
        )?;
        let table_nodes =
            IntGauge::new("gpu_extender_table_nodes", "Nodes in the allocation table.")?;
        let table_pods = IntGauge::new(
            "gpu_extender_table_pods",
            "Pods holding an allocation in the table.",
        )?;
        let table_rebuild_duration = Histogram::with_opts(HistogramOpts::new(
            "gpu_extender_table_rebuild_duration_seconds",
            "Time to apply one full list of nodes or of pods to the allocation table.",
        ))?;
        let records_missing = IntGauge::new(
            "gpu_extender_records_missing",
            "Bound GPU pods without an allocation record, counted from their requests.",
        )?;
        let records_corrupt = IntGauge::new(
            "gpu_extender_records_corrupt",
            "Bound GPU pods whose allocation record is corrupt or copied, counted from their requests.",
        )?;
        let nodes_with_problems = IntGauge::new(
            "gpu_extender_nodes_with_problems",
            "Nodes whose GPU labels, capacity or detail annotation could not be read fully.",
        )?;
        let watch_errors = IntCounter::new(
            "gpu_extender_watch_errors_total",
            "Node and pod watch errors, each retried with backoff.",
        )?;
        let relists = IntCounterVec::new(
            Opts::new(
                "gpu_extender_relists_total",
                "Completed full lists of nodes or pods.",
            ),
            &["kind"],
        )?;
        let requeue_touches = IntCounterVec::new(
            Opts::new(
                "gpu_extender_requeue_touches_total",
                "Unschedulable pods touched so kube-scheduler retries them once capacity was freed.",
            ),
            &["result"],
        )?;
        let watch_events = IntCounterVec::new(
            Opts::new(
                "gpu_extender_watch_events_total",
                "Node and pod watch events applied to the table.",
            ),
            &["kind", "event"],
        )?;
        let pod_events = IntCounterVec::new(
            Opts::new(
                "gpu_extender_pod_events_total",
                "Kubernetes Events published on pods for bind decisions, by result.",
            ),
            &["result"],
        )?;
        register(&registry, &mut names, watch_events.clone())?;
        register(&registry, &mut names, pod_events.clone())?;
        let capacity = CapacityGauges::new(&registry, &mut names)?;
        register(&registry, &mut names, requeue_touches.clone())?;
        register(&registry, &mut names, records_missing.clone())?;
        register(&registry, &mut names, records_corrupt.clone())?;
        register(&registry, &mut names, nodes_with_problems.clone())?;
        register(&registry, &mut names, watch_errors.clone())?;
        register(&registry, &mut names, relists.clone())?;
        register(&registry, &mut names, request_duration.clone())?;
        register(&registry, &mut names, requests.clone())?;
        register(&registry, &mut names, filter_nodes.clone())?;
        register(&registry, &mut names, rejections.clone())?;
        register(&registry, &mut names, invalid_requests.clone())?;
        register(&registry, &mut names, binds.clone())?;
        register(&registry, &mut names, reservations_outstanding.clone())?;
        register(&registry, &mut names, reservations_expired.clone())?;
        register(&registry, &mut names, requests_shed.clone())?;
        register(&registry, &mut names, typical_pod_classes.clone())?;
        register(&registry, &mut names, typical_pods_learned_from.clone())?;
        register(&registry, &mut names, table_nodes.clone())?;
        register(&registry, &mut names, table_pods.clone())?;
        register(&registry, &mut names, table_rebuild_duration.clone())?;
        // Pre-create the bounded label values so dashboards see zeros, not gaps.
        for verb in VERBS {
            request_duration.with_label_values(&[verb]);
        }
        for reason in RejectReason::ALL {
            rejections.with_label_values(&[reason.code()]);
        }
        for result in ["touched", "gone", "error"] {
            requeue_touches.with_label_values(&[result]);
        }
        for kind in ["node", "pod"] {
            for event in ["apply", "delete", "listed"] {
                watch_events.with_label_values(&[kind, event]);
            }
        }
        for result in ["sent", "error"] {
            pod_events.with_label_values(&[result]);
        }
        Ok(Self {
            registry,
            names: Arc::new(names),
            request_duration,
            requests,
            filter_nodes,
            rejections,
            invalid_requests,
            binds,
            reservations_outstanding,
            reservations_expired,
            requests_shed,
            typical_pod_classes,
            typical_pods_learned_from,
            table_nodes,
            table_pods,
            table_rebuild_duration,
            records_missing,
            records_corrupt,
            nodes_with_problems,
            watch_errors,
            relists,
            requeue_touches,
            watch_events,
            pod_events,
            capacity,
            scrape: Arc::new(Mutex::new(())),
        })
    }

    /// The name of every metric family registered, for checks of dashboards and documentation.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The registry, for collectors registered elsewhere.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Everything in Prometheus text format (version 0.0.4).
    pub fn render(&self) -> Result<String, prometheus::Error> {
        self.render_after(|_| {})
    }

    /// Runs `refresh` (copying state kept elsewhere into the metrics), then renders; no other
    /// scrape refreshes in between.
    pub fn render_after(&self, refresh: impl FnOnce(&Self)) -> Result<String, prometheus::Error> {
        let _scrape = self.scrape.lock().unwrap_or_else(PoisonError::into_inner);
        refresh(self);
        let mut buffer = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buffer)?;
        String::from_utf8(buffer).map_err(|error| prometheus::Error::Msg(error.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_text_format_with_preregistered_labels() {
        let metrics = Metrics::new().unwrap();
        metrics.requests.with_label_values(&["filter", "ok"]).inc();
        let text = metrics.render().unwrap();
        assert!(text.contains("# TYPE gpu_extender_request_duration_seconds histogram"));
        assert!(text.contains(r#"gpu_extender_requests_total{outcome="ok",verb="filter"} 1"#));
        assert!(text.contains(r#"gpu_extender_rejections_total{reason="no_free_whole_gpus"} 0"#));
    }
}
