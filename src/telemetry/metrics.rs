//! The metric families, built once in a registry owned by the caller (no global registry), with
//! bounded label sets: verbs, outcomes and reason codes, and node names and GPU indices for the
//! allocation gauges (bounded by the cluster's size); never pod names. The families here are
//! counted as things happen; those read from the shared state come from
//! [`StateCollector`](super::state_collector::StateCollector) at scrape time.

use std::sync::{Arc, OnceLock};

use prometheus::core::Collector;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use super::state_collector::{self, StateCollector};
use crate::build_info;
use crate::state::{ClusterState, PolicyCell};
use gpu_engine::RejectReason;

/// Extender verbs, the `verb` label's values.
pub const VERBS: [&str; 4] = ["filter", "prioritize", "bind", "preempt"];

/// The scheduler-estimator's gRPC methods (Karmada's names), the `method` label's values.
pub const ESTIMATOR_METHODS: [&str; 3] = [
    "MaxAvailableReplicas",
    "MaxAvailableComponentSets",
    "GetUnschedulableReplicas",
];

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
    /// Filter calls that fitted no candidate while a node kube-scheduler did not send would
    /// have taken the pod (its `percentageOfNodesToScore` window).
    pub filter_window_misses: IntCounter,
    /// Requests answered 503 because they waited too long for a turn under the concurrency limit.
    pub requests_shed: IntCounter,
    /// Pods whose GPU request could not be read (malformed quantities, uneven splits...).
    pub invalid_requests: IntCounter,
    /// Filter calls refused because the pod would take its team past its GPU quota's max.
    pub quota_refusals: IntCounter,
    /// Bind outcomes (`bound`, `already_bound`, `no_fit`, `over_quota`, `pod_gone`, `node_gone`,
    /// `api_error`, ...; docs/metrics.md lists them all).
    pub binds: IntCounterVec,
    /// Waiting pods touched so kube-scheduler retries them after capacity was freed, by result
    /// (`touched`, `gone`, `error`).
    pub requeue_touches: IntCounterVec,
    /// Kubernetes Events published on pods for bind decisions and quota reclaims, by result
    /// (`sent`, `error`).
    pub pod_events: IntCounterVec,
    /// Quota reclaims through the Eviction API, by result (`evicted`, `pdb_blocked`, `error`).
    pub quota_reclaims: IntCounterVec,
    /// 1 while this replica holds the writer Lease (src/k8s/lease.rs).
    pub writer: IntGauge,
    /// Admin requests refused at `limits.maxConcurrentAdminRequests`.
    pub admin_requests_shed: IntCounter,
    /// Verb request bodies refused before their turn, by reason (`too_large`, `too_slow`,
    /// `over_budget`, `unreadable`; src/http/body.rs).
    pub request_bodies_refused: IntCounterVec,
    /// Admin requests answered 429 because their client address passed
    /// `server.adminAuth.failedTokensPerMinute`.
    pub admin_tokens_throttled: IntCounter,
    /// Pods evicted by quota reclaims.
    pub quota_evictions: IntCounter,
    /// Scheduler-estimator calls by method and gRPC code (`OK`, `InvalidArgument`, ...).
    pub estimator_requests: IntCounterVec,
    /// Time to answer one scheduler-estimator call, by method.
    pub estimator_duration: HistogramVec,
    /// Scheduler-estimator calls refused at `estimator.maxConcurrentRequests`.
    pub estimator_requests_shed: IntCounter,
    /// Node patches of the largest-free-share label (src/k8s/node_label.rs), by result
    /// (`patched`, `error`).
    pub node_label_writes: IntCounterVec,
    /// Pod admission reviews answered by the webhook (src/http/webhook.rs), by result
    /// (`mutated`, `unchanged`, `bad_request`).
    pub webhook_reviews: IntCounterVec,
    /// Every family's name, in registration order.
    names: Arc<Vec<String>>,
    /// The families read from the shared state, once [`Metrics::watch_state`] named it.
    state: Arc<OnceLock<StateCollector>>,
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
            .buckets(latency_buckets.clone()),
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
        let filter_window_misses = IntCounter::new(
            "gpu_extender_filter_window_misses_total",
            "Filter calls that fitted none of the candidate nodes while a node kube-scheduler did not send would have taken the pod.",
        )?;
        let invalid_requests = IntCounter::new(
            "gpu_extender_invalid_requests_total",
            "Filter calls for pods whose GPU request could not be read.",
        )?;
        let quota_refusals = IntCounter::new(
            "gpu_extender_quota_refusals_total",
            "Filter calls refused because the pod would take its namespace past its ElasticQuota max.",
        )?;
        let binds = IntCounterVec::new(
            Opts::new("gpu_extender_binds_total", "Bind calls by result."),
            &["result"],
        )?;
        let requests_shed = IntCounter::new(
            "gpu_extender_requests_shed_total",
            "Requests answered 503 after waiting server.requestTimeoutMs for a turn under limits.maxConcurrentRequests.",
        )?;
        let requeue_touches = IntCounterVec::new(
            Opts::new(
                "gpu_extender_requeue_touches_total",
                "Unschedulable pods touched so kube-scheduler retries them once capacity was freed.",
            ),
            &["result"],
        )?;
        let pod_events = IntCounterVec::new(
            Opts::new(
                "gpu_extender_pod_events_total",
                "Kubernetes Events published on pods for bind decisions and quota reclaims, by result.",
            ),
            &["result"],
        )?;
        let quota_reclaims = IntCounterVec::new(
            Opts::new(
                "gpu_extender_quota_reclaims_total",
                "Reclaims of GPUs borrowers hold for a pod of a team under its ElasticQuota min, through the Eviction API, by result.",
            ),
            &["result"],
        )?;
        let quota_evictions = IntCounter::new(
            "gpu_extender_quota_evictions_total",
            "Pods evicted through the Eviction API by quota reclaims.",
        )?;
        register(&registry, &mut names, quota_reclaims.clone())?;
        register(&registry, &mut names, quota_evictions.clone())?;
        let estimator_requests = IntCounterVec::new(
            Opts::new(
                "gpu_extender_estimator_requests_total",
                "Karmada scheduler-estimator calls by method and gRPC code.",
            ),
            &["method", "code"],
        )?;
        let estimator_duration = HistogramVec::new(
            HistogramOpts::new(
                "gpu_extender_estimator_request_duration_seconds",
                "Time to answer one Karmada scheduler-estimator call, by method.",
            )
            .buckets(latency_buckets),
            &["method"],
        )?;
        register(&registry, &mut names, estimator_requests.clone())?;
        register(&registry, &mut names, estimator_duration.clone())?;
        let estimator_requests_shed = IntCounter::new(
            "gpu_extender_estimator_requests_shed_total",
            "Karmada scheduler-estimator calls answered RESOURCE_EXHAUSTED at estimator.maxConcurrentRequests.",
        )?;
        register(&registry, &mut names, estimator_requests_shed.clone())?;
        register(&registry, &mut names, pod_events.clone())?;
        register(&registry, &mut names, requeue_touches.clone())?;
        register(&registry, &mut names, request_duration.clone())?;
        register(&registry, &mut names, requests.clone())?;
        register(&registry, &mut names, filter_nodes.clone())?;
        register(&registry, &mut names, rejections.clone())?;
        register(&registry, &mut names, filter_window_misses.clone())?;
        register(&registry, &mut names, invalid_requests.clone())?;
        register(&registry, &mut names, quota_refusals.clone())?;
        register(&registry, &mut names, binds.clone())?;
        register(&registry, &mut names, requests_shed.clone())?;
        // Which build answers: one series, always 1, whose labels say it (joined on its labels
        // in dashboards, as kube-state-metrics' *_info series are).
        let build_info = IntGaugeVec::new(
            Opts::new(
                "gpu_extender_build_info",
                "Always 1; the labels say which build runs: version (Cargo.toml), commit and Rust version.",
            ),
            &["version", "commit", "rust_version"],
        )?;
        build_info
            .with_label_values(&[
                build_info::VERSION,
                build_info::COMMIT,
                build_info::rust_version(),
            ])
            .set(1);
        register(&registry, &mut names, build_info)?;
        let writer = IntGauge::new(
            "gpu_extender_writer",
            "1 while this replica holds the writer Lease and runs requeue and quota reclaim.",
        )?;
        register(&registry, &mut names, writer.clone())?;
        let admin_requests_shed = IntCounter::new(
            "gpu_extender_admin_requests_shed_total",
            "Admin requests (/metrics, /inspect, the web view) answered 503 at limits.maxConcurrentAdminRequests.",
        )?;
        register(&registry, &mut names, admin_requests_shed.clone())?;
        let request_bodies_refused = IntCounterVec::new(
            Opts::new(
                "gpu_extender_request_bodies_refused_total",
                "Verb request bodies refused before their turn: too_large (server.bodyLimitBytes), too_slow (limits.bodyReadTimeoutMs), over_budget (limits.maxBufferedBodyBytes), unreadable.",
            ),
            &["reason"],
        )?;
        register(&registry, &mut names, request_bodies_refused.clone())?;
        let admin_tokens_throttled = IntCounter::new(
            "gpu_extender_admin_tokens_throttled_total",
            "Admin requests answered 429 without a token review: their client address had passed server.adminAuth.failedTokensPerMinute.",
        )?;
        register(&registry, &mut names, admin_tokens_throttled.clone())?;
        let node_label_writes = IntCounterVec::new(
            Opts::new(
                "gpu_extender_node_label_writes_total",
                "Node patches of the label gpu-extender.io/largest-free-gpu-mem-mib, by result.",
            ),
            &["result"],
        )?;
        register(&registry, &mut names, node_label_writes.clone())?;
        let webhook_reviews = IntCounterVec::new(
            Opts::new(
                "gpu_extender_webhook_reviews_total",
                "Pod admission reviews answered by the webhook, by result.",
            ),
            &["result"],
        )?;
        register(&registry, &mut names, webhook_reviews.clone())?;
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
        for result in ["sent", "error"] {
            pod_events.with_label_values(&[result]);
        }
        for result in ["evicted", "pdb_blocked", "error"] {
            quota_reclaims.with_label_values(&[result]);
        }
        for method in ESTIMATOR_METHODS {
            estimator_duration.with_label_values(&[method]);
        }
        for reason in ["too_large", "too_slow", "over_budget", "unreadable"] {
            request_bodies_refused.with_label_values(&[reason]);
        }
        for result in ["patched", "error"] {
            node_label_writes.with_label_values(&[result]);
        }
        for result in ["mutated", "unchanged", "bad_request"] {
            webhook_reviews.with_label_values(&[result]);
        }
        names.extend(state_collector::family_names().map(str::to_owned));
        Ok(Self {
            registry,
            names: Arc::new(names),
            state: Arc::new(OnceLock::new()),
            request_duration,
            requests,
            filter_nodes,
            rejections,
            filter_window_misses,
            invalid_requests,
            quota_refusals,
            binds,
            requests_shed,
            requeue_touches,
            pod_events,
            quota_reclaims,
            writer,
            admin_requests_shed,
            request_bodies_refused,
            admin_tokens_throttled,
            quota_evictions,
            estimator_requests,
            estimator_duration,
            estimator_requests_shed,
            node_label_writes,
            webhook_reviews,
        })
    }

    /// The name of every metric family registered, for checks of dashboards and documentation.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Adds the families read from `cluster` and `policy` at every scrape (the table's size,
    /// the allocation gauges and the feed's health and counters); once per registry.
    pub fn watch_state(
        &self,
        cluster: Arc<ClusterState>,
        policy: PolicyCell,
    ) -> Result<(), prometheus::Error> {
        if self.state.get().is_some() {
            return Err(prometheus::Error::AlreadyReg);
        }
        let collector = StateCollector::new(cluster, policy, &self.registry)?;
        self.state
            .set(collector)
            .map_err(|_| prometheus::Error::AlreadyReg)
    }

    /// Everything in Prometheus text format (version 0.0.4): the registered metrics, then the
    /// families read from the state.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let state = self.state.get();
        if let Some(state) = state {
            state.observe_rebuilds();
        }
        let mut buffer = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buffer)?;
        let mut text =
            String::from_utf8(buffer).map_err(|error| prometheus::Error::Msg(error.to_string()))?;
        if let Some(state) = state {
            state.write(&mut text);
        }
        Ok(text)
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

    /// Every sample line of `text` belongs to the family whose `# TYPE` line came last, and no
    /// family is typed twice: the text format's grouping, which Prometheus enforces.
    fn families_are_grouped(text: &str) -> Result<std::collections::BTreeSet<&str>, String> {
        let mut typed = std::collections::BTreeSet::new();
        let mut current: Option<(&str, &str)> = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').ok_or(format!("bad TYPE: {line}"))?;
                if !typed.insert(name) {
                    return Err(format!("{name} typed twice"));
                }
                current = Some((name, kind));
            } else if line.starts_with('#') || line.is_empty() {
                continue;
            } else {
                let series = line.split(['{', ' ']).next().unwrap_or_default();
                let Some((name, kind)) = current else {
                    return Err(format!("a sample before any TYPE: {line}"));
                };
                let of_family = series == name
                    || (kind == "histogram"
                        && ["_bucket", "_sum", "_count"]
                            .iter()
                            .any(|suffix| series.strip_suffix(suffix) == Some(name)));
                if !of_family {
                    return Err(format!("{line} is outside its family (under {name})"));
                }
                let value = line.rsplit(' ').next().unwrap_or_default();
                if value.parse::<f64>().is_err() && !["+Inf", "-Inf", "NaN"].contains(&value) {
                    return Err(format!("bad value in {line}"));
                }
            }
        }
        Ok(typed)
    }

    #[test]
    fn state_families_follow_the_registered_ones_and_every_family_is_one_group() {
        use gpu_engine::Policy;
        let (cluster, metrics) = state_collector::one_t4_watched();
        cluster.note_rebuild(std::time::Duration::from_millis(3));
        let text = metrics.render().unwrap();
        let typed = families_are_grouped(&text).unwrap_or_else(|error| panic!("{error}\n{text}"));
        // Every family of the state is there, but the MIG ones (no node advertises slices),
        // the per-quota ones (no ElasticQuota, no series) and DRA's (not read by a state
        // without a watch).
        let missing: Vec<&str> = state_collector::family_names()
            .filter(|name| !typed.contains(name))
            .collect();
        assert_eq!(
            missing,
            [
                "gpu_extender_mig_slices",
                "gpu_extender_cluster_mig_slices",
                "gpu_extender_quota_used",
                "gpu_extender_quota_min",
                "gpu_extender_quota_max",
                "gpu_extender_quota_borrowed",
                "gpu_extender_dra_served",
                "gpu_extender_dra_devices",
                "gpu_extender_dra_claims_allocated",
                "gpu_extender_dra_gpus_held",
                "gpu_extender_dra_nodes_offered_both_ways",
                "gpu_extender_dra_slice_problems",
            ],
            "{text}"
        );
        // The rebuild noted before the scrape is in it, and is observed once.
        assert!(
            text.contains("gpu_extender_table_rebuild_duration_seconds_count 1"),
            "{text}"
        );
        let again = metrics.render().unwrap();
        assert!(
            again.contains("gpu_extender_table_rebuild_duration_seconds_count 1"),
            "{again}"
        );
        // The state's families are added once per registry.
        assert!(
            metrics
                .watch_state(Arc::clone(&cluster), PolicyCell::from(Policy::default()))
                .is_err()
        );
        assert_eq!(metrics.render().unwrap(), again);
    }
}
