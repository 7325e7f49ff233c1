//! GPU quotas per team, the accounting of scheduler-plugins' `ElasticQuota`: each team (a
//! namespace, or a group of namespaces) has a guaranteed `min` and a ceiling `max` in whole GPUs,
//! GPU memory and GPU compute; what it uses is summed from the allocation table (bound pods and
//! binds in flight). A pod that would take its team past `max` is refused; use above `min` is
//! borrowing, allowed while GPUs are idle and reclaimed by teams under their `min`
//! ([`choose_reclaim`] picks the borrowers' pods to evict). Pure: quotas and tables in, amounts
//! and verdicts out.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::allocation::PodAllocation;
use super::fit::fit;
use super::model::{NodeName, PodKey};
use super::policy::Policy;
use super::request::{GpuDemand, PodRequest};
use super::state::NodeState;
use super::table::Table;

/// What a quota counts. The names users write for them are configuration
/// ([`QuotaNames`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QuotaResource {
    /// Whole GPUs (`nvidia.com/gpu`, and whole GPUs chosen by topology).
    WholeGpus,
    /// GPU memory held by shares, in MiB (written in GiB, as pods request it).
    GpuMemMiB,
    /// GPU compute held by shares, in milli-GPU (written in percent of one GPU, as pods request
    /// it).
    GpuComputeMilli,
}

impl QuotaResource {
    /// Every resource, in report order.
    pub const ALL: [Self; 3] = [Self::WholeGpus, Self::GpuMemMiB, Self::GpuComputeMilli];

    fn index(self) -> usize {
        self as usize
    }
}

/// The resource names quotas are written in (the pods' request names, from the configuration).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuotaNames {
    pub whole_gpu: String,
    pub gpu_mem: String,
    pub gpu_core: String,
}

impl QuotaNames {
    /// The name users write for `resource`.
    pub fn name(&self, resource: QuotaResource) -> &str {
        match resource {
            QuotaResource::WholeGpus => &self.whole_gpu,
            QuotaResource::GpuMemMiB => &self.gpu_mem,
            QuotaResource::GpuComputeMilli => &self.gpu_core,
        }
    }

    /// `amount` of `resource` as a number in the unit users write it in (whole GPUs, GiB,
    /// percent of one GPU), for metrics.
    pub fn in_user_units(resource: QuotaResource, amount: u64) -> f64 {
        match resource {
            QuotaResource::WholeGpus => amount as f64,
            QuotaResource::GpuMemMiB => amount as f64 / 1024.0,
            QuotaResource::GpuComputeMilli => amount as f64 / 10.0,
        }
    }

    /// `amount` of `resource` in the unit users write it in (whole GPUs, GiB, percent).
    pub fn show(resource: QuotaResource, amount: u64) -> String {
        match resource {
            QuotaResource::WholeGpus => amount.to_string(),
            QuotaResource::GpuMemMiB if amount.is_multiple_of(1024) => format!("{}", amount / 1024),
            QuotaResource::GpuMemMiB => format!("{:.2}", amount as f64 / 1024.0),
            QuotaResource::GpuComputeMilli if amount.is_multiple_of(10) => {
                format!("{}", amount / 10)
            }
            QuotaResource::GpuComputeMilli => format!("{:.1}", amount as f64 / 10.0),
        }
    }
}

/// An amount of each [`QuotaResource`] (whole GPUs, MiB, milli-GPU).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Amounts([u64; 3]);

impl Amounts {
    /// The amount of `resource`.
    pub fn get(&self, resource: QuotaResource) -> u64 {
        self.0[resource.index()]
    }

    /// Sets the amount of `resource`.
    pub fn set(&mut self, resource: QuotaResource, amount: u64) {
        self.0[resource.index()] = amount;
    }

    /// Adds `other`, saturating.
    pub fn add(&mut self, other: &Amounts) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0) {
            *mine = mine.saturating_add(theirs);
        }
    }

    /// Subtracts `other`, stopping at zero.
    pub fn sub(&mut self, other: &Amounts) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0) {
            *mine = mine.saturating_sub(theirs);
        }
    }

    /// Whether every amount is zero.
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|&a| a == 0)
    }

    /// What a placed pod holds: whole GPUs it holds alone, and the memory and compute of its
    /// shares (init containers by Kubernetes' rule, as [`PodAllocation::footprint`] counts them).
    pub fn held_by(allocation: &PodAllocation) -> Self {
        let mut held = Self::default();
        for hold in allocation.footprint() {
            if hold.whole {
                held.0[0] += 1;
            } else {
                held.0[1] += hold.mem.0;
                held.0[2] += u64::from(hold.compute.0);
            }
        }
        held
    }

    /// What a pod asks for, counted as [`Amounts::held_by`] counts its placement: app containers
    /// together, or the largest init container where that is more, per resource.
    pub fn requested_by(request: &PodRequest) -> Self {
        let one = |demand: &GpuDemand| {
            let mut amounts = Self::default();
            match *demand {
                GpuDemand::None => {}
                GpuDemand::Whole { count } | GpuDemand::Topology { count } => {
                    amounts.0[0] = u64::from(count);
                }
                GpuDemand::Share {
                    gpus,
                    mem_per_gpu,
                    compute_per_gpu,
                } => {
                    amounts.0[1] = mem_per_gpu.0.saturating_mul(u64::from(gpus));
                    amounts.0[2] = u64::from(compute_per_gpu.0) * u64::from(gpus);
                }
            }
            amounts
        };
        let mut apps = Self::default();
        for container in &request.containers {
            apps.add(&one(&container.gpu));
        }
        for init in &request.init_containers {
            let alone = one(&init.gpu);
            for (app, single) in apps.0.iter_mut().zip(alone.0) {
                *app = (*app).max(single);
            }
        }
        apps
    }
}

/// One team's quota: guaranteed `min`, ceiling `max` (a resource absent from `max` is not
/// limited), as an `ElasticQuota` in its namespace says. It covers its own namespace and the
/// namespaces in `also` (a group), whose pods it counts together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quota {
    /// The `ElasticQuota` object's name.
    pub name: String,
    pub namespace: String,
    pub min: Amounts,
    pub max: [Option<u64>; 3],
    /// Further namespaces the quota covers, beside its own (none for a plain `ElasticQuota`).
    pub also: Vec<String>,
}

impl Quota {
    /// A quota `q` on `namespace` guaranteeing `min` whole GPUs with no maximum: what the
    /// reclaim and preemption tests build teams from.
    #[cfg(any(test, feature = "fixtures"))]
    pub fn whole_gpus_min(namespace: &str, min: u64) -> Self {
        let mut amounts = Amounts::default();
        amounts.set(QuotaResource::WholeGpus, min);
        Self {
            name: "q".into(),
            namespace: namespace.into(),
            min: amounts,
            max: [None; 3],
            also: Vec::new(),
        }
    }

    /// Every namespace the quota covers: its own first, then the group's others.
    pub fn namespaces(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.namespace.as_str()).chain(self.also.iter().map(String::as_str))
    }

    /// Whether the quota covers `namespace`.
    pub fn covers(&self, namespace: &str) -> bool {
        self.namespaces().any(|covered| covered == namespace)
    }

    /// What the quota's namespaces use together, from per-namespace `usage` ([`usage`]).
    pub fn used(&self, usage: &BTreeMap<String, Amounts>) -> Amounts {
        let mut used = Amounts::default();
        for namespace in self.namespaces() {
            if let Some(amounts) = usage.get(namespace) {
                used.add(amounts);
            }
        }
        used
    }

    /// What the quota's namespaces hold in `table`.
    pub fn used_in(&self, table: &Table) -> Amounts {
        let mut used = Amounts::default();
        for (pod, entry) in table.pods() {
            if entry.allocation.has_gpus() && self.covers(namespace_of(pod)) {
                used.add(&Amounts::held_by(&entry.allocation));
            }
        }
        used
    }

    /// `namespace/name`, how messages name the quota.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The ceiling for `resource`, `None` when unlimited.
    pub fn max(&self, resource: QuotaResource) -> Option<u64> {
        self.max[resource.index()]
    }

    /// Why the quota cannot be used: a `min` above its `max`.
    pub fn check(&self, names: &QuotaNames) -> Result<(), QuotaError> {
        for resource in QuotaResource::ALL {
            if let Some(max) = self.max(resource)
                && self.min.get(resource) > max
            {
                return Err(QuotaError::MinAboveMax {
                    quota: format!("{}/{}", self.namespace, self.name),
                    resource: names.name(resource).to_owned(),
                    min: QuotaNames::show(resource, self.min.get(resource)),
                    max: QuotaNames::show(resource, max),
                });
            }
        }
        Ok(())
    }

    /// Whether `used` is above `min` in any resource: the team borrows.
    pub fn borrows(&self, used: &Amounts) -> bool {
        QuotaResource::ALL
            .iter()
            .any(|&r| used.get(r) > self.min.get(r))
    }

    /// Whether `used` plus `asked` stays within `min` in every resource `asked` needs: the team
    /// claims its guarantee.
    pub fn within_min(&self, used: &Amounts, asked: &Amounts) -> bool {
        QuotaResource::ALL.iter().all(|&r| {
            asked.get(r) == 0 || used.get(r).saturating_add(asked.get(r)) <= self.min.get(r)
        })
    }

    /// How much of `used` is above `min`, per resource.
    pub fn borrowed(&self, used: &Amounts) -> Amounts {
        let mut borrowed = *used;
        borrowed.sub(&self.min);
        borrowed
    }

    /// `Err` with the reason when `asked` on top of `used` would pass `max` in a resource it
    /// needs.
    pub fn admit(&self, used: &Amounts, asked: &Amounts, names: &QuotaNames) -> Result<(), String> {
        for resource in QuotaResource::ALL {
            let (Some(max), want) = (self.max(resource), asked.get(resource)) else {
                continue;
            };
            let have = used.get(resource);
            if want > 0 && have.saturating_add(want) > max {
                let whom = if self.also.is_empty() {
                    format!("namespace {}", self.namespace)
                } else {
                    format!(
                        "namespaces {}",
                        self.namespaces().collect::<Vec<_>>().join(",")
                    )
                };
                return Err(format!(
                    "GPU quota: {whom} would exceed {} ElasticQuota {} max ({}: {} used + {} requested > {})",
                    if self.also.is_empty() { "its" } else { "their" },
                    self.name,
                    names.name(resource),
                    QuotaNames::show(resource, have),
                    QuotaNames::show(resource, want),
                    QuotaNames::show(resource, max),
                ));
            }
        }
        Ok(())
    }
}

/// Why a quota is ignored. Messages are logged and shown by `inspect`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    #[error("ElasticQuota {quota}: min {resource} {min} is above max {max}; quota ignored")]
    MinAboveMax {
        quota: String,
        resource: String,
        min: String,
        max: String,
    },
    #[error(
        "ElasticQuota {quota}: namespace {namespace} already has ElasticQuota {other}; both ignored until one is removed"
    )]
    Overlap {
        quota: String,
        namespace: String,
        other: String,
    },
}

/// The quotas in force, at most one per namespace, and those ignored with their reasons.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuotaSet {
    /// In force, by their own namespace and name.
    in_force: Vec<Quota>,
    /// Each covered namespace's quota, as a position in `in_force`.
    by_namespace: BTreeMap<String, usize>,
    /// Reasons quotas were ignored (invalid or overlapping), for logs and `inspect`.
    pub problems: Vec<String>,
    /// The names the quotas were written in.
    pub names: QuotaNames,
}

impl QuotaSet {
    /// The quotas in force from `quotas` (every `ElasticQuota` seen): invalid ones and every
    /// quota covering a namespace another quota covers too (its own or in a group) are left out,
    /// with their reasons in `problems`, along with `unreadable` (quotas that could not be read
    /// at all).
    pub fn build(quotas: Vec<Quota>, unreadable: Vec<String>, names: &QuotaNames) -> Self {
        let mut problems = unreadable;
        let mut valid: Vec<Quota> = Vec::new();
        for quota in quotas {
            match quota.check(names) {
                Ok(()) => valid.push(quota),
                Err(error) => problems.push(error.to_string()),
            }
        }
        valid.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        let mut claims: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (index, quota) in valid.iter().enumerate() {
            for namespace in quota.namespaces().collect::<BTreeSet<_>>() {
                claims.entry(namespace).or_default().push(index);
            }
        }
        let mut overlapping: BTreeSet<usize> = BTreeSet::new();
        for (namespace, claimants) in &claims {
            for pair in claimants.windows(2) {
                let (first, second) = (&valid[pair[0]], &valid[pair[1]]);
                let other = if first.namespace == second.namespace {
                    first.name.clone()
                } else {
                    first.full_name()
                };
                problems.push(
                    QuotaError::Overlap {
                        quota: second.full_name(),
                        namespace: (*namespace).to_owned(),
                        other,
                    }
                    .to_string(),
                );
            }
            if claimants.len() > 1 {
                overlapping.extend(claimants.iter().copied());
            }
        }
        let in_force: Vec<Quota> = valid
            .into_iter()
            .enumerate()
            .filter(|(index, _)| !overlapping.contains(index))
            .map(|(_, quota)| quota)
            .collect();
        let mut by_namespace = BTreeMap::new();
        for (index, quota) in in_force.iter().enumerate() {
            for namespace in quota.namespaces() {
                by_namespace.insert(namespace.to_owned(), index);
            }
        }
        Self {
            in_force,
            by_namespace,
            problems,
            names: names.clone(),
        }
    }

    /// The quota of `namespace`, if any.
    pub fn get(&self, namespace: &str) -> Option<&Quota> {
        self.by_namespace
            .get(namespace)
            .and_then(|&index| self.in_force.get(index))
    }

    /// Every quota in force, by its own namespace.
    pub fn quotas(&self) -> impl Iterator<Item = &Quota> {
        self.in_force.iter()
    }

    /// Whether no quota is in force.
    pub fn is_empty(&self) -> bool {
        self.in_force.is_empty()
    }

    /// Whether `namespace` is under a quota that borrows (uses more than its `min`) in `usage`.
    pub fn borrows(&self, usage: &BTreeMap<String, Amounts>, namespace: &str) -> bool {
        self.get(namespace)
            .is_some_and(|quota| quota.borrows(&quota.used(usage)))
    }
}

/// The namespace part of a pod key (`namespace/name`).
pub fn namespace_of(pod: &PodKey) -> &str {
    pod.as_str().split_once('/').map_or("", |(ns, _)| ns)
}

/// What each namespace holds in `table` (bound pods and reservations of binds in flight);
/// namespaces holding no GPU are left out.
pub fn usage(table: &Table) -> BTreeMap<String, Amounts> {
    let mut used: BTreeMap<String, Amounts> = BTreeMap::new();
    for (pod, entry) in table.pods() {
        if !entry.allocation.has_gpus() {
            continue;
        }
        let held = Amounts::held_by(&entry.allocation);
        match used.get_mut(namespace_of(pod)) {
            Some(amounts) => amounts.add(&held),
            None => {
                used.insert(namespace_of(pod).to_owned(), held);
            }
        }
    }
    used
}

/// Whether a pod of `victim_namespace` may be preempted for a pod of `preemptor_namespace`
/// asking `asked`, as the capacity-scheduling plugin decides: a team claiming its guarantee
/// (within its `min` after the pod) may take from teams that borrow (above their `min`) and
/// from namespaces without a quota; a team at or above its `min` may only preempt its own
/// pods (those of any namespace its quota covers). Namespaces without a quota preempt as
/// kube-scheduler proposes.
pub fn may_preempt(
    quotas: &QuotaSet,
    usage: &BTreeMap<String, Amounts>,
    preemptor_namespace: &str,
    asked: &Amounts,
    victim_namespace: &str,
) -> bool {
    let Some(own) = quotas.get(preemptor_namespace) else {
        return true;
    };
    if own.covers(victim_namespace) {
        return true;
    }
    if !own.within_min(&own.used(usage), asked) {
        return false;
    }
    quotas.get(victim_namespace).is_none() || quotas.borrows(usage, victim_namespace)
}

/// Whether preempting victims that hold `freed` brings a team asking `asked` back within its
/// `max` (capacity-scheduling's last check on a node: a team still past its `max` after its
/// victims go gains nothing from preempting). Victims of other teams free nothing of its own,
/// so `freed` counts only the team's own victims.
pub fn back_within_max(
    quota: &Quota,
    used: &Amounts,
    freed: &Amounts,
    asked: &Amounts,
    names: &QuotaNames,
) -> bool {
    let mut after = *used;
    after.sub(freed);
    quota.admit(&after, asked, names).is_ok()
}

/// The fewest of `victims` (in the order given) whose removal from `node` lets the policy place
/// `request` ([`Policy::places`]: it fits, and FGD+ does not hold the node's host) and satisfies
/// `enough` (told the victims removed), or `None` when even all of them do not.
/// Victims are spared from the end of the list: the caller lists the ones it would rather keep
/// last.
pub fn victims_needed<'a>(
    node: &NodeState,
    victims: &'a [PodAllocation],
    request: &PodRequest,
    policy: &Policy,
    enough: impl Fn(&[&PodAllocation]) -> bool,
) -> Option<Vec<&'a PodAllocation>> {
    let mut freed = node.clone();
    for victim in victims {
        freed.remove(victim);
    }
    let mut kept: Vec<bool> = vec![true; victims.len()];
    let chosen = |kept: &[bool]| -> Vec<&'a PodAllocation> {
        victims
            .iter()
            .zip(kept)
            .filter(|(_, keep)| **keep)
            .map(|(victim, _)| victim)
            .collect()
    };
    if !policy.places(&freed, request) || !enough(&chosen(&kept)) {
        return None;
    }
    for index in (0..victims.len()).rev() {
        let mut trial = freed.clone();
        trial.add(&victims[index]);
        kept[index] = false;
        if policy.places(&trial, request) && enough(&chosen(&kept)) {
            freed = trial;
        } else {
            kept[index] = true;
        }
    }
    Some(chosen(&kept))
}

/// Pods to evict so that a pod of a team under its guarantee gets GPUs that borrowers hold,
/// all on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reclaim {
    pub node: NodeName,
    /// In eviction order: lowest priority, then newest, first.
    pub victims: Vec<PodKey>,
}

/// What [`choose_reclaim`] needs to know of the waiting pod.
#[derive(Clone, Copy, Debug)]
pub struct Claimant<'a> {
    pub namespace: &'a str,
    pub request: &'a PodRequest,
}

/// The borrowers' pods to evict for `claimant`, given what each namespace uses (`used`, from
/// [`usage`] of `table`, computed once for many claimants), the capacity-scheduling plugin's
/// reclaim done
/// where kube-scheduler cannot propose it (borrowers of equal or higher priority are never
/// offered to an extender as victims):
///
/// - only for a pod whose team has a quota and stays within its `min` with the pod (the caller
///   asks for pods kube-scheduler found no node for);
/// - never on a node where the pod fits already: there, what keeps it away is not GPUs (a node
///   selector, a taint), and evicting would free nothing it can use;
/// - victims are pods of other teams whose quota borrows (uses above its `min`); namespaces
///   without a quota are never evicted for a quota;
/// - on one node, not in `excluded` (where a PodDisruptionBudget refused lately), the fewest
///   victims, taken lowest priority then newest first (`rank`, smaller goes first; `None` for a
///   pod not to be chosen, one already being evicted), whose removal makes the pod fit by the
///   engine's own [`fit`];
/// - among nodes: fewest victims, then the lowest highest-ranked victim, then node name.
pub fn choose_reclaim<O: Ord>(
    table: &Table,
    quotas: &QuotaSet,
    used: &BTreeMap<String, Amounts>,
    claimant: Claimant<'_>,
    policy: &Policy,
    excluded: &BTreeSet<NodeName>,
    rank: impl Fn(&PodKey) -> Option<O>,
) -> Option<Reclaim> {
    let own = quotas.get(claimant.namespace)?;
    let asked = Amounts::requested_by(claimant.request);
    if asked.is_zero() || !own.within_min(&own.used(used), &asked) {
        return None;
    }
    let mut best: Option<(usize, O, Reclaim)> = None;
    for node in table.nodes() {
        let name = &node.spec.name;
        if excluded.contains(name) || fit(node, claimant.request, policy).is_ok() {
            continue;
        }
        let mut candidates: Vec<(O, &PodKey, &PodAllocation)> = table
            .pods_on(name)
            .filter(|(pod, entry)| {
                let namespace = namespace_of(pod);
                entry.allocation.has_gpus()
                    && !own.covers(namespace)
                    && quotas.borrows(used, namespace)
            })
            .filter_map(|(pod, entry)| Some((rank(pod)?, pod, &entry.allocation)))
            .collect();
        if candidates.is_empty() {
            continue;
        }
        candidates.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
        let allocations: Vec<PodAllocation> =
            candidates.iter().map(|(_, _, a)| (*a).clone()).collect();
        let Some(needed) = victims_needed(node, &allocations, claimant.request, policy, |_| true)
        else {
            continue;
        };
        let mut victims = Vec::new();
        let mut highest = None;
        for ((rank, pod, _), allocation) in candidates.into_iter().zip(&allocations) {
            if needed.iter().any(|n| std::ptr::eq(*n, allocation)) {
                victims.push(pod.clone());
                highest = Some(rank);
            }
        }
        let Some(highest) = highest else {
            continue;
        };
        let better = best
            .as_ref()
            .is_none_or(|(count, rank, _)| (victims.len(), &highest) < (*count, rank));
        if better {
            best = Some((
                victims.len(),
                highest,
                Reclaim {
                    node: name.clone(),
                    victims,
                },
            ));
        }
    }
    best.map(|(_, _, reclaim)| reclaim)
}

impl fmt::Display for QuotaResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::WholeGpus => "whole_gpus",
            Self::GpuMemMiB => "gpu_memory_mib",
            Self::GpuComputeMilli => "gpu_compute_milli",
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test fixtures")]
    use super::*;
    use crate::{CpuMilli, GpuMode, MemMiB, NodeSpec, Policy, fit};
    use proptest::prelude::*;

    fn names() -> QuotaNames {
        QuotaNames {
            whole_gpu: "nvidia.com/gpu".into(),
            gpu_mem: "aliyun.com/gpu-mem".into(),
            gpu_core: "aliyun.com/gpu-core.percentage".into(),
        }
    }

    fn quota(ns: &str, name: &str, min: u64, max: Option<u64>) -> Quota {
        let mut amounts = Amounts::default();
        amounts.set(QuotaResource::WholeGpus, min);
        Quota {
            name: name.into(),
            namespace: ns.into(),
            min: amounts,
            max: [max, None, None],
            also: Vec::new(),
        }
    }

    fn whole(n: u64) -> PodRequest {
        PodRequest::single(CpuMilli(100), MemMiB(64), GpuDemand::whole(n).unwrap())
    }

    fn table_with(pods: &[(&str, u64)]) -> Table {
        let mut table = Table::rebuild(
            20,
            [NodeSpec::uniform(
                "n",
                GpuMode::Exclusive,
                8,
                "A100",
                MemMiB(80 * 1024),
            )],
            [],
        );
        for (i, (ns, n)) in pods.iter().enumerate() {
            let placed = fit(
                table.node_by_str("n").unwrap(),
                &whole(*n),
                &Policy::default(),
            );
            table
                .reserve(PodKey::new(ns, &format!("p{i}")), placed.unwrap(), 1)
                .unwrap();
        }
        table
    }

    #[test]
    fn usage_sums_each_namespaces_gpus() {
        let table = table_with(&[("a", 2), ("b", 1), ("a", 1)]);
        let used = usage(&table);
        assert_eq!(used["a"].get(QuotaResource::WholeGpus), 3);
        assert_eq!(used["b"].get(QuotaResource::WholeGpus), 1);
        assert_eq!(quota("a", "q", 0, None).used_in(&table), used["a"]);
        assert!(quota("c", "q", 0, None).used_in(&table).is_zero());
    }

    #[test]
    fn shares_count_memory_and_compute() {
        let request = PodRequest::single(
            CpuMilli(100),
            MemMiB(64),
            GpuDemand::share(8, 2, Some(30)).unwrap(),
        );
        let asked = Amounts::requested_by(&request);
        assert_eq!(asked.get(QuotaResource::GpuMemMiB), 8 * 1024);
        assert_eq!(asked.get(QuotaResource::GpuComputeMilli), 600);
        assert_eq!(asked.get(QuotaResource::WholeGpus), 0);
        assert_eq!(QuotaNames::show(QuotaResource::GpuMemMiB, 8 * 1024), "8");
        assert_eq!(QuotaNames::show(QuotaResource::GpuComputeMilli, 600), "60");
    }

    #[test]
    fn admit_refuses_past_max_and_allows_borrowing() {
        let q = quota("a", "team-a", 2, Some(4));
        let mut used = Amounts::default();
        used.set(QuotaResource::WholeGpus, 3);
        assert!(
            q.admit(&used, &Amounts::requested_by(&whole(1)), &names())
                .is_ok()
        );
        assert!(q.borrows(&used), "3 used is above min 2");
        let reason = q
            .admit(&used, &Amounts::requested_by(&whole(2)), &names())
            .unwrap_err();
        assert_eq!(
            reason,
            "GPU quota: namespace a would exceed its ElasticQuota team-a max (nvidia.com/gpu: 3 used + 2 requested > 4)"
        );
        // A pod asking for nothing the quota limits is never refused.
        let share = PodRequest::single(
            CpuMilli(1),
            MemMiB(1),
            GpuDemand::share(4, 1, None).unwrap(),
        );
        used.set(QuotaResource::WholeGpus, 9);
        assert!(
            q.admit(&used, &Amounts::requested_by(&share), &names())
                .is_ok()
        );
    }

    #[test]
    fn bad_quotas_are_ignored_with_reasons() {
        let set = QuotaSet::build(
            vec![
                quota("a", "ok", 1, Some(2)),
                quota("b", "inverted", 3, Some(2)),
                quota("c", "one", 1, None),
                quota("c", "two", 1, None),
            ],
            vec!["unreadable one".into()],
            &names(),
        );
        assert!(set.get("a").is_some());
        assert!(set.get("b").is_none());
        assert!(set.get("c").is_none());
        assert_eq!(set.quotas().count(), 1);
        assert_eq!(set.problems.len(), 3);
        assert!(
            set.problems.iter().any(|p| p
                == "ElasticQuota b/inverted: min nvidia.com/gpu 3 is above max 2; quota ignored")
        );
        assert!(
            set.problems
                .iter()
                .any(|p| p.contains("namespace c already has"))
        );
    }

    #[test]
    fn preemption_follows_the_guarantees() {
        let set = QuotaSet::build(
            vec![quota("a", "qa", 4, Some(8)), quota("b", "qb", 2, Some(8))],
            Vec::new(),
            &names(),
        );
        let table = table_with(&[("a", 1), ("b", 5)]);
        let used = usage(&table);
        let two = Amounts::requested_by(&whole(2));
        // a (1 used, min 4) claims its guarantee: b borrows (5 > 2), so b's pods may go.
        assert!(may_preempt(&set, &used, "a", &two, "b"));
        assert!(may_preempt(&set, &used, "a", &two, "no-quota"));
        // b is above its min: only its own pods.
        assert!(!may_preempt(&set, &used, "b", &two, "a"));
        assert!(may_preempt(&set, &used, "b", &two, "b"));
        // a asking past its min preempts nobody else.
        let four = Amounts::requested_by(&whole(4));
        assert!(!may_preempt(&set, &used, "a", &four, "b"));
        // b under its min would not take from a, which does not borrow.
        let light = usage(&table_with(&[("a", 3)]));
        assert!(!may_preempt(&set, &light, "b", &two, "a"));
        assert!(may_preempt(&set, &light, "none", &two, "a"));
    }

    /// A table of 4-GPU exclusive nodes with `pods` (node, namespace, name, GPUs) placed.
    fn cluster(nodes: &[&str], pods: &[(&str, &str, &str, u64)]) -> Table {
        let mut table = Table::rebuild(
            20,
            nodes.iter().map(|name| {
                NodeSpec::uniform(name, GpuMode::Exclusive, 4, "A100", MemMiB(80 * 1024))
            }),
            [],
        );
        for (node, ns, name, n) in pods {
            let placed = fit(
                table.node_by_str(node).unwrap(),
                &whole(*n),
                &Policy::default(),
            )
            .unwrap();
            table.reserve(PodKey::new(ns, name), placed, 1).unwrap();
        }
        table
    }

    fn grouped(ns: &str, name: &str, also: &[&str], min: u64, max: Option<u64>) -> Quota {
        Quota {
            also: also.iter().map(|s| (*s).to_owned()).collect(),
            ..quota(ns, name, min, max)
        }
    }

    #[test]
    fn a_group_counts_its_namespaces_together_and_may_not_overlap() {
        let set = QuotaSet::build(
            vec![
                grouped("a", "qa", &["a2", "a3"], 1, Some(3)),
                quota("b", "qb", 0, None),
                grouped("c", "qc", &["b"], 0, None),
            ],
            Vec::new(),
            &names(),
        );
        assert_eq!(set.get("a2").map(|q| q.name.as_str()), Some("qa"));
        assert!(set.get("b").is_none() && set.get("c").is_none());
        assert_eq!(
            set.problems,
            [
                "ElasticQuota c/qc: namespace b already has ElasticQuota b/qb; both ignored until one is removed"
            ]
        );
        let table = table_with(&[("a", 1), ("a2", 1), ("x", 2)]);
        let qa = set.get("a3").unwrap();
        assert_eq!(qa.used_in(&table).get(QuotaResource::WholeGpus), 2);
        assert_eq!(qa.used(&usage(&table)), qa.used_in(&table));
        let reason = qa
            .admit(
                &qa.used_in(&table),
                &Amounts::requested_by(&whole(2)),
                &names(),
            )
            .unwrap_err();
        assert_eq!(
            reason,
            "GPU quota: namespaces a,a2,a3 would exceed their ElasticQuota qa max (nvidia.com/gpu: 2 used + 2 requested > 3)"
        );
        // Pods of the group are its own: a3 may preempt a2's pods, like a namespace its own.
        let two = Amounts::requested_by(&whole(2));
        assert!(may_preempt(&set, &usage(&table), "a3", &two, "a2"));
        assert!(!may_preempt(&set, &usage(&table), "a3", &two, "x"));
    }

    #[test]
    fn past_max_only_own_victims_that_bring_the_team_back_within_max_count() {
        let q = quota("a", "qa", 0, Some(4));
        let mut used = Amounts::default();
        used.set(QuotaResource::WholeGpus, 4);
        let two = Amounts::requested_by(&whole(2));
        let mut freed = Amounts::default();
        freed.set(QuotaResource::WholeGpus, 1);
        assert!(!back_within_max(&q, &used, &freed, &two, &names()));
        freed.set(QuotaResource::WholeGpus, 2);
        assert!(back_within_max(&q, &used, &freed, &two, &names()));
    }

    #[test]
    fn reclaim_takes_borrowers_lowest_priority_then_newest_on_one_node() {
        // a: min 4, uses 0. b: min 1, uses 5 (borrows). c: no quota. d: min 4, uses 1 (within).
        let set = QuotaSet::build(
            vec![
                quota("a", "qa", 4, Some(8)),
                quota("b", "qb", 1, Some(8)),
                quota("d", "qd", 4, Some(8)),
            ],
            Vec::new(),
            &names(),
        );
        let table = cluster(
            &["n1", "n2"],
            &[
                ("n1", "b", "old", 1),
                ("n1", "b", "new", 1),
                ("n1", "c", "free-rider", 1),
                ("n1", "d", "guaranteed", 1),
                ("n2", "b", "big", 3),
                ("n2", "c", "other", 1),
            ],
        );
        let ages: BTreeMap<&str, (i32, std::cmp::Reverse<i64>)> = [
            ("b/old", (0, std::cmp::Reverse(1))),
            ("b/new", (0, std::cmp::Reverse(2))),
            ("b/big", (5, std::cmp::Reverse(0))),
        ]
        .into();
        let rank = |pod: &PodKey| Some(ages.get(pod.as_str()).copied().unwrap_or_default());
        let request = whole(1);
        let claimant = Claimant {
            namespace: "a",
            request: &request,
        };
        let policy = Policy::default();
        let none = BTreeSet::new();
        let chosen =
            choose_reclaim(&table, &set, &usage(&table), claimant, &policy, &none, rank).unwrap();
        // One victim either way; n1's lowest-ranked borrower is newer than "old": "new" goes.
        assert_eq!(chosen.node.as_str(), "n1");
        assert_eq!(chosen.victims, [PodKey::new("b", "new")]);
        // Two GPUs: n1 holds only two borrowers' GPUs... and so does n2's one pod of three.
        let request = whole(2);
        let claimant = Claimant {
            namespace: "a",
            request: &request,
        };
        let chosen =
            choose_reclaim(&table, &set, &usage(&table), claimant, &policy, &none, rank).unwrap();
        assert_eq!(chosen.node.as_str(), "n2", "one victim beats two");
        assert_eq!(chosen.victims, [PodKey::new("b", "big")]);
        // n2 refused (a PodDisruptionBudget): n1, both borrowers.
        let refused = BTreeSet::from([NodeName::new("n2")]);
        let chosen = choose_reclaim(
            &table,
            &set,
            &usage(&table),
            claimant,
            &policy,
            &refused,
            rank,
        )
        .unwrap();
        assert_eq!(chosen.victims.len(), 2);
        // A pod already being evicted is not chosen again.
        let busy = |pod: &PodKey| (pod.as_str() != "b/big").then(|| rank(pod)).flatten();
        let chosen =
            choose_reclaim(&table, &set, &usage(&table), claimant, &policy, &none, busy).unwrap();
        assert_eq!(chosen.node.as_str(), "n1");
        // d is within its min too, but asks past it: no reclaim. b borrows: none for it either.
        let four = whole(4);
        for (namespace, request) in [("d", &four), ("b", &request), ("c", &request)] {
            let claimant = Claimant { namespace, request };
            assert_eq!(
                choose_reclaim(&table, &set, &usage(&table), claimant, &policy, &none, rank),
                None,
                "{namespace}"
            );
        }
        // Three GPUs for a: no node frees that much from borrowers alone.
        let three = whole(3);
        let claimant = Claimant {
            namespace: "a",
            request: &three,
        };
        assert_eq!(
            choose_reclaim(&table, &set, &usage(&table), claimant, &policy, &none, rank)
                .map(|r| r.node.to_string()),
            Some("n2".to_owned()),
            "n2: big (3) frees 3 with the 0 free"
        );
    }

    #[test]
    fn no_reclaim_on_a_node_the_pod_fits_already() {
        let set = QuotaSet::build(
            vec![quota("a", "qa", 4, None), quota("b", "qb", 0, None)],
            Vec::new(),
            &names(),
        );
        // n1: a borrower holds 2 of 4; the pod asking 2 fits there, and not on n2.
        let table = cluster(&["n1", "n2"], &[("n1", "b", "p", 2), ("n2", "b", "q", 4)]);
        let request = whole(2);
        let claimant = Claimant {
            namespace: "a",
            request: &request,
        };
        let rank = |_: &PodKey| Some(0);
        let policy = Policy::default();
        let chosen = choose_reclaim(
            &table,
            &set,
            &usage(&table),
            claimant,
            &policy,
            &BTreeSet::new(),
            rank,
        );
        assert_eq!(chosen.map(|r| r.node.to_string()), Some("n2".to_owned()));
        let n2 = BTreeSet::from([NodeName::new("n2")]);
        assert_eq!(
            choose_reclaim(&table, &set, &usage(&table), claimant, &policy, &n2, rank),
            None
        );
    }

    proptest! {
        /// Whatever the mix, a reclaim's victims are all borrowers outside the claimant's team,
        /// on one node, and evicting them really makes the pod fit there; none of them could be
        /// spared.
        #[test]
        fn reclaims_free_room_from_borrowers_only(
            pods in proptest::collection::vec((0usize..2, 0usize..3, 1u64..3), 0..8),
            mins in proptest::collection::vec(0u64..5, 3),
            ask in 1u64..5,
        ) {
            let namespaces = ["a", "b", "c"];
            let nodes = ["n1", "n2"];
            let mut free = [4u64, 4];
            let mut placed = Vec::new();
            for (i, (node, ns, n)) in pods.into_iter().enumerate() {
                if free[node] >= n {
                    free[node] -= n;
                    placed.push((nodes[node], namespaces[ns], format!("p{i}"), n));
                }
            }
            let rows: Vec<(&str, &str, &str, u64)> =
                placed.iter().map(|(a, b, c, d)| (*a, *b, c.as_str(), *d)).collect();
            let table = cluster(&nodes, &rows);
            let set = QuotaSet::build(
                namespaces.iter().zip(&mins).map(|(ns, min)| quota(ns, "q", *min, None)).collect(),
                Vec::new(),
                &names(),
            );
            let request = whole(ask);
            let claimant = Claimant { namespace: "a", request: &request };
            let policy = Policy::default();
            let rank = |pod: &PodKey| Some(pod.clone());
            let used = usage(&table);
            let none = BTreeSet::new();
            if let Some(reclaim) = choose_reclaim(&table, &set, &used, claimant, &policy, &none, rank) {
                let qa = set.get("a").unwrap();
                prop_assert!(qa.within_min(&qa.used(&used), &Amounts::requested_by(&request)));
                let mut node = table.node(&reclaim.node).unwrap().clone();
                prop_assert!(fit(&node, &request, &policy).is_err());
                for victim in &reclaim.victims {
                    let entry = table.pod(victim).unwrap();
                    prop_assert_eq!(&entry.allocation.node, &reclaim.node);
                    prop_assert!(namespace_of(victim) != "a");
                    prop_assert!(set.borrows(&used, namespace_of(victim)));
                    node.remove(&entry.allocation);
                }
                prop_assert!(fit(&node, &request, &policy).is_ok());
                for victim in &reclaim.victims {
                    let mut spared = node.clone();
                    spared.add(&table.pod(victim).unwrap().allocation);
                    prop_assert!(fit(&spared, &request, &policy).is_err(), "{} was not needed", victim);
                }
            }
        }

        /// Usage is the sum of what each pod holds, whatever the mix, and admitting a pod
        /// never lets a namespace pass its max.
        #[test]
        fn usage_is_additive_and_admit_bounds(
            pods in proptest::collection::vec((0usize..3, 1u64..3), 0..6),
            max in 0u64..9,
            ask in 1u64..4,
        ) {
            let namespaces = ["a", "b", "c"];
            let mut placed: Vec<(&str, u64)> = Vec::new();
            let mut total = 0;
            for (ns, n) in pods {
                if total + n <= 8 {
                    total += n;
                    placed.push((namespaces[ns], n));
                }
            }
            let table = table_with(&placed);
            let used = usage(&table);
            let sum: u64 = used.values().map(|a| a.get(QuotaResource::WholeGpus)).sum();
            prop_assert_eq!(sum, total);
            for ns in namespaces {
                let expected: u64 = placed.iter().filter(|p| p.0 == ns).map(|p| p.1).sum();
                let q = quota(ns, "q", 0, Some(max));
                prop_assert_eq!(q.used_in(&table).get(QuotaResource::WholeGpus), expected);
                let asked = Amounts::requested_by(&whole(ask));
                let admitted = q.admit(&q.used_in(&table), &asked, &names()).is_ok();
                prop_assert_eq!(admitted, expected + ask <= max);
            }
        }
    }

    #[test]
    fn no_victim_is_named_for_a_pod_fgd_plus_would_still_hold() {
        use crate::policy::fgd_plus_held_and_unheld;
        use crate::{GpuDemand, GpuMode, MemMiB, NodeSpec, model::CpuMilli};
        // A 4-GPU node of 16 cores, one GPU pod of 4 cores on it; the typical pod asks 4 cores
        // per GPU. Evicting the GPU pod leaves an idle node, which FGD+ keeps for GPU pods: a
        // pod asking for no GPU gains nothing from it.
        let (held, unheld) = fgd_plus_held_and_unheld(CpuMilli(4000));
        let mut node = NodeState::new(
            NodeSpec::uniform("n", GpuMode::Exclusive, 4, "A100", MemMiB(80 * 1024)).with_host(
                CpuMilli(16_000),
                MemMiB(64 * 1024),
                110,
            ),
        );
        let gpu_pod = PodRequest::single(CpuMilli(4000), MemMiB(0), GpuDemand::Whole { count: 1 });
        let victim = fit(&node, &gpu_pod, &held).unwrap();
        node.add(&victim);
        let victims = [victim];
        let cpu_only = PodRequest::single(CpuMilli(13_000), MemMiB(0), GpuDemand::None);
        assert!(victims_needed(&node, &victims, &cpu_only, &held, |_| true).is_none());
        assert_eq!(
            victims_needed(&node, &victims, &cpu_only, &unheld, |_| true).map(|v| v.len()),
            Some(1)
        );
    }
}
