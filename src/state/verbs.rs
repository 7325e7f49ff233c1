//! The extender verbs' decisions, each on one [`Snapshot`]: filter, prioritize and preempt read
//! the policy in force once and the table once, translate the pod with that policy, and decide.
//! The HTTP layer decodes a call into [`Offered`] nodes and a pod, asks one of these, counts
//! what it says in the metrics, and encodes the answer.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tracing::debug;

use super::cluster::ClusterState;
use super::decide::{self, FilterVerdict, Proposal};
use super::policy::PolicyCell;
use super::snapshot::Snapshot;
use crate::config::Config;
use crate::objects::admission::PodClaims;
use crate::objects::dra::ClaimAsk;
use crate::objects::quota::quota_names;
use crate::objects::translate;
use gpu_engine::{CpuMilli, GpuDemand, MemMiB, NodeState, PodRequest, Policy, RequestError};

/// The nodes one call offers: kube-scheduler's candidate names (`nodeCacheCapable: true`), or
/// the node objects it sent, each read into a node state or the reason it could not be.
#[derive(Debug, Clone, Copy)]
pub enum Offered<'a> {
    /// Names of nodes the table should know.
    Names(&'a [&'a str]),
    /// Node objects, by position: `names[i]` read as `states[i]`.
    Objects {
        names: &'a [String],
        states: &'a [Result<NodeState, String>],
    },
}

impl<'a> Offered<'a> {
    /// Every offered name, in order.
    pub fn names(&self) -> Vec<&'a str> {
        match *self {
            Offered::Names(names) => names.to_vec(),
            Offered::Objects { names, .. } => names.iter().map(String::as_str).collect(),
        }
    }
}

/// What filter decided for one call.
#[derive(Debug)]
pub enum FilterDecision<'a> {
    /// The call named no pod.
    NoPod,
    /// The table is not synced yet: nothing can be decided.
    NotReady,
    /// The pod's request does not read: every candidate is refused for this reason, which can
    /// never change (unresolvable).
    Unreadable(String),
    /// Named candidates for a pod that asks for nothing the extender places: all pass.
    PassAll,
    /// The pod's team would go past its GPU quota's max: every candidate is refused for this
    /// reason as currently full.
    OverQuota(String),
    /// The engine's verdict over the candidates.
    Verdict {
        /// Positions into the offered names (for objects, into those that read).
        verdict: FilterVerdict<'a>,
        /// Offered node objects that did not read, with why (empty for names).
        unreadable: Vec<(&'a str, &'a str)>,
        /// The readable objects in the order the verdict's positions index (empty for names).
        readable: Vec<&'a str>,
        /// No candidate fits, but a node kube-scheduler did not send would have taken the pod
        /// (its `percentageOfNodesToScore` window hid it).
        window_miss: bool,
    },
}

/// What filter, prioritize and preempt read a pod as: its placement request under the policy
/// this call decides with; `Err` is the message for kube-scheduler.
fn placement_request(
    pod: &Pod,
    config: &Config,
    policy: &Policy,
) -> Result<Option<PodRequest>, String> {
    translate::placement_request(pod, config, policy.filter_best_only)
        .map_err(|error| error.to_string())
}

/// A pod's DRA claims' ask as the engine's request: `ask.gpus` whole GPUs in one container (none
/// when it asks only slices) and its MIG slices, with the pod's CPU and memory.
pub fn claim_pod_request(
    ask: &ClaimAsk,
    cpu: CpuMilli,
    memory: MemMiB,
) -> Result<PodRequest, RequestError> {
    let demand = GpuDemand::whole(ask.gpus)?;
    Ok(PodRequest::single(cpu, memory, demand).with_mig(ask.mig.clone()))
}

fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// The verbs over one shared state: what the HTTP handlers ask. Borrowed per call; it holds
/// nothing of its own.
#[derive(Debug, Clone, Copy)]
pub struct Verbs<'s> {
    /// The table and what the watch knows.
    pub cluster: &'s ClusterState,
    /// The policy in force, loaded once per call.
    pub policy: &'s PolicyCell,
    /// How objects are read.
    pub config: &'s Config,
}

impl Verbs<'_> {
    /// Filter: which offered nodes can take `pod` now, on one snapshot. The pod is read
    /// before the table is: translating it needs only the policy, and the table's read lock,
    /// which a bind's reservation waits on, is held for the decision alone.
    pub fn filter<'a>(&self, pod: Option<&Pod>, offered: Offered<'a>) -> FilterDecision<'a> {
        let config = self.config;
        let Some(pod) = pod else {
            return FilterDecision::NoPod;
        };
        let policy = self.policy.load();
        let mut request = match placement_request(pod, config, &policy) {
            Ok(request) => request,
            Err(message) => return FilterDecision::Unreadable(message),
        };
        let snapshot = Snapshot::of(self.cluster, policy);
        if let Some(request) = &request
            && let Err(reason) = snapshot.quota_admit(namespace(pod), request, &quota_names(config))
        {
            if !self.cluster.is_ready() {
                return FilterDecision::NotReady;
            }
            return FilterDecision::OverQuota(reason);
        }
        // A pod whose GPUs come through DRA claims: kube-scheduler's DRA plugin filters for
        // them with what the extender cannot see (selectors, CEL), so nothing is narrowed here,
        // not even to the policy's best nodes (policy.filterBestOnly); prioritize ranks them.
        if request.as_ref().is_none_or(|request| !request.wants_gpu())
            && self.cluster.claim_ask(pod).is_some()
        {
            request = None;
        }
        match offered {
            Offered::Names(names) => {
                let Some(request) = request else {
                    return FilterDecision::PassAll;
                };
                let Ok(verdict) = snapshot.filter(names, &request) else {
                    return FilterDecision::NotReady;
                };
                let window_miss = verdict.passed.is_empty()
                    && self.window_missed(&snapshot, pod, names, &request);
                FilterDecision::Verdict {
                    verdict,
                    unreadable: Vec::new(),
                    readable: Vec::new(),
                    window_miss,
                }
            }
            Offered::Objects { names, states } => {
                let mut unreadable = Vec::new();
                let mut readable = Vec::with_capacity(names.len());
                let mut nodes = Vec::with_capacity(names.len());
                for (name, node) in names.iter().zip(states) {
                    match node {
                        Ok(node) => {
                            readable.push(name.as_str());
                            nodes.push((name.as_str(), Some(node)));
                        }
                        Err(message) => unreadable.push((name.as_str(), message.as_str())),
                    }
                }
                let verdict = match &request {
                    Some(request) => decide::filter(nodes, request, snapshot.policy()),
                    None => FilterVerdict {
                        passed: (0..nodes.len()).collect(),
                        ..Default::default()
                    },
                };
                FilterDecision::Verdict {
                    verdict,
                    unreadable,
                    readable,
                    window_miss: false,
                }
            }
        }
    }

    /// Whether a node kube-scheduler did not send would have taken the pod that no candidate
    /// fits; such a pod is noted for the requeue task (when it is on), which asks
    /// kube-scheduler to retry it once it is marked unschedulable: its next window starts
    /// elsewhere.
    fn window_missed(
        &self,
        snapshot: &Snapshot<'_>,
        pod: &Pod,
        names: &[&str],
        request: &PodRequest,
    ) -> bool {
        let config = self.config;
        // A pod whose resources do not read was refused by kube-scheduler's own check already.
        let Ok(claims) = PodClaims::of(pod, config) else {
            return false;
        };
        if !snapshot.fits_outside(names, &claims, request) {
            return false;
        }
        let key = translate::pod_key(pod);
        debug!(
            pod = %key,
            candidates = names.len(),
            "no candidate fits, but a node kube-scheduler did not send would"
        );
        if config.requeue.enabled {
            self.cluster.note_window_miss(key);
        }
        true
    }

    /// Prioritize: the offered nodes' scores (0..=10) for `pod`, in offered order; empty when
    /// the pod is absent or does not read (kube-scheduler ignores prioritize's errors, so an
    /// unreadable pod just gets no preference anywhere). A pod that asks no GPU of the extender
    /// but whole GPUs or MIG slices through DRA claims (it reaches this stanza where the profile
    /// sends every pod, as the dedicated scheduler does) is ranked for them, as
    /// [`Self::prioritize_claims`] ranks it.
    pub fn prioritize<'a>(&self, pod: Option<&Pod>, offered: Offered<'a>) -> Vec<(&'a str, i64)> {
        let policy = self.policy.load();
        let request =
            pod.and_then(|pod| placement_request(pod, self.config, &policy).ok().flatten());
        let claimed = match &request {
            Some(request) if request.wants_gpu() => None,
            _ => pod.and_then(|pod| self.claim_request(pod)),
        };
        match claimed.or(request) {
            Some(request) => self.rank(policy, offered, &request),
            None => Vec::new(),
        }
    }

    /// Prioritize for pods whose DRA claims ask for whole GPUs or MIG slices of the configured
    /// DeviceClasses (docs/dra.md): the offered nodes ranked with the policy in force for that
    /// many whole GPUs and slices by profile, on the GPUs and slices the nodes' ResourceSlices
    /// publish less those claims hold (slices with the policy's MIG ranking: packed onto nodes
    /// whose slices are in use, spread the reverse). Empty (no opinion) for a pod that asks for
    /// GPUs through extended resources (the extender's own stanza ranks those) or through no
    /// claim it reads.
    pub fn prioritize_claims<'a>(
        &self,
        pod: Option<&Pod>,
        offered: Offered<'a>,
    ) -> Vec<(&'a str, i64)> {
        let Some(pod) = pod else {
            return Vec::new();
        };
        if translate::names_gpu_resource(pod, self.config) {
            return Vec::new();
        }
        let Some(request) = self.claim_request(pod) else {
            return Vec::new();
        };
        self.rank(self.policy.load(), offered, &request)
    }

    /// What `pod` asks through its DRA claims, as a request for that many whole GPUs and MIG
    /// slices with its containers' CPU and memory; `None` when its claims ask for nothing the
    /// extender reads.
    fn claim_request(&self, pod: &Pod) -> Option<PodRequest> {
        let ask = self.cluster.claim_ask(pod)?;
        let (cpu, memory) = translate::pod_host_request(pod).unwrap_or_default();
        claim_pod_request(&ask, cpu, memory).ok()
    }

    /// The offered nodes scored for `request` with `policy`.
    fn rank<'a>(
        &self,
        policy: Arc<Policy>,
        offered: Offered<'a>,
        request: &PodRequest,
    ) -> Vec<(&'a str, i64)> {
        match offered {
            Offered::Names(names) => Snapshot::of(self.cluster, policy).prioritize(names, request),
            Offered::Objects { names, states } => decide::prioritize(
                names
                    .iter()
                    .zip(states)
                    .map(|(name, node)| (name.as_str(), node.as_ref().ok())),
                request,
                &policy,
            ),
        }
    }

    /// Preempt: the proposals kept, with the victims that really make room for `pod`.
    pub fn preempt(&self, pod: Option<&Pod>, proposals: Vec<Proposal>) -> Vec<Proposal> {
        let policy = self.policy.load();
        let request =
            pod.and_then(|pod| placement_request(pod, self.config, &policy).ok().flatten());
        Snapshot::of(self.cluster, policy).preempt(proposals, request.as_ref(), pod.map(namespace))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on a broken fixture")]

    use super::*;
    use gpu_engine::{
        Change, GpuMode, MemMiB, MigProfile, MigSlices, NodeSpec, PodKey, RejectReason,
        ScoringPolicy, Table, fit,
    };
    use serde_json::json;

    /// A node of MIG cards only: seven `1g.10gb` slices, no whole GPU.
    fn mig_node(name: &str) -> NodeSpec {
        NodeSpec::uniform(name, GpuMode::Exclusive, 0, "A100", MemMiB(0)).with_mig(vec![
            MigSlices::new(MigProfile::parse("1g.10gb").unwrap(), 7),
        ])
    }

    fn mig_pod(name: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"containers": [{"name": "main", "resources": {
                "limits": {"nvidia.com/mig-1g.10gb": "1"}}}]},
        }))
        .unwrap()
    }

    /// Filter passes both MIG nodes and refuses the node without slices for good; prioritize
    /// puts the node whose slices are in use first under binpack, fgd and fgd-plus, and last
    /// under spread.
    #[test]
    fn a_mig_pod_is_packed_onto_the_node_whose_slices_are_in_use() {
        let config = Config::default();
        let whole = NodeSpec::uniform("gpus", GpuMode::Exclusive, 4, "A100", MemMiB(80 << 10));
        let mut table = Table::rebuild(20, [mig_node("fresh"), mig_node("used"), whole], []);
        let first = translate::pod_request(&mig_pod("first"), &config)
            .unwrap()
            .unwrap();
        let allocation = fit(
            table.node_by_str("used").unwrap(),
            &first,
            &Policy::default(),
        )
        .unwrap();
        table.apply(Change::PodBound {
            pod: PodKey::new("ns", "first"),
            allocation,
        });
        let cluster = ClusterState::with_table(table);
        let names = ["fresh", "used", "gpus"];
        let pod = mig_pod("next");
        for scoring in ScoringPolicy::ALL {
            let policy = PolicyCell::from(Policy::scoring(scoring));
            let verbs = Verbs {
                cluster: &cluster,
                policy: &policy,
                config: &config,
            };
            let FilterDecision::Verdict { verdict, .. } =
                verbs.filter(Some(&pod), Offered::Names(&names))
            else {
                panic!("{scoring:?}: no verdict");
            };
            assert_eq!(verdict.passed, [0, 1], "{scoring:?}");
            assert_eq!(
                verdict.unresolvable,
                [("gpus", RejectReason::NoMigSlices.message())]
            );
            let scores = verbs.prioritize(Some(&pod), Offered::Names(&names));
            let score = |node: &str| scores.iter().find(|(n, _)| *n == node).unwrap().1;
            assert_eq!(score("gpus"), 0, "{scoring:?}: {scores:?}");
            if scoring == ScoringPolicy::Spread {
                assert!(score("fresh") > score("used"), "{scoring:?}: {scores:?}");
            } else {
                assert!(score("used") > score("fresh"), "{scoring:?}: {scores:?}");
            }
        }
    }
}
