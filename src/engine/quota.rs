//! GPU quotas per namespace, the accounting of scheduler-plugins' `ElasticQuota`: each team
//! (namespace) has a guaranteed `min` and a ceiling `max` in whole GPUs, GPU memory and GPU
//! compute; what it uses is summed from the allocation table (bound pods and binds in flight).
//! A pod that would take its team past `max` is refused; use above `min` is borrowing, allowed
//! while GPUs are idle and reclaimed by teams under their `min`. Pure: quotas and tables in,
//! amounts and verdicts out.

use std::collections::BTreeMap;
use std::fmt;

use super::allocation::PodAllocation;
use super::model::PodKey;
use super::request::{GpuDemand, PodRequest};
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
/// limited), as an `ElasticQuota` in its namespace says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quota {
    /// The `ElasticQuota` object's name.
    pub name: String,
    pub namespace: String,
    pub min: Amounts,
    pub max: [Option<u64>; 3],
}

impl Quota {
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
                return Err(format!(
                    "GPU quota: namespace {} would exceed its ElasticQuota {} max ({}: {} used + {} requested > {})",
                    self.namespace,
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

/// The quotas in force, one per namespace, and those ignored with their reasons.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuotaSet {
    by_namespace: BTreeMap<String, Quota>,
    /// Reasons quotas were ignored (invalid or overlapping), for logs and `inspect`.
    pub problems: Vec<String>,
    /// The names the quotas were written in.
    pub names: QuotaNames,
}

impl QuotaSet {
    /// The quotas in force from `quotas` (every `ElasticQuota` seen): invalid ones and every
    /// quota of a namespace that has more than one are left out, with their reasons in
    /// `problems`, along with `unreadable` (quotas that could not be read at all).
    pub fn build(quotas: Vec<Quota>, unreadable: Vec<String>, names: &QuotaNames) -> Self {
        let mut problems = unreadable;
        let mut grouped: BTreeMap<String, Vec<Quota>> = BTreeMap::new();
        for quota in quotas {
            match quota.check(names) {
                Ok(()) => grouped
                    .entry(quota.namespace.clone())
                    .or_default()
                    .push(quota),
                Err(error) => problems.push(error.to_string()),
            }
        }
        let mut by_namespace = BTreeMap::new();
        for (namespace, mut quotas) in grouped {
            if quotas.len() == 1 {
                if let Some(quota) = quotas.pop() {
                    by_namespace.insert(namespace, quota);
                }
                continue;
            }
            quotas.sort_by(|a, b| a.name.cmp(&b.name));
            for pair in quotas.windows(2) {
                problems.push(
                    QuotaError::Overlap {
                        quota: format!("{namespace}/{}", pair[1].name),
                        namespace: namespace.clone(),
                        other: pair[0].name.clone(),
                    }
                    .to_string(),
                );
            }
        }
        Self {
            by_namespace,
            problems,
            names: names.clone(),
        }
    }

    /// The quota of `namespace`, if any.
    pub fn get(&self, namespace: &str) -> Option<&Quota> {
        self.by_namespace.get(namespace)
    }

    /// Every quota in force, by namespace.
    pub fn quotas(&self) -> impl Iterator<Item = &Quota> {
        self.by_namespace.values()
    }

    /// Whether no quota is in force.
    pub fn is_empty(&self) -> bool {
        self.by_namespace.is_empty()
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

/// What `namespace` holds in `table` (see [`usage`]).
pub fn usage_of(table: &Table, namespace: &str) -> Amounts {
    let mut used = Amounts::default();
    for (pod, entry) in table.pods() {
        if namespace_of(pod) == namespace && entry.allocation.has_gpus() {
            used.add(&Amounts::held_by(&entry.allocation));
        }
    }
    used
}

/// Whether a pod of `victim_namespace` may be preempted for a pod of `preemptor_namespace`
/// asking `asked`, as the capacity-scheduling plugin decides: a team claiming its guarantee
/// (within its `min` after the pod) may take from teams that borrow (above their `min`) and
/// from namespaces without a quota; a team at or above its `min` may only preempt its own
/// pods. Namespaces without a quota preempt as kube-scheduler proposes.
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
    if victim_namespace == preemptor_namespace {
        return true;
    }
    let zero = Amounts::default();
    let used = usage.get(preemptor_namespace).unwrap_or(&zero);
    if !own.within_min(used, asked) {
        return false;
    }
    match quotas.get(victim_namespace) {
        None => true,
        Some(theirs) => theirs.borrows(usage.get(victim_namespace).unwrap_or(&zero)),
    }
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
    use crate::engine::{CpuMilli, GpuMode, MemMiB, NodeSpec, Policy, fit};
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
        assert_eq!(usage_of(&table, "a"), used["a"]);
        assert!(usage_of(&table, "c").is_zero());
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

    proptest! {
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
                prop_assert_eq!(usage_of(&table, ns).get(QuotaResource::WholeGpus), expected);
                let q = quota(ns, "q", 0, Some(max));
                let asked = Amounts::requested_by(&whole(ask));
                let admitted = q.admit(&usage_of(&table, ns), &asked, &names()).is_ok();
                prop_assert_eq!(admitted, expected + ask <= max);
            }
        }
    }
}
