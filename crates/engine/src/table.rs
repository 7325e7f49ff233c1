//! The cluster's allocation table: every node's usage, every pod's allocation and the GPUs held
//! by holders that are not pods (external holds: Dynamic Resource Allocation claims), changed
//! only through [`Table::apply`], [`Table::reserve`] and [`Table::release`], and checkable
//! against its invariants. Time is passed in (milliseconds on any monotonic clock the caller
//! owns).

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;
use std::sync::{Arc, Weak};

use thiserror::Error;

use super::allocation::{GpuHold, PodAllocation};
use super::mig::{MigSlices, normalized};
use super::model::{HolderKey, LinkMatrix, NodeName, NodeSpec, PodKey, WHOLE_GPU_COMPUTE};
use super::state::{GpuUsage, NodeState, same_shape};
use super::topology::TopologyIndex;

/// A fact about the cluster, as the watchers report it.
#[derive(Clone, Debug)]
pub enum Change {
    /// A node appeared or changed (labels, capacity, GPUs).
    UpsertNode(NodeSpec),
    /// A node is gone. Its pods' records are kept until their own deletion arrives.
    RemoveNode(NodeName),
    /// A pod is bound with this allocation (from its allocation record). Replaces a reservation.
    PodBound {
        pod: PodKey,
        allocation: PodAllocation,
    },
    /// A pod finished (Succeeded/Failed) or was deleted: its GPUs are free again.
    PodGone(PodKey),
    /// A holder that is not a pod (a DRA claim) holds these GPUs and MIG slices of `node`,
    /// replacing what it held before. No pod is placed on them; like every fact, never refused.
    HoldExternal {
        holder: HolderKey,
        node: NodeName,
        holds: Vec<GpuHold>,
        /// MIG slices held, by profile (normalized when applied), counted against the node's
        /// pools as pods' slices are.
        mig: Vec<MigSlices>,
    },
    /// The holder let go of everything it held (a claim deallocated or deleted).
    ReleaseExternal(HolderKey),
}

/// What a holder that is not a pod holds ([`Change::HoldExternal`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExternalHold {
    pub node: NodeName,
    pub holds: Vec<GpuHold>,
    /// MIG slices held, by profile: normalized ([`crate::mig::normalized`]).
    pub mig: Vec<MigSlices>,
}

/// Whether a pod's hold is confirmed by the API server or only promised by a bind in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Reserved by bind; lapses at `expires_at_ms` unless the watch confirms the pod.
    Reserved { expires_at_ms: u64 },
    /// Seen bound by the watch.
    Bound,
}

/// One pod's entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodEntry {
    pub allocation: PodAllocation,
    pub hold: Hold,
}

/// Why a reservation was refused.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum TableError {
    #[error("node {0} is not known")]
    UnknownNode(NodeName),
    #[error("pod {0} already holds an allocation")]
    AlreadyAllocated(PodKey),
    #[error("allocation no longer fits node {node}: {detail}")]
    NoLongerFits { node: NodeName, detail: String },
}

/// The hasher of the maps keyed by node name ([`NameMap`], and the node map by [`NameKey`]). The
/// extender looks up every candidate of every request by name (`Table::node_by_str`); std's
/// SipHash made that about 12% of a request's CPU. foldhash is several times faster on short
/// strings and, with a random state per map, still keyed: names in a request are arbitrary, so a
/// fixed-seed hasher would let a client pick colliding names.
type NameHasher = foldhash::fast::RandomState;

/// A map keyed by node name.
type NameMap<V> = HashMap<NodeName, V, NameHasher>;

/// How many bytes of a node name [`NameKey`] holds in the node map's own entry. Cloud node
/// names are mostly 15-45 bytes (`ip-10-0-12-123.us-west-2.compute.internal` is 41).
const INLINE_NAME: usize = 54;

/// A node's name as the key of the node map: its bytes inside the map's entry when they fit
/// ([`INLINE_NAME`]), so that finding a candidate compares bytes the lookup has already
/// loaded. Keyed by `NodeName` (a pointer to the name elsewhere on the heap), every lookup of a
/// request's 420-odd names read one more cache line; in kube-scheduler's loop, where the other
/// processes run between two filter calls, each such line is a miss (`filter_names/cold` in
/// `benches/engine.rs`: about a third of a filter's time at 1,000 nodes). Looked up by the
/// name's bytes (`[u8]`), which is what it hashes and compares.
#[derive(Clone, Debug)]
enum NameKey {
    Inline { len: u8, bytes: [u8; INLINE_NAME] },
    Long(Box<[u8]>),
}

impl NameKey {
    fn new(name: &str) -> Self {
        let name = name.as_bytes();
        match u8::try_from(name.len()) {
            Ok(len) if name.len() <= INLINE_NAME => {
                let mut bytes = [0; INLINE_NAME];
                bytes[..name.len()].copy_from_slice(name);
                Self::Inline { len, bytes }
            }
            _ => Self::Long(name.into()),
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Long(bytes) => bytes,
        }
    }
}

impl std::borrow::Borrow<[u8]> for NameKey {
    fn borrow(&self) -> &[u8] {
        self.bytes()
    }
}

impl PartialEq for NameKey {
    fn eq(&self, other: &Self) -> bool {
        self.bytes() == other.bytes()
    }
}

impl Eq for NameKey {}

impl Hash for NameKey {
    // As the `[u8]` it borrows as, so that looking up by bytes finds it.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.bytes().hash(state);
    }
}

/// The table.
#[derive(Clone, Debug)]
pub struct Table {
    nodes: HashMap<NameKey, NodeState, NameHasher>,
    pods: HashMap<PodKey, PodEntry>,
    /// Pods by the node their allocation names, including nodes not (yet) known.
    pods_by_node: NameMap<BTreeSet<PodKey>>,
    /// GPUs held by holders that are not pods, and those holders by node (nodes not known
    /// included), as `pods` and `pods_by_node`.
    external: HashMap<HolderKey, ExternalHold>,
    external_by_node: NameMap<BTreeSet<HolderKey>>,
    max_shares_per_gpu: u16,
    /// One topology index per distinct link matrix among the nodes: nodes of one hardware type
    /// share an index instead of each holding its own copy of a few KiB, so that filtering
    /// thousands of them reads one index that stays in cache. Weak, so that an index lives as
    /// long as some node uses it (entries whose nodes are all gone are dropped as nodes go).
    topologies: HashMap<LinkMatrix, Weak<TopologyIndex>>,
    /// One spec per node shape, by shape hash ([`NodeState::same_shape`]): nodes of one shape
    /// hold the same one, so an estimate over thousands of nodes tells shapes apart by
    /// pointer. Weak, as `topologies`.
    shapes: HashMap<u64, Weak<NodeSpec>>,
}

impl Table {
    /// An empty table enforcing at most `max_shares_per_gpu` pods on one shared GPU.
    pub fn new(max_shares_per_gpu: u16) -> Self {
        Self {
            nodes: HashMap::default(),
            pods: HashMap::new(),
            pods_by_node: NameMap::default(),
            external: HashMap::new(),
            external_by_node: NameMap::default(),
            max_shares_per_gpu,
            topologies: HashMap::new(),
            shapes: HashMap::new(),
        }
    }

    /// A table built from a full list of nodes and bound pods, as after a restart or relist.
    pub fn rebuild(
        max_shares_per_gpu: u16,
        nodes: impl IntoIterator<Item = NodeSpec>,
        pods: impl IntoIterator<Item = (PodKey, PodAllocation)>,
    ) -> Self {
        let mut table = Self::new(max_shares_per_gpu);
        for node in nodes {
            table.apply(Change::UpsertNode(node));
        }
        for (pod, allocation) in pods {
            table.apply(Change::PodBound { pod, allocation });
        }
        table
    }

    /// The per-GPU pod limit this table enforces.
    pub fn max_shares_per_gpu(&self) -> u16 {
        self.max_shares_per_gpu
    }

    /// Applies a fact. Facts are never refused: the cluster is the truth, and an over-commit it
    /// reports is kept visible to [`Table::check_invariants`] rather than hidden.
    pub fn apply(&mut self, change: Change) {
        match change {
            Change::UpsertNode(mut spec) => {
                let name = spec.name.clone();
                spec.topology = self.intern(spec.topology);
                let mut state = NodeState::new(spec);
                state.profile.shape_peer = self.intern_shape(&state);
                for pod in self.pods_by_node.get(&name).into_iter().flatten() {
                    if let Some(entry) = self.pods.get(pod) {
                        state.add(&entry.allocation);
                    }
                }
                for holder in self.external_by_node.get(&name).into_iter().flatten() {
                    if let Some(entry) = self.external.get(holder) {
                        state.add_external(&entry.holds, &entry.mig);
                    }
                }
                if let Some(old) = self.nodes.insert(NameKey::new(name.as_str()), state) {
                    self.forget(old);
                }
            }
            Change::RemoveNode(name) => {
                if let Some(old) = self.nodes.remove(name.as_str().as_bytes()) {
                    self.forget(old);
                }
            }
            Change::PodBound { pod, allocation } => {
                if let Some(entry) = self.pods.get(&pod)
                    && entry.allocation == allocation
                {
                    self.pods.insert(
                        pod,
                        PodEntry {
                            allocation,
                            hold: Hold::Bound,
                        },
                    );
                    return;
                }
                self.release(&pod);
                self.insert(pod, allocation, Hold::Bound);
            }
            Change::PodGone(pod) => {
                self.release(&pod);
            }
            Change::HoldExternal {
                holder,
                node,
                holds,
                mig,
            } => {
                let entry = ExternalHold {
                    node,
                    holds,
                    mig: normalized(mig),
                };
                if self.external.get(&holder) == Some(&entry) {
                    return;
                }
                self.release_external(&holder);
                if let Some(state) = self.node_mut(&entry.node) {
                    state.add_external(&entry.holds, &entry.mig);
                }
                self.external_by_node
                    .entry(entry.node.clone())
                    .or_default()
                    .insert(holder.clone());
                self.external.insert(holder, entry);
            }
            Change::ReleaseExternal(holder) => {
                self.release_external(&holder);
            }
        }
    }

    /// Frees whatever `holder` holds and returns it.
    fn release_external(&mut self, holder: &HolderKey) -> Option<ExternalHold> {
        let entry = self.external.remove(holder)?;
        if let Some(state) = self.node_mut(&entry.node) {
            state.remove_external(&entry.holds, &entry.mig);
        }
        if let Some(set) = self.external_by_node.get_mut(&entry.node) {
            set.remove(holder);
            if set.is_empty() {
                self.external_by_node.remove(&entry.node);
            }
        }
        Some(entry)
    }

    /// The index the table already holds that is equal to `index`, or `index` itself (then
    /// remembered for the next node with its link matrix). Only an equal index is ever
    /// substituted, so a node answers exactly as with its own.
    fn intern(&mut self, index: Arc<TopologyIndex>) -> Arc<TopologyIndex> {
        let key = index.links();
        if let Some(known) = self.topologies.get(key).and_then(Weak::upgrade) {
            if Arc::ptr_eq(&known, &index) || *known == *index {
                return known;
            }
            // Equal matrices index equally unless the spec carries an index built otherwise
            // (by search only): keep the node's own, and share the usual one.
            return index;
        }
        self.topologies.insert(key.clone(), Arc::downgrade(&index));
        index
    }

    /// The spec the table holds for `node`'s shape, or a copy of `node`'s (then remembered for
    /// the next node of its shape). `None` when another shape has the same hash: that node is
    /// compared spec by spec.
    fn intern_shape(&mut self, node: &NodeState) -> Option<Arc<NodeSpec>> {
        let hash = node.shape_hash();
        if let Some(known) = self.shapes.get(&hash).and_then(Weak::upgrade) {
            return same_shape(&known, &node.spec).then_some(known);
        }
        let spec = Arc::new(node.spec.clone());
        self.shapes.insert(hash, Arc::downgrade(&spec));
        Some(spec)
    }

    /// Drops a node's state and, when no other node shares its topology index or its shape,
    /// the table's entry for it.
    fn forget(&mut self, old: NodeState) {
        let index = Arc::clone(&old.spec.topology);
        if let Some(peer) = &old.profile.shape_peer
            && Arc::strong_count(peer) == 1
        {
            forget_interned(&mut self.shapes, &old.shape_hash(), peer);
        }
        drop(old);
        if Arc::strong_count(&index) == 1 {
            forget_interned(&mut self.topologies, index.links(), &index);
        }
    }

    /// Holds `allocation` for `pod` until the watch confirms it or `expires_at_ms` passes.
    /// Refused if the pod already holds something or the allocation no longer fits.
    pub fn reserve(
        &mut self,
        pod: PodKey,
        allocation: PodAllocation,
        expires_at_ms: u64,
    ) -> Result<(), TableError> {
        if self.pods.contains_key(&pod) {
            return Err(TableError::AlreadyAllocated(pod));
        }
        let node = self
            .node(&allocation.node)
            .ok_or_else(|| TableError::UnknownNode(allocation.node.clone()))?;
        let mut trial = node.clone();
        trial.add(&allocation);
        if let Some(detail) = node_violations(&trial, self.max_shares_per_gpu)
            .into_iter()
            .next()
        {
            return Err(TableError::NoLongerFits {
                node: allocation.node.clone(),
                detail,
            });
        }
        self.insert(pod, allocation, Hold::Reserved { expires_at_ms });
        Ok(())
    }

    /// What taking `allocation` for `pod` would over-commit on its node's GPUs that is not
    /// over-committed already: a GPU held whole twice, held whole and shared, past its memory,
    /// compute or pod limit, or a GPU the node does not have. What `pod` holds now is set aside
    /// first, so re-reading a pod's own allocation conflicts with nothing. Empty when it fits,
    /// and when the node is not known (nothing to judge against). The watch asks this of a
    /// record it has not applied before: a record naming GPUs that others hold is not applied.
    pub fn gpu_conflicts(&self, pod: &PodKey, allocation: &PodAllocation) -> Vec<String> {
        let Some(node) = self.node(&allocation.node) else {
            return Vec::new();
        };
        let mut without = node.clone();
        if let Some(entry) = self.pods.get(pod)
            && entry.allocation.node == allocation.node
        {
            without.remove(&entry.allocation);
        }
        let before = gpu_violations(&without, self.max_shares_per_gpu);
        let mut trial = without;
        trial.add(allocation);
        gpu_violations(&trial, self.max_shares_per_gpu)
            .into_iter()
            .filter(|violation| !before.contains(violation))
            .collect()
    }

    /// Frees whatever `pod` holds and returns it.
    pub fn release(&mut self, pod: &PodKey) -> Option<PodAllocation> {
        let entry = self.pods.remove(pod)?;
        if let Some(node) = self.node_mut(&entry.allocation.node) {
            node.remove(&entry.allocation);
        }
        if let Some(set) = self.pods_by_node.get_mut(&entry.allocation.node) {
            set.remove(pod);
            if set.is_empty() {
                self.pods_by_node.remove(&entry.allocation.node);
            }
        }
        Some(entry.allocation)
    }

    /// Releases every reservation whose time has passed; returns the pods released.
    pub fn expire_reservations(&mut self, now_ms: u64) -> Vec<PodKey> {
        self.expire_reservations_released(now_ms)
            .into_iter()
            .map(|(pod, _)| pod)
            .collect()
    }

    /// [`Table::expire_reservations`], returning with each pod what it held (its node, for
    /// callers that track where capacity was freed).
    pub fn expire_reservations_released(&mut self, now_ms: u64) -> Vec<(PodKey, PodAllocation)> {
        let expired: Vec<PodKey> = self
            .pods
            .iter()
            .filter(|(_, entry)| {
                matches!(entry.hold, Hold::Reserved { expires_at_ms } if expires_at_ms <= now_ms)
            })
            .map(|(pod, _)| pod.clone())
            .collect();
        expired
            .into_iter()
            .filter_map(|pod| self.release(&pod).map(|allocation| (pod, allocation)))
            .collect()
    }

    fn insert(&mut self, pod: PodKey, allocation: PodAllocation, hold: Hold) {
        if let Some(node) = self.node_mut(&allocation.node) {
            node.add(&allocation);
        }
        self.pods_by_node
            .entry(allocation.node.clone())
            .or_default()
            .insert(pod.clone());
        self.pods.insert(pod, PodEntry { allocation, hold });
    }

    /// A node's state.
    pub fn node(&self, name: &NodeName) -> Option<&NodeState> {
        self.node_by_str(name.as_str())
    }

    /// A node's state by name.
    pub fn node_by_str(&self, name: &str) -> Option<&NodeState> {
        self.nodes.get(name.as_bytes())
    }

    fn node_mut(&mut self, name: &NodeName) -> Option<&mut NodeState> {
        self.nodes.get_mut(name.as_str().as_bytes())
    }

    /// Each of `names` with its node's state, looked up all before any is judged: the lookups
    /// do not depend on each other, so the processor overlaps their cache misses, where one
    /// lookup between two judgements waits for its own (`filter_names/cold` in
    /// `benches/engine.rs`: a third less time for 420 names of 1,000 nodes).
    pub fn nodes_by_names<'a>(&self, names: &[&'a str]) -> Vec<(&'a str, Option<&NodeState>)> {
        names
            .iter()
            .map(|&name| (name, self.node_by_str(name)))
            .collect()
    }

    /// All nodes, in no particular order.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeState> {
        self.nodes.values()
    }

    /// How many nodes the table knows.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// A pod's entry.
    pub fn pod(&self, pod: &PodKey) -> Option<&PodEntry> {
        self.pods.get(pod)
    }

    /// All pods, in no particular order.
    pub fn pods(&self) -> impl Iterator<Item = (&PodKey, &PodEntry)> {
        self.pods.iter()
    }

    /// How many pods hold an allocation.
    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// What a holder that is not a pod holds.
    pub fn external(&self, holder: &HolderKey) -> Option<&ExternalHold> {
        self.external.get(holder)
    }

    /// Every holder that is not a pod, in no particular order.
    pub fn externals(&self) -> impl Iterator<Item = (&HolderKey, &ExternalHold)> {
        self.external.iter()
    }

    /// The holders that are not pods holding GPUs of `node`.
    pub fn externals_on(
        &self,
        node: &NodeName,
    ) -> impl Iterator<Item = (&HolderKey, &ExternalHold)> {
        self.external_by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|holder| self.external.get(holder).map(|entry| (holder, entry)))
    }

    /// The pods whose allocation names `node`.
    pub fn pods_on(&self, node: &NodeName) -> impl Iterator<Item = (&PodKey, &PodEntry)> {
        self.pods_by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|pod| self.pods.get(pod).map(|entry| (pod, entry)))
    }

    /// Every broken invariant, as readable lines: no GPU over-committed in memory or compute, none
    /// both whole and shared or whole twice, at most the per-GPU pod limit, no more MIG slices of
    /// a profile held (by pods and external holds together) than the node advertises, host CPU and
    /// memory within capacity, and every node's usage equal to the sum of its pods and external holds
    /// (so released capacity equals what was allocated).
    pub fn check_invariants(&self) -> Result<(), Vec<String>> {
        let mut violations = Vec::new();
        for node in self.nodes.values() {
            let name = &node.spec.name;
            violations.extend(node_violations(node, self.max_shares_per_gpu));
            let mut recomputed = NodeState::new(node.spec.clone());
            for (_, entry) in self.pods_on(name) {
                recomputed.add(&entry.allocation);
            }
            for (_, entry) in self.externals_on(name) {
                recomputed.add_external(&entry.holds, &entry.mig);
            }
            if recomputed.gpus != node.gpus
                || recomputed.cpu_used != node.cpu_used
                || recomputed.mem_used != node.mem_used
                || recomputed.pods != node.pods
                || recomputed.mig_held != node.mig_held
            {
                violations.push(format!(
                    "node {name}: usage differs from the sum of its pods and external holds"
                ));
            }
        }
        for (pod, entry) in &self.pods {
            let listed = self
                .pods_by_node
                .get(&entry.allocation.node)
                .is_some_and(|s| s.contains(pod));
            if !listed {
                violations.push(format!("pod {pod}: missing from its node's pod index"));
            }
        }
        for (holder, entry) in &self.external {
            let listed = self
                .external_by_node
                .get(&entry.node)
                .is_some_and(|s| s.contains(holder));
            if !listed {
                violations.push(format!(
                    "holder {holder}: missing from its node's holder index"
                ));
            }
        }
        if violations.is_empty() {
            Ok(())
        } else {
            Err(violations)
        }
    }
}

impl PartialEq for Table {
    fn eq(&self, other: &Self) -> bool {
        type Usage = (Vec<GpuUsage>, u64, u64, u32, Vec<MigSlices>);
        let node_usage = |table: &Self| -> HashMap<NodeName, Usage> {
            table
                .nodes
                .values()
                .map(|n| {
                    (
                        n.spec.name.clone(),
                        (
                            n.gpus.to_vec(),
                            n.cpu_used.0,
                            n.mem_used.0,
                            n.pods,
                            n.mig_held.clone(),
                        ),
                    )
                })
                .collect()
        };
        let allocations = |table: &Self| -> HashMap<PodKey, PodAllocation> {
            table
                .pods
                .iter()
                .map(|(pod, entry)| (pod.clone(), entry.allocation.clone()))
                .collect()
        };
        self.max_shares_per_gpu == other.max_shares_per_gpu
            && node_usage(self) == node_usage(other)
            && allocations(self) == allocations(other)
            && self.external == other.external
    }
}

fn node_violations(node: &NodeState, max_shares_per_gpu: u16) -> Vec<String> {
    let name = &node.spec.name;
    let mut violations = per_gpu_violations(node, max_shares_per_gpu);
    if node.cpu_used > node.spec.cpu {
        violations.push(format!("node {name}: CPU over-committed"));
    }
    if node.mem_used > node.spec.memory {
        violations.push(format!("node {name}: memory over-committed"));
    }
    violations.extend(dangling_holds(node));
    violations.extend(mig_violations(node));
    violations
}

/// MIG slices held past what the node advertises, one line per profile: a pod bound by someone
/// else, or a node whose device plugin now advertises fewer.
fn mig_violations(node: &NodeState) -> impl Iterator<Item = String> + '_ {
    node.mig_held.iter().filter_map(move |held| {
        let advertised = node.mig_advertised(&held.profile);
        (held.count > advertised).then(|| {
            format!(
                "node {} MIG {}: {} slices held, {advertised} advertised",
                node.spec.name, held.profile, held.count
            )
        })
    })
}

/// The GPU part of [`node_violations`]: CPU and memory come from the pods' own requests, which
/// a node may over-commit without any GPU being handed out twice. MIG slices are left out too:
/// the record names no slice (kubelet chooses the instance), so a record cannot take slices
/// others hold; a pod's slices come from its own request.
fn gpu_violations(node: &NodeState, max_shares_per_gpu: u16) -> Vec<String> {
    let mut violations = per_gpu_violations(node, max_shares_per_gpu);
    violations.extend(dangling_holds(node));
    violations
}

fn per_gpu_violations(node: &NodeState, max_shares_per_gpu: u16) -> Vec<String> {
    let name = &node.spec.name;
    let mut violations = Vec::new();
    for (gpu, usage) in node.spec.gpus.iter().zip(&node.gpus) {
        let index = gpu.index.0;
        if usage.mem > gpu.memory {
            violations.push(format!("node {name} GPU {index}: memory over-committed"));
        }
        if usage.compute > WHOLE_GPU_COMPUTE {
            violations.push(format!("node {name} GPU {index}: compute over-committed"));
        }
        if usage.whole_pods > 1 {
            violations.push(format!(
                "node {name} GPU {index}: held whole by several pods"
            ));
        }
        if usage.is_whole() && usage.shares > 0 {
            violations.push(format!("node {name} GPU {index}: both whole and shared"));
        }
        if usage.shares > max_shares_per_gpu {
            violations.push(format!(
                "node {name} GPU {index}: more than {max_shares_per_gpu} pods"
            ));
        }
    }
    violations
}

fn dangling_holds(node: &NodeState) -> Option<String> {
    (node.dangling_holds > 0).then(|| {
        format!(
            "node {}: {} holds on GPUs it no longer has",
            node.spec.name, node.dangling_holds
        )
    })
}

/// Removes `map`'s entry for `key` if it is `last`, the final holder of an interned value
/// ([`Table::intern`], `Table::intern_shape`): an entry another value has taken stays.
fn forget_interned<K: Hash + Eq, T>(map: &mut HashMap<K, Weak<T>>, key: &K, last: &Arc<T>) {
    if map
        .get(key)
        .is_some_and(|known| known.as_ptr() == Arc::as_ptr(last))
    {
        map.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{GpuMode, Link, MemMiB};

    fn islands() -> LinkMatrix {
        LinkMatrix::from_fn(8, |a, b| {
            if a / 4 == b / 4 {
                Link::NvLink(2)
            } else {
                Link::CrossSocket
            }
        })
    }

    fn spec(name: &str, links: LinkMatrix) -> NodeSpec {
        NodeSpec::uniform(name, GpuMode::Exclusive, 8, "A100", MemMiB(81_920)).with_links(links)
    }

    fn index_of<'a>(table: &'a Table, name: &str) -> &'a Arc<TopologyIndex> {
        table
            .node_by_str(name)
            .map(|node| &node.spec.topology)
            .unwrap()
    }

    #[test]
    fn nodes_with_equal_link_matrices_share_one_index() {
        let mut table = Table::new(20);
        table.apply(Change::UpsertNode(spec("a", islands())));
        table.apply(Change::UpsertNode(spec("b", islands())));
        table.apply(Change::UpsertNode(spec("c", LinkMatrix::uniform(8))));
        assert!(Arc::ptr_eq(index_of(&table, "a"), index_of(&table, "b")));
        assert!(!Arc::ptr_eq(index_of(&table, "a"), index_of(&table, "c")));
        // An update of a node with the same matrix keeps sharing.
        table.apply(Change::UpsertNode(spec("a", islands())));
        assert!(Arc::ptr_eq(index_of(&table, "a"), index_of(&table, "b")));
        assert_eq!(table.topologies.len(), 2);
    }

    #[test]
    fn an_index_is_forgotten_once_no_node_uses_it() {
        let mut table = Table::new(20);
        table.apply(Change::UpsertNode(spec("a", islands())));
        table.apply(Change::UpsertNode(spec("b", islands())));
        table.apply(Change::RemoveNode(NodeName::new("a")));
        assert_eq!(table.topologies.len(), 1, "b still uses it");
        // b changes hardware: the islands index has no node left.
        table.apply(Change::UpsertNode(spec("b", LinkMatrix::uniform(8))));
        assert_eq!(table.topologies.len(), 1);
        assert!(!table.topologies.contains_key(&islands()));
        table.apply(Change::RemoveNode(NodeName::new("b")));
        assert!(table.topologies.is_empty());
    }

    fn shape_of<'a>(table: &'a Table, name: &str) -> &'a Arc<NodeSpec> {
        table
            .node_by_str(name)
            .and_then(|node| node.profile.shape_peer.as_ref())
            .unwrap()
    }

    #[test]
    fn nodes_of_one_shape_share_one_spec_until_none_is_left() {
        let mut table = Table::new(20);
        table.apply(Change::UpsertNode(spec("a", islands())));
        table.apply(Change::UpsertNode(spec("b", islands())));
        table.apply(Change::UpsertNode(spec("c", LinkMatrix::uniform(8))));
        assert!(Arc::ptr_eq(shape_of(&table, "a"), shape_of(&table, "b")));
        assert!(!Arc::ptr_eq(shape_of(&table, "a"), shape_of(&table, "c")));
        let (a, c) = (
            table.node_by_str("a").unwrap(),
            table.node_by_str("c").unwrap(),
        );
        assert!(a.same_shape(table.node_by_str("b").unwrap()));
        assert!(!a.same_shape(c));
        assert_eq!(table.shapes.len(), 2);
        table.apply(Change::RemoveNode(NodeName::new("a")));
        assert_eq!(table.shapes.len(), 2, "b still has the islands shape");
        table.apply(Change::RemoveNode(NodeName::new("b")));
        assert_eq!(table.shapes.len(), 1);
        table.apply(Change::RemoveNode(NodeName::new("c")));
        assert!(table.shapes.is_empty());
        assert!(table.topologies.is_empty());
    }

    #[test]
    fn only_an_equal_index_is_substituted() {
        let mut table = Table::new(20);
        table.apply(Change::UpsertNode(spec("a", islands())));
        let mut searching = spec("b", islands());
        searching.topology = Arc::new(TopologyIndex::build_searching(&islands()));
        table.apply(Change::UpsertNode(searching));
        assert!(!index_of(&table, "b").is_tabulated());
        assert!(index_of(&table, "a").is_tabulated());
    }

    /// A node is found by its name whether the name lies in the map's entry or on the heap
    /// ([`NameKey`]), right at the boundary included, and no other name finds it.
    #[test]
    fn names_of_every_length_find_their_node_and_only_theirs() {
        let long = |len: usize| "n".repeat(len);
        let names = [
            String::new(),
            "a".to_owned(),
            long(INLINE_NAME - 1),
            long(INLINE_NAME),
            long(INLINE_NAME + 1),
            long(253),
            "ip-10-0-3-17.us-west-2.compute.internal".to_owned(),
            // Multi-byte characters: 27 × 2 bytes is exactly the inline size.
            "é".repeat(INLINE_NAME / 2),
        ];
        let mut table = Table::new(20);
        for name in &names {
            table.apply(Change::UpsertNode(spec(name, LinkMatrix::uniform(8))));
        }
        assert_eq!(table.node_count(), names.len());
        for name in &names {
            assert_eq!(
                table.node_by_str(name).map(|n| n.spec.name.as_str()),
                Some(name.as_str())
            );
            let by_name = table
                .node(&NodeName::new(name))
                .map(|n| n.spec.name.as_str());
            assert_eq!(by_name, Some(name.as_str()));
        }
        for absent in [
            long(2),
            long(INLINE_NAME + 2),
            "é".repeat(INLINE_NAME / 2 - 1),
        ] {
            assert!(table.node_by_str(&absent).is_none(), "{absent:?}");
        }
        let asked: Vec<&str> = vec![&names[4], "absent", &names[3], &names[0]];
        let found: Vec<_> = table
            .nodes_by_names(&asked)
            .into_iter()
            .map(|(asked, node)| (asked, node.map(|n| n.spec.name.as_str())))
            .collect();
        assert_eq!(
            found,
            [
                (asked[0], Some(asked[0])),
                ("absent", None),
                (asked[2], Some(asked[2])),
                (asked[3], Some(asked[3])),
            ]
        );
        table.apply(Change::RemoveNode(NodeName::new(long(INLINE_NAME))));
        table.apply(Change::RemoveNode(NodeName::new(long(INLINE_NAME + 1))));
        assert!(table.node_by_str(&long(INLINE_NAME)).is_none());
        assert!(table.node_by_str(&long(INLINE_NAME + 1)).is_none());
        assert!(table.node_by_str(&long(INLINE_NAME - 1)).is_some());
        assert_eq!(table.node_count(), names.len() - 2);
    }
}
