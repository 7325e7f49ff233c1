//! Properties of the engine over random clusters and random histories.
//!
//! A case is a handful of random nodes (1..8 GPUs, any mode, mixed card models and memory, some
//! GPUs unhealthy, uniform, island or random link matrices), a random typical-pod distribution for
//! FGD, and a random sequence of operations: fit a random pod and reserve, bind or undo it,
//! confirm, release, delete pods, resize, relabel, remove and restore nodes, let time pass
//! so that reservations expire, and let holders that are not pods (DRA claims) take idle GPUs
//! whole or in part and let them go. After every operation:
//! - the table's invariants hold (nothing over-committed, usage equals the sum of the pods and
//!   external holds), so no pod is ever placed on a GPU a claim holds;
//! - rebuilding the table from its node specs, pod allocations and external holds gives the
//!   same table;
//! - an external hold released at once leaves the table exactly as it was;
//!
//! and for every fitted pod, under Binpack, Spread and Fgd alike:
//!
//! - the score is within 0..=100, equals the score recomputed from its definition, and the
//!   placement honours the request;
//! - reserving that placement succeeds, and releasing it restores the table exactly;
//! - a rejection that claims the node can never fit also rejects the node when empty;
//! - a node whose topology index answers from tables decides exactly as with the searching index.
//!
//! and an estimate of how many copies of a pod the nodes can still take equals the number the
//! extender places when they arrive one after another.
//!
//! The descriptions below are plain values so that a failure shrinks to a readable case.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a panic is a test failure with its location"
)]

use std::collections::BTreeMap;
use std::sync::Arc;

use gpu_engine::{
    AlikeScores, Change, ComputeMilli, CpuMilli, Evaluation, Gpu, GpuConstraints, GpuDemand,
    GpuHold, GpuIndex, GpuMode, GpuPlacement, GpuUsage, Grant, Hold, HolderKey, Link, LinkMatrix,
    MemMiB, ModelPattern, NodeName, NodeSpec, NodeState, PodAllocation, PodKey, PodRequest, Policy,
    RejectReason, ScoringPolicy, Table, TopologyIndex, TopologyPreference, TypicalPod, TypicalPods,
    fit, max_replicas,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

const MODELS: [(&str, u64); 4] = [
    ("A10", 24),
    ("A100-SXM4-80GB", 80),
    ("Tesla-T4", 16),
    ("Tesla-V100-SXM2-32GB", 32),
];
const PATTERNS: [&str; 5] = ["A10", "A100*", "Tesla*", "tesla t4", "H100"];
const MODES: [GpuMode; 4] = [
    GpuMode::Exclusive,
    GpuMode::ShareMemory,
    GpuMode::CoreMem,
    GpuMode::Topology,
];

// ---------------------------------------------------------------------------------------------
// Descriptions

#[derive(Clone, Copy, Debug)]
struct GpuDesc {
    model: usize,
    healthy: bool,
}

#[derive(Clone, Debug)]
enum LinksDesc {
    Uniform,
    /// NVLink islands of this many GPUs, PCIe across sockets between them.
    Islands(usize),
    /// One code per pair (see `link`).
    Random(Vec<u8>),
}

/// How device-plugin indices map to positions in the node's GPU list; a GPU keeps its index
/// when the node is resized.
#[derive(Clone, Copy, Debug)]
enum Indices {
    /// 0, 1, 2, ...
    Contiguous,
    /// 1, 3, 5, ...: GPUs missing from the list.
    Gapped,
    /// 1, 0, 3, 2, ...: the list is not in index order.
    Swapped,
}

impl Indices {
    fn of(self, position: usize) -> u16 {
        let position = position as u16;
        match self {
            Self::Contiguous => position,
            Self::Gapped => 2 * position + 1,
            Self::Swapped => position ^ 1,
        }
    }
}

#[derive(Clone, Debug)]
struct NodeDesc {
    mode: GpuMode,
    indices: Indices,
    placement: GpuPlacement,
    gpus: Vec<GpuDesc>,
    links: LinksDesc,
    cpu: u64,
    mem_gib: u64,
    max_pods: u32,
}

#[derive(Clone, Copy, Debug)]
enum DemandDesc {
    /// What the target node's mode serves: `gpus` whole GPUs on exclusive and topology nodes, a
    /// share of `gib_per_gpu` (and `percent` on core_mem nodes) on up to two GPUs otherwise.
    /// Most generated pods are native, so that most placements get past the mode check.
    Native {
        gpus: u64,
        gib_per_gpu: u64,
        percent: u32,
    },
    None,
    Whole(u64),
    Topology(u64),
    Share {
        gib_per_gpu: u64,
        gpus: u64,
        percent: Option<u32>,
    },
}

#[derive(Clone, Debug)]
struct PodDesc {
    cpu: u64,
    mem_mib: u64,
    apps: Vec<DemandDesc>,
    inits: Vec<DemandDesc>,
    include: Vec<usize>,
    exclude: Vec<usize>,
    min_mem_gib: Option<u64>,
    placement: Option<GpuPlacement>,
    topology: TopologyPreference,
}

#[derive(Clone, Copy, Debug)]
enum After {
    Reserve { ttl_ms: u64 },
    Bind,
    Undo,
}

#[derive(Clone, Debug)]
enum Op {
    Place {
        node: usize,
        pod: PodDesc,
        scoring: ScoringPolicy,
        after: After,
    },
    /// The watch confirms a live pod's allocation.
    Confirm(usize),
    /// The pod finished or was deleted.
    Gone(usize),
    /// The bind failed and gave the reservation back.
    Release(usize),
    /// The node was relabelled or resized: GPUs added or idle ones removed, health, mode,
    /// placement, links and host capacity changed, never below what its pods hold.
    Resize {
        node: usize,
        gpus: usize,
        added: Vec<GpuDesc>,
        sick: Vec<bool>,
        mode: Option<GpuMode>,
        placement: GpuPlacement,
        links: LinksDesc,
        more_cpu: u64,
    },
    Remove(usize),
    /// Time passes and expired reservations are released.
    Expire(u64),
    /// A DRA claim takes up to `count` idle GPUs of the node whole, or with `part` a quarter
    /// of one idle GPU's memory (a MIG slice).
    HoldIdle {
        node: usize,
        count: usize,
        part: bool,
    },
    /// A claim is deallocated.
    Unhold(usize),
}

#[derive(Clone, Debug)]
struct ClassDesc {
    cpu: u64,
    gpus: u16,
    milli: u32,
    model: Option<usize>,
    weight: u32,
}

// ---------------------------------------------------------------------------------------------
// Strategies

fn gpu_desc() -> impl Strategy<Value = GpuDesc> {
    (0..MODELS.len(), prop::bool::weighted(0.85))
        .prop_map(|(model, healthy)| GpuDesc { model, healthy })
}

fn links_desc() -> impl Strategy<Value = LinksDesc> {
    prop_oneof![
        2 => Just(LinksDesc::Uniform),
        1 => (1usize..=4).prop_map(LinksDesc::Islands),
        2 => prop::collection::vec(0u8..7, 28).prop_map(LinksDesc::Random),
    ]
}

fn node_desc() -> impl Strategy<Value = NodeDesc> {
    (
        prop::sample::select(MODES.to_vec()),
        prop::sample::select(vec![Indices::Contiguous, Indices::Gapped, Indices::Swapped]),
        prop::sample::select(vec![GpuPlacement::Binpack, GpuPlacement::Spread]),
        prop::collection::vec(gpu_desc(), 1..=8),
        links_desc(),
        1u64..=64,
        4u64..=256,
        1u32..=30,
    )
        .prop_map(
            |(mode, indices, placement, gpus, links, cores, mem_gib, max_pods)| NodeDesc {
                mode,
                indices,
                placement,
                gpus,
                links,
                cpu: cores * 1000,
                mem_gib,
                max_pods,
            },
        )
}

fn gpu_count() -> impl Strategy<Value = u64> {
    prop_oneof![4 => Just(1u64), 2 => Just(2u64), 1 => 3u64..=4]
}

fn demand_desc() -> impl Strategy<Value = DemandDesc> {
    prop_oneof![
        12 => (gpu_count(), 1u64..=24, (1u32..=20).prop_map(|k| k * 5)).prop_map(
            |(gpus, gib_per_gpu, percent)| DemandDesc::Native { gpus, gib_per_gpu, percent }
        ),
        1 => Just(DemandDesc::None),
        1 => gpu_count().prop_map(DemandDesc::Whole),
        1 => gpu_count().prop_map(DemandDesc::Topology),
        2 => (
            1u64..=24,
            prop_oneof![4 => Just(1u64), 1 => 2u64..=3],
            prop::option::weighted(0.4, (1u32..=20).prop_map(|k| k * 5)),
        )
            .prop_map(|(gib_per_gpu, gpus, percent)| DemandDesc::Share {
                gib_per_gpu,
                gpus,
                percent
            }),
    ]
}

/// Mostly no model list; sometimes one pattern.
fn patterns() -> impl Strategy<Value = Vec<usize>> {
    prop::option::weighted(0.2, 0..PATTERNS.len()).prop_map(|p| p.into_iter().collect())
}

fn pod_desc() -> impl Strategy<Value = PodDesc> {
    (
        (0u64..=8).prop_map(|c| c * 500),
        (0u64..=16).prop_map(|m| m * 1024),
        prop_oneof![
            4 => prop::collection::vec(demand_desc(), 1..=1),
            1 => prop::collection::vec(demand_desc(), 2..=3),
        ],
        prop_oneof![
            4 => prop::collection::vec(demand_desc(), 0..=0),
            1 => prop::collection::vec(demand_desc(), 1..=2),
        ],
        patterns(),
        patterns(),
        prop::option::weighted(0.15, 8u64..=48),
        prop::option::weighted(
            0.3,
            prop::sample::select(vec![GpuPlacement::Binpack, GpuPlacement::Spread]),
        ),
        prop::sample::select(vec![
            TopologyPreference::Any,
            TopologyPreference::Preferred,
            TopologyPreference::Required,
        ]),
    )
        .prop_map(
            |(cpu, mem_mib, apps, inits, include, exclude, min_mem_gib, placement, topology)| {
                PodDesc {
                    cpu,
                    mem_mib,
                    apps,
                    inits,
                    include,
                    exclude,
                    min_mem_gib,
                    placement,
                    topology,
                }
            },
        )
}

fn after() -> impl Strategy<Value = After> {
    prop_oneof![
        3 => (1u64..=2_000).prop_map(|ttl_ms| After::Reserve { ttl_ms }),
        3 => Just(After::Bind),
        1 => Just(After::Undo),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let scoring = prop::sample::select(vec![
        ScoringPolicy::Binpack,
        ScoringPolicy::Spread,
        ScoringPolicy::Fgd,
        ScoringPolicy::FgdPlus,
    ]);
    prop_oneof![
        12 => (0usize..8, pod_desc(), scoring, after()).prop_map(
            |(node, pod, scoring, after)| Op::Place { node, pod, scoring, after }
        ),
        2 => (0usize..8).prop_map(Op::Confirm),
        2 => (0usize..8).prop_map(Op::Gone),
        1 => (0usize..8).prop_map(Op::Release),
        2 => (
            0usize..8,
            1usize..=8,
            prop::collection::vec(gpu_desc(), 8),
            prop::collection::vec(prop::bool::weighted(0.1), 8),
            prop::option::weighted(0.3, prop::sample::select(MODES.to_vec())),
            prop::sample::select(vec![GpuPlacement::Binpack, GpuPlacement::Spread]),
            links_desc(),
            0u64..=8_000,
        )
            .prop_map(|(node, gpus, added, sick, mode, placement, links, more_cpu)| Op::Resize {
                node,
                gpus,
                added,
                sick,
                mode,
                placement,
                links,
                more_cpu,
            }),
        1 => (0usize..8).prop_map(Op::Remove),
        2 => (1u64..=1_500).prop_map(Op::Expire),
        2 => (0usize..8, 1usize..=3, prop::bool::weighted(0.3))
            .prop_map(|(node, count, part)| Op::HoldIdle { node, count, part }),
        1 => (0usize..8).prop_map(Op::Unhold),
    ]
}

fn class_desc() -> impl Strategy<Value = ClassDesc> {
    (
        (0u64..=16).prop_map(|c| c * 1000),
        0u16..=4,
        1u32..=20,
        prop::option::weighted(0.3, 0..PATTERNS.len()),
        1u32..=100,
    )
        .prop_map(|(cpu, gpus, twentieths, model, weight)| ClassDesc {
            cpu,
            gpus,
            // CPU-only classes take no GPU; multi-GPU classes take whole GPUs, as in the trace.
            milli: match gpus {
                0 => 0,
                1 => twentieths * 50,
                _ => 1000,
            },
            model,
            weight,
        })
}

// ---------------------------------------------------------------------------------------------
// Building engine values from descriptions

fn link(code: u8) -> Link {
    match code {
        0..=3 => Link::NvLink(code + 1),
        4 => Link::SameSwitch,
        5 => Link::HostBridge,
        _ => Link::CrossSocket,
    }
}

fn link_matrix(desc: &LinksDesc, size: usize) -> LinkMatrix {
    match desc {
        LinksDesc::Uniform => LinkMatrix::uniform(size),
        LinksDesc::Islands(island) => LinkMatrix::from_fn(size, |a, b| {
            if a / island == b / island {
                Link::NvLink(2)
            } else {
                Link::CrossSocket
            }
        }),
        LinksDesc::Random(codes) => {
            LinkMatrix::from_fn(size, |a, b| link(codes[(a * 8 + b) % codes.len()]))
        }
    }
}

fn gpu(index: u16, desc: GpuDesc) -> Gpu {
    let (model, gib) = MODELS[desc.model];
    let mut gpu = Gpu::new(index, model, MemMiB(gib * 1024));
    gpu.healthy = desc.healthy;
    gpu
}

fn node_spec(index: usize, desc: &NodeDesc) -> NodeSpec {
    let gpus: Vec<Gpu> = desc
        .gpus
        .iter()
        .enumerate()
        .map(|(i, &d)| gpu(desc.indices.of(i), d))
        .collect();
    let links = link_matrix(&desc.links, gpus.len());
    NodeSpec::with_gpus(&format!("node-{index}"), desc.mode, gpus, links)
        .with_host(
            CpuMilli(desc.cpu),
            MemMiB(desc.mem_gib * 1024),
            desc.max_pods,
        )
        .with_placement(desc.placement)
}

fn demand(desc: DemandDesc, mode: GpuMode) -> GpuDemand {
    match desc {
        DemandDesc::Native {
            gpus,
            gib_per_gpu,
            percent,
        } => {
            let split = gpus.min(2);
            match mode {
                GpuMode::Exclusive => GpuDemand::whole(gpus).unwrap(),
                GpuMode::Topology => GpuDemand::topology(gpus).unwrap(),
                GpuMode::ShareMemory => GpuDemand::share(gib_per_gpu * split, split, None).unwrap(),
                GpuMode::CoreMem => {
                    GpuDemand::share(gib_per_gpu * split, split, Some(percent)).unwrap()
                }
            }
        }
        DemandDesc::None => GpuDemand::None,
        DemandDesc::Whole(n) => GpuDemand::whole(n).unwrap(),
        DemandDesc::Topology(n) => GpuDemand::topology(n).unwrap(),
        DemandDesc::Share {
            gib_per_gpu,
            gpus,
            percent,
        } => GpuDemand::share(gib_per_gpu * gpus, gpus, percent).unwrap(),
    }
}

fn pattern(index: usize) -> ModelPattern {
    ModelPattern::parse(PATTERNS[index]).unwrap()
}

/// The pod `desc` describes, as it would be asked of a node in `mode`.
fn pod_request(desc: &PodDesc, mode: GpuMode) -> PodRequest {
    let mut request = PodRequest::single(CpuMilli(desc.cpu), MemMiB(desc.mem_mib), GpuDemand::None);
    let containers = |list: &[DemandDesc], prefix: &str| {
        list.iter()
            .enumerate()
            .map(|(i, &d)| gpu_engine::ContainerRequest {
                name: format!("{prefix}{i}"),
                gpu: demand(d, mode),
            })
            .collect()
    };
    request.containers = containers(&desc.apps, "app");
    request.init_containers = containers(&desc.inits, "init");
    request.with_constraints(GpuConstraints {
        include_models: desc.include.iter().map(|&i| pattern(i)).collect(),
        exclude_models: desc.exclude.iter().map(|&i| pattern(i)).collect(),
        min_memory_per_gpu: desc.min_mem_gib.map(|g| MemMiB(g * 1024)),
        placement: desc.placement,
        topology: desc.topology,
    })
}

fn typical(classes: &[ClassDesc]) -> TypicalPods {
    TypicalPods::new(
        classes
            .iter()
            .map(|c| TypicalPod {
                cpu: CpuMilli(c.cpu),
                memory: MemMiB(0),
                gpus: c.gpus,
                milli: c.milli,
                models: c.model.map(pattern).into_iter().collect(),
                weight: f64::from(c.weight),
            })
            .collect(),
    )
}

// ---------------------------------------------------------------------------------------------
// Checks

/// Everything observable about a table, including what `PartialEq` leaves out (dangling grants,
/// and the holds when `holds` is set), in a deterministic order.
fn fingerprint(table: &Table, holds: bool) -> String {
    let nodes: BTreeMap<String, String> = table
        .nodes()
        .map(|n| {
            (
                n.spec.name.to_string(),
                format!(
                    "{:?} cpu={} mem={} pods={} dangling={}",
                    n.gpus, n.cpu_used.0, n.mem_used.0, n.pods, n.dangling_holds
                ),
            )
        })
        .collect();
    let pods: BTreeMap<String, String> = table
        .pods()
        .map(|(k, e)| {
            let hold = if holds {
                format!("{:?}", e.hold)
            } else {
                String::new()
            };
            (k.to_string(), format!("{hold} {:?}", e.allocation))
        })
        .collect();
    let externals: BTreeMap<String, String> = table
        .externals()
        .map(|(k, e)| (k.to_string(), format!("{e:?}")))
        .collect();
    format!("{nodes:#?}\n{pods:#?}\n{externals:#?}")
}

fn check_table(table: &Table) -> Result<(), TestCaseError> {
    if let Err(violations) = table.check_invariants() {
        return Err(TestCaseError::fail(format!(
            "invariants broken: {violations:#?}"
        )));
    }
    let mut rebuilt = Table::rebuild(
        table.max_shares_per_gpu(),
        table.nodes().map(|n| n.spec.clone()),
        table.pods().map(|(k, e)| (k.clone(), e.allocation.clone())),
    );
    for (holder, entry) in table.externals() {
        rebuilt.apply(Change::HoldExternal {
            holder: holder.clone(),
            node: entry.node.clone(),
            holds: entry.holds.clone(),
            mig: entry.mig.clone(),
        });
    }
    prop_assert!(
        rebuilt == *table,
        "rebuild differs from the incremental table"
    );
    Ok(())
}

/// The placement gives each container what it asked for, on GPUs the pod may use.
fn check_placement(
    node: &NodeState,
    request: &PodRequest,
    allocation: &PodAllocation,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(&allocation.node, &node.spec.name);
    prop_assert_eq!(allocation.containers.len(), request.containers.len());
    prop_assert_eq!(
        allocation.init_containers.len(),
        request.init_containers.len()
    );
    let pairs = request.containers.iter().zip(&allocation.containers).chain(
        request
            .init_containers
            .iter()
            .zip(&allocation.init_containers),
    );
    for (asked, got) in pairs {
        prop_assert_eq!(&asked.name, &got.name);
        prop_assert_eq!(got.gpus.len(), usize::from(asked.gpu.gpu_count()));
        let mut seen = 0u64;
        for grant in &got.gpus {
            let position = node.spec.position_of(grant.gpu);
            prop_assert!(position.is_some(), "grant on a GPU the node lacks");
            let position = position.unwrap_or_default();
            prop_assert!(
                seen & (1 << position) == 0,
                "GPU given twice to one container"
            );
            seen |= 1 << position;
            let gpu = &node.spec.gpus[position];
            prop_assert!(gpu.healthy, "unhealthy GPU {} chosen", position);
            prop_assert!(
                request
                    .constraints
                    .accepts_model(&node.normalized_models[position]),
                "GPU model {} excluded by the request",
                gpu.model
            );
            prop_assert!(request.constraints.accepts_memory(gpu.memory));
            let expected = match asked.gpu {
                GpuDemand::Whole { .. } | GpuDemand::Topology { .. } => Grant::Whole,
                GpuDemand::Share {
                    mem_per_gpu,
                    compute_per_gpu,
                    ..
                } => Grant::Share {
                    mem: mem_per_gpu,
                    compute: compute_per_gpu,
                },
                GpuDemand::None => unreachable!("no grants for no demand"),
            };
            prop_assert_eq!(grant.grant, expected);
        }
    }
    Ok(())
}

/// Evaluates `request` on table node `name` under all four scoring policies and checks each
/// outcome; returns the allocation for `scoring`, if any.
fn evaluate_all(
    table: &mut Table,
    name: &NodeName,
    request: &PodRequest,
    policies: &[Policy; 4],
    scoring: ScoringPolicy,
) -> Result<Option<PodAllocation>, TestCaseError> {
    let mut kept = None;
    for policy in policies {
        let node = table.node(name).unwrap().clone();
        let outcome = policy.evaluate(&node, request);
        let fitted = fit(&node, request, policy);
        if outcome.as_ref().err() == Some(&RejectReason::HostHeldForGpus) {
            // The one refusal above the fit: FGD+ holding a GPU node's host for its GPUs,
            // only ever for a pod that asks for no GPU and fits.
            prop_assert_eq!(policy.scoring, ScoringPolicy::FgdPlus);
            prop_assert!(!request.wants_gpu() && fitted.is_ok());
        } else {
            prop_assert_eq!(
                outcome.as_ref().map(|e| &e.allocation),
                fitted.as_ref(),
                "evaluate and fit disagree"
            );
        }
        check_fast_path(policy, &node, request, &outcome)?;
        match outcome {
            Ok(evaluation) => {
                prop_assert!(
                    (0.0..=100.0).contains(&evaluation.score),
                    "{:?} score {} out of range",
                    policy.scoring,
                    evaluation.score
                );
                check_placement(&node, request, &evaluation.allocation)?;
                let expected = reference_score(policy, &node, request, &evaluation.allocation);
                prop_assert!(
                    evaluation.score.to_bits() == expected.to_bits(),
                    "{:?} score {} differs from the reference {}",
                    policy.scoring,
                    evaluation.score,
                    expected
                );
                let before = fingerprint(table, true);
                let probe = PodKey::new("probe", "probe");
                let reserved = table.reserve(probe.clone(), evaluation.allocation.clone(), 0);
                prop_assert!(
                    reserved.is_ok(),
                    "{:?}: fit said yes but reserve refused: {:?}",
                    policy.scoring,
                    reserved
                );
                check_table(table)?;
                prop_assert_eq!(table.release(&probe), Some(evaluation.allocation.clone()));
                prop_assert_eq!(
                    fingerprint(table, true),
                    before,
                    "release did not undo the reservation exactly"
                );
                if policy.scoring == scoring {
                    kept = Some(evaluation.allocation);
                }
            }
            Err(reason) => check_rejection(&node, request, policy, reason)?,
        }
    }
    Ok(kept)
}

/// The score-only path that filter and prioritize use must give exactly the verdict and score
/// of the full evaluation (placement built, then scored): the same reason on rejection, the
/// same bits on success.
fn check_fast_path(
    policy: &Policy,
    node: &NodeState,
    request: &PodRequest,
    full: &Result<Evaluation, RejectReason>,
) -> Result<(), TestCaseError> {
    let fast = policy.evaluate_score(node, request);
    prop_assert_eq!(
        fast.map(f64::to_bits),
        full.as_ref()
            .map(|e| e.score.to_bits())
            .map_err(|reason| *reason),
        "{:?}: evaluate_score {:?} differs from evaluate {:?}",
        policy.scoring,
        fast,
        full.as_ref().map(|e| e.score)
    );
    Ok(())
}

/// The score as its definition reads, from the public building blocks and full recomputation:
/// the engine's fast path must agree bit for bit.
fn reference_score(
    policy: &Policy,
    node: &NodeState,
    request: &PodRequest,
    allocation: &PodAllocation,
) -> f64 {
    use gpu_engine::policy::{binpack, fgd, free_milli, spread, topology, usage_after};
    let after = free_milli(node, &usage_after(node, allocation));
    let base = match policy.scoring {
        ScoringPolicy::Binpack => binpack::score(node, allocation, &after),
        ScoringPolicy::Spread => spread::score(node, allocation, &after),
        ScoringPolicy::Fgd => {
            let before = free_milli(node, &node.gpus);
            let access = policy.typical.access_masks(node);
            let cpu_after = CpuMilli(node.cpu_free().0.saturating_sub(allocation.cpu.0));
            let reduction = policy
                .typical
                .fragmentation(node.cpu_free(), &before, &access)
                - policy.typical.fragmentation(cpu_after, &after, &access);
            if policy.fgd_truncate {
                fgd::reference_score(reduction)
            } else {
                fgd::score_from_reduction(reduction)
            }
        }
        ScoringPolicy::FgdPlus => {
            let before = free_milli(node, &node.gpus);
            gpu_engine::policy::fgd_plus::score(
                &policy.typical,
                &policy.fgd_plus,
                node,
                allocation,
                &before,
                &after,
            )
        }
    };
    let quality = topology::quality(node, allocation);
    let score = (base * quality).clamp(0.0, 100.0);
    // `topology: preferred` ranks best-connected placements above all others.
    if request.constraints.topology == TopologyPreference::Preferred {
        topology::preferred_score(score, quality)
    } else {
        score
    }
}

/// A reason that says "never" must hold on the same node with nothing on it; a reason that says
/// "not now" must not hold there.
fn check_rejection(
    node: &NodeState,
    request: &PodRequest,
    policy: &Policy,
    reason: RejectReason,
) -> Result<(), TestCaseError> {
    let empty = NodeState::new(node.spec.clone());
    let on_empty = fit(&empty, request, policy);
    if reason.is_resolvable() {
        prop_assert!(
            on_empty.is_ok(),
            "{:?} claims waiting helps, but the empty node rejects with {:?}",
            reason,
            on_empty
        );
    } else {
        prop_assert_eq!(
            on_empty.err(),
            Some(reason),
            "{:?} is not permanent",
            reason
        );
    }
    Ok(())
}

/// What a DRA driver would allocate on `node`: up to `count` idle healthy GPUs whole, or with
/// `part` a quarter of the first idle healthy GPU's memory.
fn idle_holds(table: &Table, node: &NodeName, count: usize, part: bool) -> Vec<GpuHold> {
    let Some(state) = table.node(node) else {
        return Vec::new();
    };
    let idle = state
        .spec
        .gpus
        .iter()
        .zip(state.gpus.iter())
        .filter(|(gpu, usage)| gpu.healthy && usage.is_idle())
        .map(|(gpu, _)| gpu);
    if part {
        return idle
            .take(1)
            .map(|gpu| GpuHold {
                gpu: gpu.index,
                whole: false,
                mem: MemMiB(gpu.memory.0 / 4),
                compute: ComputeMilli(250),
            })
            .collect();
    }
    idle.take(count)
        .map(|gpu| GpuHold {
            gpu: GpuIndex(gpu.index.0),
            whole: true,
            mem: MemMiB(0),
            compute: ComputeMilli(1000),
        })
        .collect()
}

/// Live pods, in a stable order, so that an operation's index picks a pod deterministically.
fn live_pods(table: &Table) -> Vec<PodKey> {
    let mut pods: Vec<PodKey> = table.pods().map(|(k, _)| k.clone()).collect();
    pods.sort();
    pods
}

/// A resized spec that still holds everything its pods hold: GPUs are only removed from the
/// end when nothing holds them, existing GPUs keep their model and memory.
fn resized(
    table: &Table,
    old: &NodeSpec,
    op_gpus: usize,
    added: &[GpuDesc],
    sick: &[bool],
    indices: Indices,
) -> Vec<Gpu> {
    let name = &old.name;
    let highest_held = table
        .pods_on(name)
        .flat_map(|(_, e)| e.allocation.footprint())
        .chain(table.externals_on(name).flat_map(|(_, e)| e.holds.clone()))
        .filter_map(|hold| old.position_of(hold.gpu))
        .map(|position| position + 1)
        .max()
        .unwrap_or(0);
    let count = op_gpus.max(highest_held).max(1);
    (0..count)
        .map(|i| match old.gpus.get(i) {
            Some(existing) => {
                let mut gpu = existing.clone();
                gpu.healthy = !sick[i % sick.len()];
                gpu
            }
            None => gpu(indices.of(i), added[i % added.len()]),
        })
        .collect()
}

/// Binpack, Spread, Fgd and FgdPlus with the same limits and typical pods.
fn policies(classes: &[ClassDesc], max_shares: u16, truncate: bool) -> [Policy; 4] {
    [
        ScoringPolicy::Binpack,
        ScoringPolicy::Spread,
        ScoringPolicy::Fgd,
        ScoringPolicy::FgdPlus,
    ]
    .map(|scoring| Policy {
        scoring,
        max_shares_per_gpu: max_shares,
        typical: typical(classes),
        fgd_truncate: truncate,
        ..Policy::default()
    })
}

fn run(
    nodes: &[NodeDesc],
    classes: &[ClassDesc],
    max_shares: u16,
    truncate: bool,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let policies = policies(classes, max_shares, truncate);
    let mut specs: Vec<NodeSpec> = nodes
        .iter()
        .enumerate()
        .map(|(i, d)| node_spec(i, d))
        .collect();
    let mut present = vec![true; specs.len()];
    let mut table = Table::rebuild(max_shares, specs.clone(), []);
    let mut now = 0u64;
    let mut next_pod = 0usize;
    let mut next_holder = 0usize;
    check_table(&table)?;
    for op in ops {
        let live = live_pods(&table);
        let pick = |i: usize| live.get(i % live.len().max(1)).cloned();
        match op {
            Op::Place {
                node,
                pod,
                scoring,
                after,
            } => {
                let index = node % specs.len();
                if !present[index] {
                    continue;
                }
                let name = specs[index].name.clone();
                let request = pod_request(pod, specs[index].mode);
                let kept = evaluate_all(&mut table, &name, &request, &policies, *scoring)?;
                let Some(allocation) = kept else { continue };
                next_pod += 1;
                let key = PodKey::new("p", &next_pod.to_string());
                match after {
                    After::Reserve { ttl_ms } => {
                        let reserved = table.reserve(key, allocation, now + ttl_ms);
                        prop_assert!(reserved.is_ok(), "reserve refused: {:?}", reserved);
                    }
                    After::Bind => table.apply(Change::PodBound {
                        pod: key,
                        allocation,
                    }),
                    After::Undo => {}
                }
            }
            Op::Confirm(i) => {
                if let Some(pod) = pick(*i) {
                    let allocation = table.pod(&pod).unwrap().allocation.clone();
                    let before = fingerprint(&table, false);
                    table.apply(Change::PodBound {
                        pod: pod.clone(),
                        allocation,
                    });
                    prop_assert_eq!(table.pod(&pod).unwrap().hold, Hold::Bound);
                    // Confirming changes the hold only, never the usage.
                    prop_assert_eq!(fingerprint(&table, false), before);
                }
            }
            Op::Gone(i) => {
                if let Some(pod) = pick(*i) {
                    table.apply(Change::PodGone(pod.clone()));
                    prop_assert!(table.pod(&pod).is_none());
                }
            }
            Op::Release(i) => {
                if let Some(pod) = pick(*i) {
                    let held = table.pod(&pod).unwrap().allocation.clone();
                    prop_assert_eq!(table.release(&pod), Some(held));
                }
            }
            Op::Resize {
                node,
                gpus,
                added,
                sick,
                mode,
                placement,
                links,
                more_cpu,
            } => {
                let index = node % specs.len();
                let old = &specs[index];
                let new_gpus = resized(&table, old, *gpus, added, sick, nodes[index].indices);
                let matrix = link_matrix(links, new_gpus.len());
                let spec = NodeSpec::with_gpus(
                    old.name.as_str(),
                    mode.unwrap_or(old.mode),
                    new_gpus,
                    matrix,
                )
                .with_host(CpuMilli(old.cpu.0 + more_cpu), old.memory, old.max_pods)
                .with_placement(*placement);
                specs[index] = spec.clone();
                present[index] = true;
                table.apply(Change::UpsertNode(spec));
            }
            Op::Remove(node) => {
                let index = node % specs.len();
                present[index] = false;
                table.apply(Change::RemoveNode(specs[index].name.clone()));
                prop_assert!(table.node(&specs[index].name).is_none());
            }
            Op::Expire(step) => {
                now += step;
                let mut due: Vec<PodKey> = table
                    .pods()
                    .filter(|(_, e)| {
                        matches!(e.hold, Hold::Reserved { expires_at_ms } if expires_at_ms <= now)
                    })
                    .map(|(k, _)| k.clone())
                    .collect();
                due.sort();
                let mut expired = table.expire_reservations(now);
                expired.sort();
                prop_assert_eq!(expired, due);
            }
            Op::HoldIdle { node, count, part } => {
                let index = node % specs.len();
                if !present[index] {
                    continue;
                }
                let holds = idle_holds(&table, &specs[index].name, *count, *part);
                if holds.is_empty() {
                    continue;
                }
                next_holder += 1;
                let holder = HolderKey::new(format!("dra:c/{next_holder}"));
                let hold = Change::HoldExternal {
                    holder: holder.clone(),
                    node: specs[index].name.clone(),
                    holds,
                    mig: Vec::new(),
                };
                let before = fingerprint(&table, true);
                table.apply(hold.clone());
                check_table(&table)?;
                table.apply(Change::ReleaseExternal(holder));
                prop_assert_eq!(fingerprint(&table, true), before);
                table.apply(hold);
            }
            Op::Unhold(i) => {
                let mut holders: Vec<HolderKey> =
                    table.externals().map(|(k, _)| k.clone()).collect();
                holders.sort();
                if let Some(holder) = holders.get(i % holders.len().max(1)) {
                    table.apply(Change::ReleaseExternal(holder.clone()));
                    prop_assert!(table.external(holder).is_none());
                }
            }
        }
        check_table(&table)?;
    }
    Ok(())
}

/// Places pods of `request` one after another the way the extender does (filter over every
/// node with the policy's choice, bind's placement on the chosen node, reserved in the table)
/// until none fits or `cap` are placed; how many were placed.
fn place_one_after_another(
    table: &mut Table,
    request: &PodRequest,
    policy: &Policy,
    cap: usize,
) -> usize {
    for placed in 0..cap {
        let names: Vec<String> = table.nodes().map(|n| n.spec.name.to_string()).collect();
        let verdict = gpu_extender::state::decide::filter(
            names
                .iter()
                .map(|name| (name.as_str(), table.node_by_str(name))),
            request,
            policy,
        );
        let Some(&chosen) = verdict.passed.first() else {
            return placed;
        };
        let node = table.node_by_str(&names[chosen]).unwrap();
        let allocation = policy.evaluate(node, request).unwrap().allocation;
        table
            .reserve(
                PodKey::new("estimate", &placed.to_string()),
                allocation,
                u64::MAX,
            )
            .unwrap();
    }
    cap
}

/// An estimate ([`max_replicas`]) equals what the extender places when the pods arrive one
/// after another, on any nodes (some of the same shape, so that shapes counted once are
/// checked too), any pods already there, under every policy; and a limit caps it.
fn check_estimate(
    nodes: &[NodeDesc],
    twins: &[usize],
    classes: &[ClassDesc],
    max_shares: u16,
    earlier: &[(usize, PodDesc)],
    pod: &PodDesc,
    limit: u64,
) -> Result<(), TestCaseError> {
    let mut descs: Vec<&NodeDesc> = nodes.iter().collect();
    descs.extend(twins.iter().map(|&t| &nodes[t % nodes.len()]));
    let specs = descs.iter().enumerate().map(|(i, d)| node_spec(i, d));
    for (p, policy) in policies(classes, max_shares, false).into_iter().enumerate() {
        let policy = Policy {
            filter_best_only: true,
            ..policy
        };
        let mut table = Table::rebuild(max_shares, specs.clone(), []);
        for (i, (node, desc)) in earlier.iter().enumerate() {
            let name = format!("node-{}", node % descs.len());
            let state = table.node_by_str(&name).unwrap();
            if let Ok(allocation) = fit(state, &pod_request(desc, state.spec.mode), &policy) {
                table
                    .reserve(
                        PodKey::new("earlier", &format!("{p}-{i}")),
                        allocation,
                        u64::MAX,
                    )
                    .unwrap();
            }
        }
        let request = pod_request(pod, descs[0].mode);
        let estimate = max_replicas(table.nodes(), &request, &policy, u64::MAX);
        let capped = max_replicas(table.nodes(), &request, &policy, limit);
        let placed = place_one_after_another(&mut table, &request, &policy, 5_000) as u64;
        prop_assert_eq!(estimate, placed, "policy {:?}", policy.scoring);
        prop_assert_eq!(capped, placed.min(limit));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 128,
        max_shrink_iters: 2048,
        ..ProptestConfig::default()
    })]

    #[test]
    fn an_estimate_equals_the_pods_placed_one_after_another(
        nodes in prop::collection::vec(node_desc(), 1..=4),
        twins in prop::collection::vec(0usize..4, 0..=3),
        classes in prop::collection::vec(class_desc(), 1..=6),
        max_shares in 1u16..=4,
        earlier in prop::collection::vec((0usize..8, pod_desc()), 0..=6),
        pod in pod_desc(),
        limit in 1u64..=40,
    ) {
        check_estimate(&nodes, &twins, &classes, max_shares, &earlier, &pod, limit)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        max_shrink_iters: 4096,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_histories_keep_the_engine_consistent(
        nodes in prop::collection::vec(node_desc(), 1..=5),
        classes in prop::collection::vec(class_desc(), 1..=6),
        max_shares in 1u16..=4,
        truncate in any::<bool>(),
        ops in prop::collection::vec(op(), 1..=30),
    ) {
        run(&nodes, &classes, max_shares, truncate, &ops)?;
    }

    /// A node reads its GPUs' free parts through divisors prepared from their memory (a
    /// multiplication instead of a division): for any memory, from none to far past any GPU,
    /// uniform across the node or not, and any usage, the free part is the one
    /// `state::gpu_free_milli` computes by dividing.
    #[test]
    fn prepared_divisors_give_the_free_part_that_division_gives(
        gpus in prop::collection::vec(
            (
                prop_oneof![
                    Just(0u64),
                    1u64..=64,
                    1u64..=200_000,
                    (1u64 << 27) - 2..=(1u64 << 27) + 2,
                    any::<u64>(),
                ],
                any::<bool>(),
                prop_oneof![0u64..=200_000, any::<u64>()],
                0u32..=1200,
                0u16..=2,
            ),
            1..=10,
        ),
        uniform in any::<bool>(),
    ) {
        let first_memory = gpus[0].0;
        let specs: Vec<Gpu> = gpus
            .iter()
            .enumerate()
            .map(|(index, &(memory, healthy, ..))| {
                let memory = if uniform { first_memory } else { memory };
                let mut gpu = Gpu::new(index as u16, "A10", MemMiB(memory));
                gpu.healthy = healthy;
                gpu
            })
            .collect();
        let spec = NodeSpec::with_gpus(
            "n",
            GpuMode::ShareMemory,
            specs.clone(),
            LinkMatrix::uniform(specs.len()),
        );
        let mut state = NodeState::new(spec);
        for (position, &(_, _, mem, compute, whole_pods)) in gpus.iter().enumerate() {
            state.gpus[position] = GpuUsage {
                mem: MemMiB(mem),
                compute: ComputeMilli(compute),
                shares: 1,
                whole_pods,
            };
        }
        for (position, gpu) in specs.iter().enumerate() {
            prop_assert_eq!(
                state.gpu_free_milli(position),
                gpu_engine::state::gpu_free_milli(gpu, &state.gpus[position]),
                "{:?} {:?}", gpu, state.gpus[position]
            );
        }
    }

    /// Filter and prioritize judge every candidate through `evaluate_score`, bind through `fit`:
    /// on busy nodes (filled by the engine itself with random pods) and random requests, under
    /// every policy, the two paths agree on every verdict and every score bit.
    #[test]
    fn the_score_only_path_decides_exactly_as_the_full_evaluation(
        node in node_desc(),
        fill in prop::collection::vec((pod_desc(), 0usize..4), 0..=24),
        probes in prop::collection::vec(pod_desc(), 1..=12),
        classes in prop::collection::vec(class_desc(), 1..=6),
        max_shares in 1u16..=4,
        truncate in any::<bool>(),
    ) {
        let policies = policies(&classes, max_shares, truncate);
        let spec = node_spec(0, &node);
        let mut state = NodeState::new(spec.clone());
        for (pod, policy) in &fill {
            if let Ok(allocation) = fit(&state, &pod_request(pod, spec.mode), &policies[*policy]) {
                state.add(&allocation);
            }
        }
        for probe in &probes {
            let request = pod_request(probe, spec.mode);
            for policy in &policies {
                check_fast_path(policy, &state, &request, &policy.evaluate(&state, &request))?;
            }
        }
    }

    /// Filter and prioritize score their candidates through `AlikeScores`, which places once
    /// for each set of nodes placement cannot tell apart. Nodes of one or two specs under their
    /// own names, each filled by a part of one random pod sequence (so that some are alike and
    /// some are not): every verdict and score bit is the node's own `evaluate_score`.
    #[test]
    fn alike_nodes_share_one_placement_and_answer_as_each_alone(
        kinds in prop::collection::vec(node_desc(), 1..=2),
        nodes in prop::collection::vec((0usize..2, 0usize..=3), 2..=10),
        fill in prop::collection::vec((pod_desc(), 0usize..4), 0..=12),
        probes in prop::collection::vec(pod_desc(), 1..=6),
        classes in prop::collection::vec(class_desc(), 1..=6),
        max_shares in 1u16..=4,
        truncate in any::<bool>(),
    ) {
        let policies = policies(&classes, max_shares, truncate);
        let states: Vec<NodeState> = nodes
            .iter()
            .enumerate()
            .map(|(index, &(kind, thirds))| {
                let desc = &kinds[kind % kinds.len()];
                let mut state = NodeState::new(node_spec(index, desc));
                for (pod, policy) in fill.iter().take(fill.len() * thirds / 3) {
                    let request = pod_request(pod, desc.mode);
                    if let Ok(allocation) = fit(&state, &request, &policies[*policy]) {
                        state.add(&allocation);
                    }
                }
                state
            })
            .collect();
        for probe in &probes {
            let request = pod_request(probe, kinds[0].mode);
            for policy in &policies {
                let mut alike = AlikeScores::new(policy, &request, states.len());
                for state in &states {
                    prop_assert_eq!(
                        alike.score(state).map(f64::to_bits),
                        policy.evaluate_score(state, &request).map(f64::to_bits),
                        "{:?} on {}", policy.scoring, state.spec.name
                    );
                }
            }
        }
    }

    /// Nodes of up to 8 GPUs answer topology questions from tables built with their index; the
    /// search those tables replace still answers larger nodes. A node with the searching index
    /// and the same node with the tabulated one, filled by the same random pods, make the same
    /// decisions throughout: every placement, score bit and rejection, under every policy.
    #[test]
    fn tabulated_topology_decides_exactly_as_the_search(
        node in node_desc(),
        fill in prop::collection::vec((pod_desc(), 0usize..4), 0..=24),
        probes in prop::collection::vec(pod_desc(), 1..=12),
        classes in prop::collection::vec(class_desc(), 1..=6),
        max_shares in 1u16..=4,
        truncate in any::<bool>(),
    ) {
        let policies = policies(&classes, max_shares, truncate);
        let tabulated = node_spec(0, &node);
        let mut searching = tabulated.clone();
        searching.topology = Arc::new(TopologyIndex::build_searching(&searching.links));
        prop_assert!(!searching.topology.is_tabulated());
        let mut fast = NodeState::new(tabulated.clone());
        let mut slow = NodeState::new(searching);
        for (pod, policy) in &fill {
            let request = pod_request(pod, tabulated.mode);
            let placed = fit(&fast, &request, &policies[*policy]);
            prop_assert_eq!(&placed, &fit(&slow, &request, &policies[*policy]));
            if let Ok(allocation) = placed {
                fast.add(&allocation);
                slow.add(&allocation);
            }
        }
        for probe in &probes {
            let request = pod_request(probe, tabulated.mode);
            for policy in &policies {
                prop_assert_eq!(policy.evaluate(&fast, &request), policy.evaluate(&slow, &request));
                let (a, b) = (
                    policy.evaluate_score(&fast, &request),
                    policy.evaluate_score(&slow, &request),
                );
                prop_assert_eq!(a.map(f64::to_bits), b.map(f64::to_bits));
            }
        }
    }
}
