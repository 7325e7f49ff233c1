//! Pods into engine requests: the GPU resources each container asks for (whole GPUs, shares,
//! HAMi's names), host requests, and the pod's labels and annotations as constraints.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as WireQuantity;

use std::collections::BTreeMap;

use super::super::quantity::Quantity;
use super::{MAX_GPUS, MIG_RESOURCE_PREFIX, TranslateError, mig_profile_of};
use crate::config::{Config, Sharing};
use gpu_engine::mig::normalized;
use gpu_engine::{
    ContainerRequest, CpuMilli, GpuConstraints, GpuDemand, GpuPlacement, MemMiB, MigProfile,
    MigSlices, ModelPattern, PodKey, PodRequest, RequestError, TopologyPreference,
};

/// The `namespace/name` key of a pod.
pub fn pod_key(pod: &Pod) -> PodKey {
    PodKey::new(
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or_default(),
    )
}

// ---------------------------------------------------------------------------------------------
// Nodes
// ---------------------------------------------------------------------------------------------

/// What a pod asks of the GPU scheduler, or `None` when no container (app or init) asks for a
/// GPU resource or MIG slices. CPU and memory follow Kubernetes' rules (init containers,
/// sidecars, overhead, pod-level resources); GPU resources must be whole numbers. MIG slices
/// are the pod's, all containers together ([`pod_mig_request`]).
///
/// Restartable init containers (sidecars) run for the pod's whole life, so their GPUs are
/// listed with the app containers; ordinary init containers run one at a time and are listed
/// as init containers.
pub fn pod_request(pod: &Pod, cfg: &Config) -> Result<Option<PodRequest>, TranslateError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(None);
    };
    // Only an error when some container actually splits GPU memory.
    let gpu_count = pod_gpu_count(pod, cfg);
    let mut containers = Vec::with_capacity(spec.containers.len());
    let mut init_containers = Vec::new();
    for container in &spec.containers {
        containers.push(container_request(container, &gpu_count, cfg)?);
    }
    for container in spec.init_containers.iter().flatten() {
        let request = container_request(container, &gpu_count, cfg)?;
        if is_sidecar(container) {
            containers.push(request);
        } else {
            init_containers.push(request);
        }
    }
    let mig = pod_mig_request(pod)?;
    let wants_gpu = containers
        .iter()
        .chain(&init_containers)
        .any(|c| !c.gpu.is_none())
        || !mig.is_empty();
    if !wants_gpu {
        return Ok(None);
    }
    let (cpu, memory) = pod_host_request(pod)?;
    Ok(Some(PodRequest {
        cpu,
        memory,
        containers,
        init_containers,
        mig,
        constraints: pod_constraints(pod, cfg)?,
    }))
}

/// Whether any container (app or init) names a GPU resource of this configuration or a MIG
/// profile (`nvidia.com/mig-*`) in its requests or limits, even with a zero or invalid amount:
/// kube-scheduler's `IsInterested`.
pub fn names_gpu_resource(pod: &Pod, cfg: &Config) -> bool {
    let r = &cfg.resources;
    let names = [&r.whole_gpu, &r.gpu_mem, &r.gpu_core, &r.topology_gpu];
    let ours = |key: &String| names.contains(&key) || key.starts_with(MIG_RESOURCE_PREFIX);
    let names_one =
        |map: Option<&BTreeMap<String, WireQuantity>>| map.is_some_and(|m| m.keys().any(ours));
    pod.spec.iter().any(|spec| {
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .filter_map(|c| c.resources.as_ref())
            .any(|res| names_one(res.requests.as_ref()) || names_one(res.limits.as_ref()))
    })
}

/// The MIG slices the pod asks for: every `nvidia.com/mig-<profile>` any container (app or
/// init) names in its requests or limits, each counted by Kubernetes' rule for extended
/// resources (the larger of the app containers plus sidecars and the init-container peak), as
/// kube-scheduler counts them against the node's allocatable. Normalized; a profile asked 0
/// times is left out, as `nvidia.com/gpu: 0` asks for no GPU. A resource name of the prefix that
/// is no profile, or an amount that is not a whole non-negative number, is an error naming the
/// container.
pub fn pod_mig_request(pod: &Pod) -> Result<Vec<MigSlices>, TranslateError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(Vec::new());
    };
    let mut profiles: BTreeMap<&str, MigProfile> = BTreeMap::new();
    for container in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        let Some(resources) = container.resources.as_ref() else {
            continue;
        };
        let names = resources
            .requests
            .iter()
            .chain(resources.limits.iter())
            .flat_map(BTreeMap::keys);
        for name in names {
            match mig_profile_of(name) {
                None => {}
                Some(Ok(profile)) => {
                    profiles.insert(name, profile);
                }
                Some(Err(source)) => {
                    return Err(TranslateError::Request {
                        container: container.name.clone(),
                        source,
                    });
                }
            }
        }
    }
    let mut slices = Vec::with_capacity(profiles.len());
    for (resource, profile) in profiles {
        let [count] = containers_request(spec, |c| gpu_amount(c, resource).map(|n| [n]))?;
        // Saturated: a count past u32 is more than any node advertises, refused as such.
        slices.push(MigSlices::new(
            profile,
            u32::try_from(count).unwrap_or(u32::MAX),
        ));
    }
    Ok(normalized(slices))
}

/// What filter, prioritize and preempt place for `pod`: its GPU request, or, for a pod that asks
/// for no GPU while `policy.filterBestOnly` is on (`place_host_only`), its CPU and memory alone,
/// so that the policy places it too (a dedicated GPU kube-scheduler sends the extender every pod,
/// see docs/decisions/0006-filter-keeps-the-policys-choice.md). `Ok(None)`: no opinion.
pub fn placement_request(
    pod: &Pod,
    cfg: &Config,
    place_host_only: bool,
) -> Result<Option<PodRequest>, TranslateError> {
    match pod_request(pod, cfg)? {
        Some(request) => Ok(Some(request)),
        None if place_host_only => {
            let (cpu, memory) = pod_host_request(pod)?;
            Ok(Some(PodRequest::single(cpu, memory, GpuDemand::None)))
        }
        None => Ok(None),
    }
}

/// The pod's effective CPU and memory requests, as kube-scheduler computes them: the larger of
/// the app containers (plus sidecars) and the init-container peak, plus overhead; pod-level
/// resources replace the container sum when set.
pub fn pod_host_request(pod: &Pod) -> Result<(CpuMilli, MemMiB), TranslateError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok((CpuMilli(0), MemMiB(0)));
    };
    let amount = |resources: Option<&ResourceRequirements>,
                  container: &str|
     -> Result<(u64, u64), TranslateError> {
        let cpu = match resource(resources, "cpu") {
            Some(q) => parse_host(container, "cpu", q, 1000, 1)?,
            None => 0,
        };
        let mem = match resource(resources, "memory") {
            Some(q) => parse_host(container, "memory", q, 1, 1 << 20)?,
            None => 0,
        };
        Ok((cpu, mem))
    };
    let [cpu, mem] = containers_request(spec, |c| {
        amount(c.resources.as_ref(), &c.name).map(|(cpu, mem)| [cpu, mem])
    })?;
    let mut total = (cpu, mem);
    if let Some(pod_level) = spec.resources.as_ref() {
        let (cpu, mem) = amount(Some(pod_level), "(pod-level resources)")?;
        if resource(Some(pod_level), "cpu").is_some() {
            total.0 = cpu;
        }
        if resource(Some(pod_level), "memory").is_some() {
            total.1 = mem;
        }
    }
    if let Some(overhead) = spec.overhead.as_ref() {
        if let Some(q) = overhead.get("cpu") {
            total.0 = total
                .0
                .saturating_add(parse_host("(overhead)", "cpu", q, 1000, 1)?);
        }
        if let Some(q) = overhead.get("memory") {
            total.1 = total
                .1
                .saturating_add(parse_host("(overhead)", "memory", q, 1, 1 << 20)?);
        }
    }
    Ok((CpuMilli(total.0), MemMiB(total.1)))
}

/// The effective request of the pod's containers for `N` resources, by Kubernetes' rule: the
/// larger of the app containers plus sidecars and the init-container peak (a sidecar keeps
/// running, so it adds to every later init container and to the app containers). `amount` is
/// one container's request of each resource. Pod-level resources and overhead are not applied.
fn containers_request<const N: usize>(
    spec: &PodSpec,
    amount: impl Fn(&Container) -> Result<[u64; N], TranslateError>,
) -> Result<[u64; N], TranslateError> {
    let add = |a: [u64; N], b: [u64; N]| std::array::from_fn(|i| a[i].saturating_add(b[i]));
    let max = |a: [u64; N], b: [u64; N]| std::array::from_fn(|i| a[i].max(b[i]));
    let mut apps = [0; N];
    for c in &spec.containers {
        apps = add(apps, amount(c)?);
    }
    let mut sidecars = [0; N];
    let mut init_peak = [0; N];
    for c in spec.init_containers.iter().flatten() {
        let own = amount(c)?;
        if is_sidecar(c) {
            sidecars = add(sidecars, own);
            init_peak = max(init_peak, sidecars);
        } else {
            init_peak = max(init_peak, add(sidecars, own));
        }
    }
    Ok(max(add(apps, sidecars), init_peak))
}

/// The pod's effective request of an extended resource such as `nvidia.com/gpu` (a whole
/// number), as kube-scheduler's NodeResourcesFit counts it (the rule of `containers_request`); 0
/// when no container names it.
pub fn pod_resource_request(pod: &Pod, name: &str) -> Result<u64, TranslateError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(0);
    };
    containers_request(spec, |c| gpu_amount(c, name).map(|n| [n])).map(|[n]| n)
}

fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

/// A resource's request, or its limit when only the limit is set (the API server defaults the
/// request to the limit; the extender may see objects from before defaulting).
fn resource<'a>(
    resources: Option<&'a ResourceRequirements>,
    name: &str,
) -> Option<&'a WireQuantity> {
    let resources = resources?;
    resources
        .requests
        .as_ref()
        .and_then(|r| r.get(name))
        .or_else(|| resources.limits.as_ref().and_then(|l| l.get(name)))
}

/// Checks that `q` is a quantity the API server accepts for a container's `name` and not
/// negative: what the estimator asks of a template's resources that translation does not read.
pub fn check_amount(container: &str, name: &str, q: &WireQuantity) -> Result<(), TranslateError> {
    parse_host(container, name, q, 1, 1).map(drop)
}

fn parse_host(
    container: &str,
    name: &str,
    q: &WireQuantity,
    num: u128,
    den: u128,
) -> Result<u64, TranslateError> {
    Quantity::parse(&q.0)
        .and_then(|parsed| parsed.ceil_scaled(num, den))
        .map_err(|problem| TranslateError::Quantity {
            container: container.to_owned(),
            resource: name.to_owned(),
            value: q.0.clone(),
            problem,
        })
}

/// A GPU resource amount: a whole, non-negative number; 0 when absent.
fn gpu_amount(container: &Container, name: &str) -> Result<u64, TranslateError> {
    let Some(q) = resource(container.resources.as_ref(), name) else {
        return Ok(0);
    };
    let error = |problem| TranslateError::Quantity {
        container: container.name.clone(),
        resource: name.to_owned(),
        value: q.0.clone(),
        problem,
    };
    let parsed = Quantity::parse(&q.0).map_err(error)?;
    parsed.whole().map_err(error)
}

fn container_request(
    container: &Container,
    gpu_count: &Result<u64, TranslateError>,
    cfg: &Config,
) -> Result<ContainerRequest, TranslateError> {
    let r = &cfg.resources;
    let request_error = |source| TranslateError::Request {
        container: container.name.clone(),
        source,
    };
    let whole = gpu_amount(container, &r.whole_gpu)?;
    let topology = gpu_amount(container, &r.topology_gpu)?;
    let mem_gib = gpu_amount(container, &r.gpu_mem)?;
    let core = gpu_amount(container, &r.gpu_core)?;
    if mem_gib > 0
        && let Some(q) = resource(container.resources.as_ref(), &r.gpu_mem)
        && Quantity::parse(&q.0).is_ok_and(|parsed| parsed.is_binary())
    {
        let hami = r.sharing == Sharing::Hami;
        return Err(TranslateError::GpuMemoryUnit {
            container: container.name.clone(),
            resource: r.gpu_mem.clone(),
            value: q.0.clone(),
            unit: if hami { "MiB" } else { "GiB" },
            example: if hami { 3000 } else { 8 },
        });
    }
    if cfg.resources.sharing == Sharing::Hami {
        return hami_request(container, whole, topology, mem_gib, core, cfg);
    }
    let kinds = [whole > 0, topology > 0, mem_gib > 0 || core > 0]
        .iter()
        .filter(|&&k| k)
        .count();
    if kinds > 1 {
        return Err(request_error(RequestError::Conflicting(
            "ask for only one of whole GPUs, topology GPUs or a GPU share",
        )));
    }
    let gpu = if whole > 0 {
        GpuDemand::whole(whole)
    } else if topology > 0 {
        GpuDemand::topology(topology)
    } else {
        let core = if core > 0 {
            Some(u32::try_from(core).unwrap_or(u32::MAX))
        } else {
            None
        };
        let gpus = if mem_gib > 0 { gpu_count.clone()? } else { 1 };
        GpuDemand::share_under(mem_gib, gpus, core, r.share_rules())
    }
    .map_err(request_error)?;
    Ok(ContainerRequest {
        name: container.name.clone(),
        gpu,
    })
}

/// HAMi's memory share in percent of each card, which the engine cannot express: refused in
/// words under `resources.sharing: hami`.
pub const HAMI_MEM_PERCENTAGE: &str = "nvidia.com/gpumem-percentage";

/// One container's request under HAMi's semantics (`resources.sharing: hami`): `wholeGpu` is the
/// number of GPUs (1 when only memory or compute is named), `gpuMem` MiB on each, `gpuCore` a
/// percentage of each. Without memory HAMi gives the container all of each card's memory, so
/// `wholeGpu` alone, or with `gpuCore` alone unless `gpuCoreWithoutMemory`, asks for whole GPUs.
fn hami_request(
    container: &Container,
    whole: u64,
    topology: u64,
    mem_mib: u64,
    core: u64,
    cfg: &Config,
) -> Result<ContainerRequest, TranslateError> {
    let r = &cfg.resources;
    let request_error = |source| TranslateError::Request {
        container: container.name.clone(),
        source,
    };
    if gpu_amount(container, HAMI_MEM_PERCENTAGE)? > 0 {
        return Err(TranslateError::Unsupported {
            container: container.name.clone(),
            resource: HAMI_MEM_PERCENTAGE.to_owned(),
            instead: format!("ask for {} in MiB per GPU", r.gpu_mem),
        });
    }
    if topology > 0 && (whole > 0 || mem_mib > 0 || core > 0) {
        return Err(request_error(RequestError::Conflicting(
            "ask for either topology GPUs or HAMi GPUs (count, memory, cores)",
        )));
    }
    let core = (core > 0).then(|| u32::try_from(core).unwrap_or(u32::MAX));
    let gpu = if topology > 0 {
        GpuDemand::topology(topology)
    } else if mem_mib == 0 && (core.is_none() || !r.gpu_core_without_memory) {
        // A percentage alone still asks for a GPU: one, when no count is given.
        GpuDemand::whole(if core.is_some() { whole.max(1) } else { whole })
    } else {
        GpuDemand::share_per_gpu(MemMiB(mem_mib), whole.max(1), core, r.share_rules())
    }
    .map_err(request_error)?;
    Ok(ContainerRequest {
        name: container.name.clone(),
        gpu,
    })
}

/// The pod's `gpuCount` label: how many GPUs a memory share is split over (1 when absent).
fn pod_gpu_count(pod: &Pod, cfg: &Config) -> Result<u64, TranslateError> {
    let key = &cfg.resources.gpu_count;
    let Some(value) = pod.metadata.labels.as_ref().and_then(|l| l.get(key)) else {
        return Ok(1);
    };
    match value.trim().parse::<u64>() {
        Ok(0) | Err(_) => Err(TranslateError::PodLabel {
            key: key.clone(),
            value: value.clone(),
            problem: "expected a whole number of GPUs, at least 1".into(),
        }),
        Ok(n) if n > MAX_GPUS => Err(TranslateError::PodLabel {
            key: key.clone(),
            value: value.clone(),
            problem: "at most 64 GPUs".into(),
        }),
        Ok(n) => Ok(n),
    }
}

/// Model lists, minimum memory, placement override and topology wish from pod annotations.
fn pod_constraints(pod: &Pod, cfg: &Config) -> Result<GpuConstraints, TranslateError> {
    let keys = &cfg.annotations;
    let annotations = pod.metadata.annotations.as_ref();
    let get = |key: &str| {
        annotations
            .and_then(|a| a.get(key))
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    };
    let problem = |key: &str, problem: String| TranslateError::PodAnnotation {
        key: key.to_owned(),
        problem,
    };
    let models = |key: &str| -> Result<Vec<ModelPattern>, TranslateError> {
        let Some(list) = get(key) else {
            return Ok(Vec::new());
        };
        list.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| ModelPattern::parse(p).map_err(|e| problem(key, e.to_string())))
            .collect()
    };
    let min_memory = match get(&keys.min_gpu_memory) {
        None => None,
        Some(text) => {
            let parsed = Quantity::parse(text)
                .map_err(|e| problem(&keys.min_gpu_memory, format!("{text:?} {e}")))?;
            if !parsed.has_unit() {
                return Err(problem(
                    &keys.min_gpu_memory,
                    format!("{text:?} needs a unit, such as 40Gi or 40960Mi"),
                ));
            }
            let mib = parsed
                .ceil_scaled(1, 1 << 20)
                .map_err(|e| problem(&keys.min_gpu_memory, format!("{text:?} {e}")))?;
            Some(MemMiB(mib))
        }
    };
    let placement = match get(&keys.placement) {
        None => None,
        Some("binpack") => Some(GpuPlacement::Binpack),
        Some("spread") => Some(GpuPlacement::Spread),
        Some(other) => {
            return Err(problem(
                &keys.placement,
                format!("{other:?} is not a placement; expected binpack or spread"),
            ));
        }
    };
    let topology = match get(&keys.topology) {
        None => TopologyPreference::Any,
        Some("required") => TopologyPreference::Required,
        Some("preferred") => TopologyPreference::Preferred,
        Some(other) => {
            return Err(problem(
                &keys.topology,
                format!("{other:?} is not a topology wish; expected required or preferred"),
            ));
        }
    };
    Ok(GpuConstraints {
        include_models: models(&keys.model_include)?,
        exclude_models: models(&keys.model_exclude)?,
        min_memory_per_gpu: min_memory,
        placement,
        topology,
    })
}
