//! Table-driven tests of `fit` and the policies: every GPU mode, every kind of request, and every
//! rejection reason with whether waiting could resolve it. Each row is a node in a known state, a
//! pod, and what the engine must decide.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a panic is a test failure with its location"
)]

mod common;

use std::collections::BTreeSet;

use common::{
    Held, app_gpus, container, gib, hetero, mig_node, mig_pod, occupied, pod, share, topo,
    two_islands, unhealthy, uniform, whole,
};
use gpu_engine::{
    ComputeMilli, CpuMilli, GpuConstraints, GpuDemand, GpuMode, GpuPlacement, Grant, MemMiB,
    ModelPattern, NodeState, PodAllocation, PodRequest, Policy, RejectReason, RequestError,
    ScoringPolicy, TopologyPreference, TypicalPod, TypicalPods, fit,
};

/// What the engine must decide for one row.
enum Expect {
    /// Fits, with these GPU indices per app container.
    Gpus(Vec<Vec<u16>>),
    /// Fits, with any one of these GPU assignments (the rule allows ties).
    OneOf(Vec<Vec<Vec<u16>>>),
    /// Fits, and the placement satisfies a property described in words.
    Holds(&'static str, fn(&PodAllocation) -> bool),
    /// Does not fit, for this reason, which waiting can (true) or cannot (false) resolve.
    Reject(RejectReason, bool),
}

struct Case {
    name: &'static str,
    node: NodeState,
    pod: PodRequest,
    policy: Policy,
    expect: Expect,
}

fn case(name: &'static str, node: NodeState, pod: PodRequest, expect: Expect) -> Case {
    Case {
        name,
        node,
        pod,
        policy: Policy::default(),
        expect,
    }
}

fn gpus(list: &[&[u16]]) -> Expect {
    Expect::Gpus(list.iter().map(|c| c.to_vec()).collect())
}

fn one_of(options: &[&[u16]]) -> Expect {
    Expect::OneOf(options.iter().map(|gpus| vec![gpus.to_vec()]).collect())
}

fn reject(reason: RejectReason, resolvable: bool) -> Expect {
    Expect::Reject(reason, resolvable)
}

fn empty(spec: gpu_engine::NodeSpec) -> NodeState {
    NodeState::new(spec)
}

fn constrained(request: PodRequest, constraints: GpuConstraints) -> PodRequest {
    request.with_constraints(constraints)
}

fn models(include: &[&str], exclude: &[&str]) -> GpuConstraints {
    GpuConstraints {
        include_models: include
            .iter()
            .map(|p| ModelPattern::parse(p).unwrap())
            .collect(),
        exclude_models: exclude
            .iter()
            .map(|p| ModelPattern::parse(p).unwrap())
            .collect(),
        ..GpuConstraints::default()
    }
}

fn min_memory(gib_per_gpu: u64) -> GpuConstraints {
    GpuConstraints {
        min_memory_per_gpu: Some(gib(gib_per_gpu)),
        ..GpuConstraints::default()
    }
}

fn placement(placement: GpuPlacement) -> GpuConstraints {
    GpuConstraints {
        placement: Some(placement),
        ..GpuConstraints::default()
    }
}

fn topology(preference: TopologyPreference) -> GpuConstraints {
    GpuConstraints {
        topology: preference,
        ..GpuConstraints::default()
    }
}

fn host_pod(cpu: u64, memory: u64, demand: GpuDemand) -> PodRequest {
    PodRequest::single(CpuMilli(cpu), MemMiB(memory), demand)
}

/// A pod with app containers and init containers, each a GPU demand.
fn with_inits(apps: &[GpuDemand], inits: &[GpuDemand]) -> PodRequest {
    let mut request = pod(GpuDemand::None);
    request.containers = apps
        .iter()
        .enumerate()
        .map(|(i, &d)| container(&format!("app{i}"), d))
        .collect();
    request.init_containers = inits
        .iter()
        .enumerate()
        .map(|(i, &d)| container(&format!("init{i}"), d))
        .collect();
    request
}

fn share_demand(total_gib: u64, gpus: u64, percent: Option<u32>) -> GpuDemand {
    GpuDemand::share(total_gib, gpus, percent).unwrap()
}

/// One class of typical pod: `milli` on one GPU, no CPU to speak of.
fn one_class(milli: u32) -> TypicalPods {
    TypicalPods::new(vec![TypicalPod {
        cpu: CpuMilli(0),
        memory: MemMiB(0),
        gpus: 1,
        milli,
        models: Vec::new(),
        weight: 1.0,
    }])
}

fn footprint_gib(allocation: &PodAllocation, gpu: u16) -> Option<u64> {
    allocation
        .footprint()
        .iter()
        .find(|hold| hold.gpu.0 == gpu)
        .map(|hold| hold.mem.0 / 1024)
}

fn cases() -> Vec<Case> {
    use GpuMode::{CoreMem, Exclusive, ShareMemory, Topology};
    use RejectReason::*;
    let islands = || uniform(Topology, 8, "A100-SXM4-80GB", 80).with_links(two_islands());
    let mixed = || {
        hetero(
            Exclusive,
            &[("A10", 24), ("A100-SXM4-80GB", 80), ("Tesla-T4", 16)],
        )
    };
    // Three 16 GiB GPUs holding 8, 4 and nothing: binpack wants GPU 0, spread GPU 2.
    let filling = |spec| occupied(spec, &[Held::Share(0, 8, 0), Held::Share(1, 4, 0)]);
    vec![
        // --- Exclusive: whole GPUs.
        case(
            "exclusive: whole GPUs come from the lowest free positions",
            empty(uniform(Exclusive, 4, "Tesla-T4", 16)),
            whole(2),
            gpus(&[&[0, 1]]),
        ),
        case(
            "exclusive: GPUs held whole by others are skipped",
            occupied(
                uniform(Exclusive, 4, "Tesla-T4", 16),
                &[Held::Whole(&[0, 2])],
            ),
            whole(2),
            gpus(&[&[1, 3]]),
        ),
        case(
            "exclusive: a pod without GPUs fits a node without GPUs",
            empty(uniform(Exclusive, 0, "none", 0)),
            pod(GpuDemand::None),
            gpus(&[&[]]),
        ),
        case(
            "exclusive: a GPU pod never fits a node without GPUs",
            empty(uniform(Exclusive, 0, "none", 0)),
            whole(1),
            reject(NoGpus, false),
        ),
        case(
            "exclusive: memory shares are not served",
            empty(uniform(Exclusive, 4, "Tesla-T4", 16)),
            share(4, 1, None),
            reject(ModeMismatch, false),
        ),
        case(
            "exclusive: topology requests are not served",
            empty(uniform(Exclusive, 4, "Tesla-T4", 16)),
            topo(2),
            reject(ModeMismatch, false),
        ),
        case(
            "exclusive: more GPUs than the node has",
            empty(uniform(Exclusive, 4, "Tesla-T4", 16)),
            whole(8),
            reject(TooFewGpus, false),
        ),
        case(
            "exclusive: all but one GPU held",
            occupied(
                uniform(Exclusive, 4, "Tesla-T4", 16),
                &[Held::Whole(&[0, 1, 2])],
            ),
            whole(2),
            reject(NoFreeWholeGpus, true),
        ),
        // --- ShareMemory: memory shares on one or several GPUs.
        case(
            "share: binpack puts a share on the fullest GPU that fits",
            filling(uniform(ShareMemory, 3, "Tesla-T4", 16)),
            share(6, 1, None),
            gpus(&[&[0]]),
        ),
        case(
            "share: binpack skips a GPU too full for the share",
            filling(uniform(ShareMemory, 3, "Tesla-T4", 16)),
            share(10, 1, None),
            gpus(&[&[1]]),
        ),
        case(
            "share: a spread node puts a share on the emptiest GPU",
            filling(uniform(ShareMemory, 3, "Tesla-T4", 16).with_placement(GpuPlacement::Spread)),
            share(6, 1, None),
            gpus(&[&[2]]),
        ),
        case(
            "share: the pod's spread override beats the node's binpack",
            filling(uniform(ShareMemory, 3, "Tesla-T4", 16)),
            constrained(share(6, 1, None), placement(GpuPlacement::Spread)),
            gpus(&[&[2]]),
        ),
        case(
            "share: the pod's binpack override beats the node's spread",
            filling(uniform(ShareMemory, 3, "Tesla-T4", 16).with_placement(GpuPlacement::Spread)),
            constrained(share(6, 1, None), placement(GpuPlacement::Binpack)),
            gpus(&[&[0]]),
        ),
        case(
            "share: spread breaks equal free capacity by fewer pods",
            occupied(
                uniform(ShareMemory, 2, "Tesla-T4", 16).with_placement(GpuPlacement::Spread),
                &[
                    Held::Share(0, 2, 0),
                    Held::Share(0, 2, 0),
                    Held::Share(1, 4, 0),
                ],
            ),
            share(2, 1, None),
            gpus(&[&[1]]),
        ),
        case(
            "share: memory split over two GPUs takes two distinct GPUs",
            empty(uniform(ShareMemory, 4, "Tesla-T4", 16)),
            share(16, 2, None),
            gpus(&[&[0, 1]]),
        ),
        case(
            "share: a split needs its part free on every GPU",
            occupied(
                uniform(ShareMemory, 3, "Tesla-T4", 16),
                &[Held::Share(0, 10, 0), Held::Share(1, 10, 0)],
            ),
            share(16, 2, None),
            reject(InsufficientGpuMemory, true),
        ),
        case(
            "share: a split over more GPUs than the node has",
            empty(uniform(ShareMemory, 2, "Tesla-T4", 16)),
            share(8, 4, None),
            reject(TooFewGpus, false),
        ),
        case(
            "share: no single GPU has the memory free",
            occupied(
                uniform(ShareMemory, 2, "Tesla-T4", 16),
                &[Held::Share(0, 12, 0), Held::Share(1, 10, 0)],
            ),
            share(8, 1, None),
            reject(InsufficientGpuMemory, true),
        ),
        case(
            "share: larger than any GPU of the node",
            empty(uniform(ShareMemory, 4, "Tesla-T4", 16)),
            share(32, 1, None),
            reject(GpuMemoryTooSmall, false),
        ),
        case(
            "share: a memory-sharing node serves no compute percentage",
            empty(uniform(ShareMemory, 4, "Tesla-T4", 16)),
            share(4, 1, Some(30)),
            reject(ModeMismatch, false),
        ),
        case(
            "share: a whole GPU on a sharing node is an idle one, never a shared one",
            occupied(
                uniform(ShareMemory, 2, "Tesla-T4", 16),
                &[Held::Share(0, 2, 0)],
            ),
            whole(1),
            gpus(&[&[1]]),
        ),
        case(
            "share: a share never lands on a GPU held whole",
            occupied(
                uniform(ShareMemory, 2, "Tesla-T4", 16),
                &[Held::Whole(&[1])],
            ),
            share(2, 1, None),
            gpus(&[&[0]]),
        ),
        case(
            "share: a whole GPU is not free while any GPU holds a share",
            occupied(
                uniform(ShareMemory, 2, "Tesla-T4", 16),
                &[Held::Share(0, 1, 0), Held::Share(1, 1, 0)],
            ),
            whole(1),
            reject(NoFreeWholeGpus, true),
        ),
        Case {
            policy: Policy {
                max_shares_per_gpu: 2,
                ..Policy::default()
            },
            ..case(
                "share: a GPU at the per-GPU pod limit takes no more pods",
                occupied(
                    uniform(ShareMemory, 1, "Tesla-T4", 16),
                    &[Held::Share(0, 1, 0), Held::Share(0, 1, 0)],
                ),
                share(1, 1, None),
                reject(SharedGpuPodLimit, true),
            )
        },
        Case {
            policy: Policy {
                max_shares_per_gpu: 3,
                ..Policy::default()
            },
            ..case(
                "share: one pod's containers on one GPU count once towards the pod limit",
                occupied(
                    uniform(ShareMemory, 1, "Tesla-T4", 16),
                    &[Held::Share(0, 1, 0), Held::Share(0, 1, 0)],
                ),
                with_inits(&[share_demand(1, 1, None), share_demand(2, 1, None)], &[]),
                gpus(&[&[0], &[0]]),
            )
        },
        // --- CoreMem: memory and compute.
        case(
            "core_mem: a share goes where both memory and compute are free",
            occupied(uniform(CoreMem, 2, "A10", 24), &[Held::Share(0, 4, 80)]),
            share(4, 1, Some(30)),
            gpus(&[&[1]]),
        ),
        case(
            "core_mem: memory is free but compute is not",
            occupied(
                uniform(CoreMem, 2, "A10", 24),
                &[Held::Share(0, 4, 80), Held::Share(1, 4, 75)],
            ),
            share(4, 1, Some(30)),
            reject(InsufficientGpuCompute, true),
        ),
        case(
            "core_mem: the smallest percentage fills the last 5% of a GPU",
            occupied(uniform(CoreMem, 2, "A10", 24), &[Held::Share(0, 1, 95)]),
            share(1, 1, Some(5)),
            gpus(&[&[0]]),
        ),
        case(
            "core_mem: 100% needs an untouched GPU's compute",
            occupied(uniform(CoreMem, 2, "A10", 24), &[Held::Share(0, 1, 5)]),
            share(4, 1, Some(100)),
            gpus(&[&[1]]),
        ),
        case(
            "core_mem: a memory-only share is served too",
            occupied(uniform(CoreMem, 2, "A10", 24), &[Held::Share(1, 4, 50)]),
            share(4, 1, None),
            gpus(&[&[1]]),
        ),
        case(
            "core_mem: memory and compute split over two GPUs",
            empty(uniform(CoreMem, 4, "A10", 24)),
            share(8, 2, Some(25)),
            Expect::Holds("two distinct GPUs with 4 GiB and 25% each", |a| {
                let grants = &a.containers[0].gpus;
                grants.len() == 2
                    && grants[0].gpu != grants[1].gpu
                    && grants.iter().all(|g| {
                        g.grant
                            == Grant::Share {
                                mem: gib(4),
                                compute: ComputeMilli(250),
                            }
                    })
            }),
        ),
        // --- Topology: whole GPUs by interconnect.
        case(
            "topology: n GPUs on a uniformly connected node",
            empty(uniform(Topology, 4, "A100-SXM4-80GB", 80)),
            topo(2),
            gpus(&[&[0, 1]]),
        ),
        case(
            "topology: a 4-GPU pod gets one whole NVLink island",
            empty(islands()),
            topo(4),
            one_of(&[&[0, 1, 2, 3], &[4, 5, 6, 7]]),
        ),
        case(
            "topology: a 2-GPU pod does not break the only intact island",
            occupied(islands(), &[Held::Whole(&[1])]),
            topo(2),
            one_of(&[&[0, 2], &[0, 3], &[2, 3]]),
        ),
        case(
            "topology: a 1-GPU pod goes to the already broken island",
            occupied(islands(), &[Held::Whole(&[6])]),
            topo(1),
            one_of(&[&[4], &[5], &[7]]),
        ),
        case(
            "exclusive: whole GPUs follow NVLink islands too",
            occupied(
                uniform(Exclusive, 8, "A100-SXM4-80GB", 80).with_links(two_islands()),
                &[Held::Whole(&[5])],
            ),
            whole(2),
            one_of(&[&[4, 6], &[4, 7], &[6, 7]]),
        ),
        case(
            "topology: required connectivity rejects a node whose islands are both broken",
            occupied(islands(), &[Held::Whole(&[1]), Held::Whole(&[5])]),
            constrained(topo(4), topology(TopologyPreference::Required)),
            reject(NoConnectedGroup, true),
        ),
        case(
            "topology: preferred connectivity still places on a broken node",
            occupied(islands(), &[Held::Whole(&[1]), Held::Whole(&[5])]),
            constrained(topo(4), topology(TopologyPreference::Preferred)),
            Expect::Holds("four GPUs, three of them one island's free ones", |a| {
                let set: BTreeSet<u16> = a.containers[0].gpus.iter().map(|g| g.gpu.0).collect();
                set.len() == 4
                    && ([0, 2, 3].iter().all(|g| set.contains(g))
                        || [4, 6, 7].iter().all(|g| set.contains(g)))
            }),
        ),
        case(
            "topology: required connectivity is met by an intact island",
            occupied(islands(), &[Held::Whole(&[1])]),
            constrained(topo(4), topology(TopologyPreference::Required)),
            gpus(&[&[4, 5, 6, 7]]),
        ),
        // --- Card models and memory per GPU.
        case(
            "models: an include list picks the named model",
            empty(mixed()),
            constrained(whole(1), models(&["A100*"], &[])),
            gpus(&[&[1]]),
        ),
        case(
            "models: an exact name never matches a longer one (A10 is not A100)",
            empty(mixed()),
            constrained(whole(2), models(&[], &["A10"])),
            gpus(&[&[1, 2]]),
        ),
        case(
            "models: include and exclude together",
            empty(mixed()),
            constrained(whole(1), models(&["A1*"], &["A100*"])),
            gpus(&[&[0]]),
        ),
        case(
            "models: names compare case- and separator-insensitively",
            empty(mixed()),
            constrained(whole(1), models(&["tesla t4"], &[])),
            gpus(&[&[2]]),
        ),
        case(
            "models: no GPU of the included model",
            empty(mixed()),
            constrained(whole(1), models(&["H100*"], &[])),
            reject(ModelMismatch, false),
        ),
        case(
            "models: every model excluded",
            empty(mixed()),
            constrained(whole(1), models(&[], &["A1*", "Tesla*"])),
            reject(ModelMismatch, false),
        ),
        case(
            "models: fewer GPUs of the model than requested",
            empty(mixed()),
            constrained(whole(2), models(&["A100*"], &[])),
            reject(TooFewGpus, false),
        ),
        case(
            "memory per GPU: the minimum picks the large card",
            empty(mixed()),
            constrained(whole(1), min_memory(40)),
            gpus(&[&[1]]),
        ),
        case(
            "memory per GPU: no card is large enough",
            empty(mixed()),
            constrained(whole(1), min_memory(100)),
            reject(GpuMemoryTooSmall, false),
        ),
        case(
            "heterogeneous: a share goes to the one GPU large enough",
            empty(hetero(ShareMemory, &[("Tesla-T4", 16), ("A10", 24)])),
            share(20, 1, None),
            gpus(&[&[1]]),
        ),
        case(
            "heterogeneous: the large GPU is busy, the small one never suffices",
            occupied(
                hetero(ShareMemory, &[("Tesla-T4", 16), ("A10", 24)]),
                &[Held::Share(1, 8, 0)],
            ),
            share(20, 1, None),
            reject(InsufficientGpuMemory, true),
        ),
        case(
            "heterogeneous: a split needs two GPUs large enough",
            empty(hetero(
                ShareMemory,
                &[("Tesla-T4", 16), ("A10", 24), ("A10", 24)],
            )),
            share(40, 2, None),
            gpus(&[&[1, 2]]),
        ),
        // --- Unhealthy GPUs are never chosen.
        case(
            "unhealthy: a sick GPU is skipped",
            empty(unhealthy(uniform(Exclusive, 4, "Tesla-T4", 16), &[0])),
            whole(1),
            gpus(&[&[1]]),
        ),
        case(
            "unhealthy: too few healthy GPUs for the request",
            empty(unhealthy(uniform(Exclusive, 4, "Tesla-T4", 16), &[0, 2])),
            whole(3),
            reject(UnhealthyGpus, false),
        ),
        case(
            "unhealthy: an empty sick GPU is not used for a share",
            occupied(
                unhealthy(uniform(ShareMemory, 2, "Tesla-T4", 16), &[1]),
                &[Held::Share(0, 12, 0)],
            ),
            share(8, 1, None),
            reject(InsufficientGpuMemory, true),
        ),
        case(
            "unhealthy: a sick GPU does not count towards an island",
            occupied(unhealthy(islands(), &[4]), &[Held::Whole(&[1])]),
            topo(2),
            one_of(&[&[0, 2], &[0, 3], &[2, 3], &[5, 6], &[5, 7], &[6, 7]]),
        ),
        // --- Host resources.
        case(
            "host: more CPU than the node has at all",
            empty(uniform(Exclusive, 1, "Tesla-T4", 16).with_host(CpuMilli(4000), gib(16), 110)),
            host_pod(8000, 1024, GpuDemand::whole(1).unwrap()),
            reject(HostTooSmall, false),
        ),
        case(
            "host: more memory than the node has at all",
            empty(uniform(Exclusive, 1, "Tesla-T4", 16).with_host(CpuMilli(4000), gib(16), 110)),
            host_pod(1000, 32 * 1024, GpuDemand::None),
            reject(HostTooSmall, false),
        ),
        case(
            "host: CPU taken by other pods",
            occupied(
                uniform(Exclusive, 1, "Tesla-T4", 16).with_host(CpuMilli(4000), gib(16), 110),
                &[Held::Host(3000, 0)],
            ),
            host_pod(2000, 1024, GpuDemand::whole(1).unwrap()),
            reject(InsufficientCpu, true),
        ),
        case(
            "host: memory taken by other pods",
            occupied(
                uniform(Exclusive, 1, "Tesla-T4", 16).with_host(CpuMilli(4000), gib(16), 110),
                &[Held::Host(0, 12 * 1024)],
            ),
            host_pod(1000, 8 * 1024, GpuDemand::whole(1).unwrap()),
            reject(InsufficientMemory, true),
        ),
        case(
            "host: the node's pod count is reached",
            occupied(
                uniform(Exclusive, 1, "Tesla-T4", 16).with_host(CpuMilli(4000), gib(16), 2),
                &[Held::Host(0, 0), Held::Host(0, 0)],
            ),
            host_pod(100, 128, GpuDemand::None),
            reject(TooManyPods, true),
        ),
        case(
            "host: a node that can never fit wins over one that is only full",
            occupied(
                uniform(Exclusive, 1, "Tesla-T4", 16).with_host(CpuMilli(4000), gib(16), 110),
                &[Held::Host(4000, 0)],
            ),
            share(4, 1, None),
            reject(ModeMismatch, false),
        ),
        // --- Init containers: the per-GPU larger of the app sum and any single init container.
        case(
            "init: an init container reuses the app containers' GPU",
            occupied(
                uniform(ShareMemory, 2, "Tesla-T4", 16),
                &[Held::Share(0, 4, 0)],
            ),
            with_inits(&[share_demand(4, 1, None)], &[share_demand(10, 1, None)]),
            Expect::Holds(
                "app and init on GPU 0; footprint max(4, 10) = 10 GiB",
                |a| {
                    app_gpus(a) == vec![vec![0]]
                        && a.init_containers[0].gpus[0].gpu.0 == 0
                        && footprint_gib(a, 0) == Some(10)
                        && footprint_gib(a, 1).is_none()
                },
            ),
        ),
        case(
            "init: app containers add up, a smaller init container adds nothing",
            empty(uniform(ShareMemory, 2, "Tesla-T4", 16)),
            with_inits(
                &[share_demand(4, 1, None), share_demand(4, 1, None)],
                &[share_demand(6, 1, None)],
            ),
            Expect::Holds("both apps and the init on GPU 0; footprint 8 GiB", |a| {
                app_gpus(a) == vec![vec![0], vec![0]] && footprint_gib(a, 0) == Some(8)
            }),
        ),
        case(
            "init: an init container larger than any free GPU part rejects the pod",
            occupied(
                uniform(ShareMemory, 2, "Tesla-T4", 16),
                &[Held::Share(0, 4, 0), Held::Share(1, 4, 0)],
            ),
            with_inits(&[share_demand(2, 1, None)], &[share_demand(14, 1, None)]),
            reject(InsufficientGpuMemory, true),
        ),
        case(
            "init: init containers do not compete with the pod's own app containers",
            empty(uniform(ShareMemory, 1, "Tesla-T4", 16)),
            with_inits(&[share_demand(12, 1, None)], &[share_demand(12, 1, None)]),
            Expect::Holds("one GPU, footprint 12 GiB, not 24", |a| {
                footprint_gib(a, 0) == Some(12)
            }),
        ),
        case(
            "init: a GPU-only init container of a GPU-less app",
            empty(uniform(Exclusive, 2, "Tesla-T4", 16)),
            with_inits(&[GpuDemand::None], &[GpuDemand::whole(1).unwrap()]),
            Expect::Holds("the init container holds one whole GPU", |a| {
                a.containers[0].gpus.is_empty()
                    && a.init_containers[0].gpus.len() == 1
                    && a.footprint().len() == 1
                    && a.footprint()[0].whole
            }),
        ),
        case(
            "init: a whole-GPU init container is checked even when the apps fit",
            occupied(uniform(Exclusive, 2, "Tesla-T4", 16), &[Held::Whole(&[0])]),
            with_inits(
                &[GpuDemand::whole(1).unwrap()],
                &[GpuDemand::whole(2).unwrap()],
            ),
            reject(NoFreeWholeGpus, true),
        ),
        case(
            "init: a whole init container prefers the GPUs of the apps",
            empty(uniform(Exclusive, 4, "Tesla-T4", 16)),
            with_inits(
                &[GpuDemand::whole(1).unwrap(), GpuDemand::whole(1).unwrap()],
                &[GpuDemand::whole(2).unwrap()],
            ),
            Expect::Holds("footprint stays on the two app GPUs", |a| {
                a.footprint().iter().map(|h| h.gpu.0).collect::<Vec<_>>() == vec![0, 1]
            }),
        ),
        // --- A pod's own containers together, measured against the node when empty.
        case(
            "pod: app containers that together need more GPUs than the node has never fit",
            empty(uniform(Exclusive, 4, "Tesla-T4", 16)),
            with_inits(
                &[GpuDemand::whole(3).unwrap(), GpuDemand::whole(2).unwrap()],
                &[],
            ),
            reject(TooFewGpus, false),
        ),
        case(
            "pod: app containers that together need more GPU memory than the node has never fit",
            occupied(
                uniform(ShareMemory, 1, "Tesla-T4", 16),
                &[Held::Share(0, 2, 0)],
            ),
            with_inits(&[share_demand(10, 1, None), share_demand(8, 1, None)], &[]),
            reject(GpuMemoryTooSmall, false),
        ),
        case(
            "pod: a full node stays resolvable for a pod that fits it when empty",
            occupied(
                uniform(ShareMemory, 1, "Tesla-T4", 16),
                &[Held::Share(0, 8, 0)],
            ),
            with_inits(&[share_demand(6, 1, None), share_demand(6, 1, None)], &[]),
            reject(InsufficientGpuMemory, true),
        ),
        case(
            "pod: a node at its pod count that could never hold the GPUs is permanent",
            occupied(
                uniform(Exclusive, 2, "Tesla-T4", 16).with_host(CpuMilli(4000), gib(16), 1),
                &[Held::Host(0, 0)],
            ),
            with_inits(
                &[GpuDemand::whole(2).unwrap(), GpuDemand::whole(1).unwrap()],
                &[],
            ),
            reject(TooFewGpus, false),
        ),
        // --- MIG slices (the device plugin's `nvidia.com/mig-<profile>`).
        case(
            "mig: free slices of the profile fit, and no GPU is granted",
            mig_node(0, &[("1g.10gb", 7), ("3g.40gb", 2)], &[("1g.10gb", 5)]),
            mig_pod(0, &[("1g.10gb", 2)]),
            gpus(&[&[]]),
        ),
        case(
            "mig: a whole GPU and slices together",
            mig_node(1, &[("1g.10gb", 7)], &[]),
            mig_pod(1, &[("1g.10gb", 1)]),
            gpus(&[&[0]]),
        ),
        case(
            "mig: a profile the node does not advertise never fits",
            mig_node(1, &[("1g.10gb", 7)], &[]),
            mig_pod(0, &[("3g.40gb", 1)]),
            reject(NoMigSlices, false),
        ),
        case(
            "mig: more slices than the node advertises at all",
            mig_node(0, &[("3g.40gb", 2)], &[]),
            mig_pod(0, &[("3g.40gb", 3)]),
            reject(NoMigSlices, false),
        ),
        case(
            "mig: slices held by other pods",
            mig_node(0, &[("1g.10gb", 7), ("3g.40gb", 2)], &[("3g.40gb", 1)]),
            mig_pod(0, &[("1g.10gb", 1), ("3g.40gb", 2)]),
            reject(InsufficientMigSlices, true),
        ),
        case(
            "mig: no free whole GPU for a pod asking both",
            mig_node(1, &[("1g.10gb", 7)], &[]),
            mig_pod(2, &[("1g.10gb", 1)]),
            reject(TooFewGpus, false),
        ),
        // --- FGD+'s hold: an idle node of four GPUs or more is kept for GPU pods.
        Case {
            policy: Policy::scoring(ScoringPolicy::FgdPlus).with_typical(one_class(500)),
            ..case(
                "fgd-plus: a pod without GPUs is refused an idle 4-GPU node",
                empty(uniform(Exclusive, 4, "Tesla-T4", 16)),
                pod(GpuDemand::None),
                reject(HostHeldForGpus, true),
            )
        },
        Case {
            policy: Policy::scoring(ScoringPolicy::FgdPlus).with_typical(one_class(500)),
            ..case(
                "fgd-plus: a pod without GPUs takes an idle 2-GPU node's CPU its GPUs do not need",
                empty(uniform(Exclusive, 2, "Tesla-T4", 16)),
                pod(GpuDemand::None),
                gpus(&[&[]]),
            )
        },
        // --- FGD's GPU choice: free 600, 800, 1000 milli; a 200 milli share; pods of 500 typical.
        Case {
            policy: Policy::scoring(ScoringPolicy::Fgd).with_typical(one_class(500)),
            ..case(
                "fgd: the share goes where it strands least (not the fullest, not the emptiest)",
                occupied(
                    uniform(ShareMemory, 3, "A10", 10),
                    &[Held::Share(0, 4, 0), Held::Share(1, 2, 0)],
                ),
                share(2, 1, None),
                gpus(&[&[1]]),
            )
        },
        Case {
            policy: Policy::scoring(ScoringPolicy::Binpack).with_typical(one_class(500)),
            ..case(
                "fgd contrast: binpack takes the fullest GPU and strands 400",
                occupied(
                    uniform(ShareMemory, 3, "A10", 10),
                    &[Held::Share(0, 4, 0), Held::Share(1, 2, 0)],
                ),
                share(2, 1, None),
                gpus(&[&[0]]),
            )
        },
        Case {
            policy: Policy::scoring(ScoringPolicy::Fgd).with_typical(one_class(500)),
            ..case(
                "fgd: a pod's placement override still wins",
                occupied(
                    uniform(ShareMemory, 3, "A10", 10),
                    &[Held::Share(0, 4, 0), Held::Share(1, 2, 0)],
                ),
                constrained(share(2, 1, None), placement(GpuPlacement::Spread)),
                gpus(&[&[2]]),
            )
        },
        Case {
            policy: Policy::scoring(ScoringPolicy::Fgd).with_typical(one_class(500)),
            ..case(
                "fgd: each part of a split strands least given the parts before it",
                occupied(
                    uniform(ShareMemory, 3, "A10", 10),
                    &[Held::Share(0, 4, 0), Held::Share(1, 2, 0)],
                ),
                share(4, 2, None),
                gpus(&[&[1, 2]]),
            )
        },
    ]
}

fn check(case: &Case) -> Result<(), String> {
    // The one refusal made above the fit: the policy's hold of a node's host for its GPUs.
    let outcome = fit(&case.node, &case.pod, &case.policy).and_then(|allocation| {
        match case.policy.evaluate(&case.node, &case.pod) {
            Err(RejectReason::HostHeldForGpus) => Err(RejectReason::HostHeldForGpus),
            _ => Ok(allocation),
        }
    });
    let fail = |what: String| Err(format!("{}: {what}; got {outcome:?}", case.name));
    match (&case.expect, &outcome) {
        (Expect::Gpus(expected), Ok(allocation)) => {
            if &app_gpus(allocation) != expected {
                return fail(format!("expected GPUs {expected:?}"));
            }
        }
        (Expect::OneOf(options), Ok(allocation)) => {
            if !options.contains(&app_gpus(allocation)) {
                return fail(format!("expected one of {options:?}"));
            }
        }
        (Expect::Holds(what, property), Ok(allocation)) => {
            if !property(allocation) {
                return fail(format!("expected {what}"));
            }
        }
        (Expect::Reject(reason, resolvable), Err(got)) => {
            if got != reason {
                return fail(format!("expected rejection {reason:?}"));
            }
            if got.is_resolvable() != *resolvable {
                return fail(format!("expected is_resolvable() == {resolvable}"));
            }
        }
        (Expect::Reject(reason, _), Ok(_)) => return fail(format!("expected {reason:?}")),
        (_, Err(_)) => return fail("expected a placement".into()),
    }
    // Whatever fits must also be accepted by `evaluate`, with a score in range.
    if let Ok(allocation) = &outcome {
        let evaluation = case.policy.evaluate(&case.node, &case.pod).unwrap();
        if &evaluation.allocation != allocation || !(0.0..=100.0).contains(&evaluation.score) {
            return fail(format!("evaluate disagrees: {evaluation:?}"));
        }
    }
    Ok(())
}

#[test]
fn fit_table() {
    let cases = cases();
    let failures: Vec<String> = cases.iter().filter_map(|c| check(c).err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn the_table_covers_every_rejection_reason() {
    let covered: BTreeSet<RejectReason> = cases()
        .iter()
        .filter_map(|c| match c.expect {
            Expect::Reject(reason, _) => Some(reason),
            _ => None,
        })
        .collect();
    let all: BTreeSet<RejectReason> = RejectReason::ALL.into_iter().collect();
    let missing: Vec<_> = all.difference(&covered).collect();
    assert!(missing.is_empty(), "no row rejects with {missing:?}");
}

#[test]
fn case_names_are_unique() {
    let cases = cases();
    let names: BTreeSet<&str> = cases.iter().map(|c| c.name).collect();
    assert_eq!(names.len(), cases.len());
}

#[test]
fn rejection_reasons_have_distinct_codes_and_node_free_messages() {
    let codes: BTreeSet<&str> = RejectReason::ALL.iter().map(|r| r.code()).collect();
    let messages: BTreeSet<&str> = RejectReason::ALL.iter().map(|r| r.message()).collect();
    assert_eq!(codes.len(), RejectReason::ALL.len());
    assert_eq!(messages.len(), RejectReason::ALL.len());
    for reason in RejectReason::ALL {
        assert!(
            reason
                .code()
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '_'),
            "{reason:?}"
        );
        assert_eq!(reason.to_string(), reason.message());
    }
    // kube-scheduler splits nodes on this: the capacity reasons are the resolvable ones.
    let resolvable: Vec<_> = RejectReason::ALL
        .into_iter()
        .filter(|r| r.is_resolvable())
        .collect();
    assert_eq!(resolvable.len(), 10);
}

/// (GiB total, GPUs, core percent) and the demand or error it makes.
#[test]
fn request_validation_table() {
    type Row = (u64, u64, Option<u32>, Result<GpuDemand, RequestError>);
    let ok = |gpus: u16, mem: u64, compute: u32| {
        Ok(GpuDemand::Share {
            gpus,
            mem_per_gpu: gib(mem),
            compute_per_gpu: ComputeMilli(compute),
        })
    };
    let rows: Vec<Row> = vec![
        (8, 1, None, ok(1, 8, 0)),
        (16, 2, None, ok(2, 8, 0)),
        (24, 3, Some(50), ok(3, 8, 500)),
        (
            15,
            2,
            None,
            Err(RequestError::UnevenSplit {
                total_gib: 15,
                gpus: 2,
            }),
        ),
        (
            10,
            4,
            Some(30),
            Err(RequestError::UnevenSplit {
                total_gib: 10,
                gpus: 4,
            }),
        ),
        (4, 1, Some(5), ok(1, 4, 50)),
        (4, 1, Some(100), ok(1, 4, 1000)),
        (4, 1, Some(35), ok(1, 4, 350)),
        (
            4,
            1,
            Some(3),
            Err(RequestError::BadCorePercent {
                percent: 3,
                step: 5,
            }),
        ),
        (
            4,
            1,
            Some(33),
            Err(RequestError::BadCorePercent {
                percent: 33,
                step: 5,
            }),
        ),
        (
            4,
            1,
            Some(99),
            Err(RequestError::BadCorePercent {
                percent: 99,
                step: 5,
            }),
        ),
        (
            4,
            1,
            Some(0),
            Err(RequestError::BadCorePercent {
                percent: 0,
                step: 5,
            }),
        ),
        (
            4,
            1,
            Some(105),
            Err(RequestError::BadCorePercent {
                percent: 105,
                step: 5,
            }),
        ),
        (0, 1, Some(50), Err(RequestError::CoreWithoutMemory)),
        (0, 1, None, Ok(GpuDemand::None)),
        (4, 0, None, Err(RequestError::ZeroGpuCount)),
        (130, 65, None, Err(RequestError::TooManyGpus(65))),
    ];
    for (total, count, percent, expected) in rows {
        assert_eq!(
            GpuDemand::share(total, count, percent),
            expected,
            "share({total}, {count}, {percent:?})"
        );
    }
    assert_eq!(GpuDemand::whole(0), Ok(GpuDemand::None));
    assert_eq!(GpuDemand::topology(3), Ok(GpuDemand::Topology { count: 3 }));
    assert_eq!(GpuDemand::topology(65), Err(RequestError::TooManyGpus(65)));
}

#[test]
fn request_errors_explain_themselves() {
    let uneven = GpuDemand::share(15, 2, None).unwrap_err().to_string();
    assert_eq!(
        uneven,
        "GPU memory 15 GiB cannot be split evenly over 2 GPUs"
    );
    let percent = GpuDemand::share(4, 1, Some(33)).unwrap_err().to_string();
    assert_eq!(
        percent,
        "GPU core percentage 33 must be a multiple of 5 between 5 and 100"
    );
    let pattern = ModelPattern::parse("A100|H100").unwrap_err().to_string();
    assert!(pattern.contains("\"A100|H100\""), "{pattern}");
}

#[test]
fn binpack_and_spread_rank_nodes_oppositely() {
    let busy = occupied(
        uniform(GpuMode::ShareMemory, 2, "Tesla-T4", 16),
        &[Held::Share(0, 8, 0)],
    );
    let idle = NodeState::new(uniform(GpuMode::ShareMemory, 2, "Tesla-T4", 16));
    let request = share(4, 1, None);
    let score = |scoring, node: &NodeState| {
        Policy::scoring(scoring)
            .evaluate(node, &request)
            .unwrap()
            .score
    };
    assert!(score(ScoringPolicy::Binpack, &busy) > score(ScoringPolicy::Binpack, &idle));
    assert!(score(ScoringPolicy::Spread, &busy) < score(ScoringPolicy::Spread, &idle));
    // 12 of 32 GiB used after placing 4 on the busy node: binpack scores 37.5, spread 62.5.
    assert!((score(ScoringPolicy::Binpack, &busy) - 37.5).abs() < 1e-9);
    assert!((score(ScoringPolicy::Spread, &busy) - 62.5).abs() < 1e-9);
}

#[test]
fn fgd_prefers_the_node_where_the_pod_fills_a_hole() {
    // Typical pods take 500 milli. One node has a 300 milli sliver that no typical pod fits: a
    // 300 milli pod there removes that fragmentation. On an empty node the same pod leaves 700,
    // which still fits a typical pod, so fragmentation does not change.
    let policy = Policy::scoring(ScoringPolicy::Fgd).with_typical(one_class(500));
    let sliver = occupied(
        uniform(GpuMode::ShareMemory, 1, "A10", 10),
        &[Held::Share(0, 7, 0)],
    );
    let fresh = NodeState::new(uniform(GpuMode::ShareMemory, 1, "A10", 10));
    let request = share(3, 1, None);
    let on_sliver = policy.evaluate(&sliver, &request).unwrap().score;
    let on_fresh = policy.evaluate(&fresh, &request).unwrap().score;
    assert!(
        on_sliver > 50.0,
        "filling a hole scores above neutral: {on_sliver}"
    );
    assert!(
        (on_fresh - 50.0).abs() < 1e-9,
        "no change scores 50: {on_fresh}"
    );
    // A pod that turns a usable GPU into a sliver scores below neutral.
    let spoiler = share(6, 1, None);
    let spoiled = policy.evaluate(&fresh, &spoiler).unwrap().score;
    assert!(spoiled < 50.0, "{spoiled}");
}

#[test]
fn topology_quality_lowers_the_score_of_a_broken_group() {
    let islands = || uniform(GpuMode::Topology, 8, "A100-SXM4-80GB", 80).with_links(two_islands());
    let intact = NodeState::new(islands());
    let broken = occupied(islands(), &[Held::Whole(&[1]), Held::Whole(&[5])]);
    let request = constrained(topo(4), topology(TopologyPreference::Preferred));
    // Binpack alone would prefer the fuller, broken node: the interconnect must outweigh that.
    let policy = Policy::scoring(ScoringPolicy::Binpack);
    let good = policy.evaluate(&intact, &request).unwrap().score;
    let poor = policy.evaluate(&broken, &request).unwrap().score;
    assert!(good > poor, "intact island {good} vs broken {poor}");
}
