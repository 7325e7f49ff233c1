//! Why a pod does or does not fit each node right now: first the refusals of kube-scheduler's own
//! node-level filters, which the caller works out from the Node and Pod objects (the extender
//! never sees a node they refuse), then the engine's own fit on a table snapshot, and for a
//! rejection the numbers behind it (which GPU comes closest and by how much). Pure: the
//! `explain` command loads the table, the refusals and the pod and prints what this returns.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use gpu_engine::fit::allowed_mask;
use gpu_engine::topology::positions;
use gpu_engine::{
    GpuDemand, MigSlices, NodeState, PodAllocation, PodRequest, Policy, RejectReason,
    ScoringPolicy, Table,
};

/// Who refuses a node that the GPU engine itself refuses.
pub const ENGINE_LAYER: &str = "gpu-extender";

/// A refusal by one of kube-scheduler's node-level filters, which run before the extender.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedulerRefusal {
    /// The filter plugin, as kube-scheduler names it (`NodeResourcesFit`, `TaintToleration`, ...).
    pub layer: &'static str,
    /// kube-scheduler's reason and the numbers behind it.
    pub detail: String,
    /// Whether waiting (or preemption) could lift it.
    pub resolvable: bool,
}

/// The verdict for one node.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeVerdict {
    pub node: String,
    pub fits: bool,
    /// Which check refuses the node, when it does not fit: a kube-scheduler filter plugin
    /// (`NodeUnschedulable`, `TaintToleration`, `NodeAffinity`, `NodeResourcesFit`) or
    /// [`ENGINE_LAYER`].
    pub layer: Option<String>,
    /// The engine's rejection code (`gpu_extender_rejections_total`'s `reason`), when the engine
    /// refuses the node.
    pub reason: Option<String>,
    /// What fits, or the numbers behind the rejection, in words.
    pub detail: String,
    /// Whether waiting (or preemption) could make it fit; `None` when it fits.
    pub resolvable: Option<bool>,
}

/// For every node of `table` (sorted by name), whether `request` fits now and why not: a node in
/// `refused` (by name) is refused by that kube-scheduler filter before the engine is asked.
pub fn explain(
    table: &Table,
    request: &PodRequest,
    policy: &Policy,
    refused: &BTreeMap<String, SchedulerRefusal>,
) -> Vec<NodeVerdict> {
    let mut verdicts: Vec<NodeVerdict> = table
        .nodes()
        .map(|node| {
            let name = node.spec.name.to_string();
            if let Some(refusal) = refused.get(&name) {
                return NodeVerdict {
                    node: name,
                    fits: false,
                    layer: Some(refusal.layer.to_owned()),
                    reason: None,
                    detail: format!("kube-scheduler {}: {}", refusal.layer, refusal.detail),
                    resolvable: Some(refusal.resolvable),
                };
            }
            // The policy's verdict, as filter's: the placement, and FGD+'s hold on top of it.
            match policy.evaluate(node, request) {
                Ok(evaluation) => NodeVerdict {
                    node: name,
                    fits: true,
                    layer: None,
                    reason: None,
                    detail: if request.mig.is_empty() {
                        format!(
                            "fits: would get {}",
                            describe_allocation(&evaluation.allocation)
                        )
                    } else {
                        format!(
                            "fits: would get {}; {}",
                            describe_allocation(&evaluation.allocation),
                            mig_basis(node, request, policy, evaluation.score)
                        )
                    },
                    resolvable: None,
                },
                Err(reason) => NodeVerdict {
                    node: name,
                    fits: false,
                    layer: Some(ENGINE_LAYER.to_owned()),
                    reason: Some(reason.code().to_owned()),
                    detail: format!(
                        "{ENGINE_LAYER}: {}: {}",
                        reason.message(),
                        closest(node, request, reason)
                    ),
                    resolvable: Some(reason.is_resolvable()),
                },
            }
        })
        .collect();
    verdicts.sort_by(|a, b| a.node.cmp(&b.node));
    verdicts
}

/// The GPUs of an allocation in words: `GPU0 (whole), GPU1 (8 GiB)`, then its MIG slices
/// (`2 MIG 1g.10gb slice(s)`).
pub fn describe_allocation(allocation: &PodAllocation) -> String {
    let holds = allocation.footprint();
    if holds.is_empty() && allocation.mig.is_empty() {
        return "no GPU".to_owned();
    }
    holds
        .iter()
        .map(|hold| {
            if hold.whole {
                format!("GPU{} (whole)", hold.gpu.0)
            } else if hold.compute.0 > 0 {
                format!(
                    "GPU{} ({}, {}% compute)",
                    hold.gpu.0,
                    gib(hold.mem.0),
                    hold.compute.0 / 10
                )
            } else {
                format!("GPU{} ({})", hold.gpu.0, gib(hold.mem.0))
            }
        })
        .chain(allocation.mig.iter().map(describe_slices))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Slices of one MIG profile in words: `2 MIG 1g.10gb slice(s)`.
fn describe_slices(slices: &MigSlices) -> String {
    format!("{} MIG {} slice(s)", slices.count, slices.profile)
}

/// What a MIG pod's score on a node that takes it rests on ([`gpu_engine::policy::mig`]):
/// whether the node's slices are in use, and how many of each asked profile stay free after.
fn mig_basis(node: &NodeState, request: &PodRequest, policy: &Policy, score: f64) -> String {
    let held: u32 = node.mig_held.iter().map(|slices| slices.count).sum();
    let in_use = if held == 0 {
        "no MIG slice in use on the node".to_owned()
    } else {
        format!("{held} MIG slice(s) in use on the node")
    };
    let left: Vec<String> = request
        .mig
        .iter()
        .map(|asked| {
            format!(
                "{} {} left free after",
                node.mig_free(&asked.profile).saturating_sub(asked.count),
                asked.profile
            )
        })
        .collect();
    let order = match policy.scoring {
        ScoringPolicy::Spread => {
            "spread ranks nodes without slices in use first, then the most left"
        }
        _ => "slices are packed onto nodes whose slices are in use first, then the fewest left",
    };
    format!(
        "score {score:.1} ({}): {in_use}, {}; {order}",
        policy.scoring.as_str(),
        left.join(", ")
    )
}

/// The request in words, for the heading of the explanation.
pub fn describe_request(request: &PodRequest) -> String {
    let mut out = String::new();
    let demands: Vec<String> = request
        .all_containers()
        .filter(|c| !c.gpu.is_none())
        .map(|c| format!("{}: {}", c.name, describe_demand(c.gpu)))
        .chain(request.mig.iter().map(describe_slices))
        .collect();
    let _ = write!(
        out,
        "{}; cpu {}m, memory {}",
        demands.join(", "),
        request.cpu.0,
        gib(request.memory.0)
    );
    let constraints = &request.constraints;
    if !constraints.include_models.is_empty() {
        let _ = write!(out, "; models {:?}", constraints.include_models);
    }
    if !constraints.exclude_models.is_empty() {
        let _ = write!(out, "; not models {:?}", constraints.exclude_models);
    }
    if let Some(min) = constraints.min_memory_per_gpu {
        let _ = write!(out, "; GPUs of at least {}", gib(min.0));
    }
    out
}

fn describe_demand(demand: GpuDemand) -> String {
    match demand {
        GpuDemand::None => "no GPU".to_owned(),
        GpuDemand::Whole { count } => format!("{count} whole GPU(s)"),
        GpuDemand::Topology { count } => format!("{count} well-connected whole GPU(s)"),
        GpuDemand::Share {
            gpus,
            mem_per_gpu,
            compute_per_gpu,
        } if compute_per_gpu.0 > 0 => format!(
            "{} and {}% compute on each of {gpus} GPU(s)",
            gib(mem_per_gpu.0),
            compute_per_gpu.0 / 10
        ),
        GpuDemand::Share {
            gpus, mem_per_gpu, ..
        } => format!("{} on each of {gpus} GPU(s)", gib(mem_per_gpu.0)),
    }
}

/// The numbers behind `reason` on `node`: how close the node comes.
fn closest(node: &NodeState, request: &PodRequest, reason: RejectReason) -> String {
    let demand = request.primary_demand();
    let usable = allowed_mask(node, &request.constraints);
    let healthy_usable = usable & node.healthy_mask();
    match reason {
        RejectReason::NoGpus => "the node reports no GPUs".to_owned(),
        RejectReason::ModeMismatch => format!(
            "the node's GPUs are in mode {}, the pod asks for {}",
            node.spec.mode.as_str(),
            describe_demand(demand)
        ),
        RejectReason::ModelMismatch => format!("the node has {}", models(node)),
        RejectReason::GpuMemoryTooSmall => {
            let largest = node.spec.gpus.iter().map(|gpu| gpu.memory.0).max();
            format!(
                "its largest GPU has {}, the pod needs {} per GPU",
                gib(largest.unwrap_or(0)),
                gib(needed_memory(request, demand))
            )
        }
        RejectReason::TooFewGpus => format!(
            "{} GPU(s) the pod may use, it needs {}",
            usable.count_ones(),
            demand.gpu_count()
        ),
        RejectReason::UnhealthyGpus => format!(
            "{} of the {} GPU(s) the pod may use are healthy, it needs {}",
            healthy_usable.count_ones(),
            usable.count_ones(),
            demand.gpu_count()
        ),
        RejectReason::HostTooSmall => format!(
            "the node has {}m CPU and {} memory allocatable, the pod asks {}m and {}",
            node.spec.cpu.0,
            gib(node.spec.memory.0),
            request.cpu.0,
            gib(request.memory.0)
        ),
        RejectReason::InsufficientCpu => format!(
            "{}m CPU free, the pod asks {}m ({}m short)",
            node.cpu_free().0,
            request.cpu.0,
            request.cpu.0.saturating_sub(node.cpu_free().0)
        ),
        RejectReason::InsufficientMemory => format!(
            "{} memory free, the pod asks {} ({} short)",
            gib(node.mem_free().0),
            gib(request.memory.0),
            gib(request.memory.0.saturating_sub(node.mem_free().0))
        ),
        RejectReason::TooManyPods => {
            format!("{} pods of at most {}", node.pods, node.spec.max_pods)
        }
        RejectReason::NoFreeWholeGpus | RejectReason::NoConnectedGroup => {
            let free = (node.idle_mask() & usable).count_ones();
            format!(
                "{free} of the {} usable GPU(s) are free, the pod needs {} ({} short{})",
                healthy_usable.count_ones(),
                demand.gpu_count(),
                u32::from(demand.gpu_count()).saturating_sub(free),
                if reason == RejectReason::NoConnectedGroup {
                    ", or no well-connected group among the free ones"
                } else {
                    ""
                }
            )
        }
        RejectReason::HostHeldForGpus => format!(
            "{}m CPU and {} memory free beside {} idle GPU(s); the pod asks {}m and {} and no GPU",
            node.cpu_free().0,
            gib(node.mem_free().0),
            node.idle_mask().count_ones(),
            request.cpu.0,
            gib(request.memory.0)
        ),
        RejectReason::InsufficientGpuMemory
        | RejectReason::InsufficientGpuCompute
        | RejectReason::SharedGpuPodLimit => closest_share(node, request, demand, usable),
        RejectReason::NoMigSlices | RejectReason::InsufficientMigSlices => {
            closest_mig(node, request)
        }
    }
}

/// For MIG slices that do not fit: each profile the pod asks for that the node cannot give, with
/// how many slices of it the node advertises and has free, then what the node advertises.
fn closest_mig(node: &NodeState, request: &PodRequest) -> String {
    let mut parts: Vec<String> = request
        .mig
        .iter()
        .filter(|asked| node.mig_free(&asked.profile) < asked.count)
        .map(|asked| {
            let free = node.mig_free(&asked.profile);
            format!(
                "{free} of {} MIG {} slice(s) free, the pod needs {} ({} short)",
                node.mig_advertised(&asked.profile),
                asked.profile,
                asked.count,
                asked.count - free
            )
        })
        .collect();
    parts.push(format!("the node advertises {}", mig_pools(node)));
    parts.join("; ")
}

/// The node's MIG slices in words: `1g.10gb x7 (2 free), 3g.40gb x2 (2 free)`.
fn mig_pools(node: &NodeState) -> String {
    if node.spec.mig.is_empty() {
        return "no MIG slices".to_owned();
    }
    node.spec
        .mig
        .iter()
        .map(|pool| {
            format!(
                "{} x{} ({} free)",
                pool.profile,
                pool.count,
                node.mig_free(&pool.profile)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// For a share that does not fit: the usable healthy GPU with the most free memory (or compute),
/// and how far it is from the request.
fn closest_share(node: &NodeState, request: &PodRequest, demand: GpuDemand, usable: u64) -> String {
    let GpuDemand::Share {
        gpus,
        mem_per_gpu,
        compute_per_gpu,
    } = demand
    else {
        return format!("the pod asks for {}", describe_demand(demand));
    };
    let candidates: Vec<usize> = positions(usable & node.healthy_mask())
        .filter(|&p| p < node.gpus.len())
        .collect();
    // Reversed so that among equals the lowest index is named, as `inspect` lists them first.
    let best = candidates
        .into_iter()
        .rev()
        .max_by_key(|&p| (node.gpu_mem_free(p), node.gpu_compute_free(p)));
    let Some(best) = best else {
        return "no healthy GPU the pod may use".to_owned();
    };
    let index = node.spec.gpus[best].index.0;
    let free_mem = node.gpu_mem_free(best).0;
    let free_compute = node.gpu_compute_free(best).0;
    let shares = node.gpus[best].shares;
    let mut detail = format!(
        "closest is GPU{index} with {} of {} free",
        gib(free_mem),
        gib(node.spec.gpus[best].memory.0)
    );
    if compute_per_gpu.0 > 0 {
        let _ = write!(detail, " and {}% compute free", free_compute / 10);
    }
    let _ = write!(
        detail,
        ", {shares} pod(s) on it; the pod needs {} per GPU",
        gib(mem_per_gpu.0)
    );
    if compute_per_gpu.0 > 0 {
        let _ = write!(detail, " and {}% compute", compute_per_gpu.0 / 10);
    }
    if gpus > 1 {
        let _ = write!(detail, " on {gpus} GPUs");
    }
    let _ = write!(
        detail,
        " ({} short",
        gib(needed_memory(request, demand).saturating_sub(free_mem))
    );
    if compute_per_gpu.0 > free_compute {
        let _ = write!(
            detail,
            ", {}% compute short",
            (compute_per_gpu.0 - free_compute) / 10
        );
    }
    detail.push(')');
    detail
}

/// Memory per GPU the pod needs: the share's, or the minimum it asks for.
fn needed_memory(request: &PodRequest, demand: GpuDemand) -> u64 {
    match demand {
        GpuDemand::Share { mem_per_gpu, .. } => mem_per_gpu.0,
        _ => request
            .constraints
            .min_memory_per_gpu
            .map_or(0, |min| min.0),
    }
}

/// The node's GPU models in words.
fn models(node: &NodeState) -> String {
    let mut models: Vec<&str> = node
        .spec
        .gpus
        .iter()
        .map(|gpu| gpu.model.as_str())
        .collect();
    models.sort_unstable();
    models.dedup();
    format!("GPU model(s) {}", models.join(", "))
}

/// MiB in GiB, without decimals when whole; below 1 GiB in MiB.
fn gib(mib: u64) -> String {
    if mib > 0 && mib < 1024 {
        format!("{mib} MiB")
    } else if mib.is_multiple_of(1024) {
        format!("{} GiB", mib / 1024)
    } else {
        format!("{:.1} GiB", mib as f64 / 1024.0)
    }
}

/// The explanation as aligned text: a heading, then one line per node.
pub fn to_text(pod: &str, request: &PodRequest, verdicts: &[NodeVerdict]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Pod {pod} asks for {}", describe_request(request));
    let fitting = verdicts.iter().filter(|v| v.fits).count();
    let _ = writeln!(
        out,
        "Fits {fitting} of {} node(s) now (kube-scheduler's cordon, taint, node affinity and GPU \
         resource-count filters, then the extender's GPU, CPU, memory and pod-count checks; \
         kube-scheduler's other filters, such as ports and volumes, are not evaluated).",
        verdicts.len()
    );
    let width = verdicts
        .iter()
        .map(|v| v.node.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(out, "{:<width$}  FITS  WHY", "NODE");
    for verdict in verdicts {
        let _ = writeln!(
            out,
            "{:<width$}  {:<4}  {}",
            verdict.node,
            if verdict.fits { "yes" } else { "no" },
            verdict.detail
        );
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on a broken fixture")]

    use super::*;
    use crate::inspect::fixtures::{add_mig_node, add_node, bind, bind_mig, mig};
    use gpu_engine::{CpuMilli, GpuMode, MemMiB};

    fn table() -> Table {
        let mut table = Table::new(20);
        add_node(&mut table, "t4", GpuMode::ShareMemory, 2, "Tesla-T4", 16);
        add_node(
            &mut table,
            "whole",
            GpuMode::Exclusive,
            1,
            "NVIDIA-A100",
            40,
        );
        bind(
            &mut table,
            "t4",
            "a",
            GpuDemand::share(10, 1, None).unwrap(),
        );
        bind(
            &mut table,
            "t4",
            "b",
            GpuDemand::share(12, 1, None).unwrap(),
        );
        table
    }

    #[test]
    fn a_share_too_big_for_what_is_free_names_the_closest_gpu_and_the_shortfall() {
        let request = PodRequest::single(
            CpuMilli(0),
            MemMiB(0),
            GpuDemand::share(8, 1, None).unwrap(),
        );
        let verdicts = explain(&table(), &request, &Policy::default(), &BTreeMap::new());
        assert_eq!(verdicts.len(), 2);
        let t4 = &verdicts[0];
        assert!(!t4.fits);
        assert_eq!(t4.reason.as_deref(), Some("insufficient_gpu_memory"));
        // 16 - 10 = 6 GiB free on one GPU, 16 - 12 = 4 GiB on the other.
        assert!(t4.detail.contains("closest is GPU"), "{}", t4.detail);
        assert!(t4.detail.contains("6 GiB of 16 GiB free"), "{}", t4.detail);
        assert!(t4.detail.contains("(2 GiB short)"), "{}", t4.detail);
        let whole = &verdicts[1];
        assert_eq!(whole.reason.as_deref(), Some("mode_mismatch"));
        assert_eq!(whole.resolvable, Some(false));
    }

    #[test]
    fn a_fitting_pod_says_which_gpus_it_would_get() {
        let request = PodRequest::single(
            CpuMilli(0),
            MemMiB(0),
            GpuDemand::share(4, 1, None).unwrap(),
        );
        let verdicts = explain(&table(), &request, &Policy::default(), &BTreeMap::new());
        assert!(verdicts[0].fits);
        assert!(
            verdicts[0].detail.starts_with("fits: would get GPU"),
            "{}",
            verdicts[0].detail
        );
        let text = to_text("ns/p", &request, &verdicts);
        assert!(text.contains("Fits 1 of 2 node(s)"), "{text}");
        assert!(text.contains("4 GiB on each of 1 GPU(s)"), "{text}");
    }

    /// A pending MIG pod: the node without the profile is refused for good with what it
    /// advertises, the full node for now with the shortfall, and the nodes that fit say what
    /// their score rests on.
    #[test]
    fn a_mig_pod_is_judged_node_by_node_with_its_score_basis() {
        let mut table = Table::new(20);
        add_mig_node(&mut table, "fresh", &[("1g.10gb", 7)]);
        add_mig_node(&mut table, "used", &[("1g.10gb", 7)]);
        add_mig_node(&mut table, "full", &[("1g.10gb", 1)]);
        add_mig_node(&mut table, "other", &[("3g.40gb", 2)]);
        bind_mig(&mut table, "used", "a", &[("1g.10gb", 2)]);
        bind_mig(&mut table, "full", "b", &[("1g.10gb", 1)]);
        let request = PodRequest::single(CpuMilli(0), MemMiB(0), GpuDemand::None)
            .with_mig(mig(&[("1g.10gb", 1)]));
        let verdicts = explain(&table, &request, &Policy::default(), &BTreeMap::new());
        let detail = |node: &str| {
            verdicts
                .iter()
                .find(|v| v.node == node)
                .map(|v| (v.fits, v.reason.clone(), v.detail.clone()))
                .unwrap()
        };
        let (fits, _, used) = detail("used");
        assert!(fits);
        assert!(
            used.starts_with("fits: would get 1 MIG 1g.10gb slice(s); score ")
                && used.contains("2 MIG slice(s) in use on the node, 4 1g.10gb left free after"),
            "{used}"
        );
        let (_, _, fresh) = detail("fresh");
        assert!(
            fresh.contains("no MIG slice in use on the node, 6 1g.10gb left free after"),
            "{fresh}"
        );
        let (fits, reason, full) = detail("full");
        assert!(!fits);
        assert_eq!(reason.as_deref(), Some("insufficient_mig_slices"));
        assert!(
            full.contains("0 of 1 MIG 1g.10gb slice(s) free, the pod needs 1 (1 short)"),
            "{full}"
        );
        let (_, reason, other) = detail("other");
        assert_eq!(reason.as_deref(), Some("no_mig_slices"));
        assert!(
            other.ends_with("the node advertises 3g.40gb x2 (2 free)"),
            "{other}"
        );
        let text = to_text("ns/p", &request, &verdicts);
        assert!(text.contains("asks for 1 MIG 1g.10gb slice(s)"), "{text}");
        assert!(text.contains("Fits 2 of 4 node(s)"), "{text}");
    }

    #[test]
    fn whole_gpus_report_how_many_are_free() {
        let mut table = table();
        bind(&mut table, "whole", "w", GpuDemand::whole(1).unwrap());
        let request = PodRequest::single(CpuMilli(0), MemMiB(0), GpuDemand::whole(1).unwrap());
        let verdicts = explain(&table, &request, &Policy::default(), &BTreeMap::new());
        let whole = &verdicts[1];
        assert_eq!(whole.reason.as_deref(), Some("no_free_whole_gpus"));
        assert!(
            whole
                .detail
                .contains("0 of the 1 usable GPU(s) are free, the pod needs 1 (1 short)"),
            "{}",
            whole.detail
        );
    }
}
