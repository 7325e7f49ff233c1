//! What filter, prioritize and preempt decide: candidate nodes in, verdicts out. The free
//! functions judge any candidates (the nodes of a non-cache request, or the live table's); the
//! [`Snapshot`] methods decide on the live table as one call sees it. No HTTP here: the verbs
//! ([`super::verbs`]) ask these, and the handlers decode and encode.

use std::collections::HashSet;

use super::snapshot::Snapshot;
use crate::objects::admission::PodClaims;
use gpu_engine::quota::{
    Amounts, back_within_max, may_preempt, namespace_of, usage, victims_needed,
};
use gpu_engine::{AlikeScores, NodeState, PodAllocation, PodRequest, Policy, RejectReason};

/// The reason given for a candidate the extender has not seen yet (its watch may lag the
/// scheduler's); resolvable, because it will be known shortly.
pub const UNKNOWN_NODE: &str = "node not yet known to the GPU extender";

/// Filter's verdict on a list of candidates, in the scheduler's terms. Rejections are (name,
/// reason) pairs in candidate order, borrowed: the HTTP layer makes them the
/// answer's maps.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct FilterVerdict<'a> {
    /// Positions (in the candidate list) of the nodes that fit.
    pub passed: Vec<usize>,
    /// Currently full: preemption or waiting may help.
    pub failed: Vec<(&'a str, &'a str)>,
    /// Can never fit as configured.
    pub unresolvable: Vec<(&'a str, &'a str)>,
    /// Each rejection's reason, for metrics.
    pub reasons: Vec<RejectReason>,
    /// Candidates the extender does not know.
    pub unknown: usize,
}

/// Decides which candidates can hold `request` now. `candidates` pairs each name with the node's
/// state, `None` when the extender does not know the node.
pub fn filter<'a, 'n>(
    candidates: impl IntoIterator<Item = (&'a str, Option<&'n NodeState>)>,
    request: &PodRequest,
    policy: &Policy,
) -> FilterVerdict<'a> {
    let mut verdict = FilterVerdict::default();
    let mut scores = Vec::new();
    let candidates = candidates.into_iter();
    let mut alike = AlikeScores::new(policy, request, candidates.size_hint().0);
    for (position, (name, node)) in candidates.enumerate() {
        let Some(node) = node else {
            verdict.failed.push((name, UNKNOWN_NODE));
            verdict.unknown += 1;
            continue;
        };
        // Only the verdict and the score matter here; bind builds the placement for the chosen
        // node.
        match alike.score(node) {
            Ok(score) => {
                verdict.passed.push(position);
                scores.push((score, name));
            }
            Err(reason) => {
                let target = if reason.is_resolvable() {
                    &mut verdict.failed
                } else {
                    &mut verdict.unresolvable
                };
                target.push((name, reason.message()));
                verdict.reasons.push(reason);
            }
        }
    }
    if policy.filter_best_only {
        // One node passes: the best-scored, equal scores broken by a stable hash of the name.
        // The others fit but are dropped unlisted, so kube-scheduler binds the policy's choice
        // and skips scoring. Its own scores must not break the ties: they favour the emptiest,
        // largest node (LeastAllocated), which FGD's many ties between empty nodes would hand
        // the nodes the largest pods need (measured in docs/decisions/0006).
        let chosen = scores
            .iter()
            .enumerate()
            .max_by(|(_, a), (_, b)| {
                a.0.total_cmp(&b.0)
                    .then_with(|| tie_rank(b.1).cmp(&tie_rank(a.1)))
            })
            .map(|(index, _)| index);
        verdict.passed = chosen
            .and_then(|index| verdict.passed.get(index).copied())
            .into_iter()
            .collect();
    }
    verdict
}

/// The order in which equally scored nodes are preferred (lowest first): a fixed hash of the
/// name, so every call and every replica prefers the same node, and no node is favoured for
/// its name's place in the alphabet.
fn tie_rank(name: &str) -> u64 {
    use std::hash::BuildHasher;
    foldhash::quality::FixedState::with_seed(0x6770_752d_6578_7400).hash_one(name)
}

/// Scores candidates on the extender's 0..=10 scale, in candidate order (name, score). Nodes
/// that do not fit (or are unknown) get 0. The engine's 0..=100 scores are stretched over the candidates (best
/// 10, worst 0) because ten buckets would otherwise merge placements the policy tells apart;
/// when all are equal every node gets 10 so the extender expresses no preference.
pub fn prioritize<'a, 'n>(
    candidates: impl IntoIterator<Item = (&'a str, Option<&'n NodeState>)>,
    request: &PodRequest,
    policy: &Policy,
) -> Vec<(&'a str, i64)> {
    let candidates = candidates.into_iter();
    let mut alike = AlikeScores::new(policy, request, candidates.size_hint().0);
    let scored: Vec<(&'a str, Option<f64>)> = candidates
        .map(|(name, node)| (name, node.and_then(|n| alike.score(n).ok())))
        .collect();
    let raw = scored.iter().filter_map(|(_, score)| *score);
    let low = raw.clone().fold(f64::INFINITY, f64::min);
    let high = raw.fold(f64::NEG_INFINITY, f64::max);
    scored
        .into_iter()
        .map(|(host, score)| (host, to_extender_score(score, low, high)))
        .collect()
}

fn to_extender_score(score: Option<f64>, low: f64, high: f64) -> i64 {
    match score {
        None => 0,
        Some(_) if high - low < 1e-9 => 10,
        Some(score) => (10.0 * (score - low) / (high - low))
            .round()
            .clamp(0.0, 10.0) as i64,
    }
}

/// The table is not synced yet: deciding now could hand out capacity that is in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.message())]
pub struct NotReady;

impl NotReady {
    /// What kube-scheduler is told (filter's `Error`).
    pub fn message(self) -> &'static str {
        "GPU extender is not ready: allocation table not yet synced"
    }
}

/// One node kube-scheduler proposes for preemption, with its victims by UID.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Proposal {
    pub node: String,
    pub victims: Vec<String>,
    pub pdb_violations: i64,
}

impl Snapshot<'_> {
    /// Filter over the live table: which of `names` can hold `request` now. Under
    /// `policy.filterBestOnly` the pod goes to the one node that passes, and the other nodes'
    /// reasons are dropped: kube-scheduler reads them only when no node is left.
    pub fn filter<'a>(
        &self,
        names: &[&'a str],
        request: &PodRequest,
    ) -> Result<FilterVerdict<'a>, NotReady> {
        if !self.cluster.is_ready() {
            return Err(NotReady);
        }
        let policy = &*self.policy;
        let mut verdict = filter(self.table.nodes_by_names(names), request, policy);
        if policy.filter_best_only && !verdict.passed.is_empty() {
            verdict.failed.clear();
            verdict.unresolvable.clear();
        }
        Ok(verdict)
    }

    /// Whether a node kube-scheduler did not send would take the pod: not among `names`, and
    /// both the policy ([`Policy::places`]) and the node's labels, taints, cordon and
    /// allocatable admit it.
    /// Asked when no candidate fits, it tells kube-scheduler's window apart from a full cluster:
    /// kube-scheduler stops filtering once it has found `percentageOfNodesToScore` of the
    /// nodes feasible by its own checks, which do not see the GPUs the engine checks.
    pub fn fits_outside(&self, names: &[&str], pod: &PodClaims<'_>, request: &PodRequest) -> bool {
        let policy = &*self.policy;
        let sent: HashSet<&str> = names.iter().copied().collect();
        let claims = self.cluster.node_claims();
        // Cheapest first: the name, the node's claims (map lookups), then the fit alone; a
        // node's score does not matter here, and scoring every node of a full cluster would be
        // the costliest part of a failing filter.
        self.table.nodes().any(|node| {
            let name = node.spec.name.as_str();
            !sent.contains(name)
                && pod.admitted_by(name, claims.get(&node.spec.name))
                && policy.places(node, request)
        })
    }

    /// Prioritize over the live table: (name, 0..=10) in candidate order.
    pub fn prioritize<'a>(&self, names: &[&'a str], request: &PodRequest) -> Vec<(&'a str, i64)> {
        prioritize(self.table.nodes_by_names(names), request, &self.policy)
    }

    /// Keeps the proposed nodes where evicting the victims really makes room on the GPUs, and
    /// spares the victims whose eviction would not help. Victims the extender does not track
    /// (pods without GPUs) are kept untouched: they free only CPU and memory, which
    /// kube-scheduler has already accounted for. Without a readable GPU request, or on a node
    /// the table does not know, a proposal is kept as it is.
    ///
    /// With GPU quotas (`namespace` is the preemptor's), GPU victims are limited as the
    /// capacity-scheduling plugin limits them ([`may_preempt`]): a team within its `min` takes
    /// its guarantee back from borrowers only, a team above its `min` preempts only its own pods;
    /// a node whose allowed victims do not free room is dropped. A pod its quota's `max` refuses
    /// (as filter does) keeps a node only where evicting its own team's pods there brings the
    /// team back within `max`, the capacity-scheduling plugin's rule.
    pub fn preempt(
        &self,
        proposals: Vec<Proposal>,
        request: Option<&PodRequest>,
        namespace: Option<&str>,
    ) -> Vec<Proposal> {
        let policy = &*self.policy;
        let quotas = &*self.quotas;
        let table = &*self.table;
        let cluster = self.cluster;
        let guarded = match (namespace, request) {
            (Some(namespace), Some(request)) => quotas.get(namespace).map(|quota| {
                let used = usage(table);
                let asked = Amounts::requested_by(request);
                let own = quota.used(&used);
                let over_max = quota.admit(&own, &asked, &quotas.names).is_err();
                (namespace, quota, asked, used, own, over_max)
            }),
            _ => None,
        };
        let mut kept = Vec::with_capacity(proposals.len());
        for proposal in proposals {
            let (Some(request), Some(node)) = (request, table.node_by_str(&proposal.node)) else {
                kept.push(proposal);
                continue;
            };
            let mut tracked: Vec<(String, PodAllocation)> = Vec::new();
            let mut untracked: Vec<String> = Vec::new();
            for uid in proposal.victims {
                let entry = cluster
                    .pod_key_for_uid(&uid)
                    .and_then(|key| table.pod(&key).cloned().map(|entry| (key, entry)));
                match entry {
                    Some((key, entry)) if entry.allocation.node.as_str() == proposal.node => {
                        let allowed = guarded.as_ref().is_none_or(|(own, _, asked, used, ..)| {
                            may_preempt(quotas, used, own, asked, namespace_of(&key))
                        });
                        if allowed {
                            tracked.push((uid, entry.allocation));
                        }
                    }
                    _ => untracked.push(uid),
                }
            }
            if guarded.is_some() {
                // A quota reclaims: borrowers' pods go lowest priority, then newest, first
                // (`victims_needed` spares from the end of the list).
                tracked.sort_by_key(|(uid, _)| {
                    cluster
                        .pod_key_for_uid(uid)
                        .and_then(|key| cluster.rank(&key))
                        .unwrap_or_default()
                        .eviction_order()
                });
            }
            let allocations: Vec<PodAllocation> = tracked.iter().map(|(_, a)| a.clone()).collect();
            // Past its max, a team's victims are its own pods (`may_preempt` allowed no others):
            // they must free enough of the quota as well as room on the node.
            let enough = |evicted: &[&PodAllocation]| match &guarded {
                Some((_, quota, asked, _, own, true)) => {
                    let mut freed = Amounts::default();
                    for victim in evicted {
                        freed.add(&Amounts::held_by(victim));
                    }
                    back_within_max(quota, own, &freed, asked, &quotas.names)
                }
                _ => true,
            };
            let Some(needed) = victims_needed(node, &allocations, request, policy, enough) else {
                continue;
            };
            let mut victims = untracked;
            for (uid, allocation) in &tracked {
                if needed.contains(&allocation) {
                    victims.push(uid.clone());
                }
            }
            if !victims.is_empty() {
                kept.push(Proposal {
                    victims,
                    ..proposal
                });
            }
        }
        kept
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::state::ClusterState;
    use gpu_engine::{CpuMilli, GpuDemand, GpuMode, MemMiB, NodeSpec, PodKey, Table, fit};

    fn table() -> Table {
        Table::rebuild(
            20,
            [
                NodeSpec::uniform("share", GpuMode::ShareMemory, 2, "T4", MemMiB(16 * 1024)),
                NodeSpec::uniform("whole", GpuMode::Exclusive, 1, "A100", MemMiB(80 * 1024)),
            ],
            [],
        )
    }

    fn share(gib: u64) -> PodRequest {
        PodRequest::single(
            CpuMilli(100),
            MemMiB(64),
            GpuDemand::share(gib, 1, None).unwrap(),
        )
    }

    #[test]
    fn filter_splits_full_from_never_and_unknown() {
        let table = table();
        let names = ["share", "whole", "ghost"];
        let verdict = filter(
            names.map(|n| (n, table.node_by_str(n))),
            &share(8),
            &Policy::default(),
        );
        assert_eq!(verdict.passed, vec![0]);
        assert_eq!(
            verdict.unresolvable,
            vec![("whole", RejectReason::ModeMismatch.message())]
        );
        assert_eq!(verdict.failed, vec![("ghost", UNKNOWN_NODE)]);
        assert_eq!(verdict.unknown, 1);

        let verdict = filter(
            names.map(|n| (n, table.node_by_str(n))),
            &share(32),
            &Policy::default(),
        );
        assert!(verdict.passed.is_empty());
        assert!(
            verdict
                .unresolvable
                .contains(&("share", RejectReason::GpuMemoryTooSmall.message()))
        );
    }

    #[test]
    fn filter_best_only_keeps_the_policys_choice_and_its_ties() {
        let table = Table::rebuild(
            20,
            [
                NodeSpec::uniform("s8", GpuMode::ShareMemory, 8, "T4", MemMiB(16 * 1024)),
                NodeSpec::uniform("s2", GpuMode::ShareMemory, 2, "T4", MemMiB(16 * 1024)),
                NodeSpec::uniform("s4", GpuMode::ShareMemory, 4, "T4", MemMiB(16 * 1024)),
                NodeSpec::uniform("whole", GpuMode::Exclusive, 1, "A100", MemMiB(80 * 1024)),
            ],
            [],
        );
        let nodes = ["s8", "s2", "s4", "whole"];
        let candidates = || nodes.iter().map(|&name| (name, table.node_by_str(name)));
        let all = filter(candidates(), &share(4), &Policy::default());
        let best_only = Policy {
            filter_best_only: true,
            ..Policy::default()
        };
        let narrowed = filter(candidates(), &share(4), &best_only);
        assert!(!narrowed.passed.is_empty());
        assert!(narrowed.passed.len() <= all.passed.len());
        // The kept nodes are exactly those the policy scores best among the fitting ones.
        let score = |position: usize| {
            Policy::default()
                .evaluate_score(table.node_by_str(nodes[position]).unwrap(), &share(4))
                .unwrap()
        };
        let best = all
            .passed
            .iter()
            .map(|&p| score(p))
            .fold(f64::MIN, f64::max);
        assert_eq!(narrowed.passed.len(), 1);
        assert_eq!(score(narrowed.passed[0]), best);
        assert_eq!(all.passed.len(), 3);
        assert_eq!(
            narrowed.passed,
            [1],
            "binpack: the fullest after placing, s2"
        );
        // Equal scores: one node, the same one in every call and whatever the order.
        let twins = Table::rebuild(
            20,
            ["t1", "t2", "t3", "t4"]
                .map(|n| NodeSpec::uniform(n, GpuMode::ShareMemory, 2, "T4", MemMiB(16 * 1024))),
            [],
        );
        let pick = |order: &[&'static str]| {
            let verdict = filter(
                order.iter().map(|&name| (name, twins.node_by_str(name))),
                &share(4),
                &best_only,
            );
            assert_eq!(verdict.passed.len(), 1);
            order[verdict.passed[0]]
        };
        let first = pick(&["t1", "t2", "t3", "t4"]);
        assert_eq!(pick(&["t4", "t3", "t2", "t1"]), first);
        assert_eq!(pick(&["t2", "t4", "t1", "t3"]), first);
        // Rejections are unchanged: narrowing drops fitting nodes only, unlisted.
        assert_eq!(narrowed.failed, all.failed);
        assert_eq!(narrowed.unresolvable, all.unresolvable);
    }

    #[test]
    fn prioritize_stretches_scores_and_zeroes_misfits() {
        let mut table = table();
        let busy = gpu_engine::fit(
            table.node_by_str("share").unwrap(),
            &share(8),
            &Policy::default(),
        )
        .unwrap();
        table.reserve(PodKey::new("ns", "busy"), busy, 1).unwrap();
        table.apply(gpu_engine::Change::UpsertNode(NodeSpec::uniform(
            "idle",
            GpuMode::ShareMemory,
            2,
            "T4",
            MemMiB(16 * 1024),
        )));
        let names = ["share", "idle", "whole"];
        let scores = prioritize(
            names.map(|n| (n, table.node_by_str(n))),
            &share(4),
            &Policy::default(),
        );
        assert_eq!(scores, vec![("share", 10), ("idle", 0), ("whole", 0)]);
    }

    #[test]
    fn preemption_spares_victims_that_free_nothing_useful() {
        let policy = Policy::default();
        let mut node = NodeState::new(NodeSpec::uniform(
            "n",
            GpuMode::ShareMemory,
            2,
            "T4",
            MemMiB(16 * 1024),
        ));
        let first = gpu_engine::fit(&node, &share(12), &policy).unwrap();
        node.add(&first);
        let second = gpu_engine::fit(&node, &share(12), &policy).unwrap();
        node.add(&second);
        let victims = vec![first.clone(), second.clone()];
        let needed = victims_needed(&node, &victims, &share(8), &policy, |_| true).unwrap();
        assert_eq!(needed.len(), 1, "one freed GPU is enough for 8 GiB");
        assert!(victims_needed(&node, &victims, &share(20), &policy, |_| true).is_none());
    }

    /// Reclaim: a team under its min takes GPUs back from a borrower only (lowest priority, then
    /// newest, first); a victim of a team within its own min is spared, and a node where only
    /// such victims would free room is dropped. A team above its min preempts nobody else.
    #[test]
    fn preemption_for_quotas_takes_from_borrowers_only() {
        use gpu_engine::quota::{Quota, QuotaNames, QuotaSet};
        let policy = Policy::default();
        let whole = |n| PodRequest::single(CpuMilli(1), MemMiB(1), GpuDemand::whole(n).unwrap());
        let mut table = Table::rebuild(
            20,
            ["n1", "n2"]
                .map(|n| NodeSpec::uniform(n, GpuMode::Exclusive, 2, "A100", MemMiB(80 * 1024))),
            [],
        );
        // n1: two borrower pods of team b; n2: team c's two pods, within c's min.
        let pods = [
            ("n1", "b", "b1"),
            ("n1", "b", "b2"),
            ("n2", "c", "c1"),
            ("n2", "c", "c2"),
        ];
        for (node, ns, name) in pods {
            let placed = fit(table.node_by_str(node).unwrap(), &whole(1), &policy).unwrap();
            table.reserve(PodKey::new(ns, name), placed, 1).unwrap();
        }
        let state = ClusterState::with_table(table);
        for (i, (_, ns, name)) in pods.into_iter().enumerate() {
            state.note_gpu_pod(PodKey::new(ns, name), name, None);
            // Equal priority; each pod newer than the one before.
            let rank = crate::state::VictimRank {
                priority: 10,
                created_s: 100 * i as i64,
                terminating: false,
            };
            state.note_rank(&PodKey::new(ns, name), rank);
        }
        let quota = Quota::whole_gpus_min;
        state.set_quotas(QuotaSet::build(
            vec![quota("a", 2), quota("b", 0), quota("c", 2)],
            Vec::new(),
            &QuotaNames::default(),
        ));
        let proposals = vec![
            Proposal {
                node: "n1".into(),
                victims: vec!["b1".into(), "b2".into()],
                pdb_violations: 0,
            },
            Proposal {
                node: "n2".into(),
                victims: vec!["c1".into(), "c2".into()],
                pdb_violations: 0,
            },
        ];
        let kept = Snapshot::of(&state, Arc::new(policy.clone())).preempt(
            proposals.clone(),
            Some(&whole(1)),
            Some("a"),
        );
        assert_eq!(
            kept,
            vec![Proposal {
                node: "n1".into(),
                victims: vec!["b2".into()],
                pdb_violations: 0,
            }],
            "the borrower's newest pod goes, the older one is spared"
        );
        // A lower priority goes first whatever its age.
        state.note_rank(
            &PodKey::new("b", "b1"),
            crate::state::VictimRank {
                priority: 1,
                created_s: 0,
                terminating: false,
            },
        );
        let kept = Snapshot::of(&state, Arc::new(policy.clone())).preempt(
            proposals.clone(),
            Some(&whole(1)),
            Some("a"),
        );
        assert_eq!(kept[0].victims, vec!["b1".to_owned()]);
        // With a min of 0, team a asking for one GPU borrows: it may take nothing from others.
        state.set_quotas(QuotaSet::build(
            vec![quota("a", 0), quota("b", 0), quota("c", 2)],
            Vec::new(),
            &QuotaNames::default(),
        ));
        assert!(
            Snapshot::of(&state, Arc::new(policy.clone()))
                .preempt(proposals.clone(), Some(&whole(1)), Some("a"))
                .is_empty()
        );
        // A namespace without a quota preempts as kube-scheduler proposes (needed victims only).
        let free = Snapshot::of(&state, Arc::new(policy.clone())).preempt(
            proposals,
            Some(&whole(1)),
            Some("none"),
        );
        assert_eq!(free.len(), 2);
    }
    /// A pod past its quota's max (filter refuses it) gets victims only among its own team's
    /// pods, and only on a node where evicting them brings the team back within max: the
    /// capacity-scheduling plugin's rule, so preempt agrees with filter.
    #[test]
    fn preemption_past_max_takes_only_what_brings_the_team_back_within_max() {
        use gpu_engine::quota::{Amounts, Quota, QuotaNames, QuotaSet};
        let policy = Policy::default();
        let whole = |n| PodRequest::single(CpuMilli(1), MemMiB(1), GpuDemand::whole(n).unwrap());
        let mut table = Table::rebuild(
            20,
            [NodeSpec::uniform(
                "n1",
                GpuMode::Exclusive,
                4,
                "A100",
                MemMiB(80 * 1024),
            )],
            [],
        );
        let pods = [("a", "a1"), ("a", "a2"), ("b", "b1"), ("b", "b2")];
        for (ns, name) in pods {
            let placed = fit(table.node_by_str("n1").unwrap(), &whole(1), &policy).unwrap();
            table.reserve(PodKey::new(ns, name), placed, 1).unwrap();
        }
        let state = ClusterState::with_table(table);
        for (ns, name) in pods {
            state.note_gpu_pod(PodKey::new(ns, name), name, None);
        }
        state.set_quotas(QuotaSet::build(
            vec![Quota {
                name: "q".into(),
                namespace: "a".into(),
                min: Amounts::default(),
                max: [Some(2), None, None],
                also: Vec::new(),
            }],
            Vec::new(),
            &QuotaNames::default(),
        ));
        let proposal = |victims: &[&str]| Proposal {
            node: "n1".into(),
            victims: victims.iter().map(|v| (*v).to_owned()).collect(),
            pdb_violations: 0,
        };
        // Team a holds 2 of its max 2. Another team's pods free room on the node, but not on
        // the quota: nothing.
        let kept = Snapshot::of(&state, Arc::new(policy.clone())).preempt(
            vec![proposal(&["b1", "b2"])],
            Some(&whole(1)),
            Some("a"),
        );
        assert!(kept.is_empty(), "{kept:?}");
        // One of its own pods brings it back to 1 + 1 <= 2.
        let kept = Snapshot::of(&state, Arc::new(policy.clone())).preempt(
            vec![proposal(&["a1", "a2", "b1"])],
            Some(&whole(1)),
            Some("a"),
        );
        assert_eq!(kept, vec![proposal(&["a1"])]);
        // Asking 2, it needs both of its own pods gone, though one would free room enough.
        let kept = Snapshot::of(&state, Arc::new(policy.clone())).preempt(
            vec![proposal(&["a1", "a2", "b1"])],
            Some(&whole(2)),
            Some("a"),
        );
        assert_eq!(kept, vec![proposal(&["a1", "a2"])]);
        // Asking 3 it can never get back within its max of 2: nothing.
        let kept = Snapshot::of(&state, Arc::new(policy.clone())).preempt(
            vec![proposal(&["a1", "a2"])],
            Some(&whole(3)),
            Some("a"),
        );
        assert!(kept.is_empty(), "{kept:?}");
    }

    #[test]
    fn a_node_fgd_plus_holds_for_its_gpus_is_no_window_miss() {
        use gpu_engine::policy::fgd_plus_held_and_unheld;
        // One idle 4-GPU node kube-scheduler did not send; a pod asking for no GPU fits it but
        // FGD+ keeps it for GPU pods: the window hid nothing from the pod.
        let state = ClusterState::with_table(Table::rebuild(
            20,
            [NodeSpec::uniform(
                "big",
                GpuMode::Exclusive,
                4,
                "A100",
                MemMiB(80 * 1024),
            )],
            [],
        ));
        let (held, unheld) = fgd_plus_held_and_unheld(CpuMilli(4000));
        let pod = k8s_openapi::api::core::v1::Pod::default();
        let claims = PodClaims::of(&pod, &crate::config::Config::default()).unwrap();
        let cpu_only = PodRequest::single(CpuMilli(1000), MemMiB(1024), GpuDemand::None);
        assert!(!Snapshot::of(&state, Arc::new(held)).fits_outside(&[], &claims, &cpu_only));
        assert!(Snapshot::of(&state, Arc::new(unheld)).fits_outside(&[], &claims, &cpu_only));
    }
}
