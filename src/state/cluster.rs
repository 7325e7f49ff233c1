//! The cluster as the extender knows it: the allocation table, the pending GPU pods and their
//! UIDs, readiness, the feed's health, where capacity was freed and which pods kube-scheduler's
//! window kept from every node that fits them (both for the requeue task). The table has one
//! writer handle ([`TableWriter`], held by the watch feed in [`crate::k8s::watch`] and by the
//! binder for its short reservations) and many readers (filter, prioritize, preempt, inspect,
//! metrics), which hold the [`ClusterState`] and cannot write: the store/writer split of
//! kube-runtime's reflector. Nothing here reads Kubernetes objects beyond storing the pending
//! ones.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use k8s_openapi::api::core::v1::{Node, Pod};
use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::config::Config;
use crate::inspect::{ClaimReport, DraReport};
use crate::objects::admission::NodeClaims;
use crate::objects::dra::{DraCounts, DraState};
use gpu_engine::quota::QuotaSet;
use gpu_engine::{NodeName, PodAllocation, PodKey, Table};

/// The cluster as the extender knows it, shared by the feed and the binder (which write through
/// a [`TableWriter`]) and the HTTP handlers, the metrics and the tasks (which only read).
#[derive(Debug)]
pub struct ClusterState {
    table: RwLock<Table>,
    /// Times the table was taken for writing ([`ClusterState::writes`]).
    writes: AtomicU64,
    /// Pending GPU pods, slimmed to what translation needs: the binder reads the pod it binds
    /// from here, the requeue task the pods it may touch. Bound pods are not kept: their use is
    /// in the table, and at 150,000 pods a slimmed `Pod` each (7.5 KiB, the k8s-openapi structs
    /// are large even when mostly empty) would be a gigabyte.
    ///
    /// Per-key concurrent maps: the feed inserts and removes one pod at a time while binds read
    /// the pod they bind and preempt looks victims up by UID, none of them waiting on a lock
    /// over the whole map.
    pods: DashMap<PodKey, Arc<Pod>>,
    /// Every GPU pod the watch shows, pending or bound, by UID (preemption names its victims by
    /// UID only).
    uids: DashMap<Box<str>, PodKey>,
    /// What orders GPU pods as preemption victims when a quota reclaims ([`VictimRank`]).
    ranks: DashMap<PodKey, VictimRank>,
    ready: AtomicBool,
    stats: Mutex<FeedStats>,
    /// Nodes where capacity was freed since the requeue task last looked (see `requeue`).
    freed: Mutex<BTreeSet<NodeName>>,
    /// Pods filter turned away while a node kube-scheduler did not send would have taken them
    /// (see `requeue`), since the requeue task last looked.
    window_missed: Mutex<BTreeSet<PodKey>>,
    /// Wakes the requeue task when `freed` gains a node or `window_missed` a pod; a wake-up
    /// with no waiter is kept.
    freed_signal: tokio::sync::Notify,
    /// Times to apply full lists not yet taken by a metrics scrape (at most
    /// [`MAX_PENDING_REBUILDS`], the newest kept).
    rebuilds: Mutex<Vec<Duration>>,
    /// What kube-scheduler's node-level filters read of each node (labels, taints, cordon,
    /// allocatable; [`NodeClaims`]): the estimator applies a template's node claims with them.
    /// Written by the feed on every node event (with the table's write lock held, so always
    /// taken after the table's lock); read by an estimate under one read lock for all its
    /// node lookups (hashed with foldhash, as the table's node map is), not a lock per node.
    node_claims: RwLock<NodeClaimsMap>,
    /// The GPU quotas in force (`ElasticQuota`s, see [`super::quota`]); empty without the CRD.
    pub(super) quotas: RwLock<Arc<QuotaSet>>,
    /// Allocation records the watch refused to apply ([`super::rejected`]).
    pub(super) rejected: Mutex<super::rejected::RejectedRecords>,
    /// What the feed reads of Dynamic Resource Allocation: the slices and claims, slimmed, and
    /// what they mean as GPUs. Written by the feed with the table's write lock held (so always
    /// taken after the table's lock, never before it); read for the views under its own lock
    /// alone.
    dra: RwLock<DraState>,
}

/// What the node-level filters read of each node, by name ([`ClusterState::node_claims`]).
pub type NodeClaimsMap = HashMap<NodeName, NodeClaims, foldhash::fast::RandomState>;

/// How a GPU pod ranks as a preemption victim when a quota reclaims GPUs: lowest priority first,
/// then newest (the capacity-scheduling plugin's order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VictimRank {
    /// `spec.priority` (0 when unset).
    pub priority: i32,
    /// `metadata.creationTimestamp`, seconds since the epoch (0 when unset).
    pub created_s: i64,
    /// `metadata.deletionTimestamp` is set: the pod is already going (evicted by a reclaim of
    /// this or another replica, or deleted), so it is no victim to evict again.
    pub terminating: bool,
}

impl VictimRank {
    /// The order victims are taken in: lowest priority, then newest, first.
    pub fn eviction_order(&self) -> (i32, std::cmp::Reverse<i64>) {
        (self.priority, std::cmp::Reverse(self.created_s))
    }
}

/// Rebuild times kept for the next scrape; older ones are dropped if nobody scrapes.
const MAX_PENDING_REBUILDS: usize = 64;

/// The most pods [`ClusterState::note_window_miss`] keeps for the requeue task between its
/// rounds (more are dropped: a backlog this large means no task is taking them).
const MAX_WINDOW_MISSED: usize = 4096;

/// Health of the feed, for metrics and logs. Gauges describe the current state; counters only
/// grow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FeedStats {
    /// Nodes in the table.
    pub nodes: usize,
    /// Nodes whose labels, capacity or detail annotation had problems (see the logs).
    pub nodes_with_problems: usize,
    /// Bound pods in the table (reservations not included).
    pub pods_bound: usize,
    /// Bound GPU pods without an allocation record, counted as using what they request.
    pub records_missing: usize,
    /// Bound GPU pods whose record is corrupt or copied, counted as using what they request.
    pub records_corrupt: usize,
    /// Of those, pods whose requests do not fit their node even when empty: they hold CPU and
    /// memory only.
    pub unplaceable: usize,
    /// Pods without a usable record bound to a node not (yet) seen; placed when it appears.
    pub waiting_for_node: usize,
    /// Completed relists (the first list included).
    pub node_lists: u64,
    pub pod_lists: u64,
    /// Watch errors reported by the runner (each is retried with backoff).
    pub watch_errors: u64,
    /// Reservations released because the watch never saw their pod bound.
    pub reservations_expired: u64,
    /// Watch events applied, per kind.
    pub node_events: EventCounts,
    pub pod_events: EventCounts,
    /// Allocation records the watch refused to apply, by why.
    pub records_rejected: RecordRejections,
}

/// Allocation records the watch saw and did not apply (docs/annotations.md, "Who may write the
/// record"). Counters: they only grow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordRejections {
    /// A record changed after the pod was bound with one: the first stays applied.
    pub changed: u64,
    /// A record removed after the pod was bound with one: what it said stays applied.
    pub removed: u64,
    /// A record that is not what the pod asks for (other amounts, GPUs the node lacks, GPUs for
    /// a pod that asks for none): the pod is counted from its requests.
    pub mismatch: u64,
    /// A record naming GPUs other pods hold: the pod is counted from its requests.
    pub conflict: u64,
}

/// Watch events of one kind, by type. Counters: they only grow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventCounts {
    pub apply: u64,
    pub delete: u64,
    /// Objects delivered by a full list (initial or relist).
    pub listed: u64,
}

impl ClusterState {
    /// An empty state whose table enforces `max_shares_per_gpu`.
    pub fn new(max_shares_per_gpu: u16) -> Self {
        Self {
            table: RwLock::new(Table::new(max_shares_per_gpu)),
            writes: AtomicU64::new(0),
            pods: DashMap::new(),
            uids: DashMap::new(),
            ranks: DashMap::new(),
            node_claims: RwLock::default(),
            ready: AtomicBool::new(false),
            stats: Mutex::new(FeedStats::default()),
            freed: Mutex::new(BTreeSet::new()),
            window_missed: Mutex::new(BTreeSet::new()),
            freed_signal: tokio::sync::Notify::new(),
            rebuilds: Mutex::new(Vec::new()),
            quotas: RwLock::new(Arc::new(QuotaSet::default())),
            rejected: Mutex::default(),
            dra: RwLock::default(),
        }
    }

    /// What the views show of Dynamic Resource Allocation; `None` while it is not read
    /// (`dra.enabled` off, or before the feed knows whether the API serves it). Claims carry
    /// no node or GPUs here: [`ClusterReport::with_dra`](crate::inspect::ClusterReport::with_dra)
    /// fills those in from the table's report.
    pub fn dra_report(&self) -> Option<DraReport> {
        let dra = self.dra.read();
        let served = dra.served?;
        let mut keys = dra.book.claim_keys();
        keys.sort();
        let claims = keys
            .into_iter()
            .map(|key| ClaimReport {
                devices: dra.book.claim_devices(&key),
                pods: dra.book.claim_pods(&key).to_vec(),
                problems: dra.claim_problems.get(&key).cloned().unwrap_or_default(),
                claim: key,
                node: None,
                gpus: Vec::new(),
            })
            .collect();
        Some(DraReport {
            served,
            counts: dra.book.counts(),
            nodes_offered_both_ways: dra.both_ways.iter().cloned().collect(),
            problems: dra.book.problems(),
            claims,
        })
    }

    /// What `pod`'s claims ask for of the configured DeviceClasses (whole GPUs, MIG slices by
    /// profile), as the watch last saw the claims; `None` when they ask for none the extender
    /// reads (or the pod has no claims).
    pub fn claim_ask(&self, pod: &Pod) -> Option<crate::objects::dra::ClaimAsk> {
        let claims = crate::objects::dra::pod_claims(pod);
        if claims.is_empty() {
            return None;
        }
        let dra = self.dra.read();
        let mut ask = crate::objects::dra::ClaimAsk::default();
        for claim in &claims {
            if let Some(asked) = dra.book.claim_request(claim) {
                ask.add(asked);
            }
        }
        (!ask.is_empty()).then_some(ask)
    }

    /// What the metrics read of Dynamic Resource Allocation: whether it is served, the book's
    /// counts and how many nodes offer GPUs both ways; `None` while it is not read.
    pub fn dra_counts(&self) -> Option<(bool, DraCounts, usize)> {
        let dra = self.dra.read();
        let served = dra.served?;
        Some((served, dra.book.counts(), dra.both_ways.len()))
    }

    /// A state serving a fixed table, synced by definition (tools, tests, load runs).
    pub fn with_table(table: Table) -> Self {
        let state = Self::new(table.max_shares_per_gpu());
        *state.write_table() = table;
        state.set_ready();
        state
    }

    /// The key of the GPU pod with this UID, if the watch has seen it (preemption victims are
    /// named by UID only).
    pub fn pod_key_for_uid(&self, uid: &str) -> Option<PodKey> {
        self.uids.get(uid).map(|key| key.value().clone())
    }

    /// One consistent snapshot for filter, prioritize and inspect. Hold it only to decide.
    pub fn read(&self) -> RwLockReadGuard<'_, Table> {
        // parking_lot's lock does not poison: a panic while writing leaves the table as it was
        // at that instant; serving on beats refusing every request, and check_invariants
        // would show any damage.
        self.table.read()
    }

    /// An empty state enforcing the configuration's per-GPU pod limit (the same limit the
    /// engine policy from [`Config::engine_policy`] decides with).
    pub fn for_config(cfg: &Config) -> Self {
        Self::new(cfg.policy.max_pods_per_shared_gpu)
    }

    /// The table for writing: through a [`TableWriter`] (the feed and the binder's
    /// reservation) only, briefly.
    pub(super) fn write_table(&self) -> RwLockWriteGuard<'_, Table> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.table.write()
    }

    /// How many times the table has been taken for writing: when it has not moved, the table
    /// is as it was, and what was measured on it still holds.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Whether both initial lists have been applied: before that the table may miss
    /// allocations, and the extender must not decide.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// A pending GPU pod as last seen by the watch (bound pods are not kept).
    pub fn pod(&self, key: &PodKey) -> Option<Arc<Pod>> {
        self.pods.get(key).map(|pod| Arc::clone(pod.value()))
    }

    /// The feed's health.
    pub fn stats(&self) -> FeedStats {
        *self.stats.lock()
    }

    /// [`TableWriter::expire_reservations`] on a table the caller already holds for writing
    /// (`table` is this state's table, from [`TableWriter::write`]): counts the expiries and
    /// records where capacity was freed. Every expiry goes through here.
    pub fn expire_in(&self, table: &mut Table, now_ms: u64) -> Vec<PodKey> {
        let released = table.expire_reservations_released(now_ms);
        if !released.is_empty() {
            self.update_stats(|s| s.reservations_expired += released.len() as u64);
        }
        released
            .into_iter()
            .map(|(pod, allocation)| {
                self.note_freed(&allocation.node);
                pod
            })
            .collect()
    }

    /// Releases what `pod` holds on `table` (this state's table, held for writing) and records
    /// its node as freed for the requeue task. Every release outside the watch's own pod-gone
    /// path goes through here.
    pub fn release_in(&self, table: &mut Table, pod: &PodKey) -> Option<PodAllocation> {
        let released = table.release(pod)?;
        self.note_freed(&released.node);
        Some(released)
    }

    /// Records how long applying one full list (nodes or pods) to the table took.
    pub fn note_rebuild(&self, took: Duration) {
        let mut rebuilds = self.rebuilds.lock();
        if rebuilds.len() >= MAX_PENDING_REBUILDS {
            rebuilds.remove(0);
        }
        rebuilds.push(took);
    }

    /// The list application times recorded since the last call (for the metrics scrape).
    pub fn take_rebuild_times(&self) -> Vec<Duration> {
        std::mem::take(&mut *self.rebuilds.lock())
    }

    /// Records that capacity was freed on `node` (a pod finished or was deleted, a reservation
    /// lapsed or was cancelled, the node appeared or changed) and wakes the requeue task.
    pub fn note_freed(&self, node: &NodeName) {
        let mut freed = self.freed.lock();
        if freed.insert(node.clone()) {
            self.freed_signal.notify_one();
        }
    }

    /// The nodes freed since the last call, emptied.
    pub fn take_freed(&self) -> BTreeSet<NodeName> {
        std::mem::take(&mut *self.freed.lock())
    }

    /// Records that filter fitted `pod` on none of kube-scheduler's candidates while a node it
    /// did not send would have taken it (its `percentageOfNodesToScore` window), and wakes the
    /// requeue task: kube-scheduler would retry such a pod only on a later cluster event or its
    /// periodic flush. The one thing filter records, and not in the table.
    pub fn note_window_miss(&self, pod: PodKey) {
        let mut missed = self.window_missed.lock();
        if missed.len() < MAX_WINDOW_MISSED && missed.insert(pod) {
            self.freed_signal.notify_one();
        }
    }

    /// The pods noted by [`ClusterState::note_window_miss`] since the last call, emptied.
    pub fn take_window_missed(&self) -> BTreeSet<PodKey> {
        std::mem::take(&mut *self.window_missed.lock())
    }

    /// Resolves when [`ClusterState::note_freed`] has recorded a node, or
    /// [`ClusterState::note_window_miss`] a pod, since the last wake-up.
    pub async fn freed_wakeup(&self) {
        self.freed_signal.notified().await;
    }

    /// The pending GPU pods, as the watch last saw them, that `wanted` accepts (the requeue
    /// task asks for those kube-scheduler has marked unschedulable).
    pub fn pending_pods(&self, wanted: impl Fn(&Pod) -> bool) -> Vec<(PodKey, Arc<Pod>)> {
        self.pods
            .iter()
            .filter(|entry| wanted(entry.value()))
            .map(|entry| (entry.key().clone(), Arc::clone(entry.value())))
            .collect()
    }

    /// Marks the state synced: both initial lists are applied (the feed's call).
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// Notes a GPU pod the watch shows: its UID, and the pod itself while it is pending.
    pub fn note_gpu_pod(&self, key: PodKey, uid: &str, pending: Option<Arc<Pod>>) {
        // The read guard is dropped before inserting: a DashMap shard held for reading while
        // the same shard is written would deadlock.
        let known = self.uids.get(uid).is_some_and(|known| *known == key);
        if !known {
            self.uids.insert(uid.into(), key.clone());
        }
        match pending {
            Some(pod) => {
                self.pods.insert(key, pod);
            }
            None => {
                self.pods.remove(&key);
            }
        }
    }

    /// Notes a GPU pod's priority and creation time (the feed's call, beside
    /// [`ClusterState::note_gpu_pod`]).
    pub fn note_rank(&self, key: &PodKey, rank: VictimRank) {
        let same = self.ranks.get(key).is_some_and(|known| *known == rank);
        if !same {
            self.ranks.insert(key.clone(), rank);
        }
    }

    /// A GPU pod's priority and creation time, if the watch has seen it.
    pub fn rank(&self, key: &PodKey) -> Option<VictimRank> {
        self.ranks.get(key).map(|rank| *rank)
    }

    /// Keeps what the node-level filters read of `node`, replacing what was kept before.
    /// `name` is the table's own for the node (the same allocation, as the table's nodes carry
    /// it): an estimate looks every node's claims up by the table's name, and equal pointers
    /// compare without reading the text.
    pub fn note_node_claims(&self, name: NodeName, node: &Node) {
        let claims = NodeClaims::of(node);
        // Most node events are status heartbeats that change nothing read here: no write lock
        // for them, which would hold up estimates reading every node's claims.
        if self.node_claims.read().get(&name) == Some(&claims) {
            return;
        }
        self.node_claims.write().insert(name, claims);
    }

    /// Forgets a node that is gone.
    pub fn forget_node_claims(&self, name: &NodeName) {
        self.node_claims.write().remove(name);
    }

    /// What the node-level filters read of every node the feed has seen, by name. Node events
    /// wait while the answer is held: take it after the table's lock, as the feed does.
    pub fn node_claims(&self) -> RwLockReadGuard<'_, NodeClaimsMap> {
        self.node_claims.read()
    }

    /// Forgets a pod that is gone; `uid` is the one the feed last saw for it, if any.
    pub fn forget_pod(&self, key: &PodKey, uid: Option<&str>) {
        self.pods.remove(key);
        self.ranks.remove(key);
        match uid {
            Some(uid) => {
                self.uids.remove_if(uid, |_, known| known == key);
            }
            // The feed kept no memo of the pod: find its UID the slow way (rare).
            None => self.uids.retain(|_, known| known != key),
        }
    }

    /// Updates the feed's health counters (the feed's and the binder's expiry calls).
    pub fn update_stats(&self, update: impl FnOnce(&mut FeedStats)) {
        update(&mut self.stats.lock());
    }
}

/// Milliseconds since `epoch` on the monotonic clock: the time base of reservations. Binds and
/// the expiry tick must use the same `epoch`.
pub fn monotonic_ms(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The one handle that changes the table, as kube-runtime's reflector `Writer`: made with its
/// state ([`TableWriter::new`]), cloned to the watch feed and the binder, and never made from a
/// state that is already shared. Everything else holds the [`ClusterState`]
/// ([`TableWriter::reader`]), which reads.
#[derive(Clone, Debug)]
pub struct TableWriter(Arc<ClusterState>);

impl TableWriter {
    /// A writer for a new state; its readers come from [`TableWriter::reader`].
    pub fn new(state: ClusterState) -> Self {
        Self(Arc::new(state))
    }

    /// The state this writer changes, for its readers.
    pub fn reader(&self) -> &Arc<ClusterState> {
        &self.0
    }

    /// The table for writing, briefly: the feed applies one change, the binder reserves.
    pub fn write(&self) -> RwLockWriteGuard<'_, Table> {
        self.0.write_table()
    }

    /// What the feed reads of Dynamic Resource Allocation, for reading (the feed's call on every
    /// node event, which needs to write only for nodes DRA serves).
    pub fn dra_read(&self) -> RwLockReadGuard<'_, DraState> {
        self.0.dra.read()
    }

    /// What the feed reads of Dynamic Resource Allocation, for writing (the feed's call, with
    /// the table's write lock already held when both are needed).
    pub fn dra_write(&self) -> RwLockWriteGuard<'_, DraState> {
        self.0.dra.write()
    }

    /// Releases reservations older than their TTL; returns the pods released.
    pub fn expire_reservations(&self, now_ms: u64) -> Vec<PodKey> {
        self.0.expire_in(&mut self.write(), now_ms)
    }
}

impl std::ops::Deref for TableWriter {
    type Target = ClusterState;

    /// A writer reads too: the feed and the binder consult what they change.
    fn deref(&self) -> &ClusterState {
        &self.0
    }
}

impl ClusterState {
    /// Notes a record the watch refused on pod `key` (UID `uid`); `true` when it is news
    /// ([`super::rejected::RejectedRecords`]).
    pub fn note_rejected_record(
        &self,
        key: &PodKey,
        uid: &str,
        reason: &str,
        detail: &str,
    ) -> bool {
        self.rejected.lock().note(key, uid, reason, detail)
    }

    /// Forgets pod `key`'s refused record (the pod is gone).
    pub fn forget_rejected_record(&self, key: &PodKey) {
        self.rejected.lock().forget(key);
    }

    /// The refused records of the pods that still exist, by pod.
    pub fn rejected_records(&self) -> Vec<crate::inspect::RejectedRecord> {
        self.rejected.lock().list()
    }

    /// The refused records no Event has told yet; each is returned once, until it changes.
    pub fn take_untold_rejections(&self) -> Vec<crate::inspect::RejectedRecord> {
        self.rejected.lock().take_untold()
    }
}
