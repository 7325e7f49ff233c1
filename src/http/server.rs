//! The axum routers: the extender verbs kube-scheduler calls, and the admin surface (health,
//! readiness, metrics, inspection). Handlers decode, ask the engine on one snapshot, and encode;
//! every failure is an answer kube-scheduler can read, never a panic.

use std::collections::HashMap;
use std::sync::{Arc, RwLockReadGuard};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde::de::DeserializeOwned;
use tracing::{Instrument, info_span, warn};

use crate::engine::{
    NodeSpec, NodeState, PodAllocation, PodKey, PodRequest, Policy, RejectReason, Table,
};
use crate::k8s::watch::ClusterState;
use crate::telemetry::Metrics;

use super::verbs;
use super::wire::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult,
    ExtenderPreemptionArgs, ExtenderPreemptionResult, HostPriorityList, MetaPod, MetaVictims,
    NodeList,
};
use crate::inspect;

/// What the HTTP layer needs from the Kubernetes side: reading requests and nodes (label and
/// annotation parsing lives there, not here) and binding.
pub trait Adapter: Send + Sync + 'static {
    /// The pod's GPU request; `Ok(None)` when it asks for no GPU; `Err` is a user-facing message.
    fn pod_request(&self, pod: &Pod) -> Result<Option<PodRequest>, String>;
    /// A node as the engine sees it; `Err` is a user-facing message.
    fn node_spec(&self, node: &Node) -> Result<NodeSpec, String>;
    /// The key of the pod with this UID, if the extender tracks it.
    fn pod_key_for_uid(&self, uid: &str) -> Option<PodKey>;
    /// Chooses the GPUs on `args.node`, records them and binds the pod; `Err` is the message
    /// kube-scheduler gets in `Error`.
    fn bind(&self, args: ExtenderBindingArgs) -> BoxFuture<'_, Result<(), String>>;
}

/// Everything the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// The allocation table and whether it is synced.
    pub cluster: Arc<ClusterState>,
    pub policy: Arc<Policy>,
    pub adapter: Arc<dyn Adapter>,
    pub metrics: Metrics,
    /// Largest request body accepted, in bytes.
    pub body_limit: usize,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("ready", &self.cluster.is_ready())
            .finish_non_exhaustive()
    }
}

impl AppState {
    fn snapshot(&self) -> RwLockReadGuard<'_, Table> {
        self.cluster.read()
    }

    fn is_ready(&self) -> bool {
        self.cluster.is_ready()
    }
}

/// The extender's routes under `prefix` (for example `/scheduler`; empty for the root).
pub fn router(state: AppState, prefix: &str) -> Router {
    let prefix = prefix.trim_end_matches('/');
    let limit = state.body_limit;
    Router::new()
        .route(&format!("{prefix}/filter"), post(filter))
        .route(&format!("{prefix}/prioritize"), post(prioritize))
        .route(&format!("{prefix}/bind"), post(bind))
        .route(&format!("{prefix}/preempt"), post(preempt))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// The admin routes: `/healthz`, `/readyz`, `/metrics`, `/inspect`.
pub fn admin_router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/inspect", get(inspect_table))
        .with_state(state)
}

/// A request body kube-scheduler should never send: 400 with a message saying what is wrong.
#[derive(Debug)]
struct BadRequest(String);

impl IntoResponse for BadRequest {
    fn into_response(self) -> Response {
        (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            self.0,
        )
            .into_response()
    }
}

fn decode<T: DeserializeOwned>(verb: &str, body: &Bytes) -> Result<T, BadRequest> {
    serde_json::from_slice(body)
        .map_err(|error| BadRequest(format!("cannot decode {verb} request body: {error}")))
}

fn pod_name(pod: Option<&Pod>) -> String {
    pod.map(|p| {
        format!(
            "{}/{}",
            p.metadata.namespace.as_deref().unwrap_or_default(),
            p.metadata.name.as_deref().unwrap_or_default()
        )
    })
    .unwrap_or_default()
}

/// Times a verb and counts its outcome.
struct Timer<'a> {
    metrics: &'a Metrics,
    verb: &'static str,
    start: Instant,
}

impl<'a> Timer<'a> {
    fn start(metrics: &'a Metrics, verb: &'static str) -> Self {
        Self {
            metrics,
            verb,
            start: Instant::now(),
        }
    }

    fn finish(self, outcome: &str) {
        self.metrics
            .request_duration
            .with_label_values(&[self.verb])
            .observe(self.start.elapsed().as_secs_f64());
        self.metrics
            .requests
            .with_label_values(&[self.verb, outcome])
            .inc();
    }
}

/// Candidate nodes as the request gives them: names to look up in the live table (cache mode),
/// or full objects to judge on their own (non-cache mode).
enum Candidates {
    Names(Vec<String>),
    Objects {
        names: Vec<String>,
        states: Vec<Result<NodeState, String>>,
        list: NodeList,
    },
}

/// The name of a node object that does not decode as a `Node` (a malformed timestamp or
/// quantity somewhere in it), read on its own so that its rejection is reported against that
/// node rather than an empty name kube-scheduler cannot place. Found by the `extender_filter`
/// fuzz target.
fn raw_node_name(raw: &str) -> String {
    #[derive(serde::Deserialize)]
    struct Metadata {
        name: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Named {
        metadata: Option<Metadata>,
    }
    serde_json::from_str::<Named>(raw)
        .ok()
        .and_then(|named| named.metadata)
        .and_then(|metadata| metadata.name)
        .unwrap_or_default()
}

fn candidates(args: &mut ExtenderArgs, adapter: &dyn Adapter) -> Candidates {
    if let Some(list) = args.nodes.take() {
        let mut names = Vec::with_capacity(list.items.len());
        let mut states = Vec::with_capacity(list.items.len());
        for raw in &list.items {
            match serde_json::from_str::<Node>(raw.get()) {
                Ok(node) => {
                    names.push(node.metadata.name.clone().unwrap_or_default());
                    states.push(adapter.node_spec(&node).map(NodeState::new));
                }
                Err(error) => {
                    names.push(raw_node_name(raw.get()));
                    states.push(Err(format!("node object unreadable: {error}")));
                }
            }
        }
        refuse_ambiguous_names(&names, &mut states);
        return Candidates::Objects {
            names,
            states,
            list,
        };
    }
    Candidates::Names(args.node_names.take().unwrap_or_default())
}

/// A node object without a name, or whose name another object in the same request also has,
/// cannot be given a verdict of its own: the answer is keyed by name. Both become unreadable
/// (failed as unresolvable), so no name is ever both passed and failed. kube-scheduler never
/// sends either; a hand-written or corrupted request may.
fn refuse_ambiguous_names(names: &[String], states: &mut [Result<NodeState, String>]) {
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(names.len());
    for name in names {
        *seen.entry(name.as_str()).or_default() += 1;
    }
    for (name, state) in names.iter().zip(states.iter_mut()) {
        if name.is_empty() {
            *state = Err("node object has no metadata.name".to_owned());
        } else if seen.get(name.as_str()).is_some_and(|&count| count > 1) {
            *state = Err(format!(
                "node {name} is listed more than once in the request"
            ));
        }
    }
}

async fn filter(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Json<ExtenderFilterResult>, BadRequest> {
    let timer = Timer::start(&state.metrics, "filter");
    let mut args: ExtenderArgs = match decode("filter", &body) {
        Ok(args) => args,
        Err(error) => {
            timer.finish("bad_request");
            return Err(error);
        }
    };
    let span = info_span!("filter", pod = %pod_name(args.pod.as_ref()));
    let result = span.in_scope(|| filter_decision(&state, &mut args));
    timer.finish(if result.error.is_empty() {
        "ok"
    } else {
        "error"
    });
    Ok(Json(result))
}

fn filter_decision(state: &AppState, args: &mut ExtenderArgs) -> ExtenderFilterResult {
    let candidates = candidates(args, state.adapter.as_ref());
    let Some(pod) = args.pod.as_ref() else {
        return ExtenderFilterResult {
            error: "filter request has no Pod".to_owned(),
            ..Default::default()
        };
    };
    let request = match state.adapter.pod_request(pod) {
        Ok(request) => request,
        Err(message) => {
            state.metrics.invalid_requests.inc();
            let names = match &candidates {
                Candidates::Names(names) | Candidates::Objects { names, .. } => names,
            };
            return ExtenderFilterResult {
                failed_and_unresolvable_nodes: verbs::reject_all(
                    names.iter().map(String::as_str),
                    &message,
                ),
                ..Default::default()
            };
        }
    };
    match candidates {
        Candidates::Names(names) => {
            let Some(request) = request else {
                return ExtenderFilterResult {
                    node_names: Some(names),
                    ..Default::default()
                };
            };
            if !state.is_ready() {
                return ExtenderFilterResult {
                    error: "GPU extender is not ready: allocation table not yet synced".to_owned(),
                    ..Default::default()
                };
            }
            let table = state.snapshot();
            let verdict = verbs::filter(
                names
                    .iter()
                    .map(|name| (name.as_str(), table.node_by_str(name))),
                &request,
                &state.policy,
            );
            drop(table);
            record_verdict(&state.metrics, &verdict);
            // Each candidate is listed once, so the passed names move out of the request.
            let mut names = names;
            let passed = verdict
                .passed
                .iter()
                .filter_map(|&i| names.get_mut(i).map(std::mem::take))
                .collect();
            ExtenderFilterResult {
                node_names: Some(passed),
                failed_nodes: verdict.failed,
                failed_and_unresolvable_nodes: verdict.unresolvable,
                ..Default::default()
            }
        }
        Candidates::Objects {
            names,
            states,
            mut list,
        } => {
            let mut unreadable = verbs::FilterVerdict::default();
            let candidates = names
                .iter()
                .zip(&states)
                .filter_map(|(name, node)| match node {
                    Ok(node) => Some((name.as_str(), Some(node))),
                    Err(message) => {
                        unreadable
                            .unresolvable
                            .insert(name.clone(), message.clone());
                        None
                    }
                });
            let readable: Vec<(&str, Option<&NodeState>)> = candidates.collect();
            let mut verdict = match &request {
                Some(request) => verbs::filter(readable.iter().copied(), request, &state.policy),
                None => verbs::FilterVerdict {
                    passed: (0..readable.len()).collect(),
                    ..Default::default()
                },
            };
            record_verdict(&state.metrics, &verdict);
            verdict.unresolvable.append(&mut unreadable.unresolvable);
            let keep: std::collections::HashSet<&str> = verdict
                .passed
                .iter()
                .filter_map(|&i| readable.get(i).map(|(name, _)| *name))
                .collect();
            let items = std::mem::take(&mut list.items);
            list.items = items
                .into_iter()
                .zip(&names)
                .filter(|(_, name)| keep.contains(name.as_str()))
                .map(|(raw, _)| raw)
                .collect();
            ExtenderFilterResult {
                nodes: Some(list),
                failed_nodes: verdict.failed,
                failed_and_unresolvable_nodes: verdict.unresolvable,
                ..Default::default()
            }
        }
    }
}

fn record_verdict(metrics: &Metrics, verdict: &verbs::FilterVerdict) {
    let counts = [
        ("passed", verdict.passed.len()),
        ("failed", verdict.failed.len() - verdict.unknown),
        ("unresolvable", verdict.unresolvable.len()),
        ("unknown", verdict.unknown),
    ];
    for (label, count) in counts {
        metrics
            .filter_nodes
            .with_label_values(&[label])
            .inc_by(count as u64);
    }
    // One counter update per reason, not per rejected node: a filter over 500 candidates would
    // otherwise look the label up hundreds of times.
    let mut by_reason = [0u64; RejectReason::ALL.len()];
    for reason in &verdict.reasons {
        by_reason[*reason as usize] += 1;
    }
    for (reason, count) in RejectReason::ALL.iter().zip(by_reason) {
        if count > 0 {
            metrics
                .rejections
                .with_label_values(&[reason.code()])
                .inc_by(count);
        }
    }
}

async fn prioritize(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Json<HostPriorityList>, BadRequest> {
    let timer = Timer::start(&state.metrics, "prioritize");
    let mut args: ExtenderArgs = match decode("prioritize", &body) {
        Ok(args) => args,
        Err(error) => {
            timer.finish("bad_request");
            return Err(error);
        }
    };
    let span = info_span!("prioritize", pod = %pod_name(args.pod.as_ref()));
    let scores = span.in_scope(|| prioritize_decision(&state, &mut args));
    timer.finish("ok");
    Ok(Json(scores))
}

fn prioritize_decision(state: &AppState, args: &mut ExtenderArgs) -> HostPriorityList {
    let candidates = candidates(args, state.adapter.as_ref());
    // Prioritize errors are ignored by kube-scheduler, so an unreadable pod just gets no
    // preference anywhere.
    let request = args
        .pod
        .as_ref()
        .and_then(|pod| state.adapter.pod_request(pod).ok().flatten());
    match candidates {
        Candidates::Names(names) => {
            let Some(request) = request else {
                return verbs::prioritize_none(&names);
            };
            let table = state.snapshot();
            let scores = verbs::prioritize(
                names
                    .iter()
                    .map(|name| (name.as_str(), table.node_by_str(name))),
                &request,
                &state.policy,
            );
            drop(table);
            verbs::host_priorities(names, scores)
        }
        Candidates::Objects { names, states, .. } => {
            let Some(request) = request else {
                return verbs::prioritize_none(&names);
            };
            let scores = verbs::prioritize(
                names
                    .iter()
                    .zip(&states)
                    .map(|(name, node)| (name.as_str(), node.as_ref().ok())),
                &request,
                &state.policy,
            );
            verbs::host_priorities(names, scores)
        }
    }
}

async fn bind(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Json<ExtenderBindingResult>, BadRequest> {
    let timer = Timer::start(&state.metrics, "bind");
    let args: ExtenderBindingArgs = match decode("bind", &body) {
        Ok(args) => args,
        Err(error) => {
            timer.finish("bad_request");
            return Err(error);
        }
    };
    let span = info_span!("bind", pod = %format!("{}/{}", args.pod_namespace, args.pod_name), node = %args.node);
    let outcome = state.adapter.bind(args).instrument(span.clone()).await;
    let error = match outcome {
        Ok(()) => String::new(),
        Err(message) => {
            span.in_scope(|| warn!(%message, "bind failed"));
            message
        }
    };
    timer.finish(if error.is_empty() { "ok" } else { "error" });
    Ok(Json(ExtenderBindingResult { error }))
}

async fn preempt(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Json<ExtenderPreemptionResult>, BadRequest> {
    let timer = Timer::start(&state.metrics, "preempt");
    let args: ExtenderPreemptionArgs = match decode("preempt", &body) {
        Ok(args) => args,
        Err(error) => {
            timer.finish("bad_request");
            return Err(error);
        }
    };
    let span = info_span!("preempt", pod = %pod_name(args.pod.as_ref()));
    let result = span.in_scope(|| preempt_decision(&state, args));
    timer.finish("ok");
    Ok(Json(result))
}

/// Keeps the candidate nodes where evicting the proposed victims really makes room on the GPUs,
/// and spares the victims whose eviction would not help. Victims the extender does not track
/// (pods without GPUs) are passed through untouched: they free only CPU and memory, which
/// kube-scheduler has already accounted for.
fn preempt_decision(state: &AppState, args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult {
    let mut proposals: Vec<(String, Vec<String>, i64)> = Vec::new();
    for (node, victims) in args.node_name_to_meta_victims {
        let victims = victims.unwrap_or_default();
        proposals.push((
            node,
            victims.pods.into_iter().map(|p| p.uid).collect(),
            victims.num_pdb_violations,
        ));
    }
    for (node, victims) in args.node_name_to_victims {
        let victims = victims.unwrap_or_default();
        let uids = victims
            .pods
            .iter()
            .map(|p| p.metadata.uid.clone().unwrap_or_default())
            .collect();
        proposals.push((node, uids, victims.num_pdb_violations));
    }
    let request = args
        .pod
        .as_ref()
        .and_then(|pod| state.adapter.pod_request(pod).ok().flatten());
    let table = state.snapshot();
    let mut out = ExtenderPreemptionResult::default();
    for (node_name, uids, violations) in proposals {
        let meta = |uids: Vec<String>| MetaVictims {
            pods: uids.into_iter().map(|uid| MetaPod { uid }).collect(),
            num_pdb_violations: violations,
        };
        let (Some(request), Some(node)) = (&request, table.node_by_str(&node_name)) else {
            out.node_name_to_meta_victims.insert(node_name, meta(uids));
            continue;
        };
        let mut tracked: Vec<(String, PodAllocation)> = Vec::new();
        let mut untracked: Vec<String> = Vec::new();
        for uid in uids {
            let entry = state
                .adapter
                .pod_key_for_uid(&uid)
                .and_then(|key| table.pod(&key).cloned());
            match entry {
                Some(entry) if entry.allocation.node.as_str() == node_name => {
                    tracked.push((uid, entry.allocation));
                }
                _ => untracked.push(uid),
            }
        }
        let allocations: Vec<PodAllocation> = tracked.iter().map(|(_, a)| a.clone()).collect();
        let Some(needed) = verbs::victims_needed(node, &allocations, request, &state.policy) else {
            continue;
        };
        let mut keep = untracked;
        for (uid, allocation) in &tracked {
            if needed.contains(&allocation) {
                keep.push(uid.clone());
            }
        }
        if !keep.is_empty() {
            out.node_name_to_meta_victims.insert(node_name, meta(keep));
        }
    }
    out
}

async fn readyz(State(state): State<AppState>) -> Response {
    if state.is_ready() {
        (StatusCode::OK, "ready").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "allocation table not yet synced",
        )
            .into_response()
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    let rendered = state.metrics.render_after(|metrics| {
        crate::service::refresh_metrics(metrics, &state.cluster, &state.policy);
    });
    match rendered {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
    }
}

async fn inspect_table(State(state): State<AppState>) -> Json<inspect::ClusterReport> {
    let table = state.snapshot();
    Json(inspect::report(&table))
}
