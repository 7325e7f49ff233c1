//! The metric families, built once in a registry owned by the caller (no global registry), with
//! bounded label sets: verbs, outcomes and reason codes, never pod names.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
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
    /// Pods whose GPU request could not be read (malformed quantities, uneven splits...).
    pub invalid_requests: IntCounter,
    /// Bind outcomes (`bound`, `already_bound`, `no_fit`, `pod_gone`, `node_gone`, `api_error`).
    pub binds: IntCounterVec,
    /// Reservations held between bind and the watch confirming the pod.
    pub reservations_outstanding: IntGauge,
    /// Reservations released because the pod never appeared bound.
    pub reservations_expired: IntCounter,
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
}

impl Metrics {
    /// Registers every family in a new registry.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
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
        let reservations_expired = IntCounter::new(
            "gpu_extender_reservations_expired_total",
            "Reservations released because the bound pod never appeared.",
        )?;
        let table_nodes =
            IntGauge::new("gpu_extender_table_nodes", "Nodes in the allocation table.")?;
        let table_pods = IntGauge::new(
            "gpu_extender_table_pods",
            "Pods holding an allocation in the table.",
        )?;
        let table_rebuild_duration = Histogram::with_opts(HistogramOpts::new(
            "gpu_extender_table_rebuild_duration_seconds",
            "Time to rebuild the allocation table from a full list of nodes and pods.",
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
        registry.register(Box::new(requeue_touches.clone()))?;
        registry.register(Box::new(records_missing.clone()))?;
        registry.register(Box::new(records_corrupt.clone()))?;
        registry.register(Box::new(nodes_with_problems.clone()))?;
        registry.register(Box::new(watch_errors.clone()))?;
        registry.register(Box::new(relists.clone()))?;
        registry.register(Box::new(request_duration.clone()))?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(filter_nodes.clone()))?;
        registry.register(Box::new(rejections.clone()))?;
        registry.register(Box::new(invalid_requests.clone()))?;
        registry.register(Box::new(binds.clone()))?;
        registry.register(Box::new(reservations_outstanding.clone()))?;
        registry.register(Box::new(reservations_expired.clone()))?;
        registry.register(Box::new(table_nodes.clone()))?;
        registry.register(Box::new(table_pods.clone()))?;
        registry.register(Box::new(table_rebuild_duration.clone()))?;
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
        Ok(Self {
            registry,
            request_duration,
            requests,
            filter_nodes,
            rejections,
            invalid_requests,
            binds,
            reservations_outstanding,
            reservations_expired,
            table_nodes,
            table_pods,
            table_rebuild_duration,
            records_missing,
            records_corrupt,
            nodes_with_problems,
            watch_errors,
            relists,
            requeue_touches,
        })
    }

    /// The registry, for collectors registered elsewhere.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Everything in Prometheus text format (version 0.0.4).
    pub fn render(&self) -> Result<String, prometheus::Error> {
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
