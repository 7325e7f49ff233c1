//! Cluster state from the watch: a synchronous [`Feed`] that turns Node and Pod watch events into
//! engine [`Change`]s on the shared [`ClusterState`] (the state room's one writer), and the thin async runner that drives it
//! from kube-runtime watchers. The feed is a state machine with no I/O (like kube-runtime's
//! reflector store): tests drive it with scripted events.
//!
//! What the table holds, per pod: bound pods with a valid allocation record hold exactly what
//! the record says; bound pods that ask for no GPU hold their CPU and memory; bound GPU pods
//! without a usable record (bound by someone else, or a corrupt or copied record) are counted and
//! logged, and hold what their requests need, placed on their node as a fresh bind would place
//! them, so their capacity is never handed out twice. Pending pods hold nothing here (a bind in
//! flight holds a reservation, which the feed never touches); finished and deleted pods free
//! everything.
//!
//! Lists are buffered from `Init` to `InitDone` and applied under one write lock, so readers see
//! either the old or the new list, never half of it; objects missing from a relist are treated
//! as deleted. The state reports ready once both initial lists are applied, and DRA's
//! ResourceSlice and ResourceClaim lists where the API serves them ([`dra`]).

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    Container, Node, Pod, PodCondition, PodSpec, PodStatus, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_stream};
use kube::{Api, ResourceExt};
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::k8s::dra::DraEvent;
use crate::objects::record;
use crate::objects::scheduling::POD_SCHEDULED;
pub use crate::objects::scheduling::is_unschedulable;
use crate::objects::translate::{
    names_gpu_resource, pod_host_request, pod_key, pod_request, translate_node,
};
use crate::state::{EventCounts, FeedStats, TableWriter, VictimRank, monotonic_ms};
use gpu_engine::{
    Change, CpuMilli, MemMiB, NodeName, NodeSpec, NodeState, PodAllocation, PodKey, PodRequest,
    Policy, Table, fit, shape_hash,
};

/// Counts `event` (`Init` and `InitDone` carry no object and are not counted).
fn count_event<K>(counts: &mut EventCounts, event: &Event<K>) {
    match event {
        Event::Apply(_) => counts.apply += 1,
        Event::Delete(_) => counts.delete += 1,
        Event::InitApply(_) => counts.listed += 1,
        Event::Init | Event::InitDone => {}
    }
}

/// Where a bound pod's allocation came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Source {
    Record,
    /// A pod that asks for no GPU: CPU and memory only.
    HostOnly,
    /// A GPU pod without a record: placed by fitting its requests.
    Missing,
    /// A GPU pod with a corrupt or copied record: placed by fitting its requests.
    Corrupt,
}

/// What the feed last did for a pod, so repeated events (status updates) cost no write.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Applied {
    Pending,
    Bound {
        node: NodeName,
        source: Source,
        /// Hash of the allocation applied (records and host-only pods).
        fingerprint: u64,
        unplaceable: bool,
    },
    WaitingForNode {
        node: NodeName,
        source: Source,
    },
}

/// Why a record was not applied ([`crate::state::RecordRejections`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rejection {
    Changed,
    Removed,
    Mismatch,
    Conflict,
}

impl Rejection {
    fn as_str(self) -> &'static str {
        match self {
            Self::Changed => "changed",
            Self::Removed => "removed",
            Self::Mismatch => "mismatch",
            Self::Conflict => "conflict",
        }
    }
}

#[derive(Clone, Debug)]
struct PodMemo {
    uid: String,
    applied: Applied,
}

/// An inferred pod waiting for its node.
#[derive(Clone, Debug)]
struct Inference {
    request: Option<PodRequest>,
    cpu: CpuMilli,
    memory: MemMiB,
    source: Source,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct NodeMemo {
    fingerprint: u64,
    has_problems: bool,
}

/// The watch-event state machine. One task owns it and feeds it every Node and Pod event.
#[derive(Debug)]
pub struct Feed {
    state: TableWriter,
    cfg: Arc<Config>,
    policy: Arc<Policy>,
    nodes: HashMap<NodeName, NodeMemo>,
    pods: HashMap<PodKey, PodMemo>,
    node_buffer: Option<Vec<Node>>,
    pod_buffer: Option<Vec<Pod>>,
    nodes_listed: bool,
    pods_listed: bool,
    waiting: HashMap<NodeName, HashMap<PodKey, Inference>>,
    /// The pod counts of [`FeedStats`], kept current by `set_memo` and `take_memo`.
    tally: FeedStats,
    /// How many of `nodes` have translation problems, kept current by `set_node_memo` and
    /// `take_node_memo`: stats are published after every pod event, and counting them there
    /// was a pass over every node per pod event.
    nodes_with_problems: usize,
    /// ResourceSlices and ResourceClaims ([`dra`]).
    dra: dra::DraSide,
}

impl Feed {
    /// A feed writing through `state`, reading objects with `cfg` and placing pods without a
    /// record with `policy`.
    pub fn new(state: TableWriter, cfg: Arc<Config>, policy: Arc<Policy>) -> Self {
        Self {
            state,
            cfg,
            policy,
            nodes: HashMap::new(),
            pods: HashMap::new(),
            node_buffer: None,
            pod_buffer: None,
            nodes_listed: false,
            pods_listed: false,
            waiting: HashMap::new(),
            tally: FeedStats::default(),
            nodes_with_problems: 0,
            dra: dra::DraSide::default(),
        }
    }

    /// The writer of the shared state this feed writes.
    pub fn state(&self) -> &TableWriter {
        &self.state
    }

    /// Applies one Node watch event.
    pub fn apply_node_event(&mut self, event: &Event<Node>) {
        let state = self.state.clone();
        state.update_stats(|s| count_event(&mut s.node_events, event));
        match event {
            Event::Init => self.node_buffer = Some(Vec::new()),
            Event::InitApply(node) => match self.node_buffer.as_mut() {
                Some(buffer) => buffer.push(slim_node(node)),
                // An InitApply outside Init..InitDone: apply it at once rather than lose it.
                None => self.upsert_node(&mut state.write(), node),
            },
            Event::InitDone => {
                let started = Instant::now();
                let listed = self.node_buffer.take().unwrap_or_default();
                let mut table = state.write();
                let names: HashSet<NodeName> = listed.iter().map(node_name).collect();
                for node in &listed {
                    self.upsert_node(&mut table, node);
                }
                let gone: Vec<NodeName> = self
                    .nodes
                    .keys()
                    .filter(|name| !names.contains(*name))
                    .cloned()
                    .collect();
                for name in gone {
                    self.remove_node(&mut table, &name);
                }
                drop(table);
                state.note_rebuild(started.elapsed());
                self.nodes_listed = true;
                self.state.update_stats(|s| s.node_lists += 1);
                info!(nodes = names.len(), "node list applied");
                self.maybe_ready();
            }
            Event::Apply(node) => self.upsert_node(&mut state.write(), node),
            Event::Delete(node) => self.remove_node(&mut state.write(), &node_name(node)),
        }
        self.publish_stats();
    }

    /// Applies one Pod watch event.
    pub fn apply_pod_event(&mut self, event: &Event<Pod>) {
        let state = self.state.clone();
        state.update_stats(|s| count_event(&mut s.pod_events, event));
        match event {
            Event::Init => self.pod_buffer = Some(Vec::new()),
            Event::InitApply(pod) => match self.pod_buffer.as_mut() {
                Some(buffer) => buffer.push(slim_pod(pod, &self.cfg)),
                None => self.apply_pod(&mut state.write(), pod),
            },
            Event::InitDone => {
                let started = Instant::now();
                let listed = self.pod_buffer.take().unwrap_or_default();
                let mut table = state.write();
                let keys: HashSet<PodKey> = listed.iter().map(pod_key).collect();
                for pod in &listed {
                    self.apply_pod(&mut table, pod);
                }
                let gone: Vec<PodKey> = self
                    .pods
                    .keys()
                    .filter(|key| !keys.contains(*key))
                    .cloned()
                    .collect();
                for key in gone {
                    self.pod_gone(&mut table, &key);
                }
                drop(table);
                state.note_rebuild(started.elapsed());
                self.pods_listed = true;
                self.state.update_stats(|s| s.pod_lists += 1);
                info!(pods = keys.len(), "pod list applied");
                self.maybe_ready();
            }
            Event::Apply(pod) => self.apply_pod(&mut state.write(), pod),
            Event::Delete(pod) => {
                let key = pod_key(pod);
                let uid = pod.metadata.uid.as_deref().unwrap_or_default();
                // A late delete of an older pod of the same name must not free the new one.
                let newer = self
                    .pods
                    .get(&key)
                    .is_some_and(|memo| !uid.is_empty() && !memo.uid.is_empty() && memo.uid != uid);
                if !newer {
                    self.pod_gone(&mut state.write(), &key);
                }
            }
        }
        self.publish_stats();
    }

    /// Counts a watch error (the runner retries with backoff; state is kept meanwhile).
    pub fn watch_error(&mut self) {
        self.state.update_stats(|s| s.watch_errors += 1);
    }

    fn maybe_ready(&self) {
        if self.nodes_listed && self.pods_listed && self.dra.settled() && !self.state.is_ready() {
            info!("initial node and pod lists (and DRA's, where read) applied: ready");
            self.state.set_ready();
        }
    }

    fn upsert_node(&mut self, table: &mut Table, node: &Node) {
        let translation = translate_node(node, &self.cfg);
        let spec = self.dra_merge(translation.spec);
        let memo = NodeMemo {
            fingerprint: spec_fingerprint(&spec),
            has_problems: !translation.problems.is_empty(),
        };
        if self.nodes.get(&spec.name) == Some(&memo) && table.node(&spec.name).is_some() {
            // Labels and taints change without the engine's spec changing: kept on every event.
            self.note_claims(table, node);
            return;
        }
        for problem in &translation.problems {
            warn!(node = %spec.name, %problem, "node translated with problems");
        }
        self.apply_node_spec(table, spec, memo);
        self.note_claims(table, node);
    }

    /// Puts a node's new or changed spec in the table, then what depends on it: the pods
    /// waiting for it, and the DRA claims on its GPUs.
    fn apply_node_spec(&mut self, table: &mut Table, spec: NodeSpec, memo: NodeMemo) {
        let name = spec.name.clone();
        debug!(node = %name, gpus = spec.gpus.len(), mode = spec.mode.as_str(), "node upserted");
        table.apply(Change::UpsertNode(spec));
        // New or changed capacity: pods waiting for room may fit now.
        self.state.note_freed(&name);
        self.set_node_memo(name.clone(), memo);
        if let Some(waiting) = self.waiting.remove(&name) {
            for (key, inference) in waiting {
                self.place_inferred(table, key, &name, inference);
            }
        }
        self.refresh_dra_claims_on(table, &name);
    }

    /// Keeps what kube-scheduler's node-level filters read of `node` for the estimator, under
    /// the table's own name for it: an estimate then finds each node's claims by pointer, not
    /// by reading both names.
    fn note_claims(&self, table: &Table, node: &Node) {
        let name = node_name(node);
        let name = table
            .node(&name)
            .map_or(name, |known| known.spec.name.clone());
        self.state.note_node_claims(name, node);
    }

    fn remove_node(&mut self, table: &mut Table, name: &NodeName) {
        self.state.forget_node_claims(name);
        self.dra_node_gone(name);
        if self.take_node_memo(name).is_some() || table.node(name).is_some() {
            debug!(node = %name, "node removed");
            table.apply(Change::RemoveNode(name.clone()));
        }
    }

    fn apply_pod(&mut self, table: &mut Table, pod: &Pod) {
        let key = pod_key(pod);
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if let Some(memo) = self.pods.get(&key)
            && !memo.uid.is_empty()
            && !uid.is_empty()
            && memo.uid != uid
        {
            // Deleted and recreated between events: the old pod is gone.
            self.pod_gone(table, &key);
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            if self.pods.contains_key(&key) || table.pod(&key).is_some() {
                self.pod_gone(table, &key);
            }
            return;
        }
        let is_gpu = names_gpu_resource(pod, &self.cfg);
        if is_gpu {
            let bound = pod
                .spec
                .as_ref()
                .is_some_and(|s| s.node_name.as_deref().is_some_and(|n| !n.is_empty()));
            let pending = (!bound).then(|| Arc::new(slim_pod(pod, &self.cfg)));
            self.state.note_gpu_pod(key.clone(), &uid, pending);
            self.state.note_rank(
                &key,
                VictimRank {
                    priority: pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0),
                    created_s: pod
                        .metadata
                        .creation_timestamp
                        .as_ref()
                        .map_or(0, |time| time.0.as_second()),
                    terminating: pod.metadata.deletion_timestamp.is_some(),
                },
            );
        }
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
            // Pending: holds nothing here. A bind in flight holds a reservation, left alone.
            self.set_memo(
                key,
                PodMemo {
                    uid,
                    applied: Applied::Pending,
                },
            );
            return;
        };
        let node = NodeName::new(node);
        let known = self.pods.get(&key).map(|memo| &memo.applied);

        let decoded = if is_gpu {
            record::decode(pod, &self.cfg)
        } else {
            Ok(None)
        };
        // The record a pod was bound with is fixed: what anyone writes after it is not applied.
        if let Some(Applied::Bound {
            node: applied_node,
            source: Source::Record,
            fingerprint: applied,
            ..
        }) = known
            && *applied_node == node
            && table.pod(&key).is_some()
        {
            let rejected = match &decoded {
                Ok(Some(allocation)) if fingerprint(allocation) == *applied => None,
                Ok(Some(_)) | Err(_) => Some((Rejection::Changed, "changed after bind".to_owned())),
                Ok(None) => Some((Rejection::Removed, "removed after bind".to_owned())),
            };
            if let Some((why, detail)) = rejected {
                self.reject_record(&key, pod, why, &detail);
            }
            return;
        }
        let decoded = match decoded {
            Ok(Some(allocation)) => match self.judge_record(table, &key, pod, allocation) {
                Ok(allocation) => Ok(Some(allocation)),
                Err((why, detail)) => {
                    self.reject_record(&key, pod, why, &detail);
                    Err(record::RecordError::Corrupt {
                        key: self.cfg.annotations.allocation.clone(),
                        problem: detail,
                    })
                }
            },
            other => other,
        };
        let (source, allocation) = match decoded {
            Ok(Some(allocation)) => (Source::Record, Some(allocation)),
            // A pod that names a GPU resource with amount 0 asks for no GPU: no record is
            // written for it, and none is missing.
            Ok(None) if !is_gpu || matches!(pod_request(pod, &self.cfg), Ok(None)) => {
                let (cpu, memory) = pod_host_request(pod).unwrap_or_else(|problem| {
                    warn!(pod = %key, %problem, "unreadable pod resources; counting none");
                    (CpuMilli(0), MemMiB(0))
                });
                (
                    Source::HostOnly,
                    Some(PodAllocation::host_only(node.clone(), cpu, memory)),
                )
            }
            Ok(None) => (Source::Missing, None),
            Err(problem) => {
                if !matches!(
                    known,
                    Some(
                        Applied::Bound {
                            source: Source::Corrupt,
                            ..
                        } | Applied::WaitingForNode {
                            source: Source::Corrupt,
                            ..
                        }
                    )
                ) {
                    warn!(pod = %key, %problem, "allocation record unusable; counting the pod's requests");
                }
                (Source::Corrupt, None)
            }
        };

        match allocation {
            Some(allocation) => {
                let fingerprint = fingerprint(&allocation);
                let unchanged = matches!(known, Some(Applied::Bound { node: n, source: s, fingerprint: f, .. })
                    if *n == node && *s == source && *f == fingerprint)
                    && table.pod(&key).is_some();
                if !unchanged {
                    table.apply(Change::PodBound {
                        pod: key.clone(),
                        allocation,
                    });
                }
                self.set_memo(
                    key,
                    PodMemo {
                        uid,
                        applied: Applied::Bound {
                            node,
                            source,
                            fingerprint,
                            unplaceable: false,
                        },
                    },
                );
            }
            None => {
                let unchanged = match known {
                    Some(Applied::Bound {
                        node: n, source: s, ..
                    }) => *n == node && *s == source && table.pod(&key).is_some(),
                    Some(Applied::WaitingForNode { node: n, source: s }) => {
                        *n == node && *s == source
                    }
                    _ => false,
                };
                if unchanged {
                    return;
                }
                if source == Source::Missing {
                    warn!(pod = %key, node = %node, "bound GPU pod has no allocation record; counting its requests");
                }
                let request = pod_request(pod, &self.cfg).unwrap_or_else(|problem| {
                    warn!(pod = %key, %problem, "unreadable GPU request on a bound pod; counting CPU and memory only");
                    None
                });
                let (cpu, memory) = pod_host_request(pod).unwrap_or_default();
                self.set_memo(
                    key.clone(),
                    PodMemo {
                        uid,
                        applied: Applied::Pending,
                    },
                );
                let inference = Inference {
                    request,
                    cpu,
                    memory,
                    source,
                };
                self.place_inferred(table, key, &node, inference);
            }
        }
    }

    /// A record the table has not applied for this pod before, judged before it is: it must be
    /// what the pod asks for, on GPUs its node has ([`record::matches_request`]), and must not
    /// take GPUs other pods hold ([`Table::gpu_conflicts`]). The binder writes records only
    /// from the pod's own request and onto free GPUs, so a record that fails either was
    /// written by someone else (docs/annotations.md, "Who may write the record").
    fn judge_record(
        &self,
        table: &Table,
        key: &PodKey,
        pod: &Pod,
        allocation: PodAllocation,
    ) -> Result<PodAllocation, (Rejection, String)> {
        let request = pod_request(pod, &self.cfg).ok().flatten();
        let node = table.node(&allocation.node).map(|node| &node.spec);
        record::matches_request(&allocation, request.as_ref(), node)
            .map_err(|detail| (Rejection::Mismatch, detail))?;
        let conflicts = table.gpu_conflicts(key, &allocation);
        if !conflicts.is_empty() {
            return Err((Rejection::Conflict, conflicts.join("; ")));
        }
        Ok(allocation)
    }

    /// Counts a record that is not applied, and keeps it for `inspect` and an Event on the
    /// pod; logged when it is news (a tampered pod's every status update repeats it).
    fn reject_record(&self, key: &PodKey, pod: &Pod, why: Rejection, detail: &str) {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        if self
            .state
            .note_rejected_record(key, uid, why.as_str(), detail)
        {
            warn!(pod = %key, reason = why.as_str(), %detail, "allocation record not applied: the extender writes it, once, at bind");
        }
        self.state.update_stats(|s| {
            let counter = match why {
                Rejection::Changed => &mut s.records_rejected.changed,
                Rejection::Removed => &mut s.records_rejected.removed,
                Rejection::Mismatch => &mut s.records_rejected.mismatch,
                Rejection::Conflict => &mut s.records_rejected.conflict,
            };
            *counter = counter.saturating_add(1);
        });
    }

    /// Places a bound pod that has no usable record: on its node's current usage if it fits,
    /// else on the empty node (an over-commit the cluster already made, kept visible to the
    /// invariant check), else as CPU and memory only.
    fn place_inferred(
        &mut self,
        table: &mut Table,
        key: PodKey,
        node: &NodeName,
        inference: Inference,
    ) {
        let Some(uid) = self.pods.get(&key).map(|memo| memo.uid.clone()) else {
            return;
        };
        // Whatever the pod held before (an old placement, a lapsed reservation) is replaced.
        self.state.release_in(table, &key);
        let Some(state) = table.node(node) else {
            let applied = Applied::WaitingForNode {
                node: node.clone(),
                source: inference.source,
            };
            self.set_memo(key.clone(), PodMemo { uid, applied });
            self.waiting
                .entry(node.clone())
                .or_default()
                .insert(key, inference);
            return;
        };
        let host_only = || PodAllocation::host_only(node.clone(), inference.cpu, inference.memory);
        let (allocation, unplaceable) = match &inference.request {
            None => (host_only(), false),
            Some(request) => match fit(state, request, &self.policy) {
                Ok(allocation) => (allocation, false),
                Err(_) => match fit(&NodeState::new(state.spec.clone()), request, &self.policy) {
                    Ok(allocation) => {
                        warn!(pod = %key, node = %node, "pod without a usable record over-commits its node");
                        (allocation, false)
                    }
                    Err(reason) => {
                        warn!(pod = %key, node = %node, %reason, "pod without a usable record cannot fit its node; counting CPU and memory only");
                        (host_only(), true)
                    }
                },
            },
        };
        let applied = Applied::Bound {
            node: node.clone(),
            source: inference.source,
            fingerprint: fingerprint(&allocation),
            unplaceable,
        };
        self.set_memo(key.clone(), PodMemo { uid, applied });
        table.apply(Change::PodBound {
            pod: key,
            allocation,
        });
    }

    fn pod_gone(&mut self, table: &mut Table, key: &PodKey) {
        self.state.forget_rejected_record(key);
        let memo = self.take_memo(key);
        if let Some(memo) = &memo
            && let Applied::WaitingForNode { node, .. } = &memo.applied
            && let Some(waiting) = self.waiting.get_mut(node)
        {
            waiting.remove(key);
            if waiting.is_empty() {
                self.waiting.remove(node);
            }
        }
        if let Some(entry) = table.pod(key) {
            self.state.note_freed(&entry.allocation.node);
        }
        table.apply(Change::PodGone(key.clone()));
        self.state
            .forget_pod(key, memo.as_ref().map(|memo| memo.uid.as_str()));
    }

    fn publish_stats(&self) {
        let nodes = self.nodes.len();
        let nodes_with_problems = self.nodes_with_problems;
        let pods = self.tally;
        self.state.update_stats(|s| {
            s.nodes = nodes;
            s.nodes_with_problems = nodes_with_problems;
            s.pods_bound = pods.pods_bound;
            s.records_missing = pods.records_missing;
            s.records_corrupt = pods.records_corrupt;
            s.unplaceable = pods.unplaceable;
            s.waiting_for_node = pods.waiting_for_node;
        });
    }

    /// Records what was applied for a pod, keeping the pod counts current without a full pass
    /// (a pass over 150,000 pods on every event would cost more than the events).
    fn set_memo(&mut self, key: PodKey, memo: PodMemo) {
        tally(&mut self.tally, &memo.applied, 1);
        if let Some(old) = self.pods.insert(key, memo) {
            tally(&mut self.tally, &old.applied, -1);
        }
    }

    fn take_memo(&mut self, key: &PodKey) -> Option<PodMemo> {
        let old = self.pods.remove(key)?;
        tally(&mut self.tally, &old.applied, -1);
        Some(old)
    }

    /// Records what was applied for a node, keeping the count of nodes with problems current.
    fn set_node_memo(&mut self, name: NodeName, memo: NodeMemo) {
        self.nodes_with_problems += usize::from(memo.has_problems);
        if let Some(old) = self.nodes.insert(name, memo) {
            self.nodes_with_problems = self
                .nodes_with_problems
                .saturating_sub(usize::from(old.has_problems));
        }
    }

    fn take_node_memo(&mut self, name: &NodeName) -> Option<NodeMemo> {
        let old = self.nodes.remove(name)?;
        self.nodes_with_problems = self
            .nodes_with_problems
            .saturating_sub(usize::from(old.has_problems));
        Some(old)
    }
}

/// Adds (`sign` 1) or removes (`sign` -1) one pod's contribution to the pod counts.
fn tally(stats: &mut FeedStats, applied: &Applied, sign: isize) {
    let bump = |value: &mut usize| *value = value.saturating_add_signed(sign);
    let source = match applied {
        Applied::Pending => return,
        Applied::Bound {
            source,
            unplaceable,
            ..
        } => {
            bump(&mut stats.pods_bound);
            if *unplaceable {
                bump(&mut stats.unplaceable);
            }
            source
        }
        Applied::WaitingForNode { source, .. } => {
            bump(&mut stats.waiting_for_node);
            source
        }
    };
    match source {
        Source::Missing => bump(&mut stats.records_missing),
        Source::Corrupt => bump(&mut stats.records_corrupt),
        Source::Record | Source::HostOnly => {}
    }
}

fn node_name(node: &Node) -> NodeName {
    NodeName::new(node.metadata.name.as_deref().unwrap_or_default())
}

fn fingerprint(allocation: &PodAllocation) -> u64 {
    let mut hasher = DefaultHasher::new();
    allocation.hash(&mut hasher);
    hasher.finish()
}

/// Everything of a spec the engine uses, hashed: an unchanged node costs no write. Its shape
/// ([`shape_hash`]) and what tells one node and its GPUs from another of the same shape.
fn spec_fingerprint(spec: &NodeSpec) -> u64 {
    let mut hasher = DefaultHasher::new();
    spec.name.hash(&mut hasher);
    for gpu in &spec.gpus {
        gpu.uuid.hash(&mut hasher);
    }
    shape_hash(spec).hash(&mut hasher);
    hasher.finish()
}

/// A Node with only what translation reads (metadata labels and annotations, capacity and
/// allocatable) and what kube-scheduler's node-level filters read for the estimator
/// (`spec.unschedulable`, `spec.taints`): buffered lists stay small.
pub fn slim_node(node: &Node) -> Node {
    Node {
        metadata: ObjectMeta {
            name: node.metadata.name.clone(),
            uid: node.metadata.uid.clone(),
            labels: node.metadata.labels.clone(),
            annotations: node.metadata.annotations.clone(),
            ..ObjectMeta::default()
        },
        spec: node
            .spec
            .as_ref()
            .map(|spec| k8s_openapi::api::core::v1::NodeSpec {
                unschedulable: spec.unschedulable,
                taints: spec.taints.clone(),
                ..Default::default()
            }),
        status: node
            .status
            .as_ref()
            .map(|status| k8s_openapi::api::core::v1::NodeStatus {
                capacity: status.capacity.clone(),
                allocatable: status.allocatable.clone(),
                ..Default::default()
            }),
    }
}

/// A Pod with only what translation and the record read: names, uid, the `gpuCount` label, our
/// own annotations, container resources, node and scheduler names and phase; and its controller and
/// `PodScheduled` condition, which the requeue task and the estimator read. Keeps 150,000 cached pods small
/// (`kubectl.kubernetes.io/last-applied-configuration` alone can be kilobytes).
pub fn slim_pod(pod: &Pod, cfg: &Config) -> Pod {
    let keep_label = |key: &String| *key == cfg.resources.gpu_count;
    let a = &cfg.annotations;
    let ours = [
        &a.allocation,
        &a.model_include,
        &a.model_exclude,
        &a.min_gpu_memory,
        &a.placement,
        &a.topology,
    ];
    let keep_annotation = |key: &String| ours.contains(&key);
    let filter = |map: &Option<BTreeMap<String, String>>, keep: &dyn Fn(&String) -> bool| {
        map.as_ref().map(|m| {
            m.iter()
                .filter(|(k, _)| keep(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<BTreeMap<_, _>>()
        })
    };
    // Without `claims` (DRA claim names), which no GPU decision reads: the protobuf watch
    // does not decode them either.
    let slim_container = |c: &Container| Container {
        name: c.name.clone(),
        resources: c.resources.as_ref().map(|r| ResourceRequirements {
            claims: None,
            ..r.clone()
        }),
        restart_policy: c.restart_policy.clone(),
        ..Container::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            uid: pod.metadata.uid.clone(),
            creation_timestamp: pod.metadata.creation_timestamp.clone(),
            labels: filter(&pod.metadata.labels, &keep_label),
            annotations: filter(&pod.metadata.annotations, &keep_annotation),
            // The controller only (its ReplicaSet, Job, ...): the estimator counts a workload's
            // unschedulable pods by it (`GetUnschedulableReplicas`).
            owner_references: pod.metadata.owner_references.as_ref().map(|owners| {
                owners
                    .iter()
                    .filter(|owner| owner.controller == Some(true))
                    .cloned()
                    .collect()
            }),
            ..ObjectMeta::default()
        },
        spec: pod.spec.as_ref().map(|spec| PodSpec {
            node_name: spec.node_name.clone(),
            // Bind refuses pods of a scheduler it does not serve (`server.schedulerNames`).
            scheduler_name: spec.scheduler_name.clone(),
            containers: spec.containers.iter().map(slim_container).collect(),
            init_containers: spec
                .init_containers
                .as_ref()
                .map(|list| list.iter().map(slim_container).collect()),
            overhead: spec.overhead.clone(),
            resources: spec.resources.clone(),
            ..PodSpec::default()
        }),
        status: pod.status.as_ref().map(|status| PodStatus {
            phase: status.phase.clone(),
            // Only kube-scheduler's verdict: the requeue task looks for unschedulable pods, the
            // estimator for those unschedulable longer than a threshold.
            conditions: status.conditions.as_ref().map(|conditions| {
                conditions
                    .iter()
                    .filter(|c| c.type_ == POD_SCHEDULED)
                    .map(|c| PodCondition {
                        type_: c.type_.clone(),
                        status: c.status.clone(),
                        reason: c.reason.clone(),
                        last_transition_time: c.last_transition_time.clone(),
                        ..PodCondition::default()
                    })
                    .collect()
            }),
            ..PodStatus::default()
        }),
    }
}

/// The field selector of the pods the extender reads. Finished pods hold nothing: leaving them
/// out of the list keeps it small, and a pod that finishes leaves the selection, which the watch
/// reports as a delete.
pub const LIVE_PODS: &str = "status.phase!=Succeeded,status.phase!=Failed";

/// Runs the Node and Pod watchers into `feed` until both streams end (they do not, normally:
/// errors are retried with kube-runtime's default backoff), and expires reservations every
/// second on the `epoch` time base. Pods are watched in protobuf unless `watch.protobuf` is off.
pub async fn run(client: kube::Client, mut feed: Feed, epoch: Instant) {
    let protobuf = feed.cfg.watch.protobuf;
    // Boxed: a Pod event is kilobytes, and both kinds share one stream.
    enum Item {
        Node(Box<Result<Event<Node>, watcher::Error>>),
        Pod(Box<Result<Event<Pod>, watcher::Error>>),
        Dra(Box<DraEvent>),
    }
    let nodes = watch_stream(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .modify(|node| node.managed_fields_mut().clear())
        .map(|item| Item::Node(Box::new(item)));
    if feed.cfg.dra.enabled {
        feed.watch_dra();
    }
    let resources =
        crate::k8s::dra::events(client.clone(), &feed.cfg).map(|event| Item::Dra(Box::new(event)));
    let pods = if protobuf {
        protobuf::pod_watch(client, LIVE_PODS)
            .default_backoff()
            .boxed()
    } else {
        watch_stream(
            Api::<Pod>::all(client),
            watcher::Config::default().fields(LIVE_PODS),
        )
        .default_backoff()
        .modify(|pod| pod.managed_fields_mut().clear())
        .boxed()
    }
    .map(|item| Item::Pod(Box::new(item)));
    let mut events = std::pin::pin!(futures::stream::select(
        futures::stream::select(nodes, pods),
        resources
    ));
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            item = events.next() => match item {
                Some(Item::Node(item)) => match *item {
                    Ok(event) => feed.apply_node_event(&event),
                    Err(error) => {
                        feed.watch_error();
                        warn!(%error, "node watch failed; retrying with backoff");
                    }
                },
                Some(Item::Pod(item)) => match *item {
                    Ok(event) => feed.apply_pod_event(&event),
                    Err(error) => {
                        feed.watch_error();
                        warn!(%error, "pod watch failed; retrying with backoff");
                    }
                },
                Some(Item::Dra(event)) => feed.apply_dra_event(*event),
                None => break,
            },
            _ = tick.tick() => {
                let expired = feed.state().expire_reservations(monotonic_ms(epoch));
                if !expired.is_empty() {
                    warn!(count = expired.len(), "bind reservations expired without the watch seeing the pods bound");
                }
            }
        }
    }
}

mod dra;
mod protobuf;
pub use protobuf::pod_watch;

#[cfg(test)]
mod tests;
