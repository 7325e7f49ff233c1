//! The feed's Dynamic Resource Allocation side: ResourceSlice and ResourceClaim events
//! ([`crate::k8s::dra`]) into the shared [`DraState`](crate::objects::dra::DraState) and the
//! table. A node whose own translation has no GPUs takes the GPUs its DRA slices publish; a node
//! with GPUs of its own keeps them and is noted as offering GPUs both ways; a DRA-only node's
//! MIG slices become its MIG pools by profile. Every allocated claim holds its devices' GPUs
//! (and MIG slices) in the table as an external hold (`dra:namespace/name`), so no pod is
//! placed on them; a released or deleted claim lets them go. Lists are read into a
//! book of their own and swapped in at `InitDone`, as node and pod lists are.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::runtime::watcher::Event;
use tracing::{debug, info, warn};

use super::{Feed, NodeMemo, spec_fingerprint};
use crate::k8s::dra::DraEvent;
use crate::objects::dra::{DraBook, claim_holder, claim_key, node_gpus, node_mig};
use gpu_engine::{Change, GpuMode, LinkMatrix, NodeName, NodeSpec, Table};

/// What the feed keeps of DRA besides the shared state: lists in progress and where it stands.
#[derive(Debug, Default)]
pub(super) struct DraSide {
    /// The runner watches DRA ([`Feed::watch_dra`]): readiness waits for its lists.
    watched: bool,
    /// The API does not serve DRA or refuses the extender: nothing to wait for.
    unavailable: bool,
    slice_list: Option<DraBook>,
    claim_list: Option<DraBook>,
    slices_listed: bool,
    claims_listed: bool,
    /// Nodes whose table spec takes its GPUs from DRA, with the mode their own translation
    /// had (restored if their slices go).
    from_dra: std::collections::HashMap<NodeName, GpuMode>,
    /// Drivers not configured whose slices were seen, said once each.
    unknown_drivers_told: BTreeSet<String>,
}

impl DraSide {
    /// Whether readiness need not wait for DRA: it is not watched, cannot be read, or both
    /// lists are applied.
    pub(super) fn settled(&self) -> bool {
        !self.watched || self.unavailable || (self.slices_listed && self.claims_listed)
    }

    /// Whether slices and claims are read into the table.
    fn active(&self) -> bool {
        self.watched && !self.unavailable
    }
}

impl Feed {
    /// Tells the feed that DRA events will come ([`crate::k8s::dra::events`]): readiness then
    /// waits for the ResourceSlice and ResourceClaim lists, or for word that DRA cannot be read.
    /// A feed never told (the offline tools) reads nodes and pods alone.
    pub fn watch_dra(&mut self) {
        self.dra.watched = true;
    }

    /// Applies one item of the DRA watches.
    pub fn apply_dra_event(&mut self, event: DraEvent) {
        match event {
            DraEvent::Unavailable(why) => {
                warn!("{}", why.explain());
                self.dra.unavailable = true;
                self.state.dra_write().served = Some(false);
                self.maybe_ready();
            }
            DraEvent::Slice(Ok(event)) => self.apply_slice_event(event),
            DraEvent::Claim(Ok(event)) => self.apply_claim_event(event),
            DraEvent::Slice(Err(error)) => {
                self.watch_error();
                warn!(%error, "ResourceSlice watch failed; retrying with backoff");
            }
            DraEvent::Claim(Err(error)) => {
                self.watch_error();
                warn!(%error, "ResourceClaim watch failed; retrying with backoff");
            }
        }
    }

    fn apply_slice_event(&mut self, event: Event<ResourceSlice>) {
        let cfg = Arc::clone(&self.cfg);
        let state = self.state.clone();
        match event {
            Event::Init => self.dra.slice_list = Some(DraBook::new()),
            Event::InitApply(slice) => match self.dra.slice_list.as_mut() {
                Some(list) => {
                    let applied = list.apply_slice(&slice, &cfg.dra);
                    self.tell_slice(&slice, &applied);
                }
                None => self.slice_changed(Some(&slice), &slice_name(&slice)),
            },
            Event::InitDone => {
                let listed = self.dra.slice_list.take().unwrap_or_default();
                let mut table = state.write();
                let mut dra = state.dra_write();
                let mut nodes: BTreeSet<String> = dra.book.nodes().into_iter().collect();
                nodes.extend(listed.nodes());
                dra.book.replace_slices(listed);
                dra.served = Some(true);
                let slices = dra.book.counts().slices;
                drop(dra);
                for node in &nodes {
                    self.refresh_dra_node(&mut table, node);
                }
                self.refresh_all_claims(&mut table);
                drop(table);
                self.dra.slices_listed = true;
                info!(slices, nodes = nodes.len(), "ResourceSlice list applied");
                self.maybe_ready();
            }
            Event::Apply(slice) => self.slice_changed(Some(&slice), &slice_name(&slice)),
            Event::Delete(slice) => self.slice_changed(None, &slice_name(&slice)),
        }
    }

    /// Applies a slice (`Some`) or its deletion (`None`), then redoes the nodes and claims of
    /// the pools it was and is in.
    fn slice_changed(&mut self, slice: Option<&ResourceSlice>, name: &str) {
        let cfg = Arc::clone(&self.cfg);
        let state = self.state.clone();
        let mut table = state.write();
        let mut dra = state.dra_write();
        let mut nodes: BTreeSet<String> = dra
            .book
            .slice_node(name)
            .map(str::to_owned)
            .into_iter()
            .collect();
        let (pools, applied) = match slice {
            Some(slice) => {
                let applied = dra.book.apply_slice(slice, &cfg.dra);
                (applied.pools.clone(), Some(applied))
            }
            None => (dra.book.remove_slice(name), None),
        };
        nodes.extend(dra.book.slice_node(name).map(str::to_owned));
        let claims: BTreeSet<String> = pools
            .iter()
            .flat_map(|pool| dra.book.claims_in(pool))
            .collect();
        for pool in &pools {
            if let Some(view) = dra.book.pool(pool)
                && let Some(problem) = crate::objects::dra::pool_problem(pool, &view)
            {
                info!(%problem, "DRA pool not counted as it stands");
            }
        }
        drop(dra);
        if let (Some(slice), Some(applied)) = (slice, &applied) {
            self.tell_slice(slice, applied);
        }
        for node in &nodes {
            self.refresh_dra_node(&mut table, node);
        }
        for claim in &claims {
            self.refresh_dra_claim(&mut table, claim);
        }
    }

    /// Logs what was wrong with a slice: its bad devices, and an unknown driver once.
    fn tell_slice(&mut self, slice: &ResourceSlice, applied: &crate::objects::dra::SliceApplied) {
        let name = slice_name(slice);
        for problem in &applied.problems {
            warn!(slice = %name, %problem, "ResourceSlice device not read");
        }
        if let Some(driver) = &applied.unknown_driver
            && self.dra.unknown_drivers_told.insert(driver.clone())
        {
            info!(
                slice = %name,
                %driver,
                "ResourceSlices of a driver dra.drivers does not list are ignored (said once per driver)"
            );
        }
    }

    fn apply_claim_event(&mut self, event: Event<ResourceClaim>) {
        let cfg = Arc::clone(&self.cfg);
        let state = self.state.clone();
        match event {
            Event::Init => self.dra.claim_list = Some(DraBook::new()),
            Event::InitApply(claim) => match self.dra.claim_list.as_mut() {
                Some(list) => {
                    let key = list.apply_claim(&claim, &cfg.dra);
                    tell_unread(list, &key);
                }
                None => self.claim_changed(Some(&claim), &claim_key(&claim)),
            },
            Event::InitDone => {
                let listed = self.dra.claim_list.take().unwrap_or_default();
                let mut table = state.write();
                let mut dra = state.dra_write();
                dra.book.replace_claims(listed);
                dra.served = Some(true);
                drop(dra);
                self.refresh_all_claims(&mut table);
                let held = table
                    .externals()
                    .filter(|(holder, _)| crate::objects::dra::holder_claim(holder).is_some())
                    .count();
                drop(table);
                self.dra.claims_listed = true;
                info!(claims_holding = held, "ResourceClaim list applied");
                self.maybe_ready();
            }
            Event::Apply(claim) => self.claim_changed(Some(&claim), &claim_key(&claim)),
            Event::Delete(claim) => self.claim_changed(None, &claim_key(&claim)),
        }
    }

    fn claim_changed(&mut self, claim: Option<&ResourceClaim>, key: &str) {
        let cfg = Arc::clone(&self.cfg);
        let state = self.state.clone();
        let mut table = state.write();
        let mut dra = state.dra_write();
        match claim {
            Some(claim) => {
                dra.book.apply_claim(claim, &cfg.dra);
                tell_unread(&dra.book, key);
            }
            None => dra.book.remove_claim(key),
        }
        drop(dra);
        self.refresh_dra_claim(&mut table, key);
    }

    /// Redoes every claim the book holds, and releases every claim hold in the table the book
    /// no longer has (after a list: claims deleted while the watch was away).
    fn refresh_all_claims(&mut self, table: &mut Table) {
        let mut keys: BTreeSet<String> = self
            .state
            .dra_write()
            .book
            .claim_keys()
            .into_iter()
            .collect();
        keys.extend(
            table
                .externals()
                .filter_map(|(holder, _)| crate::objects::dra::holder_claim(holder))
                .map(str::to_owned),
        );
        for key in &keys {
            self.refresh_dra_claim(table, key);
        }
    }

    /// Puts what claim `key` holds now into the table: its devices' GPUs on their node, or
    /// nothing (released, deleted, or not mappable yet; the reasons are logged when they
    /// change).
    fn refresh_dra_claim(&mut self, table: &mut Table, key: &str) {
        let holder = claim_holder(key);
        let mut dra = self.state.dra_write();
        let holds = dra.book.claim_holds(key, |node| {
            table
                .node_by_str(node)
                .map(|state| state.spec.gpus.as_slice())
        });
        let news = dra.claim_problems.get(key) != Some(&holds.problems);
        if news && !holds.problems.is_empty() {
            for problem in &holds.problems {
                // Before the lists are all in, a claim may name a node or pool not seen yet.
                if self.state.is_ready() {
                    warn!(claim = %key, %problem, "ResourceClaim device not counted");
                } else {
                    debug!(claim = %key, %problem, "ResourceClaim device not counted yet");
                }
            }
        }
        if holds.problems.is_empty() {
            dra.claim_problems.remove(key);
        } else {
            dra.claim_problems
                .insert(key.to_owned(), holds.problems.clone());
        }
        drop(dra);
        let before = table.external(&holder).cloned();
        match holds.node {
            Some(node) if !holds.holds.is_empty() => {
                let node = NodeName::new(node);
                if let Some(old) = &before
                    && (old.node != node || old.holds != holds.holds || old.mig != holds.mig)
                {
                    self.state.note_freed(&old.node);
                }
                table.apply(Change::HoldExternal {
                    holder,
                    node,
                    holds: holds.holds,
                    mig: holds.mig,
                });
            }
            _ => {
                if let Some(old) = before {
                    info!(claim = %key, node = %old.node, "ResourceClaim's GPUs released");
                    self.state.note_freed(&old.node);
                    table.apply(Change::ReleaseExternal(holder));
                }
            }
        }
    }

    /// The node's spec with the GPUs its DRA slices publish when its own translation has none;
    /// a node with GPUs of its own keeps them and is noted (and said once) as offering GPUs
    /// both ways.
    pub(super) fn dra_merge(&mut self, spec: NodeSpec) -> NodeSpec {
        let name = spec.name.clone();
        self.dra.from_dra.remove(&name);
        if !self.dra.active() {
            return spec;
        }
        {
            // Most node events are of nodes DRA does not serve: no write lock for them.
            let dra = self.state.dra_read();
            if !dra.book.serves(name.as_str()) && !dra.both_ways.contains(name.as_str()) {
                return spec;
            }
        }
        let mut dra = self.state.dra_write();
        let devices = dra.book.node_devices(name.as_str());
        let dra_devices = devices.len();
        let (gpus, mut problems) = node_gpus(&devices);
        let (mig, mig_problems) = node_mig(&devices);
        problems.extend(mig_problems);
        if dra_devices == 0 {
            dra.both_ways.remove(name.as_str());
            return spec;
        }
        if !spec.gpus.is_empty() || !spec.mig.is_empty() {
            if dra.both_ways.insert(name.to_string()) {
                warn!(
                    node = %name,
                    device_plugin_gpus = spec.gpus.len(),
                    dra_devices,
                    "node offers GPUs both through the device plugin and a DRA driver: claims and pods are accounted on the same GPUs (matched by UUID, else index), and a GPU held both ways shows as over-committed"
                );
            }
            return spec;
        }
        dra.both_ways.remove(name.as_str());
        drop(dra);
        for problem in &problems {
            warn!(node = %name, %problem, "DRA GPU or MIG slice not counted");
        }
        self.dra.from_dra.insert(name.clone(), spec.mode);
        let links = LinkMatrix::uniform(gpus.len());
        NodeSpec::with_gpus(name.as_str(), GpuMode::Exclusive, gpus, links)
            .with_host(spec.cpu, spec.memory, spec.max_pods)
            .with_placement(spec.placement)
            .with_mig(mig)
    }

    /// Forgets what was merged for a node that is gone (its slices, if any are left, merge again
    /// when it comes back).
    pub(super) fn dra_node_gone(&mut self, name: &NodeName) {
        self.dra.from_dra.remove(name);
        if self.dra.active() && self.state.dra_read().both_ways.contains(name.as_str()) {
            self.state.dra_write().both_ways.remove(name.as_str());
        }
    }

    /// Redoes a node's GPUs after its slices changed: its own spec (the table's, less any GPUs
    /// it took from DRA) merged again, applied when it differs.
    fn refresh_dra_node(&mut self, table: &mut Table, name: &str) {
        let Some(current) = table.node_by_str(name) else {
            // Not seen yet: its GPUs are merged when it is.
            return;
        };
        let spec = current.spec.clone();
        let own = match self.dra.from_dra.get(name) {
            Some(mode) => NodeSpec::with_gpus(name, *mode, Vec::new(), LinkMatrix::uniform(0))
                .with_host(spec.cpu, spec.memory, spec.max_pods)
                .with_placement(spec.placement),
            None => spec,
        };
        let merged = self.dra_merge(own);
        let fingerprint = spec_fingerprint(&merged);
        let memo = self.nodes.get(&merged.name).copied();
        if memo.is_some_and(|memo| memo.fingerprint == fingerprint) {
            return;
        }
        let memo = NodeMemo {
            fingerprint,
            has_problems: memo.is_some_and(|memo| memo.has_problems),
        };
        self.apply_node_spec(table, merged, memo);
    }

    /// Redoes the claims whose devices are on `node` (its GPUs changed: UUIDs and indices
    /// decide which GPU a device is).
    pub(super) fn refresh_dra_claims_on(&mut self, table: &mut Table, node: &NodeName) {
        if !self.dra.active() {
            return;
        }
        let claims: BTreeSet<String> = {
            let dra = self.state.dra_write();
            dra.book
                .pools_on(node.as_str())
                .iter()
                .flat_map(|pool| dra.book.claims_in(pool))
                .collect()
        };
        for claim in &claims {
            self.refresh_dra_claim(table, claim);
        }
    }
}

/// Says at debug why a claim asking devices of the configured DeviceClasses is not read (its
/// pod gets no ranking from the extender; kube-scheduler's DRA plugin still allocates it).
fn tell_unread(book: &DraBook, key: &str) {
    if let Some(why) = book.claim_unread(key) {
        debug!(claim = %key, %why, "ResourceClaim's request not read: no ranking for its pod");
    }
}

fn slice_name(slice: &ResourceSlice) -> String {
    slice.metadata.name.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests;
