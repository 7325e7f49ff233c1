//! Can this pod fit this node now, and where exactly: a concrete per-container placement, or a
//! rejection with a stable, node-independent reason that says whether waiting could help.

use std::fmt;

use super::allocation::{ContainerAllocation, GpuGrant, Grant, PodAllocation};
use super::model::CpuMilli;
use super::model::{ComputeMilli, Gpu, MemMiB};
use super::policy::{Policy, ShareAsk, ShareChoice};
use super::request::{GpuConstraints, GpuDemand, PodRequest, TopologyPreference};
use super::state::{GpuUsage, NodeState, gpu_compute_free, gpu_mem_free};
use super::topology::positions;

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
    // Full right now; capacity may free up or preemption may help (FailedNodes).
    InsufficientCpu,
    InsufficientMemory,
    TooManyPods,
    NoFreeWholeGpus,
    InsufficientGpuMemory,
    InsufficientGpuCompute,
    SharedGpuPodLimit,
    NoConnectedGroup,
}

impl RejectReason {
    /// Every reason, for documentation and metric pre-registration.
    pub const ALL: [RejectReason; 15] = [
        Self::NoGpus,
        Self::ModeMismatch,
        Self::ModelMismatch,
        Self::GpuMemoryTooSmall,
        Self::TooFewGpus,
        Self::UnhealthyGpus,
        Self::HostTooSmall,
        Self::InsufficientCpu,
        Self::InsufficientMemory,
        Self::TooManyPods,
        Self::NoFreeWholeGpus,
        Self::InsufficientGpuMemory,
        Self::InsufficientGpuCompute,
        Self::SharedGpuPodLimit,
        Self::NoConnectedGroup,
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
            Self::InsufficientCpu => "Insufficient cpu",
            Self::InsufficientMemory => "Insufficient memory",
            Self::TooManyPods => "Too many pods",
            Self::NoFreeWholeGpus => "not enough free whole GPUs",
            Self::InsufficientGpuMemory => "insufficient GPU memory on any single GPU",
            Self::InsufficientGpuCompute => "insufficient GPU compute on any single GPU",
            Self::SharedGpuPodLimit => "shared GPUs are at their pod limit",
            Self::NoConnectedGroup => "no well-connected group of free GPUs",
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
            Self::InsufficientCpu => "insufficient_cpu",
            Self::InsufficientMemory => "insufficient_memory",
            Self::TooManyPods => "too_many_pods",
            Self::NoFreeWholeGpus => "no_free_whole_gpus",
            Self::InsufficientGpuMemory => "insufficient_gpu_memory",
            Self::InsufficientGpuCompute => "insufficient_gpu_compute",
            Self::SharedGpuPodLimit => "shared_gpu_pod_limit",
            Self::NoConnectedGroup => "no_connected_group",
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
    fit_with(node, request, policy, policy.share_choice(node, request))
}

/// [`fit`] with the GPU choice for shares given by the caller instead of derived from the policy:
/// the simulator uses it to replay reference rules (a drawn GPU) through the same placement code.
pub fn fit_with(
    node: &NodeState,
    request: &PodRequest,
    policy: &Policy,
    choice: ShareChoice,
) -> Result<PodAllocation, RejectReason> {
    let eligible = check_capability(node, request)?;
    check_host(node, request)?;
    let placer = Placer {
        node,
        eligible,
        choice,
        policy,
        require_connected: request.constraints.topology == TopologyPreference::Required,
        cpu_after: CpuMilli(node.cpu_free().0.saturating_sub(request.cpu.0)),
    };
    let mut usage = node.gpus.clone();
    let mut pod_shares = 0u64;
    let mut containers = Vec::with_capacity(request.containers.len());
    for container in &request.containers {
        let gpus = placer.place(&mut usage, &mut pod_shares, container.gpu, 0)?;
        containers.push(ContainerAllocation {
            name: container.name.clone(),
            gpus,
        });
    }
    let held_by_apps = containers
        .iter()
        .flat_map(|c| c.gpus.iter())
        .filter_map(|grant| node.spec.position_of(grant.gpu))
        .fold(0u64, |mask, position| mask | (1u64 << position));
    let mut init_containers = Vec::with_capacity(request.init_containers.len());
    for container in &request.init_containers {
        // An init container runs alone, before the app containers: it competes only with the
        // other pods on the node, and prefers the GPUs the app containers will use, so the pod's
        // footprint (the per-GPU larger of the two) grows as little as possible.
        let mut alone = node.gpus.clone();
        let mut alone_shares = 0u64;
        let gpus = placer.place(&mut alone, &mut alone_shares, container.gpu, held_by_apps)?;
        init_containers.push(ContainerAllocation {
            name: container.name.clone(),
            gpus,
        });
    }
    Ok(PodAllocation {
        node: node.spec.name.clone(),
        cpu: request.cpu,
        memory: request.memory,
        containers,
        init_containers,
    })
}

/// The GPU positions of `node` that `constraints` allow, healthy or not.
pub fn allowed_mask(node: &NodeState, constraints: &GpuConstraints) -> u64 {
    node.normalized_models
        .iter()
        .zip(&node.spec.gpus)
        .enumerate()
        .filter(|(_, (model, gpu))| {
            constraints.accepts_model(model) && constraints.accepts_memory(gpu.memory)
        })
        .fold(0u64, |mask, (position, _)| mask | (1u64 << position))
}

/// The checks that no amount of waiting fixes. Returns the healthy GPU positions the pod may use.
fn check_capability(node: &NodeState, request: &PodRequest) -> Result<u64, RejectReason> {
    if request.cpu > node.spec.cpu || request.memory > node.spec.memory {
        return Err(RejectReason::HostTooSmall);
    }
    let constraints = &request.constraints;
    let usable = allowed_mask(node, constraints);
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
        if !node
            .normalized_models
            .iter()
            .any(|model| constraints.accepts_model(model))
        {
            return Err(RejectReason::ModelMismatch);
        }
        let big_enough = match demand {
            GpuDemand::Share { mem_per_gpu, .. } => {
                usable & mask_where(node, |gpu| gpu.memory >= mem_per_gpu)
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
        if (big_enough & healthy_mask(node)).count_ones() < needed {
            return Err(RejectReason::UnhealthyGpus);
        }
    }
    Ok(usable & healthy_mask(node))
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

fn mask_where(node: &NodeState, keep: impl Fn(&Gpu) -> bool) -> u64 {
    node.spec
        .gpus
        .iter()
        .enumerate()
        .filter(|(_, gpu)| keep(gpu))
        .fold(0u64, |mask, (position, _)| mask | (1u64 << position))
}

fn healthy_mask(node: &NodeState) -> u64 {
    mask_where(node, |gpu| gpu.healthy)
}

/// Positions of GPUs nobody uses, under scratch `usage`.
pub fn idle_positions(usage: &[GpuUsage]) -> u64 {
    usage
        .iter()
        .enumerate()
        .filter(|(_, u)| u.is_idle())
        .fold(0u64, |mask, (position, _)| mask | (1u64 << position))
}

/// Places containers of one pod on one node, on scratch usage.
struct Placer<'a> {
    node: &'a NodeState,
    eligible: u64,
    choice: ShareChoice,
    policy: &'a Policy,
    require_connected: bool,
    /// Free host CPU once the pod is placed (FGD's fragmentation depends on it).
    cpu_after: CpuMilli,
}

impl Placer<'_> {
    /// Places one container, recording on `usage` what it takes. `pod_shares` marks the GPUs the
    /// pod already shares (a pod counts once towards a GPU's pod limit); `prefer` marks GPUs to
    /// use first when they suffice.
    fn place(
        &self,
        usage: &mut [GpuUsage],
        pod_shares: &mut u64,
        demand: GpuDemand,
        prefer: u64,
    ) -> Result<Vec<GpuGrant>, RejectReason> {
        let node = self.node;
        match demand {
            GpuDemand::None => Ok(Vec::new()),
            GpuDemand::Whole { count } | GpuDemand::Topology { count } => {
                let count = usize::from(count);
                let free = self.eligible & idle_positions(usage);
                if (free.count_ones() as usize) < count {
                    return Err(RejectReason::NoFreeWholeGpus);
                }
                let pool = preferred_pool(prefer, free, count);
                let topology = &node.spec.topology;
                let group = topology
                    .choose_group(pool, count)
                    .ok_or(RejectReason::NoFreeWholeGpus)?;
                if self.require_connected && count > 1 {
                    let best_possible = topology.best_group(self.eligible, count).map(|(_, c)| c);
                    let chosen = topology.best_group(group, count).map(|(_, c)| c);
                    if chosen < best_possible {
                        return Err(RejectReason::NoConnectedGroup);
                    }
                }
                let mut grants = Vec::with_capacity(count);
                for position in positions(group) {
                    usage[position].whole_pods += 1;
                    grants.push(GpuGrant {
                        gpu: node.spec.gpus[position].index,
                        grant: Grant::Whole,
                    });
                }
                Ok(grants)
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
                    let (gpu, slot) = (&node.spec.gpus[position], &usage[position]);
                    if gpu_mem_free(gpu, slot) < mem_per_gpu || slot.is_whole() {
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
                };
                let chosen = self
                    .policy
                    .choose_shares(node, usage, pool, ask, self.choice);
                let mut grants = Vec::with_capacity(count);
                for position in chosen {
                    let slot = &mut usage[position];
                    slot.mem = MemMiB(slot.mem.0 + mem_per_gpu.0);
                    slot.compute = ComputeMilli(slot.compute.0 + compute_per_gpu.0);
                    if *pod_shares & (1u64 << position) == 0 {
                        slot.shares += 1;
                        *pod_shares |= 1u64 << position;
                    }
                    grants.push(GpuGrant {
                        gpu: node.spec.gpus[position].index,
                        grant: Grant::Share {
                            mem: mem_per_gpu,
                            compute: compute_per_gpu,
                        },
                    });
                }
                Ok(grants)
            }
        }
    }
}

fn preferred_pool(prefer: u64, candidates: u64, count: usize) -> u64 {
    if ((prefer & candidates).count_ones() as usize) >= count {
        prefer & candidates
    } else {
        candidates
    }
}
