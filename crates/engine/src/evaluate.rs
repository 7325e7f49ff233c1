//! Fit and score in one call: the verdict, placement and score that bind, filter and prioritize
//! ask of one node. Sits above both [`fit`](super::fit) (where the pod can go) and
//! [`policy`](super::policy) (which GPUs, how good), which therefore never import each other
//! both ways.

use std::collections::HashMap;

use super::fit::{RejectReason, fit, fit_with, footprint_with};
use super::policy::fgd::FgdCache;
use super::policy::fgd_plus::Taking;
use super::policy::topology::{preferred_score, quality};
use super::policy::{Evaluation, Policy};
use super::request::{PodRequest, TopologyPreference};
use super::state::{NodeState, PerGpu};

impl Policy {
    /// Whether the policy would pass `node` for `request` in filter: the pod fits and the policy
    /// does not hold the node's host for its GPUs ([`Policy::holds_host`]). [`Policy::evaluate`]'s
    /// verdict without the score, for the questions "would some node take this pod".
    pub fn places(&self, node: &NodeState, request: &PodRequest) -> bool {
        fit(node, request, self)
            .is_ok_and(|allocation| !self.holds_host(node, Taking::of(&allocation)))
    }

    /// Fit and score in one call, with the placement: what bind asks of the chosen node.
    pub fn evaluate(
        &self,
        node: &NodeState,
        request: &PodRequest,
    ) -> Result<Evaluation, RejectReason> {
        let mut cache = FgdCache::default();
        let choice = self.share_choice(node, request);
        let allocation = fit_with(node, request, self, choice, &mut cache)?;
        if self.holds_host(node, Taking::of(&allocation)) {
            return Err(RejectReason::HostHeldForGpus);
        }
        let mut score = self.score_with(node, &allocation, &mut cache);
        if request.constraints.topology == TopologyPreference::Preferred {
            score = preferred_score(score, quality(node, &allocation));
        }
        Ok(Evaluation { allocation, score })
    }

    /// The verdict and score of [`Policy::evaluate`] (equal to
    /// `evaluate(node, request).map(|e| e.score)`, bit for bit) without building the placement:
    /// what filter and prioritize ask of every candidate node. The same placement procedure runs,
    /// but what it chooses is recorded on the stack as the node's usage afterwards instead of as
    /// a [`PodAllocation`] (a few heap blocks and the node name's reference count per node).
    pub fn evaluate_score(
        &self,
        node: &NodeState,
        request: &PodRequest,
    ) -> Result<f64, RejectReason> {
        self.evaluate_score_with(node, request, &mut FgdCache::default())
    }

    /// [`Policy::evaluate_score`] with `cache` holding what FGD and FGD+ derived from `node` in
    /// earlier calls (the measure of the node as it is, its classes' access): a replay keeps one
    /// per node while neither the node nor the classes' scarcity changes, and scores the node for
    /// every pod class from it. The same score bit for bit: the cache holds what would be
    /// computed again.
    pub fn evaluate_score_with(
        &self,
        node: &NodeState,
        request: &PodRequest,
        cache: &mut FgdCache,
    ) -> Result<f64, RejectReason> {
        // Allocations name GPUs by index and scores read them back by index: the footprint,
        // which works on positions, gives the same usage only when indices are positions.
        if !node.profile.contiguous {
            return self
                .evaluate(node, request)
                .map(|evaluation| evaluation.score);
        }
        // The node's usage, then the placement's scratch, then the usage the pod leaves: built
        // here and written in place (moving it out of the placement was a `memcpy` call, 10% of
        // filtering a share pod).
        let mut after = PerGpu::copy_of(&node.gpus);
        let group_quality = footprint_with(node, request, self, cache, &mut after)?;
        // The placement succeeded, so the pod holds GPUs exactly when it asks for any.
        let taking = Taking::asked(request);
        if self.holds_host(node, taking) {
            return Err(RejectReason::HostHeldForGpus);
        }
        let score = self.score_after(node, &after, taking, group_quality, cache);
        let score = self.with_mig(score, node, &request.mig, request.wants_gpu_grants());
        if request.constraints.topology == TopologyPreference::Preferred {
            return Ok(preferred_score(score, group_quality));
        }
        Ok(score)
    }
}

/// [`Policy::evaluate_score`] of one pod over many nodes, run once for each set of nodes that
/// placement cannot tell apart ([`NodeState::placed_alike`]: the same shape, the same usage),
/// which get the same verdict and score bit for bit. A node pool of one hardware type is mostly
/// empty nodes and full ones, so kube-scheduler's hundreds of candidates per call are a handful
/// of placements. Lives for one request: nothing is kept between calls, so a node's change can
/// never meet a stale score.
///
/// Where nearly every node differs, the key and the map entry per node cost more than they save
/// under a cheap policy (`binpack` on 5,000 mixed nodes: +38%, filter_alike in
/// benches/engine.rs), so the memo stops after [`ALIKE_PROBE`] nodes if fewer than a third of
/// them were answered from it, and places every later node itself.
#[derive(Debug)]
pub struct AlikeScores<'a, 'n> {
    policy: &'a Policy,
    request: &'a PodRequest,
    /// By [`NodeState::usage_key`]: the first node seen with that key, and its answer.
    seen: HashMap<u64, (&'n NodeState, Result<f64, RejectReason>), foldhash::fast::RandomState>,
    /// Nodes asked about, and how many of them the memo answered, while it is on.
    asked: usize,
    remembered: usize,
}

/// How many nodes [`AlikeScores`] asks about before judging whether its memo pays.
pub const ALIKE_PROBE: usize = 64;

impl<'a, 'n> AlikeScores<'a, 'n> {
    /// Scores of `request` under `policy`, for about `nodes` nodes.
    pub fn new(policy: &'a Policy, request: &'a PodRequest, nodes: usize) -> Self {
        Self {
            policy,
            request,
            seen: HashMap::with_capacity_and_hasher(
                nodes.min(4 * ALIKE_PROBE),
                foldhash::fast::RandomState::default(),
            ),
            asked: 0,
            remembered: 0,
        }
    }

    /// `policy.evaluate_score(node, request)`, placed anew only for a node unlike those seen.
    pub fn score(&mut self, node: &'n NodeState) -> Result<f64, RejectReason> {
        if !self.on() {
            return self.policy.evaluate_score(node, self.request);
        }
        let key = node.usage_key();
        let (answer, remembered) = match self.seen.get(&key) {
            Some((seen, answer)) if seen.placed_alike(node) => (*answer, true),
            // Equal keys of unlike nodes: placed without the memo, never answered wrongly.
            Some(_) => (self.policy.evaluate_score(node, self.request), false),
            None => {
                let answer = self.policy.evaluate_score(node, self.request);
                self.seen.insert(key, (node, answer));
                (answer, false)
            }
        };
        self.asked += 1;
        self.remembered += usize::from(remembered);
        answer
    }

    /// Whether the memo is still used: off for good once the first [`ALIKE_PROBE`] nodes had
    /// fewer than a third answered from it (counting stops there).
    fn on(&self) -> bool {
        self.asked != ALIKE_PROBE || 3 * self.remembered >= ALIKE_PROBE
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on a broken fixture")]

    use proptest::prelude::*;

    use super::*;
    use crate::allocation::{ContainerAllocation, GpuGrant, Grant, PodAllocation};
    use crate::fit::{RejectReason, fit};
    use crate::model::{CpuMilli, GpuIndex, GpuMode, Link, LinkMatrix, MemMiB, NodeSpec};
    use crate::request::{GpuConstraints, GpuDemand};

    /// Eight GPUs in two islands of four: NV12 inside an island, NV4 across.
    fn islands(name: &str) -> NodeState {
        let links = LinkMatrix::from_fn(8, |a, b| {
            if a / 4 == b / 4 {
                Link::NvLink(12)
            } else {
                Link::NvLink(4)
            }
        });
        NodeState::new(
            NodeSpec::uniform(name, GpuMode::Topology, 8, "A100", MemMiB(80 * 1024))
                .with_links(links),
        )
    }

    /// Another pod holds `gpus` of `node` whole.
    fn take_whole(node: &mut NodeState, gpus: &[u16]) {
        node.add(&PodAllocation {
            node: node.spec.name.clone(),
            cpu: CpuMilli(0),
            memory: MemMiB(0),
            containers: vec![ContainerAllocation {
                name: "other".into(),
                gpus: gpus
                    .iter()
                    .map(|&gpu| GpuGrant {
                        gpu: GpuIndex(gpu),
                        grant: Grant::Whole,
                    })
                    .collect(),
            }],
            init_containers: Vec::new(),
            mig: Vec::new(),
        });
    }

    /// `islands` with whole GPUs 0, 1, 2, 4, 5 and 6 taken: the free pair 3 + 7 spans both.
    fn split_free_pair() -> NodeState {
        let mut node = islands("busy");
        take_whole(&mut node, &[0, 1, 2, 4, 5, 6]);
        node
    }

    fn pair(topology: TopologyPreference) -> PodRequest {
        PodRequest::single(CpuMilli(0), MemMiB(0), GpuDemand::topology(2).unwrap())
            .with_constraints(GpuConstraints {
                topology,
                ..GpuConstraints::default()
            })
    }

    fn score(node: &NodeState, request: &PodRequest) -> f64 {
        let policy = Policy::default();
        let full = policy.evaluate(node, request).unwrap().score;
        let fast = policy.evaluate_score(node, request).unwrap();
        assert_eq!(full.to_bits(), fast.to_bits(), "both paths score alike");
        full
    }

    #[test]
    fn preferred_topology_ranks_a_best_connected_group_above_a_fuller_node() {
        let busy = split_free_pair();
        let empty = islands("empty");
        // Without the wish, binpack's preference for the fuller node outweighs the weaker link.
        let any = pair(TopologyPreference::Any);
        assert!(score(&busy, &any) > score(&empty, &any));
        // With it, the node that offers a pair inside one island wins.
        let preferred = pair(TopologyPreference::Preferred);
        assert!(score(&empty, &preferred) > score(&busy, &preferred));
        assert!(score(&empty, &preferred) >= 50.0);
        assert!(score(&busy, &preferred) < 50.0);
    }

    #[test]
    fn preferred_topology_accepts_a_worse_group_and_required_refuses_it() {
        let busy = split_free_pair();
        let policy = Policy::default();
        let placed = fit(&busy, &pair(TopologyPreference::Preferred), &policy).unwrap();
        let gpus: Vec<u16> = placed.containers[0].gpus.iter().map(|g| g.gpu.0).collect();
        assert_eq!(gpus, vec![3, 7]);
        assert_eq!(
            fit(&busy, &pair(TopologyPreference::Required), &policy),
            Err(RejectReason::NoConnectedGroup)
        );
    }

    #[test]
    fn preferred_topology_takes_the_best_group_the_node_has() {
        let mut node = islands("n");
        // GPU 0 taken: the pair still fits inside the first island.
        take_whole(&mut node, &[0]);
        let placed = fit(
            &node,
            &pair(TopologyPreference::Preferred),
            &Policy::default(),
        )
        .unwrap();
        let gpus: Vec<u16> = placed.containers[0].gpus.iter().map(|g| g.gpu.0).collect();
        assert!(
            gpus.len() == 2 && gpus.iter().all(|&g| g / 4 == gpus[0] / 4),
            "one island, got {gpus:?}"
        );
        assert!(score(&node, &pair(TopologyPreference::Preferred)) >= 50.0);
    }

    /// Nodes of one spec, the i-th with `cpu_used(i)` milli-CPU taken: alike where that is equal.
    fn nodes_using(count: usize, cpu_used: impl Fn(usize) -> u64) -> Vec<NodeState> {
        (0..count)
            .map(|i| {
                let spec = NodeSpec::uniform(
                    &format!("n{i}"),
                    GpuMode::Exclusive,
                    4,
                    "T4",
                    MemMiB(16_384),
                )
                .with_host(CpuMilli(64_000), MemMiB(256 * 1024), 110);
                let mut node = NodeState::new(spec);
                node.cpu_used = CpuMilli(cpu_used(i));
                node
            })
            .collect()
    }

    #[test]
    fn the_memo_answers_alike_nodes_and_stops_where_none_are_alike() {
        let policy = Policy::default();
        let pod = PodRequest::single(CpuMilli(1000), MemMiB(0), GpuDemand::whole(1).unwrap());
        // Three kinds of node in turn: all but the first three answered from the memo.
        let alike = nodes_using(200, |i| (i % 3) as u64 * 1000);
        let mut scores = AlikeScores::new(&policy, &pod, alike.len());
        for node in &alike {
            assert_eq!(scores.score(node), policy.evaluate_score(node, &pod));
        }
        assert!(scores.on());
        assert_eq!(scores.remembered, 197);
        // Every node differs: the memo is off after the probe, and answers are unchanged.
        let unlike = nodes_using(200, |i| i as u64);
        let mut scores = AlikeScores::new(&policy, &pod, unlike.len());
        for node in &unlike {
            assert_eq!(scores.score(node), policy.evaluate_score(node, &pod));
        }
        assert!(!scores.on());
        assert_eq!((scores.asked, scores.remembered), (ALIKE_PROBE, 0));
    }

    /// A replay scores one node for every pod class from one cache (`evaluate_score_with`): each
    /// score must be the one a fresh evaluation gives, bit for bit, under FGD and FGD+ (with a
    /// scarce class, so that FGD+'s node measure has every term), whatever was scored before.
    #[test]
    fn one_cache_across_pod_classes_scores_as_fresh_evaluations_do() {
        use crate::ScoringPolicy;
        use crate::model::ComputeMilli;
        use crate::policy::typical::{TypicalPod, TypicalPods};
        let node_of = |name: &str, memory_gib: u64| {
            NodeState::new(
                NodeSpec::uniform(name, GpuMode::CoreMem, 8, "T4", MemMiB(16 << 10)).with_host(
                    CpuMilli(96_000),
                    MemMiB(memory_gib << 10),
                    110,
                ),
            )
        };
        let class = |cpu: u64, memory_gib: u64, gpus: u16, milli: u32, weight: f64| TypicalPod {
            cpu: CpuMilli(cpu),
            memory: MemMiB(memory_gib << 10),
            gpus,
            milli,
            models: Vec::new(),
            weight,
        };
        let (big, small) = (node_of("big", 384), node_of("small", 192));
        let typical = TypicalPods::new(vec![
            class(8_000, 16, 1, 1000, 6.0),
            class(4_000, 8, 1, 500, 3.0),
            class(64_000, 257, 8, 1000, 1.0),
        ])
        .with_cluster(&[big.clone(), small.clone(), small.clone(), small.clone()]);
        assert!(!typical.scarce().is_empty(), "the 257 GiB class is scarce");
        let share = |gib: u64, compute: u32| GpuDemand::Share {
            gpus: 1,
            mem_per_gpu: MemMiB(gib << 10),
            compute_per_gpu: ComputeMilli(compute),
        };
        let requests: Vec<PodRequest> = [
            (8_000, 16, GpuDemand::Whole { count: 1 }),
            (16_000, 64, GpuDemand::Whole { count: 2 }),
            (4_000, 8, share(8, 500)),
            (2_000, 4, share(4, 0)),
            (12_000, 48, GpuDemand::None),
            (64_000, 257, GpuDemand::Whole { count: 8 }),
        ]
        .into_iter()
        .map(|(cpu, gib, demand)| PodRequest::single(CpuMilli(cpu), MemMiB(gib << 10), demand))
        .collect();
        // The node part used: a whole GPU and a share taken, memory and CPU partly spent.
        let mut busy = node_of("busy", 384);
        let placed = Policy::default().evaluate(&busy, &requests[0]).unwrap();
        busy.add(&placed.allocation);
        let placed = Policy::default().evaluate(&busy, &requests[2]).unwrap();
        busy.add(&placed.allocation);
        for scoring in [ScoringPolicy::Fgd, ScoringPolicy::FgdPlus] {
            let policy = Policy::scoring(scoring).with_typical(typical.clone());
            for node in [&big, &small, &busy] {
                let mut cache = FgdCache::default();
                // Twice over, so that every class also meets a cache another class filled.
                for request in requests.iter().chain(&requests) {
                    let fresh = policy
                        .evaluate(node, request)
                        .map(|evaluation| evaluation.score.to_bits());
                    let cached = policy
                        .evaluate_score_with(node, request, &mut cache)
                        .map(f64::to_bits);
                    assert_eq!(cached, fresh, "{scoring:?} on {}", node.spec.name);
                }
            }
        }
    }

    proptest! {
        /// Whatever the policy scores, a best-connected placement outranks every other one, and
        /// among placements of one kind the policy's order is kept.
        #[test]
        fn preferred_scores_put_best_connected_placements_first(
            a in 0.0f64..=100.0,
            b in 0.0f64..=100.0,
            worse in 0.0f64..1.0,
        ) {
            prop_assert!(preferred_score(a, 1.0) > preferred_score(b, worse));
            prop_assert!((0.0..=100.0).contains(&preferred_score(a, 1.0)));
            prop_assert!((0.0..50.0).contains(&preferred_score(b, worse)));
            if a > b {
                prop_assert!(preferred_score(a, 1.0) > preferred_score(b, 1.0));
                prop_assert!(preferred_score(a, worse) >= preferred_score(b, worse));
            }
        }
    }
}
