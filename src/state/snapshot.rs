//! One consistent view of the shared state for one verb call ([`Snapshot`]): the allocation
//! table read once, the policy in force and the quotas loaded once. Every question a filter,
//! prioritize or preempt asks is answered from it, so no call sees two tables or two policies.

use std::sync::Arc;

use parking_lot::RwLockReadGuard;

use super::cluster::ClusterState;
use gpu_engine::quota::QuotaSet;
use gpu_engine::{Policy, Table};

/// The table, the policy and the quotas as one verb call sees them. Holding it holds the
/// table's read lock: take one per call, decide, and drop it; never read the table again
/// through the [`ClusterState`] while it is held (a waiting writer would then wait on it).
pub struct Snapshot<'s> {
    pub(super) cluster: &'s ClusterState,
    pub(super) table: RwLockReadGuard<'s, Table>,
    pub(super) policy: Arc<Policy>,
    pub(super) quotas: Arc<QuotaSet>,
}

impl std::fmt::Debug for Snapshot<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("nodes", &self.table.node_count())
            .field("scoring", &self.policy.scoring)
            .finish_non_exhaustive()
    }
}

impl<'s> Snapshot<'s> {
    /// `cluster` as one decision sees it, deciding with `policy` (the [`super::PolicyCell`]'s
    /// [`load`](super::PolicyCell::load), once per call). The quotas are loaded before the
    /// table is read, as every other reader of both does. (A constructor here rather than a
    /// method of [`ClusterState`]: the state's module does not depend on its readers.)
    pub fn of(cluster: &'s ClusterState, policy: Arc<Policy>) -> Self {
        let quotas = cluster.quotas();
        Self {
            cluster,
            table: cluster.read(),
            policy,
            quotas,
        }
    }

    /// The table as this call reads it.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// The policy this call decides with.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The quotas in force for this call.
    pub fn quotas(&self) -> &QuotaSet {
        &self.quotas
    }
}
