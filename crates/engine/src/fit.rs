//! Can this pod fit this node now, and where exactly: a concrete per-container placement, or a
//! rejection with a stable, node-independent reason that says whether waiting could help.

use std::fmt;

use super::allocation::{ContainerAllocation, GpuGrant, Grant, PodAllocation};
use super::model::{ComputeMilli, CpuMilli, MemMiB};
use super::policy::fgd::FgdCache;
use super::policy::topology::group_quality;
use super::policy::{Picked, Policy, ShareAsk, ShareChoice};
use super::request::{ContainerRequest, GpuConstraints, GpuDemand, PodRequest, TopologyPreference};
use super::state::{GpuUsage, NodeState, PerGpu, gpu_compute_free, mem_free};
use super::topology::{bit, lowest_bits, positions};

/// Why a pod does not fit a node. The message is what kube-scheduler aggregates across nodes, so
/// it never names the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RejectReason {
    // Can never fit as the node is configured (FailedAndUnresolvableNodes).
    NoGpus,
    ModeMismatch,
    ModelMismatch,
    GpuMemoryTooSmall,
    TooFewGpus,
    UnhealthyGpus,
    HostTooSmall,
    NoMigSlices,
    // Full right now; capacity may free up or preemption may help (FailedNodes).
    InsufficientCpu,
    InsufficientMemory,
    TooManyPods,
    NoFreeWholeGpus,
    InsufficientGpuMemory,
    InsufficientGpuCompute,
    SharedGpuPodLimit,
    NoConnectedGroup,
    HostHeldForGpus,
    InsufficientMigSlices,
}

impl RejectReason {
    /// Every reason, for documentation and metric pre-registration, in declaration order (the
    /// metrics index counts by `reason as usize`).
    pub const ALL: [RejectReason; 18] = [
        Self::NoGpus,
        Self::ModeMismatch,
        Self::ModelMismatch,
        Self::GpuMemoryTooSmall,
        Self::TooFewGpus,
        Self::UnhealthyGpus,
        Self::HostTooSmall,
        Self::NoMigSlices,
        Self::InsufficientCpu,
        Self::InsufficientMemory,
        Self::TooManyPods,
        Self::NoFreeWholeGpus,
        Self::InsufficientGpuMemory,
        Self::InsufficientGpuCompute,
        Self::SharedGpuPodLimit,
        Self::NoConnectedGroup,
        Self::HostHeldForGpus,
        Self::InsufficientMigSlices,
    ];

    /// The short message shown in the pod's FailedScheduling event.
    pub fn message(self) -> &'static str {
        match self {
            Self::NoGpus => "node has no GPUs",
            Self::ModeMismatch => "node GPU sharing mode does not serve this request",
            Self::ModelMismatch => "node has no GPU of the requested model",
            Self::GpuMemoryTooSmall => "node GPUs have too little memory for the request",
            Self::TooFewGpus => "node has fewer GPUs than requested",
            Self::UnhealthyGpus => "node has too few healthy GPUs",
            Self::HostTooSmall => "node CPU or memory capacity is too small",
            Self::NoMigSlices => "node has too few MIG slices of the requested profile",
            Self::InsufficientCpu => "Insufficient cpu",
            Self::InsufficientMemory => "Insufficient memory",
            Self::TooManyPods => "Too many pods",
            Self::NoFreeWholeGpus => "not enough free whole GPUs",
            Self::InsufficientGpuMemory => "insufficient GPU memory on any single GPU",
            Self::InsufficientGpuCompute => "insufficient GPU compute on any single GPU",
            Self::SharedGpuPodLimit => "shared GPUs are at their pod limit",
            Self::NoConnectedGroup => "no well-connected group of free GPUs",
            Self::HostHeldForGpus => "node CPU and memory are held for its free GPUs",
            Self::InsufficientMigSlices => "not enough free MIG slices of the requested profile",
        }
    }

    /// A stable snake_case code, used as a metric label.
    pub fn code(self) -> &'static str {
        match self {
            Self::NoGpus => "no_gpus",
            Self::ModeMismatch => "mode_mismatch",
            Self::ModelMismatch => "model_mismatch",
            Self::GpuMemoryTooSmall => "gpu_memory_too_small",
            Self::TooFewGpus => "too_few_gpus",
            Self::UnhealthyGpus => "unhealthy_gpus",
            Self::HostTooSmall => "host_too_small",
            Self::NoMigSlices => "no_mig_slices",
            Self::InsufficientCpu => "insufficient_cpu",
            Self::InsufficientMemory => "insufficient_memory",
            Self::TooManyPods => "too_many_pods",
            Self::NoFreeWholeGpus => "no_free_whole_gpus",
            Self::InsufficientGpuMemory => "insufficient_gpu_memory",
            Self::InsufficientGpuCompute => "insufficient_gpu_compute",
            Self::SharedGpuPodLimit => "shared_gpu_pod_limit",
            Self::NoConnectedGroup => "no_connected_group",
            Self::HostHeldForGpus => "host_held_for_gpus",
            Self::InsufficientMigSlices => "insufficient_mig_slices",
        }
    }

    /// Whether the node could take the pod once other pods leave (preemption may help).
    pub fn is_resolvable(self) -> bool {
        matches!(
            self,
            Self::InsufficientCpu
                | Self::InsufficientMemory
                | Self::TooManyPods
                | Self::NoFreeWholeGpus
                | Self::InsufficientGpuMemory
                | Self::InsufficientGpuCompute
                | Self::SharedGpuPodLimit
                | Self::NoConnectedGroup
                | Self::HostHeldForGpus
                | Self::InsufficientMigSlices
        )
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

/// Decides where `request` goes on `node`, following `policy` for the choice of GPUs.
pub fn fit(
    node: &NodeState,
    request: &PodRequest,
    policy: &Policy,
) -> Result<PodAllocation, RejectReason> {
    let choice = policy.share_choice(node, request);
    fit_with(node, request, policy, choice, &mut FgdCache::default())
}

/// [`fit`] with the GPU choice for shares given by the caller instead of derived from the
/// policy: the simulator replays reference rules (a drawn GPU) through the same placement code.
pub fn fit_choosing(
    node: &NodeState,
    request: &PodRequest,
    policy: &Policy,
    choice: ShareChoice,
) -> Result<PodAllocation, RejectReason> {
    fit_with(node, request, policy, choice, &mut FgdCache::default())
}

/// [`fit_choosing`], keeping in `cache` what FGD derives from the node so that scoring the
/// placement right after reuses it.
pub(crate) fn fit_with(
    node: &NodeState,
    request: &PodRequest,
    policy: &Policy,
    choice: ShareChoice,
    cache: &mut FgdCache,
) -> Result<PodAllocation, RejectReason> {
    let mut containers = Vec::with_capacity(request.containers.len());
    let mut init_containers = Vec::with_capacity(request.init_containers.len());
    place(
        node,
        request,
        policy,
        choice,
        cache,
        &mut PerGpu::copy_of(&node.gpus),
        &mut |role, container, placed| {
            let allocation = ContainerAllocation {
                name: container.name.clone(),
                gpus: placed.grants(node).collect(),
            };
            match role {
                Role::App => containers.push(allocation),
                Role::Init => init_containers.push(allocation),
            }
        },
    )?;
    Ok(PodAllocation {
        node: node.spec.name.clone(),
        cpu: request.cpu,
        memory: request.memory,
        containers,
        init_containers,
        mig: request.mig.clone(),
    })
}

/// What placing `request` on `node` does to the node, without building the [`PodAllocation`]:
/// `after` (which comes in as a copy of the node's usage) is left with the pod's footprint
/// added, and the topology quality of the placement is returned. Filter and prioritize ask only this of every candidate; the allocation itself is
/// built by [`fit`] at bind, for the chosen node alone.
///
/// Exactly what [`fit`] followed by `add_allocation` and `topology::quality` give, because the
/// same placement code runs and only the recording differs, provided GPU indices map to
/// positions one to one: [`Policy::evaluate_score`] takes this path only on nodes whose GPU
/// indices are their positions (`GpuProfile::contiguous`).
pub(crate) fn footprint_with(
    node: &NodeState,
    request: &PodRequest,
    policy: &Policy,
    cache: &mut FgdCache,
    after: &mut [GpuUsage],
) -> Result<f64, RejectReason> {
    let choice = policy.share_choice(node, request);
    let mut quality: f64 = 1.0;
    let mut rate = |role: Role, placed: &Placed| {
        if role == Role::App && placed.grant == Grant::Whole {
            quality = quality.min(group_quality(node, placed.positions.mask()));
        }
    };
    if !request
        .init_containers
        .iter()
        .any(|container| !container.gpu.is_none())
    {
        // No init container holds a GPU (nearly every pod): the footprint is the app
        // containers' grants, which the placement's own scratch usage already adds to the
        // node's, each GPU the pod shares counted once, as `PodAllocation::footprint` counts it.
        place(
            node,
            request,
            policy,
            choice,
            cache,
            after,
            &mut |role, _, placed| rate(role, placed),
        )?;
        return Ok(quality);
    }
    // Per position, what the app containers hold together and the most any single init
    // container holds: the pod's footprint is their larger (Kubernetes' init-container rule,
    // as `PodAllocation::footprint` applies it GPU by GPU).
    let mut apps = PerGpu::<Take>::defaults(node.gpus.len());
    let mut inits = PerGpu::<Take>::defaults(node.gpus.len());
    let mut touched = 0u64;
    place(
        node,
        request,
        policy,
        choice,
        cache,
        after,
        &mut |role, _, placed| {
            let takes = match role {
                Role::App => &mut apps,
                Role::Init => &mut inits,
            };
            for position in placed.positions.iter() {
                touched |= bit(position);
                let take = &mut takes[position];
                match placed.grant {
                    Grant::Whole => take.whole = true,
                    Grant::Share { mem, compute } if role == Role::App => {
                        take.mem = MemMiB(take.mem.0.saturating_add(mem.0));
                        take.compute = ComputeMilli(take.compute.0.saturating_add(compute.0));
                    }
                    // An init container holds each of its GPUs through one grant.
                    Grant::Share { mem, compute } => {
                        take.mem = take.mem.max(mem);
                        take.compute = take.compute.max(compute);
                    }
                }
            }
            rate(role, placed);
        },
    )?;
    after.copy_from_slice(&node.gpus);
    for position in positions(touched) {
        let (app, init) = (apps[position], inits[position]);
        let slot = &mut after[position];
        if app.whole || init.whole {
            slot.whole_pods = slot.whole_pods.saturating_add(1);
        } else {
            slot.mem = MemMiB(slot.mem.0.saturating_add(app.mem.max(init.mem).0));
            slot.compute = ComputeMilli(
                slot.compute
                    .0
                    .saturating_add(app.compute.max(init.compute).0),
            );
            slot.shares = slot.shares.saturating_add(1);
        }
    }
    Ok(quality)
}

/// What one pod's containers of one kind take from one GPU.
#[derive(Clone, Copy, Debug, Default)]
struct Take {
    whole: bool,
    mem: MemMiB,
    compute: ComputeMilli,
}

/// Which list of the pod a container belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    App,
    Init,
}

/// The GPUs one container got: positions in the order they were chosen, all with one grant.
#[derive(Clone, Copy, Debug)]
struct Placed {
    positions: Picked,
    grant: Grant,
}

impl Placed {
    /// A container that holds no GPU.
    fn none() -> Self {
        Self {
            positions: Picked::new(),
            grant: Grant::Whole,
        }
    }

    /// The grants, as the allocation names them.
    fn grants<'a>(&'a self, node: &'a NodeState) -> impl Iterator<Item = GpuGrant> + 'a {
        self.positions.iter().map(move |position| GpuGrant {
            gpu: node.index_at(position),
            grant: self.grant,
        })
    }
}

/// Decides where every container of `request` goes on `node` and hands each placed container to
/// `record`: the one placement procedure behind both [`fit`] and [`footprint_with`]. `usage`,
/// a copy of the node's usage, is left with the app containers placed (see
/// [`Placer::place_pod`]).
fn place(
    node: &NodeState,
    request: &PodRequest,
    policy: &Policy,
    choice: ShareChoice,
    cache: &mut FgdCache,
    usage: &mut [GpuUsage],
    record: &mut impl FnMut(Role, &ContainerRequest, &Placed),
) -> Result<(), RejectReason> {
    let eligible = check_capability(node, request)?;
    let placer = Placer {
        node,
        eligible,
        choice,
        policy,
        require_connected: request.constraints.topology == TopologyPreference::Required,
        cpu_after: CpuMilli(node.cpu_free().0.saturating_sub(request.cpu.0)),
        mem_after: MemMiB(node.mem_free().0.saturating_sub(request.memory.0)),
    };
    if let Err(reason) = check_host(node, request) {
        return Err(placer.confirm_resolvable(request, reason));
    }
    check_mig_free(node, request)?;
    placer
        .place_pod(request, &node.gpus, usage, cache, record)
        .map_err(|reason| placer.confirm_resolvable(request, reason))
}

/// The GPU positions of `node` that `constraints` allow, healthy or not.
pub fn allowed_mask(node: &NodeState, constraints: &GpuConstraints) -> u64 {
    accepted_models(node, constraints).0 & memory_mask(node, constraints)
}

/// The positions whose model `constraints` accept, and whether any GPU's model is accepted at
/// all (a GPU past the 64th position has no bit but still counts). Models are matched once per
/// distinct model of the node, and not at all when the pod names none.
fn accepted_models(node: &NodeState, constraints: &GpuConstraints) -> (u64, bool) {
    let profile = &node.profile;
    if constraints.include_models.is_empty() && constraints.exclude_models.is_empty() {
        return (profile.all, !node.spec.gpus.is_empty());
    }
    profile
        .models
        .iter()
        .filter(|(model, _)| constraints.accepts_model(model))
        .fold((0u64, false), |(mask, _), (_, positions)| {
            (mask | positions, true)
        })
}

/// The positions with at least the pod's minimum memory per GPU.
fn memory_mask(node: &NodeState, constraints: &GpuConstraints) -> u64 {
    match constraints.min_memory_per_gpu {
        None => node.profile.all,
        Some(min) => node.profile.memory_at_least(min),
    }
}

/// The checks that no amount of waiting fixes. Returns the healthy GPU positions the pod may use.
fn check_capability(node: &NodeState, request: &PodRequest) -> Result<u64, RejectReason> {
    if request.cpu > node.spec.cpu || request.memory > node.spec.memory {
        return Err(RejectReason::HostTooSmall);
    }
    if request
        .mig
        .iter()
        .any(|asked| node.mig_advertised(&asked.profile) < asked.count)
    {
        return Err(RejectReason::NoMigSlices);
    }
    let constraints = &request.constraints;
    let (models, any_model) = accepted_models(node, constraints);
    let usable = models & memory_mask(node, constraints);
    let healthy = node.profile.healthy;
    for container in request.all_containers() {
        let demand = container.gpu;
        if demand.is_none() {
            continue;
        }
        if node.spec.gpus.is_empty() {
            return Err(RejectReason::NoGpus);
        }
        if !demand.served_by(node.spec.mode) {
            return Err(RejectReason::ModeMismatch);
        }
        if !any_model {
            return Err(RejectReason::ModelMismatch);
        }
        let big_enough = match demand {
            GpuDemand::Share { mem_per_gpu, .. } => {
                usable & node.profile.memory_at_least(mem_per_gpu)
            }
            _ => usable,
        };
        if big_enough == 0 {
            return Err(RejectReason::GpuMemoryTooSmall);
        }
        let needed = u32::from(demand.gpu_count());
        if big_enough.count_ones() < needed {
            return Err(RejectReason::TooFewGpus);
        }
        if (big_enough & healthy).count_ones() < needed {
            return Err(RejectReason::UnhealthyGpus);
        }
    }
    Ok(usable & healthy)
}

fn check_host(node: &NodeState, request: &PodRequest) -> Result<(), RejectReason> {
    if request.cpu > node.cpu_free() {
        return Err(RejectReason::InsufficientCpu);
    }
    if request.memory > node.mem_free() {
        return Err(RejectReason::InsufficientMemory);
    }
    if node.pods >= node.spec.max_pods {
        return Err(RejectReason::TooManyPods);
    }
    Ok(())
}

/// Enough free slices of every MIG profile the pod asks for. The node advertises enough of them
/// ([`check_capability`]), so the empty node would take them: waiting can help.
fn check_mig_free(node: &NodeState, request: &PodRequest) -> Result<(), RejectReason> {
    if request
        .mig
        .iter()
        .any(|asked| node.mig_free(&asked.profile) < asked.count)
    {
        return Err(RejectReason::InsufficientMigSlices);
    }
    Ok(())
}

/// Positions of GPUs nobody uses, under scratch `usage`.
pub fn idle_positions(usage: &[GpuUsage]) -> u64 {
    usage
        .iter()
        .enumerate()
        .filter(|(_, u)| u.is_idle())
        .fold(0u64, |mask, (position, _)| mask | bit(position))
}

/// Places containers of one pod on one node, on scratch usage.
#[derive(Clone, Copy)]
struct Placer<'a> {
    node: &'a NodeState,
    eligible: u64,
    choice: ShareChoice,
    policy: &'a Policy,
    require_connected: bool,
    /// Free host CPU once the pod is placed (FGD's fragmentation depends on it).
    cpu_after: CpuMilli,
    /// The node's free memory once the pod is on it (FGD+ measures the GPUs it strands).
    mem_after: MemMiB,
}

impl Placer<'_> {
    /// Places every container of the pod on top of `base` usage: app containers together, each
    /// init container alone. Each placed container goes to `record` as soon as it is placed.
    /// `usage` comes in equal to `base` and is left with the app containers' grants added (each
    /// GPU a pod shares counted once): the usage the pod leaves when no init container holds a
    /// GPU. The caller provides it so that it is written in place rather than moved out.
    fn place_pod(
        &self,
        request: &PodRequest,
        base: &[GpuUsage],
        usage: &mut [GpuUsage],
        cache: &mut FgdCache,
        record: &mut impl FnMut(Role, &ContainerRequest, &Placed),
    ) -> Result<(), RejectReason> {
        let mut pod_shares = 0u64;
        let mut held_by_apps = 0u64;
        for container in &request.containers {
            let placed = self.place(
                usage,
                &mut pod_shares,
                container.gpu,
                0,
                &mut held_by_apps,
                cache,
            )?;
            record(Role::App, container, &placed);
        }
        for container in &request.init_containers {
            // An init container runs alone, before the app containers: it competes only with the
            // other pods on the node, and prefers the GPUs the app containers will use, so the
            // pod's footprint (the per-GPU larger of the two) grows as little as possible.
            let mut alone = PerGpu::copy_of(base);
            let mut alone_shares = 0u64;
            let placed = self.place(
                &mut alone,
                &mut alone_shares,
                container.gpu,
                held_by_apps,
                &mut 0,
                cache,
            )?;
            record(Role::Init, container, &placed);
        }
        Ok(())
    }

    /// `reason` says the node is only full right now. That is true when the pod's GPUs would fit
    /// the same node with no other pod on it; when even the empty node cannot take them (the
    /// pod's own containers together need more GPUs, memory or compute than the node has),
    /// waiting or preempting never helps, so the permanent reason replaces it.
    fn confirm_resolvable(&self, request: &PodRequest, reason: RejectReason) -> RejectReason {
        // Which GPUs a share takes decides whether a later app container still fits, so with
        // several GPU app containers the pod's own GPU choice is replayed. With one, every
        // choice fits or none does (init containers are placed alone), and binpack is cheapest.
        let gpu_apps = request
            .containers
            .iter()
            .filter(|c| !c.gpu.is_none())
            .count();
        let empty;
        let placer = if gpu_apps <= 1 {
            Placer {
                choice: ShareChoice::Binpack,
                ..*self
            }
        } else {
            // The replayed choice must be the one the node would make with nothing on it: FGD's
            // reads the node's free CPU (and usage), and on this busy node's values it can pick
            // a GPU that leaves a later container no room where the empty node would not (found
            // by `random_histories_keep_the_engine_consistent`). Rare (pods with several GPU
            // containers, rejected), so the empty node is built only here.
            empty = NodeState::new(self.node.spec.clone());
            Placer {
                node: &empty,
                cpu_after: CpuMilli(empty.cpu_free().0.saturating_sub(request.cpu.0)),
                mem_after: MemMiB(empty.mem_free().0.saturating_sub(request.memory.0)),
                ..*self
            }
        };
        let idle = PerGpu::<GpuUsage>::defaults(self.node.gpus.len());
        let mut usage = idle.clone();
        let outcome = placer.place_pod(
            request,
            &idle,
            &mut usage,
            &mut FgdCache::default(),
            &mut |_, _, _| {},
        );
        match outcome {
            Ok(()) => reason,
            Err(RejectReason::InsufficientGpuMemory) => RejectReason::GpuMemoryTooSmall,
            Err(_) => RejectReason::TooFewGpus,
        }
    }

    /// Places one container, recording on `usage` what it takes and marking in `taken` the
    /// positions it got. `pod_shares` marks the GPUs the pod already shares (a pod counts once
    /// towards a GPU's pod limit); `prefer` marks GPUs to use first when they suffice.
    fn place(
        &self,
        usage: &mut [GpuUsage],
        pod_shares: &mut u64,
        demand: GpuDemand,
        prefer: u64,
        taken: &mut u64,
        cache: &mut FgdCache,
    ) -> Result<Placed, RejectReason> {
        let node = self.node;
        match demand {
            GpuDemand::None => Ok(Placed::none()),
            GpuDemand::Whole { count } | GpuDemand::Topology { count } => {
                let count = usize::from(count);
                let free = self.eligible & idle_positions(usage);
                if (free.count_ones() as usize) < count {
                    return Err(RejectReason::NoFreeWholeGpus);
                }
                let pool = preferred_pool(prefer, free, count);
                // On a uniformly connected node every group is as good as any other: the index
                // would take the lowest positions, and no group can fall short of the best.
                if node.profile.uniform_topology {
                    let group = lowest_bits(pool, count);
                    return Ok(self.grant_whole(usage, group, taken));
                }
                let topology = &node.spec.topology;
                let mut group = topology
                    .choose_group(pool, count)
                    .ok_or(RejectReason::NoFreeWholeGpus)?;
                if self.require_connected && count > 1 {
                    let best_possible = topology.best_group(self.eligible, count).map(|(_, c)| c);
                    let connected = |group: u64| {
                        topology.best_group(group, count).map(|(_, c)| c) >= best_possible
                    };
                    if !connected(group) && pool != free {
                        // Reusing the app containers' GPUs is a preference; the required
                        // interconnect is not: look at every free GPU before giving up.
                        group = topology
                            .choose_group(free, count)
                            .ok_or(RejectReason::NoFreeWholeGpus)?;
                    }
                    if !connected(group) {
                        return Err(RejectReason::NoConnectedGroup);
                    }
                }
                Ok(self.grant_whole(usage, group, taken))
            }
            GpuDemand::Share {
                gpus,
                mem_per_gpu,
                compute_per_gpu,
            } => {
                let count = usize::from(gpus);
                let max_shares = self.policy.max_shares_per_gpu;
                let mut with_memory = 0u64;
                let mut with_compute = 0u64;
                let mut candidates = 0u64;
                for position in positions(self.eligible) {
                    let slot = &usage[position];
                    let memory = node.profile.memory(position);
                    if mem_free(memory, slot) < mem_per_gpu || slot.is_whole() {
                        continue;
                    }
                    with_memory |= 1u64 << position;
                    if gpu_compute_free(slot) < compute_per_gpu {
                        continue;
                    }
                    with_compute |= 1u64 << position;
                    let already_shared = *pod_shares & (1u64 << position) != 0;
                    if already_shared || slot.shares < max_shares {
                        candidates |= 1u64 << position;
                    }
                }
                if (candidates.count_ones() as usize) < count {
                    return Err(if (with_memory.count_ones() as usize) < count {
                        RejectReason::InsufficientGpuMemory
                    } else if (with_compute.count_ones() as usize) < count {
                        RejectReason::InsufficientGpuCompute
                    } else {
                        RejectReason::SharedGpuPodLimit
                    });
                }
                let pool = preferred_pool(prefer, candidates, count);
                let ask = ShareAsk {
                    mem: mem_per_gpu,
                    compute: compute_per_gpu,
                    count,
                    cpu_after: self.cpu_after,
                    mem_after: self.mem_after,
                };
                let chosen = self
                    .policy
                    .pick_shares(node, usage, pool, ask, self.choice, cache);
                for position in chosen.iter() {
                    *taken |= 1u64 << position;
                    let slot = &mut usage[position];
                    slot.mem = MemMiB(slot.mem.0 + mem_per_gpu.0);
                    slot.compute = ComputeMilli(slot.compute.0 + compute_per_gpu.0);
                    if *pod_shares & (1u64 << position) == 0 {
                        slot.shares += 1;
                        *pod_shares |= 1u64 << position;
                    }
                }
                Ok(Placed {
                    positions: chosen,
                    grant: Grant::Share {
                        mem: mem_per_gpu,
                        compute: compute_per_gpu,
                    },
                })
            }
        }
    }

    /// Gives the GPUs of `group` whole, recording them on `usage` and in `taken`.
    fn grant_whole(&self, usage: &mut [GpuUsage], group: u64, taken: &mut u64) -> Placed {
        *taken |= group;
        let mut placed = Placed {
            positions: Picked::new(),
            grant: Grant::Whole,
        };
        for position in positions(group) {
            usage[position].whole_pods += 1;
            placed.positions.push(position);
        }
        placed
    }
}

fn preferred_pool(prefer: u64, candidates: u64, count: usize) -> u64 {
    if ((prefer & candidates).count_ones() as usize) >= count {
        prefer & candidates
    } else {
        candidates
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocation::GpuGrant;
    use crate::model::{GpuIndex, GpuMode, NodeSpec};
    use crate::request::ContainerRequest;

    fn node(mode: GpuMode, count: u16, gib: u64) -> NodeState {
        NodeState::new(NodeSpec::uniform(
            "n",
            mode,
            count,
            "A10",
            MemMiB(gib * 1024),
        ))
    }

    fn pod(demands: &[GpuDemand]) -> PodRequest {
        let mut request = PodRequest::single(CpuMilli(0), MemMiB(0), GpuDemand::None);
        request.containers = demands
            .iter()
            .enumerate()
            .map(|(i, &gpu)| ContainerRequest {
                name: format!("c{i}"),
                gpu,
            })
            .collect();
        request
    }

    fn share(gib: u64, percent: Option<u32>) -> GpuDemand {
        GpuDemand::share(gib, 1, percent).unwrap_or_default()
    }

    /// Regression: each container passed the "can it ever fit" checks on its own, so a pod whose
    /// containers together need more than the whole node was reported as only "full right now"
    /// (resolvable), inviting preemption on a node where it can never run.
    #[test]
    fn regression_containers_that_together_overflow_the_empty_node_are_not_resolvable() {
        let policy = Policy::default();
        let cases = [
            (
                node(GpuMode::Exclusive, 4, 24),
                pod(&[GpuDemand::Whole { count: 3 }, GpuDemand::Whole { count: 3 }]),
                RejectReason::TooFewGpus,
            ),
            (
                node(GpuMode::ShareMemory, 1, 24),
                pod(&[share(14, None), share(11, None)]),
                RejectReason::GpuMemoryTooSmall,
            ),
            (
                node(GpuMode::CoreMem, 1, 24),
                pod(&[share(2, Some(60)), share(2, Some(60))]),
                RejectReason::TooFewGpus,
            ),
        ];
        for (node, request, expected) in cases {
            let got = fit(&node, &request, &policy);
            assert_eq!(got, Err(expected), "{request:?}");
            assert!(!expected.is_resolvable());
        }
    }

    /// Regression: GPU masks were built with `1 << position` over every GPU of the node, which
    /// panicked (debug) or aliased GPU 64 onto GPU 0 (release) on a node reporting more than 64
    /// GPUs, for example from a mistyped `nvidia_count` label.
    #[test]
    fn regression_nodes_with_more_than_64_gpus_do_not_overflow_the_gpu_masks() {
        let fgd =
            Policy::scoring(crate::ScoringPolicy::Fgd).with_typical(crate::TypicalPods::new(vec![
                crate::TypicalPod {
                    cpu: CpuMilli(0),
                    memory: crate::MemMiB(0),
                    gpus: 1,
                    milli: 500,
                    models: Vec::new(),
                    weight: 1.0,
                },
            ]));
        let cases = [
            (
                GpuMode::Exclusive,
                GpuDemand::Whole { count: 1 },
                RejectReason::NoFreeWholeGpus,
            ),
            (
                GpuMode::ShareMemory,
                share(4, None),
                RejectReason::InsufficientGpuMemory,
            ),
        ];
        for (mode, demand, when_full) in cases {
            let request = pod(&[demand]);
            let mut node = node(mode, 70, 24);
            // Every GPU but GPU 3 of those the masks can address is taken whole.
            for position in (0..64).filter(|&p| p != 3) {
                node.gpus[position].whole_pods = 1;
            }
            for policy in [&Policy::default(), &fgd] {
                let placed = policy.evaluate(&node, &request).unwrap();
                let gpus: Vec<u16> = placed.allocation.containers[0]
                    .gpus
                    .iter()
                    .map(|g| g.gpu.0)
                    .collect();
                assert_eq!(gpus, vec![3], "{mode:?}");
                assert!((0.0..=100.0).contains(&placed.score));
            }
            // GPU 3 taken too: GPUs 64.. must not alias onto the busy GPUs 0...
            node.gpus[3].whole_pods = 1;
            for policy in [&Policy::default(), &fgd] {
                assert_eq!(policy.evaluate(&node, &request), Err(when_full), "{mode:?}");
            }
        }
    }

    /// Regression: an init container prefers the GPUs its app containers hold, and when those
    /// were poorly connected a whole-GPU init container with required topology was rejected
    /// (`NoConnectedGroup`) although a well-connected pair was free on the node.
    #[test]
    fn regression_init_container_preference_does_not_override_required_topology() {
        use crate::model::{GpuPlacement, Link, LinkMatrix};
        use crate::request::GpuConstraints;
        let islands = LinkMatrix::from_fn(8, |a, b| {
            if a / 4 == b / 4 {
                Link::NvLink(2)
            } else {
                Link::CrossSocket
            }
        });
        let spec = NodeSpec::uniform("n", GpuMode::ShareMemory, 8, "A10", MemMiB(24 * 1024))
            .with_links(islands);
        let mut node = NodeState::new(spec);
        // Small shares on GPUs 0, 1, 2 and 5: spread sends the app's two parts to the emptiest
        // GPUs, 3 and 4, one in each island; GPUs 6 and 7 stay idle, linked to 4 and each other.
        for gpu in [0, 1, 2, 5] {
            node.add(&PodAllocation {
                node: node.spec.name.clone(),
                cpu: CpuMilli(0),
                memory: MemMiB(0),
                containers: vec![ContainerAllocation {
                    name: "other".into(),
                    gpus: vec![GpuGrant {
                        gpu: GpuIndex(gpu),
                        grant: Grant::Share {
                            mem: MemMiB(1024),
                            compute: ComputeMilli(0),
                        },
                    }],
                }],
                init_containers: Vec::new(),
                mig: Vec::new(),
            });
        }
        let mut request = pod(&[GpuDemand::share(2, 2, None).unwrap_or_default()]);
        request.init_containers = vec![ContainerRequest {
            name: "init".into(),
            gpu: GpuDemand::Whole { count: 2 },
        }];
        request.constraints = GpuConstraints {
            placement: Some(GpuPlacement::Spread),
            topology: TopologyPreference::Required,
            ..GpuConstraints::default()
        };
        let placed = fit(&node, &request, &Policy::default()).unwrap();
        let gpus = |c: &ContainerAllocation| c.gpus.iter().map(|g| g.gpu.0).collect::<Vec<_>>();
        assert_eq!(gpus(&placed.containers[0]), vec![3, 4]);
        let init = gpus(&placed.init_containers[0]);
        assert!(
            init.len() == 2 && init.iter().all(|&g| (4..8).contains(&g)),
            "the init container needs a linked pair, got {init:?}"
        );
    }

    #[test]
    fn a_pod_that_fits_the_empty_node_stays_resolvable_when_the_node_is_busy() {
        let mut busy = node(GpuMode::ShareMemory, 1, 24);
        busy.add(&PodAllocation {
            node: busy.spec.name.clone(),
            cpu: CpuMilli(0),
            memory: MemMiB(0),
            containers: vec![ContainerAllocation {
                name: "other".into(),
                gpus: vec![GpuGrant {
                    gpu: GpuIndex(0),
                    grant: Grant::Share {
                        mem: MemMiB(20 * 1024),
                        compute: ComputeMilli(0),
                    },
                }],
            }],
            init_containers: Vec::new(),
            mig: Vec::new(),
        });
        let request = pod(&[share(10, None), share(10, None)]);
        assert_eq!(
            fit(&busy, &request, &Policy::default()),
            Err(RejectReason::InsufficientGpuMemory)
        );
    }
}
