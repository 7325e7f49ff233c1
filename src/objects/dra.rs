//! Dynamic Resource Allocation read as GPUs: the ResourceSlices of the configured drivers into
//! the GPUs and MIG slices each node offers, and ResourceClaims' allocations into which of them
//! each claim holds. Pure (no I/O): the watch feeds objects in and turns the answers into table
//! changes (`crate::k8s::watch`). Bad or partial slices are reported with what is wrong, never
//! guessed around: an unknown driver is counted and ignored, a device missing an attribute is
//! left out, a pool whose slices have not all arrived offers nothing until they have, and only
//! the newest generation of a pool counts.

use std::collections::{BTreeMap, BTreeSet, HashMap};

pub use crate::inspect::{CLAIM_HOLDER_PREFIX, DraCounts, claim_holder, holder_claim};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourceClaim, ResourceSlice};

use super::quantity::Quantity;
use super::translate::UNKNOWN_MODEL;
use crate::config::{DraConfig, DraDriverConfig};
use gpu_engine::mig::normalized;
use gpu_engine::{
    ComputeMilli, Gpu, GpuHold, GpuIndex, MemMiB, MigProfile, MigSlices, WHOLE_GPU_COMPUTE,
};

/// The most problems a book keeps for the views (the log has each one as it happens).
const MAX_PROBLEMS: usize = 64;

/// A pool of devices: a driver's name and the pool's (`spec.pool.name`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolKey {
    pub driver: String,
    pub pool: String,
}

impl std::fmt::Display for PoolKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.driver, self.pool)
    }
}

/// What a device is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// A whole GPU.
    Gpu,
    /// A MIG slice of a GPU, with its profile where the driver names it.
    Mig { profile: Option<String> },
}

/// One GPU or MIG slice of a configured driver, with only what accounting reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraDevice {
    /// The device's name in its pool (what claims' allocations name).
    pub name: String,
    pub kind: DeviceKind,
    /// The GPU's index on its node: the device's own, or a MIG slice's parent's.
    pub gpu_index: u16,
    /// The GPU's UUID: the device's own, or a MIG slice's parent's.
    pub gpu_uuid: Option<String>,
    pub model: Option<String>,
    pub memory: MemMiB,
}

/// One ResourceSlice of a configured driver, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SliceReading {
    pool: PoolKey,
    generation: i64,
    slice_count: i64,
    /// `spec.nodeName`; `None` for slices of devices reachable from several nodes, which are
    /// not GPUs of one node and are not read.
    node: Option<String>,
    devices: Vec<DraDevice>,
    /// Devices of other types (neither the GPU nor the MIG type).
    other_devices: usize,
    problems: Vec<String>,
}

/// Where a pool stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolState {
    /// Every slice of the newest generation is here: its devices count.
    Complete,
    /// Fewer slices of the newest generation than `spec.pool.resourceSliceCount` says: the
    /// pool offers nothing until the rest arrive.
    Waiting {
        generation: i64,
        seen: usize,
        expected: i64,
    },
    /// The pool's slices name no node (or different ones): not GPUs of one node.
    NotNodeLocal,
}

/// A pool's devices, newest generation only, and where it stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolView<'a> {
    pub node: Option<&'a str>,
    pub state: PoolState,
    pub devices: Vec<&'a DraDevice>,
    /// Slices of older generations still listed (a driver republishing): ignored.
    pub stale_slices: usize,
}

/// One claim's allocation, as read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct ClaimReading {
    /// Devices of configured drivers in `status.allocation.devices.results`.
    devices: Vec<(PoolKey, String)>,
    /// `namespace/name` of the pods in `status.reservedFor`.
    pods: Vec<String>,
}

/// What a claim holds on its node, ready for the table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimHolds {
    pub node: Option<String>,
    pub holds: Vec<GpuHold>,
    /// The MIG slices among its devices, by profile (normalized): counted against the node's
    /// pools ([`node_mig`]) besides the memory [`Self::holds`] takes of their parent GPUs.
    pub mig: Vec<MigSlices>,
    /// Why some allocated device is not (yet) held: its pool is incomplete or unknown, the
    /// device is not in it, or it matches none of the node's GPUs.
    pub problems: Vec<String>,
}

/// Every slice and claim of the configured drivers, slimmed, and what they mean as GPUs.
#[derive(Debug, Default)]
pub struct DraBook {
    /// Slices of the configured drivers, by object name.
    slices: HashMap<String, SliceReading>,
    /// Slices of other drivers, by object name, with their driver: counted, not read.
    unknown: HashMap<String, String>,
    /// Slice names by pool.
    pools: BTreeMap<PoolKey, BTreeSet<String>>,
    /// Pools by the node their slices name.
    pools_by_node: HashMap<String, BTreeSet<PoolKey>>,
    /// Claims by `namespace/name`.
    claims: HashMap<String, ClaimReading>,
    /// Claims by the pools their allocations name.
    claims_by_pool: HashMap<PoolKey, BTreeSet<String>>,
    /// What each claim asks of the configured DeviceClasses, allocated or not (what prioritize
    /// ranks nodes for), by `namespace/name`.
    requests: HashMap<String, ClaimAsk>,
    /// Why a claim asking devices of the configured DeviceClasses is not read (no opinion on
    /// its pod), by `namespace/name`.
    unread: HashMap<String, String>,
}

/// What a claim, or a pod's claims together, ask of the configured DeviceClasses: whole GPUs,
/// and MIG slices by profile (normalized).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimAsk {
    pub gpus: u64,
    pub mig: Vec<MigSlices>,
}

impl ClaimAsk {
    /// Whether it asks for nothing.
    pub fn is_empty(&self) -> bool {
        self.gpus == 0 && self.mig.is_empty()
    }

    /// Adds what `other` asks.
    pub fn add(&mut self, other: &ClaimAsk) {
        self.gpus = self.gpus.saturating_add(other.gpus);
        let mut mig = std::mem::take(&mut self.mig);
        mig.extend(other.mig.iter().cloned());
        self.mig = normalized(mig);
    }

    /// In words: `2 whole GPU(s)`, `3 MIG slice(s) of 1g.10gb`, joined by `and`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.gpus > 0 {
            parts.push(format!("{} whole GPU(s)", self.gpus));
        }
        for slices in &self.mig {
            parts.push(format!(
                "{} MIG slice(s) of {}",
                slices.count, slices.profile
            ));
        }
        parts.join(" and ")
    }
}

/// What the extender knows of Dynamic Resource Allocation, shared by the feed (which writes it)
/// and the views (which read it).
#[derive(Debug, Default)]
pub struct DraState {
    /// `None`: DRA is not read (`dra.enabled` off, or not known yet); `Some(false)`: the API
    /// does not serve it or refuses the extender; `Some(true)`: read.
    pub served: Option<bool>,
    pub book: DraBook,
    /// Nodes offering GPUs both through the device plugin and a DRA driver.
    pub both_ways: BTreeSet<String>,
    /// Why some of a claim's devices are not held, by claim.
    pub claim_problems: HashMap<String, Vec<String>>,
}

impl DraBook {
    /// An empty book.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads a slice (new or changed); returns the pools whose devices may have changed (the
    /// slice's, and the one it was in before if it moved) and the problems found in it.
    pub fn apply_slice(&mut self, slice: &ResourceSlice, cfg: &DraConfig) -> SliceApplied {
        let name = slice.metadata.name.clone().unwrap_or_default();
        let mut touched = self.remove_slice(&name);
        let Some(driver) = cfg
            .drivers
            .iter()
            .find(|driver| driver.name == slice.spec.driver)
        else {
            self.unknown.insert(name, slice.spec.driver.clone());
            return SliceApplied {
                pools: touched,
                problems: Vec::new(),
                unknown_driver: Some(slice.spec.driver.clone()),
            };
        };
        let reading = read_slice(slice, driver);
        let problems = reading.problems.clone();
        let pool = reading.pool.clone();
        if let Some(node) = &reading.node {
            self.pools_by_node
                .entry(node.clone())
                .or_default()
                .insert(pool.clone());
        }
        self.pools
            .entry(pool.clone())
            .or_default()
            .insert(name.clone());
        self.slices.insert(name, reading);
        if !touched.contains(&pool) {
            touched.push(pool);
        }
        SliceApplied {
            pools: touched,
            problems,
            unknown_driver: None,
        }
    }

    /// Forgets a slice; returns the pool it was in, if it was read.
    pub fn remove_slice(&mut self, name: &str) -> Vec<PoolKey> {
        self.unknown.remove(name);
        let Some(old) = self.slices.remove(name) else {
            return Vec::new();
        };
        if let Some(names) = self.pools.get_mut(&old.pool) {
            names.remove(name);
            if names.is_empty() {
                self.pools.remove(&old.pool);
            }
        }
        if let Some(node) = &old.node {
            let still_there = self
                .pools
                .get(&old.pool)
                .into_iter()
                .flatten()
                .filter_map(|slice| self.slices.get(slice))
                .any(|slice| slice.node.as_ref() == Some(node));
            if !still_there && let Some(pools) = self.pools_by_node.get_mut(node) {
                pools.remove(&old.pool);
                if pools.is_empty() {
                    self.pools_by_node.remove(node);
                }
            }
        }
        vec![old.pool]
    }

    /// The node a slice names, if the book read it.
    pub fn slice_node(&self, name: &str) -> Option<&str> {
        self.slices
            .get(name)
            .and_then(|slice| slice.node.as_deref())
    }

    /// Every node some slice names.
    pub fn nodes(&self) -> Vec<String> {
        self.pools_by_node.keys().cloned().collect()
    }

    /// Takes the slices of `listed` (a full list, read into a book of its own) in place of
    /// this book's, keeping the claims.
    pub fn replace_slices(&mut self, listed: DraBook) {
        self.slices = listed.slices;
        self.unknown = listed.unknown;
        self.pools = listed.pools;
        self.pools_by_node = listed.pools_by_node;
    }

    /// Takes the claims of `listed` (a full list, read into a book of its own) in place of
    /// this book's, keeping the slices.
    pub fn replace_claims(&mut self, listed: DraBook) {
        self.claims = listed.claims;
        self.claims_by_pool = listed.claims_by_pool;
        self.requests = listed.requests;
        self.unread = listed.unread;
    }

    /// What a claim asks for of the configured DeviceClasses (`None`: nothing, or asked in a
    /// way not read: [`Self::claim_unread`] says which).
    pub fn claim_request(&self, key: &str) -> Option<&ClaimAsk> {
        self.requests.get(key)
    }

    /// Why a claim that asks devices of the configured DeviceClasses is not read, if it is not
    /// ([`read_claim_request`]).
    pub fn claim_unread(&self, key: &str) -> Option<&str> {
        self.unread.get(key).map(String::as_str)
    }

    /// A pool's devices (newest generation only) and where it stands; `None` for a pool no
    /// slice names.
    pub fn pool(&self, key: &PoolKey) -> Option<PoolView<'_>> {
        let slices: Vec<&SliceReading> = self
            .pools
            .get(key)?
            .iter()
            .filter_map(|name| self.slices.get(name))
            .collect();
        let newest = slices.iter().map(|slice| slice.generation).max()?;
        let current: Vec<&SliceReading> = slices
            .iter()
            .copied()
            .filter(|slice| slice.generation == newest)
            .collect();
        let stale_slices = slices.len() - current.len();
        let expected = current
            .iter()
            .map(|slice| slice.slice_count)
            .max()
            .unwrap_or(1);
        let nodes: BTreeSet<Option<&str>> =
            current.iter().map(|slice| slice.node.as_deref()).collect();
        let node = match nodes.into_iter().collect::<Vec<_>>().as_slice() {
            [Some(node)] => Some(*node),
            _ => None,
        };
        let state = if node.is_none() {
            PoolState::NotNodeLocal
        } else if i64::try_from(current.len()).unwrap_or(i64::MAX) < expected {
            PoolState::Waiting {
                generation: newest,
                seen: current.len(),
                expected,
            }
        } else {
            PoolState::Complete
        };
        let devices = if state == PoolState::Complete {
            current
                .iter()
                .flat_map(|slice| slice.devices.iter())
                .collect()
        } else {
            Vec::new()
        };
        Some(PoolView {
            node,
            state,
            devices,
            stale_slices,
        })
    }

    /// Whether any slice names `node`.
    pub fn serves(&self, node: &str) -> bool {
        self.pools_by_node.contains_key(node)
    }

    /// The pools whose slices name `node`.
    pub fn pools_on(&self, node: &str) -> Vec<PoolKey> {
        self.pools_by_node
            .get(node)
            .map(|pools| pools.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The devices the complete pools of `node` offer.
    pub fn node_devices(&self, node: &str) -> Vec<&DraDevice> {
        self.pools_on(node)
            .iter()
            .filter_map(|pool| self.pool(pool))
            .filter(|view| view.node == Some(node))
            .flat_map(|view| view.devices)
            .collect()
    }

    /// Reads a claim (new or changed). Returns the claim's `namespace/name`.
    pub fn apply_claim(&mut self, claim: &ResourceClaim, cfg: &DraConfig) -> String {
        let key = claim_key(claim);
        let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
        let status = claim.status.as_ref();
        let devices: Vec<(PoolKey, String)> = status
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .into_iter()
            .flatten()
            .filter(|result| cfg.drivers.iter().any(|d| d.name == result.driver))
            .map(|result| {
                (
                    PoolKey {
                        driver: result.driver.clone(),
                        pool: result.pool.clone(),
                    },
                    result.device.clone(),
                )
            })
            .collect();
        let pods = status
            .and_then(|s| s.reserved_for.as_ref())
            .into_iter()
            .flatten()
            .filter(|consumer| {
                consumer.resource == "pods"
                    && consumer.api_group.as_deref().unwrap_or("").is_empty()
            })
            .map(|consumer| format!("{namespace}/{}", consumer.name))
            .collect();
        self.remove_claim(&key);
        match read_claim_request(claim, cfg) {
            Ok(Some(ask)) => {
                self.requests.insert(key.clone(), ask);
            }
            Ok(None) => {}
            Err(why) => {
                self.unread.insert(key.clone(), why);
            }
        }
        if !devices.is_empty() {
            for (pool, _) in &devices {
                self.claims_by_pool
                    .entry(pool.clone())
                    .or_default()
                    .insert(key.clone());
            }
            self.claims
                .insert(key.clone(), ClaimReading { devices, pods });
        }
        key
    }

    /// Forgets a claim (deleted, or allocated no device of ours any more).
    pub fn remove_claim(&mut self, key: &str) {
        self.requests.remove(key);
        self.unread.remove(key);
        let Some(old) = self.claims.remove(key) else {
            return;
        };
        for (pool, _) in &old.devices {
            if let Some(claims) = self.claims_by_pool.get_mut(pool) {
                claims.remove(key);
                if claims.is_empty() {
                    self.claims_by_pool.remove(pool);
                }
            }
        }
    }

    /// The keys of every claim holding devices of ours (for relists).
    pub fn claim_keys(&self) -> Vec<String> {
        self.claims.keys().cloned().collect()
    }

    /// The claims whose allocations name a device of `pool`.
    pub fn claims_in(&self, pool: &PoolKey) -> Vec<String> {
        self.claims_by_pool
            .get(pool)
            .map(|claims| claims.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The pods (`namespace/name`) a claim is reserved for.
    pub fn claim_pods(&self, key: &str) -> &[String] {
        self.claims.get(key).map_or(&[], |claim| &claim.pods)
    }

    /// The devices (`driver/pool/device`) a claim is allocated.
    pub fn claim_devices(&self, key: &str) -> Vec<String> {
        self.claims.get(key).map_or_else(Vec::new, |claim| {
            claim
                .devices
                .iter()
                .map(|(pool, device)| format!("{pool}/{device}"))
                .collect()
        })
    }

    /// What a claim holds, mapped onto the GPUs of its node as the table knows them
    /// (`node_gpus`, looked up by node name): by UUID where both sides have one, else by index.
    /// An allocated device that cannot be mapped is a problem, not a guess.
    pub fn claim_holds<'a>(
        &self,
        key: &str,
        node_gpus: impl Fn(&str) -> Option<&'a [Gpu]>,
    ) -> ClaimHolds {
        let mut out = ClaimHolds::default();
        let Some(claim) = self.claims.get(key) else {
            return out;
        };
        for (pool, device_name) in &claim.devices {
            let Some(view) = self.pool(pool) else {
                out.problems.push(format!(
                    "device {pool}/{device_name}: no ResourceSlice of pool {pool} is known"
                ));
                continue;
            };
            let Some(node) = view.node else {
                out.problems.push(format!(
                    "device {pool}/{device_name}: pool {pool} is not local to one node"
                ));
                continue;
            };
            if let PoolState::Waiting {
                generation,
                seen,
                expected,
            } = view.state
            {
                out.problems.push(format!(
                    "device {pool}/{device_name}: pool {pool} has {seen} of {expected} slices of generation {generation}; waiting for the rest"
                ));
                continue;
            }
            let Some(device) = view.devices.iter().find(|d| d.name == *device_name) else {
                out.problems.push(format!(
                    "device {pool}/{device_name} is not among the devices pool {pool} publishes"
                ));
                continue;
            };
            match &out.node {
                Some(first) if first != node => {
                    out.problems.push(format!(
                        "device {pool}/{device_name} is on node {node}, the claim's other devices on {first}"
                    ));
                    continue;
                }
                Some(_) => {}
                None => out.node = Some(node.to_owned()),
            }
            let Some(gpus) = node_gpus(node) else {
                out.problems.push(format!(
                    "device {pool}/{device_name}: node {node} is not known yet"
                ));
                continue;
            };
            match match_gpu(device, gpus) {
                Ok(gpu) => out.holds.push(device_hold(device, gpu)),
                Err(problem) => {
                    out.problems.push(format!(
                        "device {pool}/{device_name} on node {node}: {problem}"
                    ));
                    continue;
                }
            }
            if matches!(device.kind, DeviceKind::Mig { .. }) {
                match mig_profile(device) {
                    Ok(profile) => out.mig.push(MigSlices::new(profile, 1)),
                    Err(problem) => out.problems.push(format!(
                        "device {pool}/{device_name} on node {node}: {problem}; its memory is held, not a slice of a profile"
                    )),
                }
            }
        }
        out.holds.sort_by_key(|hold| hold.gpu);
        out.mig = normalized(std::mem::take(&mut out.mig));
        out
    }

    /// Counts over the book.
    pub fn counts(&self) -> DraCounts {
        let mut counts = DraCounts {
            slices: self.slices.len(),
            unknown_driver_slices: self.unknown.len(),
            claims_allocated: self.claims.len(),
            ..DraCounts::default()
        };
        for reading in self.slices.values() {
            counts.devices_unreadable += reading.problems.len();
        }
        for key in self.pools.keys() {
            let Some(view) = self.pool(key) else { continue };
            counts.stale_slices += view.stale_slices;
            match view.state {
                PoolState::Complete => counts.pools_complete += 1,
                PoolState::Waiting { .. } => counts.pools_waiting += 1,
                PoolState::NotNodeLocal => counts.pools_not_node_local += 1,
            }
            for device in view.devices {
                match device.kind {
                    DeviceKind::Gpu => counts.gpus += 1,
                    DeviceKind::Mig { .. } => counts.mig_slices += 1,
                }
            }
        }
        counts
    }

    /// Every problem with the slices and pools, as lines for the views (at most
    /// [`MAX_PROBLEMS`]).
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let mut unknown: BTreeMap<&str, usize> = BTreeMap::new();
        for driver in self.unknown.values() {
            *unknown.entry(driver.as_str()).or_default() += 1;
        }
        for (driver, count) in unknown {
            problems.push(format!(
                "{count} ResourceSlice(s) of driver {driver}, which dra.drivers does not list: ignored"
            ));
        }
        for key in self.pools.keys() {
            let Some(view) = self.pool(key) else { continue };
            if let Some(line) = pool_problem(key, &view) {
                problems.push(line);
            }
        }
        let mut slices: Vec<(&String, &SliceReading)> = self.slices.iter().collect();
        slices.sort_by(|a, b| a.0.cmp(b.0));
        for (name, reading) in slices {
            for problem in &reading.problems {
                problems.push(format!("ResourceSlice {name}: {problem}"));
            }
        }
        problems.truncate(MAX_PROBLEMS);
        problems
    }
}

/// What applying one slice changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SliceApplied {
    /// Pools whose devices may have changed.
    pub pools: Vec<PoolKey>,
    /// What was wrong with the slice's devices.
    pub problems: Vec<String>,
    /// The slice's driver, when no configured driver has its name.
    pub unknown_driver: Option<String>,
}

/// A line on what keeps `view` from offering devices, if anything does.
pub fn pool_problem(key: &PoolKey, view: &PoolView<'_>) -> Option<String> {
    match &view.state {
        PoolState::Complete if view.stale_slices > 0 => Some(format!(
            "pool {key}: {} slice(s) of an older generation ignored (only the newest counts)",
            view.stale_slices
        )),
        PoolState::Complete => None,
        PoolState::Waiting {
            generation,
            seen,
            expected,
        } => Some(format!(
            "pool {key}: {seen} of {expected} ResourceSlices of generation {generation} seen; its devices count once all have arrived"
        )),
        PoolState::NotNodeLocal => Some(format!(
            "pool {key}: its slices name no single node (spec.nodeName); devices shared by several nodes are not read as GPUs"
        )),
    }
}

/// What `claim` asks of the DeviceClasses `cfg` lists. Each `exactly` request in `ExactCount`
/// mode of a whole-GPU class (`dra.drivers[].deviceClasses`) asks its `count` (1 when unset)
/// whole GPUs; of a MIG class (`migDeviceClasses`), with one selector whose CEL expression is
/// exactly `device.attributes['<driver>'].<profile attribute> == '<profile>'`
/// ([`selector_profile`]), `count` slices of that profile. `Ok(None)`: it asks for none of
/// them; `Err`: it asks for one in a way not read (`All` mode, `firstAvailable` alternatives,
/// a MIG request without that one selector), said in words: no opinion on its pod.
pub fn read_claim_request(
    claim: &ResourceClaim,
    cfg: &DraConfig,
) -> Result<Option<ClaimAsk>, String> {
    let whole_class = |class: &str| {
        cfg.drivers
            .iter()
            .any(|driver| driver.device_classes.iter().any(|known| known == class))
    };
    let mig_driver = |class: &str| {
        cfg.drivers
            .iter()
            .find(|driver| driver.mig_device_classes.iter().any(|known| known == class))
    };
    let Some(requests) = claim
        .spec
        .devices
        .as_ref()
        .and_then(|devices| devices.requests.as_ref())
    else {
        return Ok(None);
    };
    let mut ask = ClaimAsk::default();
    for request in requests {
        let name = &request.name;
        let Some(exact) = &request.exactly else {
            let known = request.first_available.iter().flatten().find(|sub| {
                whole_class(&sub.device_class_name) || mig_driver(&sub.device_class_name).is_some()
            });
            if let Some(sub) = known {
                return Err(format!(
                    "request {name} lists alternatives (firstAvailable) of DeviceClass {}: not read",
                    sub.device_class_name
                ));
            }
            continue;
        };
        let class = &exact.device_class_name;
        let mig = mig_driver(class);
        if !whole_class(class) && mig.is_none() {
            continue;
        }
        let mode = exact.allocation_mode.as_deref().unwrap_or("ExactCount");
        if mode != "ExactCount" {
            return Err(format!(
                "request {name} asks all devices of DeviceClass {class} (allocationMode {mode}): not read"
            ));
        }
        let count = exact.count.unwrap_or(1);
        let Some(driver) = mig else {
            let count = u64::try_from(count)
                .map_err(|_| format!("request {name}: count {count} is not a number of devices"))?;
            ask.gpus = ask.gpus.saturating_add(count);
            continue;
        };
        let count = u32::try_from(count)
            .map_err(|_| format!("request {name}: count {count} is not a number of devices"))?;
        let expressions: Vec<&str> = exact
            .selectors
            .iter()
            .flatten()
            .map(|selector| {
                selector
                    .cel
                    .as_ref()
                    .map_or("", |cel| cel.expression.as_str())
            })
            .collect();
        let profile = match expressions.as_slice() {
            [expression] => selector_profile(expression, driver).ok_or_else(|| {
                format!(
                    "request {name} of MIG DeviceClass {class}: its selector is not the plain profile comparison the extender reads (device.attributes['{}'].{} == '<profile>'): not read",
                    attribute_domain(driver),
                    attribute_short(driver)
                )
            })?,
            [] => {
                return Err(format!(
                    "request {name} of MIG DeviceClass {class} names no profile (no selector): not read"
                ));
            }
            _ => {
                return Err(format!(
                    "request {name} of MIG DeviceClass {class} has {} selectors; only one plain profile comparison is read",
                    expressions.len()
                ));
            }
        };
        ask.mig.push(MigSlices::new(profile, count));
    }
    ask.mig = normalized(ask.mig);
    Ok((!ask.is_empty()).then_some(ask))
}

/// Whole GPUs `claim` asks for of the whole-GPU DeviceClasses `cfg` lists ([`read_claim_request`]);
/// `None` when it asks for none, or asks in a way not read.
pub fn requested_gpus(claim: &ResourceClaim, cfg: &DraConfig) -> Option<u64> {
    read_claim_request(claim, cfg)
        .ok()
        .flatten()
        .map(|ask| ask.gpus)
        .filter(|gpus| *gpus > 0)
}

/// The MIG profile a CEL selector names when it is exactly the plain comparison
/// `device.attributes['<domain>'].<attribute> == '<profile>'` of the driver's profile attribute
/// (either quote, any whitespace between the parts) and the profile reads
/// ([`MigProfile::parse`]); `None` for anything else, which the extender does not evaluate.
pub fn selector_profile(expression: &str, driver: &DraDriverConfig) -> Option<MigProfile> {
    let mut rest = Cel(expression);
    rest.word("device")?;
    rest.word(".")?;
    rest.word("attributes")?;
    rest.word("[")?;
    if rest.quoted()? != attribute_domain(driver) {
        return None;
    }
    rest.word("]")?;
    rest.word(".")?;
    rest.word(attribute_short(driver))?;
    rest.word("==")?;
    let profile = rest.quoted()?;
    if !rest.0.trim().is_empty() {
        return None;
    }
    MigProfile::parse(profile).ok()
}

/// A CEL expression being read from the front, a token at a time.
struct Cel<'a>(&'a str);

impl<'a> Cel<'a> {
    /// Takes `word` after any whitespace.
    fn word(&mut self, word: &str) -> Option<()> {
        let rest = self.0.trim_start().strip_prefix(word)?;
        // An identifier must end where the next one cannot go on (`devices` is not `device`).
        let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
        if word.chars().last().is_some_and(ident) && rest.chars().next().is_some_and(ident) {
            return None;
        }
        self.0 = rest;
        Some(())
    }

    /// Takes a plain string literal after any whitespace: `'...'` or `"..."`, without escapes.
    fn quoted(&mut self) -> Option<&'a str> {
        let text = self.0.trim_start();
        let quote = text.chars().next().filter(|c| matches!(c, '\'' | '"'))?;
        let body = &text[1..];
        let end = body.find(quote)?;
        let literal = &body[..end];
        if literal.contains('\\') {
            return None;
        }
        self.0 = &body[end + 1..];
        Some(literal)
    }
}

/// The domain under which a selector names the driver's profile attribute: the attribute's own
/// (`domain/name`), else the driver's.
fn attribute_domain(driver: &DraDriverConfig) -> &str {
    driver
        .profile_attribute
        .split_once('/')
        .map_or(driver.name.as_str(), |(domain, _)| domain)
}

/// The profile attribute's name without its domain.
fn attribute_short(driver: &DraDriverConfig) -> &str {
    driver
        .profile_attribute
        .split_once('/')
        .map_or(driver.profile_attribute.as_str(), |(_, short)| short)
}

/// The claims (`namespace/name`) a pod uses: each `spec.resourceClaims` entry's
/// `resourceClaimName`, or for one made from a template the claim its
/// `status.resourceClaimStatuses` names (once kube-controller-manager has created it).
pub fn pod_claims(pod: &Pod) -> Vec<String> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let generated = pod
        .status
        .as_ref()
        .and_then(|status| status.resource_claim_statuses.as_ref());
    pod.spec
        .as_ref()
        .and_then(|spec| spec.resource_claims.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            entry.resource_claim_name.clone().or_else(|| {
                generated?
                    .iter()
                    .find(|status| status.name == entry.name)?
                    .resource_claim_name
                    .clone()
            })
        })
        .map(|name| format!("{namespace}/{name}"))
        .collect()
}

/// A claim's `namespace/name`.
pub fn claim_key(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The GPUs a node offers only through DRA, for its engine spec: each whole-GPU device, and
/// the parent of MIG slices that no whole-GPU device names (marked unhealthy: a card split into
/// MIG slices is never given whole, as the node agent reports MIG-enabled cards; its memory is
/// its slices' together). Ordered by index; a second device with an index already seen is left
/// out and reported.
pub fn node_gpus(devices: &[&DraDevice]) -> (Vec<Gpu>, Vec<String>) {
    let mut gpus: BTreeMap<u16, Gpu> = BTreeMap::new();
    let mut problems = Vec::new();
    for device in devices.iter().filter(|d| d.kind == DeviceKind::Gpu) {
        if gpus.contains_key(&device.gpu_index) {
            problems.push(format!(
                "device {}: GPU index {} is published twice; the second is left out",
                device.name, device.gpu_index
            ));
            continue;
        }
        gpus.insert(device.gpu_index, card_of(device, device.memory, true));
    }
    let mut parents: BTreeMap<u16, Gpu> = BTreeMap::new();
    for device in devices
        .iter()
        .filter(|d| matches!(d.kind, DeviceKind::Mig { .. }))
    {
        if let Some(gpu) = gpus.get_mut(&device.gpu_index) {
            gpu.healthy = false;
            continue;
        }
        let parent = parents
            .entry(device.gpu_index)
            .or_insert_with(|| card_of(device, MemMiB(0), false));
        parent.memory = MemMiB(parent.memory.0.saturating_add(device.memory.0));
    }
    gpus.extend(parents);
    (gpus.into_values().collect(), problems)
}

/// The MIG slices a node offers only through DRA, for its engine spec's pools: each `mig`
/// device of `devices` counts one slice of its profile. A slice without a readable profile is
/// left out of the pools and reported (its memory still counts in its parent GPU).
pub fn node_mig(devices: &[&DraDevice]) -> (Vec<MigSlices>, Vec<String>) {
    let mut pools = Vec::new();
    let mut problems = Vec::new();
    for device in devices
        .iter()
        .filter(|d| matches!(d.kind, DeviceKind::Mig { .. }))
    {
        match mig_profile(device) {
            Ok(profile) => pools.push(MigSlices::new(profile, 1)),
            Err(problem) => problems.push(format!(
                "device {}: {problem}; not counted as a slice",
                device.name
            )),
        }
    }
    (normalized(pools), problems)
}

/// The profile of MIG slice `device`, read as the device plugin's are.
fn mig_profile(device: &DraDevice) -> Result<MigProfile, String> {
    match &device.kind {
        DeviceKind::Mig {
            profile: Some(profile),
        } => MigProfile::parse(profile).map_err(|error| error.to_string()),
        DeviceKind::Mig { profile: None } => Err("the MIG slice names no profile".to_owned()),
        DeviceKind::Gpu => Err("not a MIG slice".to_owned()),
    }
}

/// The card `device` is, or is a MIG slice of, with `memory` and `healthy` as given.
fn card_of(device: &DraDevice, memory: MemMiB, healthy: bool) -> Gpu {
    Gpu {
        index: GpuIndex(device.gpu_index),
        uuid: device.gpu_uuid.clone(),
        model: device
            .model
            .clone()
            .unwrap_or_else(|| UNKNOWN_MODEL.to_owned()),
        memory,
        numa: None,
        healthy,
    }
}

/// The GPU of `gpus` (a node's, as the table knows them) that `device` is or is part of: the
/// one with its UUID where the device has one and the node reports UUIDs, else the one with its
/// index.
pub fn match_gpu(device: &DraDevice, gpus: &[Gpu]) -> Result<GpuIndex, String> {
    if let Some(uuid) = &device.gpu_uuid {
        if let Some(gpu) = gpus.iter().find(|gpu| gpu.uuid.as_ref() == Some(uuid)) {
            return Ok(gpu.index);
        }
        if gpus.iter().any(|gpu| gpu.uuid.is_some()) {
            return Err(format!(
                "GPU {uuid} is not among the GPUs the node reports; not counted"
            ));
        }
    }
    gpus.iter()
        .find(|gpu| gpu.index.0 == device.gpu_index)
        .map(|gpu| gpu.index)
        .ok_or_else(|| {
            format!(
                "the node has no GPU {}; not counted until it does",
                device.gpu_index
            )
        })
}

/// What holding `device` takes from GPU `gpu`: the whole card, or a MIG slice's memory (its
/// compute is the slice's own hardware, so none of the card's shareable compute is counted).
fn device_hold(device: &DraDevice, gpu: GpuIndex) -> GpuHold {
    match device.kind {
        DeviceKind::Gpu => GpuHold {
            gpu,
            whole: true,
            mem: MemMiB(0),
            compute: WHOLE_GPU_COMPUTE,
        },
        DeviceKind::Mig { .. } => GpuHold {
            gpu,
            whole: false,
            mem: device.memory,
            compute: ComputeMilli(0),
        },
    }
}

fn read_slice(slice: &ResourceSlice, driver: &DraDriverConfig) -> SliceReading {
    let spec = &slice.spec;
    let mut reading = SliceReading {
        pool: PoolKey {
            driver: spec.driver.clone(),
            pool: spec.pool.name.clone(),
        },
        generation: spec.pool.generation,
        slice_count: spec.pool.resource_slice_count.max(1),
        node: spec.node_name.clone().filter(|node| !node.is_empty()),
        devices: Vec::new(),
        other_devices: 0,
        problems: Vec::new(),
    };
    for device in spec.devices.iter().flatten() {
        match read_device(device, driver) {
            Ok(Some(read)) => reading.devices.push(read),
            Ok(None) => reading.other_devices += 1,
            Err(problem) => reading
                .problems
                .push(format!("device {}: {problem}; left out", device.name)),
        }
    }
    reading
}

/// A device as a GPU or MIG slice; `Ok(None)` for a device of another type.
fn read_device(device: &Device, driver: &DraDriverConfig) -> Result<Option<DraDevice>, String> {
    let name = &driver.name;
    let text = |attribute: &str| {
        find_attribute(device, name, attribute).and_then(|value| value.string.clone())
    };
    let int = |attribute: &str| find_attribute(device, name, attribute).and_then(|value| value.int);
    let kind_text = text(&driver.type_attribute).ok_or_else(|| {
        format!(
            "no string attribute {:?} (the device type)",
            driver.type_attribute
        )
    })?;
    let (kind, index_attribute, uuid_attribute) = if kind_text == driver.gpu_type {
        (
            DeviceKind::Gpu,
            &driver.index_attribute,
            &driver.uuid_attribute,
        )
    } else if kind_text == driver.mig_type {
        (
            DeviceKind::Mig {
                profile: text(&driver.profile_attribute),
            },
            &driver.parent_index_attribute,
            &driver.parent_uuid_attribute,
        )
    } else {
        return Ok(None);
    };
    let index = int(index_attribute)
        .ok_or_else(|| format!("no int attribute {index_attribute:?} (the GPU index)"))?;
    let gpu_index = u16::try_from(index)
        .ok()
        .filter(|index| u64::from(*index) < 64)
        .ok_or_else(|| {
            format!("attribute {index_attribute:?} = {index} is not a GPU index (0..63)")
        })?;
    let memory = find_capacity(device, name, &driver.memory_capacity)
        .ok_or_else(|| format!("no capacity {:?} (the memory)", driver.memory_capacity))?;
    let memory = Quantity::parse(&memory)
        .and_then(|quantity| quantity.floor_scaled(1, 1 << 20))
        .map_err(|problem| {
            format!(
                "capacity {:?} = {memory:?}: {problem}",
                driver.memory_capacity
            )
        })?;
    Ok(Some(DraDevice {
        name: device.name.clone(),
        kind,
        gpu_index,
        gpu_uuid: text(uuid_attribute),
        model: text(&driver.model_attribute),
        memory: MemMiB(memory),
    }))
}

/// An attribute by its name as configured, or qualified with (or stripped of) the driver's
/// domain: Kubernetes reads an unqualified attribute name as the driver's own.
fn find_attribute<'a>(device: &'a Device, driver: &str, name: &str) -> Option<&'a DeviceAttribute> {
    let attributes = device.attributes.as_ref()?;
    attributes.get(name).or_else(|| match name.split_once('/') {
        Some((domain, short)) if domain == driver => attributes.get(short),
        Some(_) => None,
        None => attributes.get(&format!("{driver}/{name}")),
    })
}

/// A capacity's value, looked up as [`find_attribute`] looks up attributes.
fn find_capacity(device: &Device, driver: &str, name: &str) -> Option<String> {
    let capacity = device.capacity.as_ref()?;
    let found = capacity.get(name).or_else(|| match name.split_once('/') {
        Some((domain, short)) if domain == driver => capacity.get(short),
        Some(_) => None,
        None => capacity.get(&format!("{driver}/{name}")),
    })?;
    Some(found.value.0.clone())
}

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod tests;
