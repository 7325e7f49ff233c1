//! The quotas in force on the shared state: the set the `ElasticQuota` watcher last built, the
//! filter's admission check against the live table, and the per-quota report that metrics and
//! `inspect` show ([`crate::inspect::quota_reports`]). The accounting itself is the pure
//! [`gpu_engine::quota`].

use std::sync::Arc;

use crate::inspect::{self, ClusterReport, QuotaReport};
use gpu_engine::PodRequest;
use gpu_engine::quota::{Amounts, QuotaNames, QuotaSet, usage};

use super::cluster::ClusterState;
use super::snapshot::Snapshot;

impl ClusterState {
    /// Replaces the quotas in force (the `ElasticQuota` watcher's call).
    pub fn set_quotas(&self, quotas: QuotaSet) {
        *self.quotas.write() = Arc::new(quotas);
    }

    /// The quotas in force.
    pub fn quotas(&self) -> Arc<QuotaSet> {
        Arc::clone(&self.quotas.read())
    }

    /// Every quota in force with what its namespace uses now, by namespace.
    pub fn quota_reports(&self) -> Vec<QuotaReport> {
        let quotas = self.quotas();
        if quotas.is_empty() {
            return Vec::new();
        }
        let used = usage(&self.read());
        inspect::quota_reports(&quotas, &used)
    }

    /// The inspection report of the live table with the quotas in force (the `/inspect`
    /// endpoint and the `inspect` command).
    pub fn report(&self) -> ClusterReport {
        let quotas = self.quotas();
        let table = self.read();
        let mut report = inspect::report(&table);
        report.quotas = inspect::quota_reports(&quotas, &usage(&table));
        drop(table);
        report.ignored_quotas = quotas.problems.clone();
        report.rejected_records = self.rejected_records();
        match self.dra_report() {
            Some(dra) => report.with_dra(dra),
            None => report,
        }
    }
}

impl Snapshot<'_> {
    /// `Err` with the reason when placing `request` would take `namespace` past its quota's
    /// max (counting every namespace the quota covers); `Ok` when it stays within, or the
    /// namespace has no quota.
    pub fn quota_admit(
        &self,
        namespace: &str,
        request: &PodRequest,
        names: &QuotaNames,
    ) -> Result<(), String> {
        let Some(quota) = self.quotas.get(namespace) else {
            return Ok(());
        };
        let used = quota.used_in(&self.table);
        quota.admit(&used, &Amounts::requested_by(request), names)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test fixtures")]
    use super::*;
    use gpu_engine::quota::{Quota, QuotaResource};
    use gpu_engine::{CpuMilli, GpuDemand, GpuMode, MemMiB, NodeSpec, PodKey, Policy, Table, fit};

    fn names() -> QuotaNames {
        QuotaNames {
            whole_gpu: "nvidia.com/gpu".into(),
            gpu_mem: "aliyun.com/gpu-mem".into(),
            gpu_core: "aliyun.com/gpu-core.percentage".into(),
        }
    }

    fn whole(n: u64) -> PodRequest {
        PodRequest::single(CpuMilli(100), MemMiB(64), GpuDemand::whole(n).unwrap())
    }

    #[test]
    fn admission_and_reports_follow_the_table() {
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
        let placed = fit(
            table.node_by_str("n").unwrap(),
            &whole(3),
            &Policy::default(),
        )
        .unwrap();
        table.reserve(PodKey::new("a", "p"), placed, 1).unwrap();
        let state = ClusterState::with_table(table);
        assert!(state.quota_reports().is_empty());
        assert!(
            Snapshot::of(&state, Arc::new(Policy::default()))
                .quota_admit("a", &whole(8), &names())
                .is_ok(),
            "no quota"
        );
        let mut min = Amounts::default();
        min.set(QuotaResource::WholeGpus, 2);
        state.set_quotas(QuotaSet::build(
            vec![Quota {
                name: "qa".into(),
                namespace: "a".into(),
                min,
                max: [Some(4), None, None],
                also: Vec::new(),
            }],
            vec!["ElasticQuota x/y: no spec; quota ignored".into()],
            &names(),
        ));
        assert!(
            Snapshot::of(&state, Arc::new(Policy::default()))
                .quota_admit("a", &whole(1), &names())
                .is_ok()
        );
        let reason = Snapshot::of(&state, Arc::new(Policy::default()))
            .quota_admit("a", &whole(2), &names())
            .unwrap_err();
        assert!(reason.contains("3 used + 2 requested > 4"), "{reason}");
        assert!(
            Snapshot::of(&state, Arc::new(Policy::default()))
                .quota_admit("b", &whole(5), &names())
                .is_ok()
        );
        let reports = state.quota_reports();
        assert_eq!(reports.len(), 1);
        let gpus = &reports[0].resources[0];
        assert_eq!(gpus.resource, "nvidia.com/gpu");
        assert_eq!(
            (gpus.used, gpus.min, gpus.max, gpus.borrowed),
            (3.0, 2.0, Some(4.0), 1.0)
        );
        let report = state.report();
        assert_eq!(report.quotas, reports);
        let text = report.to_text(false);
        assert!(text.contains("GPU quotas (ElasticQuota):"), "{text}");
        assert!(
            text.contains("Ignored: ElasticQuota x/y: no spec"),
            "{text}"
        );
        // A quota over a group: admitted and reported over its namespaces together.
        state.set_quotas(QuotaSet::build(
            vec![Quota {
                name: "qg".into(),
                namespace: "g".into(),
                min,
                max: [Some(4), None, None],
                also: vec!["a".into()],
            }],
            Vec::new(),
            &names(),
        ));
        let reason = Snapshot::of(&state, Arc::new(Policy::default()))
            .quota_admit("g", &whole(2), &names())
            .unwrap_err();
        assert!(reason.contains("namespaces g,a would exceed"), "{reason}");
        let report = state.report();
        assert_eq!(report.quotas[0].also, ["a"]);
        assert_eq!(report.quotas[0].resources[0].used, 3.0);
        let text = report.to_text(false);
        assert!(text.contains("g,a "), "{text}");
    }
}
