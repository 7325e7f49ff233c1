//! The read-only web view on the admin port: `/ui` (the page), `/ui/app.js` and `/ui/app.css`
//! (its script and style, embedded in the binary; the page loads nothing else and makes no
//! request outside the extender), and `/ui/data` (what it shows, as JSON: the `/inspect` report
//! with each pod's share of each GPU and the NVLink islands, the cluster totals with the free and
//! fragmented capacity by the policy's own measure, the pending GPU pods with what `explain`
//! says about each, and what Dynamic Resource Allocation hands out: each GPU's claims with their
//! pods, the claims, the nodes offered both ways and the slices' problems). The page polls `/ui/data`; only `/ui/data` carries cluster data, so it is
//! the path `server.adminAuth.paths` guards by default (a browser cannot put a bearer token on a
//! page load; the page sends the one it is given with each data request).

use std::collections::BTreeMap;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use crate::explain;
use crate::inspect::{self, DraReport, GpuReport, MigReport, NodeReport, Totals};
use crate::objects::translate;
use gpu_engine::{PodKey, PodRequest, Policy, Table};

use super::server::AppState;

/// The page's data path, guarded by default (`server.adminAuth.paths`).
pub const DATA_PATH: &str = "/ui/data";

/// At most this many pending pods are explained per answer (oldest first); the others are
/// counted in [`View::pending_unexplained`]. Explaining one pod fits it on every node.
pub const EXPLAIN_LIMIT: usize = 25;

const PAGE: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/app.css");

/// Everything the page shows.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct View {
    /// The scoring policy in force (`binpack`, `fgd`, ...).
    pub policy: String,
    pub nodes: Vec<NodeView>,
    pub totals: ViewTotals,
    /// Pending GPU pods, oldest first, at most [`EXPLAIN_LIMIT`].
    pub pending: Vec<PendingPod>,
    /// Pending GPU pods beyond [`EXPLAIN_LIMIT`], not listed.
    pub pending_unexplained: usize,
    /// What Dynamic Resource Allocation hands out (`/inspect`'s `dra`, each claim with its node
    /// and GPUs); absent when DRA is not read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dra: Option<DraReport>,
}

/// The `/inspect` totals plus the free and fragmented capacity.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ViewTotals {
    #[serde(flatten)]
    pub inspect: Totals,
    /// Free capacity of healthy GPUs in milli-GPU ([`inspect::Capacity`]).
    pub free_milli: u64,
    /// The part of it the policy's typical pods could not use ([`inspect::Capacity`]).
    pub fragmented_milli: f64,
    pub unhealthy_gpus: u64,
    /// GPUs that DRA claims hold, whole or a MIG slice of them.
    pub claimed_gpus: u64,
}

/// One node: its `/inspect` report, with every GPU's holders and NVLink island.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    pub name: String,
    pub mode: String,
    pub placement: String,
    pub pods: usize,
    pub gpus: Vec<GpuView>,
    /// MIG slices by profile with their holders (`/inspect`'s `mig`); absent without any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<MigReport>,
}

/// One GPU.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuView {
    #[serde(flatten)]
    pub report: GpuReport,
    /// Its NVLink island on the node (GPUs with the same number are joined by NVLink); `None`
    /// without NVLink.
    pub island: Option<u16>,
    /// What each pod holds on it, by pod name.
    pub holds: Vec<HoldView>,
}

/// What one pod holds on one GPU.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HoldView {
    /// `namespace/name`.
    pub pod: String,
    pub whole: bool,
    pub memory_mib: u64,
    pub compute_milli: u32,
}

/// A pending GPU pod and why it waits.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingPod {
    /// `namespace/name`.
    pub pod: String,
    /// What it asks for, in `explain`'s words.
    pub request: String,
    /// How many nodes it fits now.
    pub fits: usize,
    /// Per refusal (`explain`'s layer and reason code), on how many nodes.
    pub refusals: Vec<Refusal>,
    /// `explain`'s detail for the node that comes closest: the first node whose refusal waiting
    /// could lift, else the first refusing node.
    pub closest: Option<String>,
    /// kube-scheduler's own word on the pod (its `PodScheduled` condition's reason, e.g.
    /// `Unschedulable`), when it has one.
    pub scheduler: Option<String>,
}

/// One kind of refusal of a pending pod.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Refusal {
    pub reason: String,
    pub nodes: usize,
}

/// A pending pod to explain: its key, its request, kube-scheduler's word on it.
#[derive(Clone, Debug)]
pub struct Waiting {
    pub pod: PodKey,
    pub request: PodRequest,
    pub scheduler: Option<String>,
}

/// The view of `table` under `policy`, with `waiting` explained (at most [`EXPLAIN_LIMIT`], in
/// the order given) and what DRA hands out (`dra`, from
/// [`ClusterState::dra_report`](crate::state::ClusterState::dra_report); `None` when DRA is not
/// read). No I/O.
pub fn view(table: &Table, policy: &Policy, waiting: &[Waiting], dra: Option<DraReport>) -> View {
    let mut report = inspect::report(table);
    if let Some(dra) = dra {
        report = report.with_dra(dra);
    }
    let capacity = inspect::capacity(table, &policy.typical);
    let gpus = || report.nodes.iter().flat_map(|node| &node.gpus);
    let unhealthy_gpus = gpus().filter(|gpu| !gpu.healthy).count() as u64;
    let claimed_gpus = gpus().filter(|gpu| !gpu.claims.is_empty()).count() as u64;
    let dra = report.dra;
    let nodes = report
        .nodes
        .into_iter()
        .map(|node| node_view(table, node))
        .collect();
    let pending = waiting
        .iter()
        .take(EXPLAIN_LIMIT)
        .map(|pod| pending_pod(table, policy, pod))
        .collect();
    View {
        policy: policy.scoring.as_str().to_owned(),
        nodes,
        totals: ViewTotals {
            inspect: report.totals,
            free_milli: capacity.free_milli,
            fragmented_milli: capacity.fragmented_milli,
            unhealthy_gpus,
            claimed_gpus,
        },
        pending,
        pending_unexplained: waiting.len().saturating_sub(EXPLAIN_LIMIT),
        dra,
    }
}

fn node_view(table: &Table, node: NodeReport) -> NodeView {
    let state = table.node_by_str(&node.name);
    let islands = state
        .map(|state| state.spec.links.nvlink_islands())
        .unwrap_or_default();
    let mut holds: BTreeMap<u16, Vec<HoldView>> = BTreeMap::new();
    if let Some(state) = state {
        for (key, entry) in table.pods_on(&state.spec.name) {
            for hold in entry.allocation.footprint() {
                holds.entry(hold.gpu.0).or_default().push(HoldView {
                    pod: key.to_string(),
                    whole: hold.whole,
                    memory_mib: hold.mem.0,
                    compute_milli: hold.compute.0,
                });
            }
        }
    }
    let gpus = node
        .gpus
        .into_iter()
        .enumerate()
        .map(|(position, report)| {
            let mut holds = holds.remove(&report.index).unwrap_or_default();
            holds.sort_by(|a, b| a.pod.cmp(&b.pod));
            GpuView {
                island: islands.get(position).copied().flatten(),
                holds,
                report,
            }
        })
        .collect();
    NodeView {
        name: node.name,
        mode: node.mode,
        placement: node.placement,
        pods: node.pods,
        gpus,
        mig: node.mig,
    }
}

fn pending_pod(table: &Table, policy: &Policy, waiting: &Waiting) -> PendingPod {
    let verdicts = explain::explain(table, &waiting.request, policy, &BTreeMap::new());
    let mut refusals: BTreeMap<String, usize> = BTreeMap::new();
    for verdict in verdicts.iter().filter(|v| !v.fits) {
        let reason = verdict
            .reason
            .clone()
            .or_else(|| verdict.layer.clone())
            .unwrap_or_default();
        *refusals.entry(reason).or_default() += 1;
    }
    let mut refusals: Vec<Refusal> = refusals
        .into_iter()
        .map(|(reason, nodes)| Refusal { reason, nodes })
        .collect();
    refusals.sort_by(|a, b| b.nodes.cmp(&a.nodes).then_with(|| a.reason.cmp(&b.reason)));
    let closest = verdicts
        .iter()
        .find(|v| v.resolvable == Some(true))
        .or_else(|| verdicts.iter().find(|v| !v.fits))
        .map(|v| format!("{}: {}", v.node, v.detail));
    PendingPod {
        pod: waiting.pod.to_string(),
        request: explain::describe_request(&waiting.request),
        fits: verdicts.iter().filter(|v| v.fits).count(),
        refusals,
        closest,
        scheduler: waiting.scheduler.clone(),
    }
}

/// kube-scheduler's word on a pending pod: the reason of its `PodScheduled` condition when that
/// is false (the watch keeps the condition's reason, not its message, of the pods it stores).
fn scheduler_word(pod: &Pod) -> Option<String> {
    let condition = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
    Some(
        condition
            .reason
            .clone()
            .unwrap_or_else(|| "not scheduled".to_owned()),
    )
}

/// The page's routes (added to the admin router).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/ui",
            get(|| async { asset("text/html; charset=utf-8", PAGE) }),
        )
        .route(
            "/ui/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/ui/app.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
        .route(DATA_PATH, get(data))
}

/// An embedded asset, with a content security policy that lets the page reach nothing but the
/// extender itself (inline `style` attributes are allowed: the bars' widths; every value the
/// page writes into its markup is escaped).
fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = ([(header::CONTENT_TYPE, content_type)], body).into_response();
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; \
             style-src-attr 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; \
             base-uri 'none'; frame-ancestors 'none'",
        ),
    );
    response
}

async fn data(State(state): State<AppState>) -> Response {
    super::server::json_off_the_workers(move || data_view(&state)).await
}

/// What `/ui/data` answers: the view of the table, with the first pending pods explained.
fn data_view(state: &AppState) -> View {
    let mut pending = state.cluster.pending_pods(|_| true);
    pending.sort_by(|(a_key, a), (b_key, b)| {
        let created = |pod: &Pod| pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
        created(a).cmp(&created(b)).then_with(|| a_key.cmp(b_key))
    });
    let waiting: Vec<Waiting> = pending
        .iter()
        .take(EXPLAIN_LIMIT)
        .filter_map(|(key, pod)| {
            // A pod whose request cannot be read is refused by filter with that message; the
            // watch keeps only GPU pods, so `None` (no GPU asked) does not occur here.
            let request = translate::pod_request(pod, &state.config).ok()??;
            Some(Waiting {
                pod: key.clone(),
                request,
                scheduler: scheduler_word(pod),
            })
        })
        .collect();
    let unexplained = pending.len().saturating_sub(waiting.len());
    let policy = state.policy.load();
    let dra = state.cluster.dra_report();
    let table = state.cluster.read();
    let mut view = view(&table, &policy, &waiting, dra);
    drop(table);
    view.pending_unexplained = unexplained;
    view
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on a broken fixture")]

    use super::*;
    use crate::inspect::fixtures::{add_node, bind};
    use gpu_engine::{CpuMilli, GpuDemand, GpuMode, MemMiB};

    fn table() -> Table {
        let mut table = Table::new(20);
        add_node(&mut table, "t4", GpuMode::ShareMemory, 2, "Tesla-T4", 16);
        add_node(&mut table, "a100", GpuMode::Exclusive, 1, "NVIDIA-A100", 40);
        bind(
            &mut table,
            "t4",
            "a",
            GpuDemand::share(10, 1, None).unwrap(),
        );
        bind(&mut table, "t4", "b", GpuDemand::share(4, 1, None).unwrap());
        bind(&mut table, "a100", "w", GpuDemand::whole(1).unwrap());
        table
    }

    #[test]
    fn the_view_is_the_inspect_report_with_each_pods_share_of_each_gpu() {
        let table = table();
        let view = view(&table, &Policy::default(), &[], None);
        let report = inspect::report(&table);
        assert_eq!(view.totals.inspect, report.totals);
        assert_eq!(view.nodes.len(), report.nodes.len());
        for (node, reported) in view.nodes.iter().zip(&report.nodes) {
            assert_eq!(node.name, reported.name);
            let gpus: Vec<&GpuReport> = node.gpus.iter().map(|g| &g.report).collect();
            assert_eq!(gpus, reported.gpus.iter().collect::<Vec<_>>());
            for gpu in &node.gpus {
                let holders: Vec<&str> = gpu.holds.iter().map(|h| h.pod.as_str()).collect();
                assert_eq!(holders, gpu.report.pods);
                let memory: u64 = gpu.holds.iter().map(|h| h.memory_mib).sum();
                assert_eq!(memory, gpu.report.memory_allocated_mib);
                assert_eq!(gpu.island, None, "uniform nodes have no NVLink");
            }
        }
        let a100 = &view.nodes[0];
        assert_eq!(a100.name, "a100");
        assert!(a100.gpus[0].holds[0].whole);
        assert_eq!(view.totals.unhealthy_gpus, 0);
        // Free: the idle T4 and what 14 GiB leaves of the other; the partly used one strands
        // capacity by the fallback measure (a whole-GPU typical pod).
        assert!(view.totals.free_milli > 0);
        assert!(view.totals.fragmented_milli > 0.0);
    }

    #[test]
    fn gpus_that_dra_claims_hold_show_the_claim_and_its_pods() {
        use crate::inspect::{ClaimReport, DraReport, claim_holder};
        use gpu_engine::{Change, ComputeMilli, GpuHold, GpuIndex, NodeName};
        let mut table = table();
        add_node(&mut table, "dra", GpuMode::Exclusive, 2, "NVIDIA-A100", 80);
        table.apply(Change::HoldExternal {
            holder: claim_holder("ml/c"),
            node: NodeName::new("dra"),
            holds: vec![GpuHold {
                gpu: GpuIndex(1),
                whole: true,
                mem: MemMiB(80 << 10),
                compute: ComputeMilli(1000),
            }],
            mig: Vec::new(),
        });
        let dra = DraReport {
            served: true,
            claims: vec![ClaimReport {
                claim: "ml/c".to_owned(),
                devices: vec!["gpu.nvidia.com/dra/gpu-1".to_owned()],
                pods: vec!["ml/train".to_owned()],
                ..ClaimReport::default()
            }],
            ..DraReport::default()
        };
        let shown = view(&table, &Policy::default(), &[], Some(dra));
        let node = shown.nodes.iter().find(|n| n.name == "dra").unwrap();
        assert!(node.gpus[0].report.claims.is_empty());
        let held = &node.gpus[1].report.claims;
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].claim, "ml/c");
        assert_eq!(held[0].pods, ["ml/train"]);
        assert_eq!(shown.totals.claimed_gpus, 1);
        let claims = &shown.dra.as_ref().unwrap().claims;
        assert_eq!(claims[0].node.as_deref(), Some("dra"));
        assert_eq!(claims[0].gpus, [1]);
        // Without DRA read, the view carries no DRA part.
        assert!(view(&table, &Policy::default(), &[], None).dra.is_none());
    }

    #[test]
    fn mig_slices_show_with_their_holders() {
        use crate::inspect::fixtures::{add_mig_node, bind_mig};
        let mut table = table();
        add_mig_node(&mut table, "mig", &[("1g.10gb", 7)]);
        bind_mig(&mut table, "mig", "a", &[("1g.10gb", 2)]);
        let shown = view(&table, &Policy::default(), &[], None);
        let node = shown.nodes.iter().find(|n| n.name == "mig").unwrap();
        assert_eq!(node.mig.len(), 1);
        assert_eq!(node.mig[0].profile, "1g.10gb");
        assert_eq!((node.mig[0].advertised, node.mig[0].held), (7, 2));
        assert_eq!(node.mig[0].pods.len(), 1);
        assert!(node.mig[0].pods[0].pod.ends_with("/a"));
        assert_eq!(shown.totals.inspect.mig_slices_held, 2);
        assert!(
            shown
                .nodes
                .iter()
                .filter(|n| n.name != "mig")
                .all(|n| n.mig.is_empty())
        );
    }

    #[test]
    fn a_pending_pod_is_listed_with_the_refusals_explain_finds_and_the_closest_node() {
        let table = table();
        let request = PodRequest::single(
            CpuMilli(0),
            MemMiB(0),
            GpuDemand::share(20, 1, None).unwrap(),
        );
        let waiting = [Waiting {
            pod: PodKey::new("ml", "big"),
            request: request.clone(),
            scheduler: Some("Unschedulable".to_owned()),
        }];
        let view = view(&table, &Policy::default(), &waiting, None);
        assert_eq!(view.pending.len(), 1);
        let pod = &view.pending[0];
        assert_eq!(pod.pod, "ml/big");
        assert_eq!(pod.request, explain::describe_request(&request));
        let verdicts = explain::explain(&table, &request, &Policy::default(), &BTreeMap::new());
        assert_eq!(pod.fits, verdicts.iter().filter(|v| v.fits).count());
        let refused: usize = pod.refusals.iter().map(|r| r.nodes).sum();
        assert_eq!(refused + pod.fits, 2);
        assert!(pod.fits < 2, "20 GiB fits no T4: {pod:?}");
        let closest = pod.closest.as_deref().unwrap();
        assert!(
            verdicts
                .iter()
                .any(|v| closest == format!("{}: {}", v.node, v.detail)),
            "{closest}"
        );
        assert_eq!(view.pending_unexplained, 0);
    }

    #[test]
    fn pods_beyond_the_limit_are_counted_not_explained() {
        let table = table();
        let request = PodRequest::single(
            CpuMilli(0),
            MemMiB(0),
            GpuDemand::share(2, 1, None).unwrap(),
        );
        let waiting: Vec<Waiting> = (0..EXPLAIN_LIMIT + 3)
            .map(|i| Waiting {
                pod: PodKey::new("ns", &format!("p{i}")),
                request: request.clone(),
                scheduler: None,
            })
            .collect();
        let view = view(&table, &Policy::default(), &waiting, None);
        assert_eq!(view.pending.len(), EXPLAIN_LIMIT);
        assert_eq!(view.pending_unexplained, 3);
        // A 2 GiB share fits the T4 node; the exclusive A100 node takes whole GPUs only.
        assert_eq!(view.pending[0].fits, 1);
        assert_eq!(view.pending[0].refusals.len(), 1);
        assert_eq!(view.pending[0].refusals[0].nodes, 1);
    }

    #[test]
    fn the_assets_are_embedded_and_name_nothing_outside_the_extender() {
        for asset in [PAGE, SCRIPT, STYLE] {
            assert!(!asset.is_empty());
            for outside in ["http://", "https://", "//cdn", "@import"] {
                assert!(!asset.contains(outside), "an asset names {outside}");
            }
        }
        assert!(PAGE.contains("app.js") && PAGE.contains("app.css"));
        assert!(SCRIPT.contains("data"));
    }
}
