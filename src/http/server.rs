//! The axum routers: the extender verbs kube-scheduler calls, and the admin surface (health,
//! readiness, metrics, inspection). Handlers decode, ask the shared state ([`crate::state`],
//! which decides on one snapshot with the engine), and encode; every failure is an answer
//! kube-scheduler can read, never a panic.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tower_http::classify::{ServerErrorsAsFailures, SharedClassifier};
use tower_http::trace::{DefaultOnFailure, TraceLayer};
use tracing::{Instrument, Level, debug, info_span, warn};

use crate::config::Config;
use crate::objects::translate;
use crate::state::decide::{FilterVerdict, NotReady, Proposal};
use crate::state::{
    Bind, BindError, BindRequest, ClusterState, FilterDecision, Offered, PolicyCell, Verbs,
};
use crate::telemetry::Metrics;
use gpu_engine::{NodeState, RejectReason};

use super::body::{BodyReader, read_whole_body};
use super::wire::{
    CandidateArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderPreemptionArgs,
    ExtenderPreemptionResult, FilterAnswer, HostScore, MetaPod, MetaVictims, NodeList,
    NodeListAnswer, NodeName, NodeReasons,
};

/// Everything the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// The allocation table and whether it is synced.
    pub cluster: Arc<ClusterState>,
    /// The policy in force (its typical-pod distribution may be relearned while serving).
    pub policy: PolicyCell,
    /// How objects are read (label, resource and annotation keys).
    pub config: Arc<Config>,
    /// The binder; `None` in tools and tests that serve a fixed table (binds are refused).
    pub binder: Option<Arc<dyn Bind>>,
    pub metrics: Metrics,
    /// Largest request body accepted, in bytes.
    pub body_limit: usize,
    /// `/metrics` as last rendered (`limits.metricsRenderIntervalMs`).
    metrics_page: Arc<MetricsPage>,
}

impl AppState {
    /// Handlers over `cluster`, reading objects with `config` and deciding with its policy,
    /// counting in `metrics`, without a binder (binds are refused: tools, tests and load runs
    /// that serve a fixed table), accepting bodies up to `server.bodyLimitBytes`.
    pub fn new(cluster: Arc<ClusterState>, config: Arc<Config>, metrics: Metrics) -> Self {
        Self {
            cluster,
            policy: config.engine_policy().into(),
            body_limit: usize::try_from(config.server.body_limit_bytes).unwrap_or(usize::MAX),
            metrics_page: Arc::new(MetricsPage::new(Duration::from_millis(
                config.limits.metrics_render_interval_ms,
            ))),
            config,
            binder: None,
            metrics,
        }
    }

    /// The same handlers binding through `binder`.
    pub fn with_binder(self, binder: Arc<dyn Bind>) -> Self {
        Self {
            binder: Some(binder),
            ..self
        }
    }

    /// The same handlers deciding with the policy in `policy` (shared with a learner).
    pub fn with_policy(self, policy: PolicyCell) -> Self {
        Self { policy, ..self }
    }

    /// The verbs' decisions over this state (filter, prioritize, preempt).
    pub fn verbs(&self) -> Verbs<'_> {
        Verbs {
            cluster: &self.cluster,
            policy: &self.policy,
            config: &self.config,
        }
    }

    /// The same handlers accepting bodies up to `bytes`.
    pub fn with_body_limit(self, bytes: usize) -> Self {
        Self {
            body_limit: bytes,
            ..self
        }
    }
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("ready", &self.cluster.is_ready())
            .field("binder", &self.binder.is_some())
            .finish_non_exhaustive()
    }
}

/// The extender's routes under `prefix` (for example `/scheduler`; empty for the root), each
/// request in a span ([`request_spans`]).
pub fn router(state: AppState, prefix: &str) -> Router {
    verb_routes(state, prefix).layer(request_spans())
}

/// Turns Nagle's algorithm off on an accepted connection, as RPC servers do: an answer written
/// in more than one piece (HTTP/2 writes a HEADERS and a DATA frame, TLS a record each) would
/// otherwise wait for the client's delayed acknowledgement of the first, tens of milliseconds,
/// before the rest leaves. Measured on HTTP/2 over TLS without it: kube-scheduler's pods/s with
/// the extender at 0.36 times its pods/s without, against 0.78 with it (docs/benchmarks.md,
/// "Eleventh pass").
pub fn no_delay(tcp: &mut tokio::net::TcpStream) {
    if let Err(error) = tcp.set_nodelay(true) {
        debug!(%error, "setting TCP_NODELAY on an accepted connection failed");
    }
}

/// A `request` span around every request (method, path, HTTP version), with its status and
/// latency logged when it is answered; all at `debug` (`RUST_LOG=gpu_extender=info,tower_http=debug`
/// shows them). The verbs' own spans (`filter`, `bind`, ...) nest inside it and carry the pod.
/// A 5xx answer is logged at `debug` too: the shed 503 and the not-ready 503 of `/readyz`
/// already have their own line or are expected.
fn request_spans() -> TraceLayer<SharedClassifier<ServerErrorsAsFailures>> {
    TraceLayer::new_for_http().on_failure(DefaultOnFailure::new().level(Level::DEBUG))
}

/// The verb routes, without the request spans.
fn verb_routes(state: AppState, prefix: &str) -> Router {
    let prefix = prefix.trim_end_matches('/');
    let limit = state.body_limit;
    Router::new()
        .route(&format!("{prefix}/filter"), post(filter))
        .route(&format!("{prefix}/prioritize"), post(prioritize))
        // The DRA stanza's prioritize (docs/dra.md): pods whose claims ask for GPUs.
        .route(&format!("{prefix}/dra/prioritize"), post(prioritize_claims))
        .route(&format!("{prefix}/bind"), post(bind))
        .route(&format!("{prefix}/preempt"), post(preempt))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// The extender's verbs behind the limits that protect the process: at most `max_concurrent`
/// requests are served at once, and one that waits longer than `queue_budget` for its turn is
/// answered 503 at once instead of waiting on (kube-scheduler stops waiting at its
/// `httpTimeout`; a queue that only grows would answer everyone late). Shed requests are counted
/// in `gpu_extender_requests_shed_total`.
pub fn guarded_router(
    state: AppState,
    prefix: &str,
    max_concurrent: usize,
    queue_budget: Duration,
) -> Router {
    let gate = Arc::new(Gate {
        permits: Semaphore::new(max_concurrent.clamp(1, Semaphore::MAX_PERMITS)),
        max_concurrent,
        budget: queue_budget,
        metrics: state.metrics.clone(),
    });
    let reader = Arc::new(BodyReader::with_limits(
        state.body_limit,
        Duration::from_millis(state.config.limits.body_read_timeout_ms),
        usize::try_from(state.config.limits.max_buffered_body_bytes).unwrap_or(usize::MAX),
        state.metrics.clone(),
    ));
    // The spans outermost, so that a shed request is traced too; the body read whole before
    // the turn is taken, so that a slow sender holds none ([`super::body`]).
    verb_routes(state, prefix)
        .layer(axum::middleware::from_fn_with_state(gate, admit))
        .layer(axum::middleware::from_fn_with_state(
            reader,
            read_whole_body,
        ))
        .layer(request_spans())
}

/// The admission state of [`guarded_router`].
#[derive(Debug)]
struct Gate {
    permits: Semaphore,
    max_concurrent: usize,
    budget: Duration,
    metrics: Metrics,
}

async fn admit(State(gate): State<Arc<Gate>>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(gate.budget, gate.permits.acquire()).await {
        Ok(Ok(permit)) => {
            let response = next.run(request).await;
            drop(permit);
            response
        }
        // Timed out waiting, or (never: the semaphore is not closed) closed.
        Ok(Err(_)) | Err(_) => {
            gate.metrics.requests_shed.inc();
            warn!(
                limit = gate.max_concurrent,
                waited_ms = gate.budget.as_millis() as u64,
                "request shed: the extender is at its concurrency limit"
            );
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "gpu-extender is serving its limit of {} concurrent requests \
                     (limits.maxConcurrentRequests) and this one waited {} ms \
                     (server.requestTimeoutMs) without a turn",
                    gate.max_concurrent,
                    gate.budget.as_millis()
                ),
            )
                .into_response()
        }
    }
}

/// The admin routes: `/healthz`, `/readyz`, `/metrics`, `/inspect` and the web view (`/ui`,
/// [`super::ui`]), all open (tools and tests
/// that serve a fixed table; `serve` uses [`guarded_admin_router`]).
pub fn admin_router(state: AppState) -> Router {
    admin_routes(state).layer(request_spans())
}

/// The admin routes with the paths `auth` guards answered only to an allowed bearer token
/// ([`super::auth`]).
pub fn guarded_admin_router(state: AppState, auth: Arc<super::auth::AdminAuth>) -> Router {
    admin_routes(state)
        .layer(axum::middleware::from_fn_with_state(
            auth,
            super::auth::guard,
        ))
        .layer(request_spans())
}

fn admin_routes(state: AppState) -> Router {
    let limit = usize::try_from(state.config.limits.max_concurrent_admin_requests)
        .unwrap_or(1)
        .clamp(1, Semaphore::MAX_PERMITS);
    let gate = Arc::new(AdminGate {
        permits: Semaphore::new(limit),
        limit,
        metrics: state.metrics.clone(),
    });
    admin_routes_behind(state, gate)
}

/// [`admin_routes`] with the cap `gate`: the heavy pages behind it, the probes beside it, so a
/// flood never fails them.
fn admin_routes_behind(state: AppState, gate: Arc<AdminGate>) -> Router {
    let heavy = Router::new()
        .route("/metrics", get(metrics))
        .route("/inspect", get(inspect_table))
        .merge(super::ui::routes())
        .layer(axum::middleware::from_fn_with_state(gate, admit_admin));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .merge(heavy)
        .with_state(state)
}

/// The admin port's cap (`limits.maxConcurrentAdminRequests`).
#[derive(Debug)]
struct AdminGate {
    permits: Semaphore,
    limit: usize,
    metrics: Metrics,
}

/// Serves an admin request if a permit is free now, else 503 at once: a scrape or a page that
/// waited would only pile up behind the renders already running.
async fn admit_admin(State(gate): State<Arc<AdminGate>>, request: Request, next: Next) -> Response {
    let Ok(permit) = gate.permits.try_acquire() else {
        gate.metrics.admin_requests_shed.inc();
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "gpu-extender's admin port is serving its limit of {} requests \
                 (limits.maxConcurrentAdminRequests); retry",
                gate.limit
            ),
        )
            .into_response();
    };
    let response = next.run(request).await;
    drop(permit);
    response
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

fn decode<'a, T: Deserialize<'a>>(verb: &str, body: &'a Bytes) -> Result<T, BadRequest> {
    serde_json::from_slice(body)
        .map_err(|error| BadRequest(format!("cannot decode {verb} request body: {error}")))
}

/// Starts `verb`'s timer and decodes its body; a body that does not decode is counted as a
/// `bad_request` and answered 400.
fn decode_timed<'a, T: Deserialize<'a>>(
    metrics: &'a Metrics,
    verb: &'static str,
    body: &'a Bytes,
) -> Result<(Timer<'a>, T), BadRequest> {
    let timer = Timer::start(metrics, verb);
    match decode(verb, body) {
        Ok(args) => Ok((timer, args)),
        Err(error) => {
            timer.finish("bad_request");
            Err(error)
        }
    }
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
/// or full objects to judge on their own (non-cache mode). Names borrow from the request.
enum Candidates<'a> {
    Names(Vec<&'a str>),
    Objects {
        names: Vec<String>,
        states: Vec<Result<NodeState, String>>,
        list: &'a NodeList,
    },
}

impl Candidates<'_> {
    fn names(&self) -> Vec<&str> {
        self.offered().names()
    }

    /// The candidates as the state's verbs take them.
    fn offered(&self) -> Offered<'_> {
        match self {
            Candidates::Names(names) => Offered::Names(names),
            Candidates::Objects { names, states, .. } => Offered::Objects { names, states },
        }
    }
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

fn candidates<'a>(args: &'a CandidateArgs<'_>, config: &Config) -> Candidates<'a> {
    if let Some(list) = &args.nodes {
        let mut names = Vec::with_capacity(list.items.len());
        let mut states = Vec::with_capacity(list.items.len());
        for raw in &list.items {
            match serde_json::from_str::<Node>(raw.get()) {
                Ok(node) => {
                    names.push(node.metadata.name.clone().unwrap_or_default());
                    states.push(
                        translate::node_spec(&node, config)
                            .map(NodeState::new)
                            .map_err(|error| error.to_string()),
                    );
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
    Candidates::Names(
        args.node_names
            .iter()
            .flatten()
            .map(NodeName::as_str)
            .collect(),
    )
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

/// Writes an answer as `axum::Json` does (the same bytes and `Content-Type`, and the same 500 if
/// encoding ever failed), but into a buffer of `capacity` bytes: axum's starts at 128 bytes, is
/// written through `BufMut` piece by piece and grown by copying, which for a 500-node answer was
/// about a tenth of the request's CPU.
fn json_response(value: &impl Serialize, capacity: usize) -> Response {
    let mut buffer = Vec::with_capacity(capacity);
    match serde_json::to_writer(&mut buffer, value) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            Body::from(buffer),
        )
            .into_response(),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            )],
            error.to_string(),
        )
            .into_response(),
    }
}

async fn filter(State(state): State<AppState>, body: Bytes) -> Response {
    let (timer, args) = match decode_timed::<CandidateArgs<'_>>(&state.metrics, "filter", &body) {
        Ok(decoded) => decoded,
        Err(refused) => return refused.into_response(),
    };
    let span = info_span!("filter", pod = %pod_name(args.pod.as_ref()));
    span.in_scope(|| {
        let candidates = candidates(&args, &state.config);
        let decision = state
            .verbs()
            .filter(args.pod.as_ref(), candidates.offered());
        let mut decision = decision;
        let answer = filter_answer(&state.metrics, &candidates, &mut decision);
        timer.finish(if answer.error.is_empty() {
            "ok"
        } else {
            "error"
        });
        json_response(&answer, answer.encoded_len_hint())
    })
}

/// Filter's answer to kube-scheduler for what the state decided, counted in the metrics.
fn filter_answer<'d>(
    metrics: &Metrics,
    candidates: &'d Candidates<'_>,
    decision: &'d mut FilterDecision<'d>,
) -> FilterAnswer<'d> {
    match decision {
        FilterDecision::NoPod => FilterAnswer {
            error: "filter request has no Pod",
            ..Default::default()
        },
        FilterDecision::NotReady => FilterAnswer {
            error: NotReady.message(),
            ..Default::default()
        },
        FilterDecision::Unreadable(message) => {
            metrics.invalid_requests.inc();
            FilterAnswer {
                failed_and_unresolvable_nodes: reject_all(candidates.names(), message),
                ..Default::default()
            }
        }
        FilterDecision::PassAll => FilterAnswer {
            node_names: Some(candidates.names()),
            ..Default::default()
        },
        FilterDecision::OverQuota(reason) => {
            let names = candidates.names();
            metrics
                .filter_nodes
                .with_label_values(&["failed"])
                .inc_by(names.len() as u64);
            metrics.quota_refusals.inc();
            FilterAnswer {
                node_names: match candidates {
                    Candidates::Names(_) => Some(Vec::new()),
                    Candidates::Objects { .. } => None,
                },
                nodes: match candidates {
                    Candidates::Names(_) => None,
                    Candidates::Objects { list, .. } => Some(NodeListAnswer {
                        metadata: &list.metadata,
                        items: Vec::new(),
                    }),
                },
                failed_nodes: reject_all(names, reason),
                ..Default::default()
            }
        }
        FilterDecision::Verdict {
            verdict,
            unreadable,
            readable,
            window_miss,
        } => {
            record_verdict(metrics, verdict);
            if *window_miss {
                metrics.filter_window_misses.inc();
            }
            match candidates {
                Candidates::Names(names) => {
                    let passed = verdict
                        .passed
                        .iter()
                        .filter_map(|&i| names.get(i).copied())
                        .collect();
                    FilterAnswer {
                        node_names: Some(passed),
                        failed_nodes: NodeReasons::from_pairs(std::mem::take(&mut verdict.failed)),
                        failed_and_unresolvable_nodes: NodeReasons::from_pairs(std::mem::take(
                            &mut verdict.unresolvable,
                        )),
                        ..Default::default()
                    }
                }
                Candidates::Objects { names, list, .. } => {
                    // After the engine's reasons, so that an unreadable object's reason wins for
                    // a name given twice, as when the maps were merged with `BTreeMap::append`.
                    verdict.unresolvable.append(unreadable);
                    let keep: std::collections::HashSet<&str> = verdict
                        .passed
                        .iter()
                        .filter_map(|&i| readable.get(i).copied())
                        .collect();
                    let items = list
                        .items
                        .iter()
                        .zip(names)
                        .filter(|(_, name)| keep.contains(name.as_str()))
                        .map(|(raw, _)| &**raw)
                        .collect();
                    FilterAnswer {
                        nodes: Some(NodeListAnswer {
                            metadata: &list.metadata,
                            items,
                        }),
                        failed_nodes: NodeReasons::from_pairs(std::mem::take(&mut verdict.failed)),
                        failed_and_unresolvable_nodes: NodeReasons::from_pairs(std::mem::take(
                            &mut verdict.unresolvable,
                        )),
                        ..Default::default()
                    }
                }
            }
        }
    }
}

/// Every candidate rejected for one request-level reason (a malformed request): the message
/// reaches the pod's FailedScheduling event, and the pod stays `Unschedulable`, not
/// `SchedulerError`.
fn reject_all<'a>(names: impl IntoIterator<Item = &'a str>, message: &'a str) -> NodeReasons<'a> {
    NodeReasons::from_pairs(names.into_iter().map(|name| (name, message)).collect())
}

fn record_verdict(metrics: &Metrics, verdict: &FilterVerdict<'_>) {
    // Counted per candidate from the engine's reasons (a name given twice counts twice; the
    // answer's maps list it once, and may omit the reasons under filterBestOnly).
    let resolvable = verdict
        .reasons
        .iter()
        .filter(|reason| reason.is_resolvable())
        .count();
    let counts = [
        ("passed", verdict.passed.len()),
        ("failed", resolvable),
        ("unresolvable", verdict.reasons.len() - resolvable),
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

async fn prioritize(State(state): State<AppState>, body: Bytes) -> Response {
    let (timer, args) = match decode_timed::<CandidateArgs<'_>>(&state.metrics, "prioritize", &body)
    {
        Ok(decoded) => decoded,
        Err(refused) => return refused.into_response(),
    };
    let span = info_span!("prioritize", pod = %pod_name(args.pod.as_ref()));
    span.in_scope(|| {
        let candidates = candidates(&args, &state.config);
        let scores = prioritize_decision(&state, &args, &candidates);
        timer.finish("ok");
        json_response(&scores, HostScore::encoded_len_hint(&scores))
    })
}

/// Prioritize for pods whose DRA claims ask for GPUs ([`Verbs::prioritize_claims`]), called by
/// a stanza of its own that names no managed resources: kube-scheduler calls such an extender
/// for every pod, so it answers no opinion for all others.
async fn prioritize_claims(State(state): State<AppState>, body: Bytes) -> Response {
    // Counted with the other stanza's calls, as the same verb.
    let (timer, args) = match decode_timed::<CandidateArgs<'_>>(&state.metrics, "prioritize", &body)
    {
        Ok(decoded) => decoded,
        Err(refused) => return refused.into_response(),
    };
    let span = info_span!("prioritize_claims", pod = %pod_name(args.pod.as_ref()));
    span.in_scope(|| {
        let candidates = candidates(&args, &state.config);
        let scores = state
            .verbs()
            .prioritize_claims(args.pod.as_ref(), candidates.offered());
        let scores = positive(scores);
        timer.finish("ok");
        json_response(&scores, HostScore::encoded_len_hint(&scores))
    })
}

fn prioritize_decision<'a>(
    state: &AppState,
    args: &CandidateArgs<'_>,
    candidates: &'a Candidates<'_>,
) -> Vec<HostScore<'a>> {
    let scores = state
        .verbs()
        .prioritize(args.pod.as_ref(), candidates.offered());
    positive(scores)
}

/// Scores as kube-scheduler reads them.
fn positive(scores: Vec<(&str, i64)>) -> Vec<HostScore<'_>> {
    // No opinion (no pod, or one that does not read) is an empty list: 0 everywhere, so it
    // changes no ranking. kube-scheduler counts a candidate the answer leaves out as 0 (it adds
    // only the hosts it is given), so zeros are left out: less for its serial loop to decode.
    scores
        .into_iter()
        .filter(|&(_, score)| score > 0)
        .map(|(host, score)| HostScore { host, score })
        .collect()
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
    let request = BindRequest {
        namespace: args.pod_namespace,
        name: args.pod_name,
        uid: args.pod_uid,
        node: args.node,
    };
    let outcome = match &state.binder {
        Some(binder) => binder.bind(request).instrument(span.clone()).await,
        None => Err(BindError::NoBinder),
    };
    let error = match outcome {
        Ok(_) => String::new(),
        Err(error) => {
            let message = error.to_string();
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

/// Preempt's answer: the proposals decoded (victims named by UID, as `NodeNameToMetaVictims`
/// answers them), judged by the shared state, encoded.
fn preempt_decision(state: &AppState, args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult {
    let mut proposals: Vec<Proposal> = Vec::new();
    for (node, victims) in args.node_name_to_meta_victims {
        let victims = victims.unwrap_or_default();
        proposals.push(Proposal {
            node,
            victims: victims.pods.into_iter().map(|p| p.uid).collect(),
            pdb_violations: victims.num_pdb_violations,
        });
    }
    for (node, victims) in args.node_name_to_victims {
        let victims = victims.unwrap_or_default();
        proposals.push(Proposal {
            node,
            victims: victims
                .pods
                .iter()
                .map(|p| p.metadata.uid.clone().unwrap_or_default())
                .collect(),
            pdb_violations: victims.num_pdb_violations,
        });
    }
    let kept = state.verbs().preempt(args.pod.as_ref(), proposals);
    let mut out = ExtenderPreemptionResult::default();
    for proposal in kept {
        out.node_name_to_meta_victims.insert(
            proposal.node,
            MetaVictims {
                pods: proposal
                    .victims
                    .into_iter()
                    .map(|uid| MetaPod { uid })
                    .collect(),
                num_pdb_violations: proposal.pdb_violations,
            },
        );
    }
    out
}

async fn readyz(State(state): State<AppState>) -> Response {
    if state.cluster.is_ready() {
        (StatusCode::OK, "ready").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "allocation table not yet synced",
        )
            .into_response()
    }
}

/// Runs `work` on a blocking thread: what reads the whole table (the metrics, the report, the
/// web view's data: tens of milliseconds at thousands of nodes) does not occupy the runtime's
/// workers, which answer kube-scheduler. An error is the task's failure, as text.
async fn off_the_workers<R: Send + 'static>(
    work: impl FnOnce() -> R + Send + 'static,
) -> Result<R, String> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| format!("the admin task failed: {error}"))
}

/// A JSON answer built and encoded off the runtime's workers ([`off_the_workers`]).
pub(crate) async fn json_off_the_workers<T: Serialize>(
    build: impl FnOnce() -> T + Send + 'static,
) -> Response {
    match off_the_workers(move || serde_json::to_vec(&build())).await {
        Ok(Ok(body)) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Ok(Err(error)) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error).into_response(),
    }
}

/// `/metrics` as last rendered, reused for `interval`: at thousands of nodes a render is
/// megabytes and tens of milliseconds, so a scraper (or anyone) asking often gets the page of
/// the last render rather than a new one each time. One render runs at a time; scrapes that
/// arrive during it wait for it and share it.
#[derive(Debug)]
struct MetricsPage {
    interval: Duration,
    last: tokio::sync::Mutex<Option<(Instant, Bytes)>>,
}

impl MetricsPage {
    fn new(interval: Duration) -> Self {
        Self {
            interval,
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// The page: the last render if it is younger than the interval, else a new one.
    async fn get(&self, metrics: &Metrics) -> Result<Bytes, String> {
        // Held across the render: the scrapes behind it then find it fresh.
        let mut last = self.last.lock().await;
        if let Some((at, page)) = last.as_ref()
            && at.elapsed() < self.interval
        {
            return Ok(page.clone());
        }
        let metrics = metrics.clone();
        let page = off_the_workers(move || metrics.render())
            .await?
            .map_err(|error| error.to_string())?;
        let page = Bytes::from(page);
        *last = Some((Instant::now(), page.clone()));
        Ok(page)
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    match state.metrics_page.get(&state.metrics).await {
        Ok(page) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            page,
        )
            .into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error).into_response(),
    }
}

async fn inspect_table(State(state): State<AppState>) -> Response {
    json_off_the_workers(move || state.cluster.report()).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_engine::Table;

    /// At the cap, a further admin request is answered 503 at once; a freed permit serves the
    /// next one.
    #[tokio::test]
    async fn the_admin_gate_refuses_at_its_cap_without_waiting() {
        use tower::ServiceExt;
        let gate = Arc::new(AdminGate {
            permits: Semaphore::new(1),
            limit: 1,
            metrics: Metrics::new().unwrap(),
        });
        let release = Arc::new(tokio::sync::Notify::new());
        let held = release.clone();
        let app = Router::new()
            .route(
                "/slow",
                get(move || {
                    let held = held.clone();
                    async move {
                        held.notified().await;
                        "done"
                    }
                }),
            )
            .route("/fast", get(|| async { "ok" }))
            .layer(axum::middleware::from_fn_with_state(
                gate.clone(),
                admit_admin,
            ));
        let get_path = |path: &str| axum::http::Request::get(path).body(Body::empty()).unwrap();
        let slow = tokio::spawn(app.clone().oneshot(get_path("/slow")));
        // Let the slow request take the one permit.
        while gate.permits.available_permits() > 0 {
            tokio::task::yield_now().await;
        }
        let refused = app.clone().oneshot(get_path("/fast")).await.unwrap();
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(gate.metrics.admin_requests_shed.get(), 1);
        release.notify_one();
        assert_eq!(slow.await.unwrap().unwrap().status(), StatusCode::OK);
        let served = app.oneshot(get_path("/fast")).await.unwrap();
        assert_eq!(served.status(), StatusCode::OK);
    }

    /// The probes are outside the cap: with every permit taken they still answer, while the
    /// heavy pages are refused.
    #[tokio::test]
    async fn metrics_are_rendered_once_per_interval_and_afresh_after_it() {
        let metrics = Metrics::new().unwrap();
        let page = |metrics: &Metrics| {
            let metrics = metrics.clone();
            async move {
                let text = MetricsPage::new(Duration::from_secs(3600));
                let first = text.get(&metrics).await.unwrap();
                metrics.requests_shed.inc();
                let second = text.get(&metrics).await.unwrap();
                (first, second)
            }
        };
        let (first, second) = page(&metrics).await;
        assert_eq!(first, second, "within the interval: the same page");
        let fresh = MetricsPage::new(Duration::ZERO);
        let before = fresh.get(&metrics).await.unwrap();
        metrics.requests_shed.inc();
        let after = fresh.get(&metrics).await.unwrap();
        let shed = |page: &Bytes| {
            String::from_utf8_lossy(page)
                .lines()
                .find_map(|line| line.strip_prefix("gpu_extender_requests_shed_total "))
                .map(str::to_owned)
        };
        assert_eq!(shed(&before).as_deref(), Some("1"));
        assert_eq!(
            shed(&after).as_deref(),
            Some("2"),
            "no interval: every scrape renders"
        );
    }

    #[tokio::test]
    async fn the_probes_answer_while_the_admin_cap_is_full() {
        use tower::ServiceExt;
        let state = AppState::new(
            Arc::new(ClusterState::new(20)),
            Arc::new(Config::default()),
            Metrics::new().unwrap(),
        );
        state.cluster.set_ready();
        let gate = Arc::new(AdminGate {
            permits: Semaphore::new(1),
            limit: 1,
            metrics: state.metrics.clone(),
        });
        let app = admin_routes_behind(state, gate.clone());
        let _taken = gate.permits.try_acquire().unwrap();
        let status = |path: &'static str| {
            let app = app.clone();
            async move {
                app.oneshot(axum::http::Request::get(path).body(Body::empty()).unwrap())
                    .await
                    .unwrap()
                    .status()
            }
        };
        assert_eq!(status("/healthz").await, StatusCode::OK);
        assert_eq!(status("/readyz").await, StatusCode::OK);
        assert_eq!(status("/metrics").await, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(status("/inspect").await, StatusCode::SERVICE_UNAVAILABLE);
    }

    /// Filter's answer to `body`, as the handler encodes it.
    fn filter_text(state: &AppState, body: &Bytes) -> String {
        let args: CandidateArgs<'_> = decode("filter", body).unwrap();
        let candidates = candidates(&args, &state.config);
        let mut decision = state
            .verbs()
            .filter(args.pod.as_ref(), candidates.offered());
        serde_json::to_string(&filter_answer(&state.metrics, &candidates, &mut decision)).unwrap()
    }

    fn state() -> AppState {
        AppState::new(
            Arc::new(ClusterState::with_table(Table::new(20))),
            Arc::new(Config::default()),
            Metrics::new().unwrap(),
        )
        .with_body_limit(1 << 20)
    }

    /// kube-scheduler lists each candidate once, but a body may not: the answer names a node once
    /// (its maps are keyed by name) while the metrics count candidates. Counting the unknown
    /// candidates against the deduplicated map once underflowed.
    #[tokio::test]
    async fn accepted_connections_send_small_writes_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut accepted, _) = listener.accept().await.unwrap();
        assert!(
            !accepted.nodelay().unwrap(),
            "Nagle's algorithm is on by default"
        );
        no_delay(&mut accepted);
        assert!(accepted.nodelay().unwrap());
    }

    #[test]
    fn a_name_given_twice_is_answered_once_and_counted_twice() {
        let state = state();
        let body = Bytes::from_static(
            br#"{"Pod":{"spec":{"containers":[{"name":"c","resources":{"limits":{"aliyun.com/gpu-mem":"8"}}}]}},"NodeNames":["ghost","ghost"]}"#,
        );
        assert_eq!(
            filter_text(&state, &body),
            format!(
                r#"{{"Nodes":null,"NodeNames":[],"FailedNodes":{{"ghost":"{}"}},"FailedAndUnresolvableNodes":{{}},"Error":""}}"#,
                crate::state::decide::UNKNOWN_NODE
            )
        );
        let count = |label| state.metrics.filter_nodes.with_label_values(&[label]).get();
        assert_eq!((count("unknown"), count("failed")), (2, 0));
    }

    /// No candidate holds the pod while a node kube-scheduler did not send would: a window miss
    /// is counted. Not counted: a fitting candidate, a node outside whose taint the pod does not
    /// tolerate, and a pod no node can hold.
    #[test]
    fn a_fitting_node_outside_kube_schedulers_window_is_counted_as_a_miss() {
        use gpu_engine::{GpuMode, MemMiB, NodeSpec};
        use k8s_openapi::api::core::v1::{NodeSpec as KubeNodeSpec, Taint};
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

        let table = Table::rebuild(
            20,
            [
                NodeSpec::uniform("small", GpuMode::Exclusive, 1, "T4", MemMiB(16 * 1024)),
                NodeSpec::uniform("large", GpuMode::Exclusive, 4, "A100", MemMiB(80 * 1024)),
            ],
            [],
        );
        let state = AppState {
            cluster: Arc::new(ClusterState::with_table(table)),
            ..state()
        };
        let filter = |gpus: u32, tolerates: bool, names: &[&str]| -> (Vec<String>, u64) {
            let tolerations = if tolerates {
                r#","tolerations":[{"key":"pool","operator":"Exists","effect":"NoSchedule"}]"#
            } else {
                ""
            };
            let body = Bytes::from(format!(
                r#"{{"Pod":{{"metadata":{{"namespace":"ns","name":"p"}},"spec":{{"containers":[{{"name":"c","resources":{{"limits":{{"nvidia.com/gpu":"{gpus}"}}}}}}]{tolerations}}}}},"NodeNames":{}}}"#,
                serde_json::to_string(names).unwrap()
            ));
            let answer: serde_json::Value =
                serde_json::from_str(&filter_text(&state, &body)).unwrap();
            let passed = answer["NodeNames"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_str().unwrap().to_owned())
                .collect();
            (passed, state.metrics.filter_window_misses.get())
        };
        // Each miss notes the pod for the requeue task, and nothing else does.
        let noted = || {
            let missed = state.cluster.take_window_missed();
            missed
                .iter()
                .map(|key| key.as_str().to_owned())
                .collect::<Vec<_>>()
        };
        // Two GPUs: "small" cannot, "large" can.
        assert_eq!(filter(2, false, &["small"]), (vec![], 1));
        assert_eq!(noted(), ["ns/p"]);
        assert_eq!(
            filter(2, false, &["small", "large"]),
            (vec!["large".to_owned()], 1)
        );
        // Eight GPUs fit nowhere: the cluster is full for it, not the window.
        assert_eq!(filter(8, false, &["small"]), (vec![], 1));
        assert!(noted().is_empty());
        // "large" tainted: kube-scheduler would never have sent it to this pod.
        let name = state
            .cluster
            .read()
            .node_by_str("large")
            .unwrap()
            .spec
            .name
            .clone();
        let tainted = Node {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("large".into()),
                ..Default::default()
            },
            spec: Some(KubeNodeSpec {
                taints: Some(vec![Taint {
                    key: "pool".into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: Some(k8s_openapi::api::core::v1::NodeStatus {
                allocatable: Some([("nvidia.com/gpu".to_owned(), Quantity("4".into()))].into()),
                ..Default::default()
            }),
        };
        state.cluster.note_node_claims(name, &tainted);
        assert_eq!(filter(2, false, &["small"]), (vec![], 1));
        assert!(noted().is_empty());
        assert_eq!(filter(2, true, &["small"]), (vec![], 2));
        assert_eq!(noted(), ["ns/p"]);
    }

    /// A team at its quota's max: every candidate is refused as full, with the quota's reason;
    /// another namespace, and the same team asking for less, pass.
    #[test]
    fn filter_refuses_a_pod_past_its_teams_quota() {
        use crate::objects::quota::read_quota;
        use gpu_engine::quota::QuotaSet;
        use gpu_engine::{GpuMode, MemMiB, NodeSpec};

        let config = Config::default();
        let mut table = Table::rebuild(
            20,
            [NodeSpec::uniform(
                "a100",
                GpuMode::Exclusive,
                4,
                "A100",
                MemMiB(80 * 1024),
            )],
            [],
        );
        let two = gpu_engine::PodRequest::single(
            gpu_engine::CpuMilli(1),
            MemMiB(1),
            gpu_engine::GpuDemand::whole(2).unwrap(),
        );
        let placed = gpu_engine::fit(
            table.node_by_str("a100").unwrap(),
            &two,
            &Default::default(),
        )
        .unwrap();
        table
            .reserve(gpu_engine::PodKey::new("team-a", "running"), placed, 1)
            .unwrap();
        let state = AppState {
            cluster: Arc::new(ClusterState::with_table(table)),
            ..state()
        };
        let quota = read_quota(
            "gpus",
            "team-a",
            Some(&serde_json::json!({"min": {"nvidia.com/gpu": 1}, "max": {"nvidia.com/gpu": 3}})),
            None,
            &config,
        )
        .unwrap();
        state.cluster.set_quotas(QuotaSet::build(
            vec![quota],
            Vec::new(),
            &crate::objects::quota::quota_names(&config),
        ));
        let answer = |namespace: &str, gpus: u32| {
            let body = format!(
                r#"{{"Pod":{{"metadata":{{"namespace":"{namespace}","name":"p"}},"spec":{{"containers":[{{"name":"c","resources":{{"limits":{{"nvidia.com/gpu":"{gpus}"}}}}}}]}}}},"NodeNames":["a100"]}}"#
            );
            filter_text(&state, &Bytes::from(body))
        };
        assert_eq!(
            answer("team-a", 2),
            r#"{"Nodes":null,"NodeNames":[],"FailedNodes":{"a100":"GPU quota: namespace team-a would exceed its ElasticQuota gpus max (nvidia.com/gpu: 2 used + 2 requested > 3)"},"FailedAndUnresolvableNodes":{},"Error":""}"#
        );
        assert_eq!(state.metrics.quota_refusals.get(), 1);
        assert!(answer("team-a", 1).contains(r#""NodeNames":["a100"]"#));
        assert!(answer("team-b", 2).contains(r#""NodeNames":["a100"]"#));
    }
}
