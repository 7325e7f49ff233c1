//! Properties of MIG slices over random nodes and pods: a placement never takes more slices of a
//! profile than are free, so the table never holds more than a node advertises; a node that does
//! not advertise a profile never takes a pod asking for it; releasing a pod restores its node
//! exactly, and rebuilding the table from specs and pods gives the same table; the score-only
//! path decides as the full evaluation; and packing ranks a node whose slices are in use above an
//! untouched one, spread the reverse. External holds (DRA claims) of slices count against the
//! pools as pods do and are released exactly.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a panic is a test failure with its location"
)]

mod common;

use common::mig;
use gpu_engine::mig::normalized;
use gpu_engine::{
    Change, CpuMilli, GpuDemand, GpuMode, HolderKey, MemMiB, MigProfile, MigSlices, NodeName,
    NodeSpec, NodeState, PodAllocation, PodKey, PodRequest, Policy, RejectReason, ScoringPolicy,
    Table, TypicalPod, TypicalPods, fit,
};
use proptest::prelude::*;

const PROFILES: [&str; 5] = ["1g.10gb", "1g.10gb.me", "2g.20gb", "3g.40gb", "7g.80gb"];

/// A node: whole GPUs, and (profile, slices advertised) pairs.
#[derive(Clone, Debug)]
struct NodeDesc {
    whole: u16,
    pools: Vec<(usize, u32)>,
}

/// A pod: whole GPUs, and (profile, slices) pairs.
#[derive(Clone, Debug)]
struct PodDesc {
    whole: u64,
    asks: Vec<(usize, u32)>,
}

fn node_desc() -> impl Strategy<Value = NodeDesc> {
    (
        0u16..3,
        prop::collection::vec((0..PROFILES.len(), 0u32..8), 0..4),
    )
        .prop_map(|(whole, pools)| NodeDesc { whole, pools })
}

fn pod_desc() -> impl Strategy<Value = PodDesc> {
    (
        prop_oneof![4 => Just(0u64), 1 => Just(1u64)],
        prop::collection::vec((0..PROFILES.len(), 1u32..4), 1..3),
    )
        .prop_map(|(whole, asks)| PodDesc { whole, asks })
}

/// One step of a run: a pod placed by fit, or a claim (an external hold) taking slices.
#[derive(Clone, Debug)]
enum Step {
    Pod(PodDesc),
    /// (profile, slices) pairs the claim asks for; it is given those free on its node.
    Claim(Vec<(usize, u32)>),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        pod_desc().prop_map(Step::Pod),
        prop::collection::vec((0..PROFILES.len(), 1u32..4), 1..3).prop_map(Step::Claim),
    ]
}

fn slices(pairs: &[(usize, u32)]) -> Vec<(&'static str, u32)> {
    pairs
        .iter()
        .map(|&(profile, count)| (PROFILES[profile], count))
        .collect()
}

fn spec(name: &str, desc: &NodeDesc) -> NodeSpec {
    NodeSpec::uniform(
        name,
        GpuMode::Exclusive,
        desc.whole,
        "A100",
        MemMiB(80 * 1024),
    )
    .with_host(CpuMilli(64_000), MemMiB(512 * 1024), 110)
    .with_mig(mig(&slices(&desc.pools)))
}

fn request(desc: &PodDesc) -> PodRequest {
    PodRequest::single(
        CpuMilli(100),
        MemMiB(128),
        GpuDemand::whole(desc.whole).unwrap(),
    )
    .with_mig(mig(&slices(&desc.asks)))
}

fn policies() -> [Policy; 4] {
    let typical = TypicalPods::new(vec![TypicalPod {
        cpu: CpuMilli(4000),
        memory: MemMiB(16 * 1024),
        gpus: 1,
        milli: 1000,
        models: Vec::new(),
        weight: 1.0,
    }]);
    ScoringPolicy::ALL.map(|scoring| Policy::scoring(scoring).with_typical(typical.clone()))
}

/// The node's held slices never exceed what it advertises, profile by profile.
fn within_pools(node: &NodeState) -> Result<(), TestCaseError> {
    for held in &node.mig_held {
        prop_assert!(
            held.count <= node.mig_advertised(&held.profile),
            "{}: {} of {} held, {} advertised",
            node.spec.name,
            held.count,
            held.profile,
            node.mig_advertised(&held.profile)
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Pods placed one after another on random nodes, then released in another order: every
    /// placement takes slices that were free, the table's invariants hold throughout, a pod
    /// released at once leaves its node exactly as it was, rebuilding gives the same table, and
    /// with every pod gone no slice is held.
    #[test]
    fn placements_never_over_commit_a_pool_and_release_restores(
        nodes in prop::collection::vec(node_desc(), 1..4),
        pods in prop::collection::vec((pod_desc(), any::<prop::sample::Index>()), 1..24),
        scoring in 0..ScoringPolicy::ALL.len(),
    ) {
        let policy = &policies()[scoring];
        let specs: Vec<NodeSpec> = nodes
            .iter()
            .enumerate()
            .map(|(i, desc)| spec(&format!("n{i}"), desc))
            .collect();
        let mut table = Table::rebuild(20, specs.clone(), []);
        let mut placed: Vec<PodKey> = Vec::new();
        for (index, (desc, on)) in pods.iter().enumerate() {
            let name = NodeName::new(format!("n{}", on.index(specs.len())));
            let request = request(desc);
            let node = table.node(&name).unwrap().clone();
            let Ok(allocation) = fit(&node, &request, policy) else {
                continue;
            };
            for asked in &request.mig {
                prop_assert!(node.mig_free(&asked.profile) >= asked.count);
            }
            prop_assert_eq!(&allocation.mig, &request.mig);
            // Taking and giving back at once restores the node.
            let mut trial = node.clone();
            trial.add(&allocation);
            within_pools(&trial)?;
            trial.remove(&allocation);
            prop_assert!(trial.placed_alike(&node));
            prop_assert_eq!(&trial.mig_held, &node.mig_held);
            let key = PodKey::new("ns", &format!("p{index}"));
            table.apply(Change::PodBound { pod: key.clone(), allocation });
            placed.push(key);
            prop_assert!(table.check_invariants().is_ok(), "{:?}", table.check_invariants());
        }
        let bound: Vec<(PodKey, PodAllocation)> = table
            .pods()
            .map(|(key, entry)| (key.clone(), entry.allocation.clone()))
            .collect();
        prop_assert!(Table::rebuild(20, specs.clone(), bound) == table);
        placed.reverse();
        let half = placed.len() / 2;
        placed.rotate_left(half);
        for key in &placed {
            table.apply(Change::PodGone(key.clone()));
            prop_assert!(table.check_invariants().is_ok(), "{:?}", table.check_invariants());
        }
        for node in table.nodes() {
            prop_assert!(node.mig_held.is_empty(), "{:?}", node.mig_held);
        }
        prop_assert!(table == Table::rebuild(20, specs, []));
    }

    /// Claims holding free slices between pod placements, as kube-scheduler's DRA allocator
    /// gives them: a pod placed after them never takes a claimed slice, so no pool is
    /// over-committed and the invariants hold throughout; a claim released at once leaves its
    /// node exactly as it was; the table equals its rebuild with the claims held again; and with
    /// every pod and claim gone no slice is held.
    #[test]
    fn claims_holding_slices_never_over_commit_a_pool_and_release_restores(
        nodes in prop::collection::vec(node_desc(), 1..4),
        steps in prop::collection::vec((step(), any::<prop::sample::Index>()), 1..24),
        scoring in 0..ScoringPolicy::ALL.len(),
    ) {
        let policy = &policies()[scoring];
        let specs: Vec<NodeSpec> = nodes
            .iter()
            .enumerate()
            .map(|(i, desc)| spec(&format!("n{i}"), desc))
            .collect();
        let mut table = Table::rebuild(20, specs.clone(), []);
        let mut pods: Vec<PodKey> = Vec::new();
        let mut claims: Vec<HolderKey> = Vec::new();
        for (index, (step, on)) in steps.iter().enumerate() {
            let name = NodeName::new(format!("n{}", on.index(specs.len())));
            let node = table.node(&name).unwrap().clone();
            match step {
                Step::Pod(desc) => {
                    let Ok(allocation) = fit(&node, &request(desc), policy) else {
                        continue;
                    };
                    let key = PodKey::new("ns", &format!("p{index}"));
                    table.apply(Change::PodBound { pod: key.clone(), allocation });
                    pods.push(key);
                }
                Step::Claim(asks) => {
                    let held: Vec<MigSlices> = normalized(mig(&slices(asks)))
                        .into_iter()
                        .filter_map(|asked| {
                            let count = asked.count.min(node.mig_free(&asked.profile));
                            (count > 0).then(|| MigSlices::new(asked.profile, count))
                        })
                        .collect();
                    if held.is_empty() {
                        continue;
                    }
                    let holder = HolderKey::new(format!("dra:ns/c{index}"));
                    let hold = Change::HoldExternal {
                        holder: holder.clone(),
                        node: name.clone(),
                        holds: Vec::new(),
                        mig: held.clone(),
                    };
                    table.apply(hold.clone());
                    let holding = table.node(&name).unwrap();
                    for slices in &held {
                        prop_assert_eq!(
                            holding.mig_held_of(&slices.profile),
                            node.mig_held_of(&slices.profile) + slices.count
                        );
                    }
                    prop_assert_eq!(holding.pods, node.pods);
                    table.apply(Change::ReleaseExternal(holder.clone()));
                    let released = table.node(&name).unwrap();
                    prop_assert!(released.placed_alike(&node));
                    prop_assert_eq!(&released.mig_held, &node.mig_held);
                    table.apply(hold);
                    claims.push(holder);
                }
            }
            for state in table.nodes() {
                within_pools(state)?;
            }
            prop_assert!(table.check_invariants().is_ok(), "{:?}", table.check_invariants());
        }
        let bound: Vec<(PodKey, PodAllocation)> = table
            .pods()
            .map(|(key, entry)| (key.clone(), entry.allocation.clone()))
            .collect();
        let mut rebuilt = Table::rebuild(20, specs.clone(), bound);
        for (holder, entry) in table.externals() {
            rebuilt.apply(Change::HoldExternal {
                holder: holder.clone(),
                node: entry.node.clone(),
                holds: entry.holds.clone(),
                mig: entry.mig.clone(),
            });
        }
        prop_assert!(rebuilt == table);
        for key in &pods {
            table.apply(Change::PodGone(key.clone()));
        }
        for holder in &claims {
            table.apply(Change::ReleaseExternal(holder.clone()));
            prop_assert!(table.check_invariants().is_ok(), "{:?}", table.check_invariants());
        }
        for node in table.nodes() {
            prop_assert!(node.mig_held.is_empty(), "{:?}", node.mig_held);
        }
        prop_assert!(table == Table::rebuild(20, specs, []));
    }

    /// A pod asking for a profile its node does not advertise is refused for good, whatever
    /// else the node has, under every policy and on both evaluation paths.
    #[test]
    fn a_node_without_the_profile_never_fits(
        node in node_desc(),
        pod in pod_desc(),
        missing in 0..PROFILES.len(),
    ) {
        let node = NodeDesc {
            pools: node.pools.into_iter().filter(|&(p, _)| p != missing).collect(),
            ..node
        };
        let mut asks = pod.asks.clone();
        asks.push((missing, 1));
        let request = request(&PodDesc { asks, ..pod });
        let state = NodeState::new(spec("n", &node));
        for policy in &policies() {
            prop_assert_eq!(
                policy.evaluate(&state, &request).map(|e| e.allocation),
                Err(RejectReason::NoMigSlices)
            );
            prop_assert_eq!(
                policy.evaluate_score(&state, &request),
                Err(RejectReason::NoMigSlices)
            );
        }
        prop_assert!(!RejectReason::NoMigSlices.is_resolvable());
    }

    /// The score-only path filter and prioritize take gives the full evaluation's verdict and
    /// score bit for bit, within 0..=100, for MIG pods on nodes partly used.
    #[test]
    fn the_score_only_path_decides_as_the_full_evaluation(
        node in node_desc(),
        others in prop::collection::vec(pod_desc(), 0..4),
        pod in pod_desc(),
    ) {
        let mut state = NodeState::new(spec("n", &node));
        for other in &others {
            if let Ok(allocation) = fit(&state, &request(other), &Policy::default()) {
                state.add(&allocation);
            }
        }
        let request = request(&pod);
        for policy in &policies() {
            let full = policy.evaluate(&state, &request).map(|e| e.score.to_bits());
            let fast = policy.evaluate_score(&state, &request).map(f64::to_bits);
            prop_assert_eq!(full, fast);
            if let Ok(score) = policy.evaluate_score(&state, &request) {
                prop_assert!((0.0..=100.0).contains(&score));
            }
        }
    }

    /// Two nodes of one shape, one with some MIG slice held and one untouched: a pod of slices
    /// only that fits both ranks the used one first under binpack, fgd and fgd-plus, and last
    /// under spread.
    #[test]
    fn packing_prefers_nodes_in_use_and_spread_the_untouched(
        pools in prop::collection::vec((0..PROFILES.len(), 1u32..8), 1..4),
        used in any::<prop::sample::Index>(),
        asked in any::<prop::sample::Index>(),
    ) {
        let desc = NodeDesc { whole: 0, pools };
        let untouched = NodeState::new(spec("untouched", &desc));
        let mut in_use = NodeState::new(spec("in-use", &desc));
        let pool = &in_use.spec.mig[used.index(in_use.spec.mig.len())];
        let mut other = PodAllocation::host_only(in_use.spec.name.clone(), CpuMilli(0), MemMiB(0));
        other.mig = vec![gpu_engine::MigSlices::new(pool.profile.clone(), 1)];
        in_use.add(&other);
        // A profile with a slice free on both nodes.
        let free: Vec<MigProfile> = in_use
            .spec
            .mig
            .iter()
            .map(|pool| pool.profile.clone())
            .filter(|profile| in_use.mig_free(profile) >= 1)
            .collect();
        prop_assume!(!free.is_empty());
        let profile = free[asked.index(free.len())].clone();
        let request = PodRequest::single(CpuMilli(100), MemMiB(128), GpuDemand::None)
            .with_mig(vec![gpu_engine::MigSlices::new(profile, 1)]);
        for policy in &policies() {
            let used = policy.evaluate_score(&in_use, &request).unwrap();
            let fresh = policy.evaluate_score(&untouched, &request).unwrap();
            if policy.scoring == ScoringPolicy::Spread {
                prop_assert!(used < fresh, "{:?}: {used} >= {fresh}", policy.scoring);
            } else {
                prop_assert!(used > fresh, "{:?}: {used} <= {fresh}", policy.scoring);
            }
        }
    }
}

#[test]
fn a_pod_of_slices_only_is_a_gpu_pod() {
    let request = common::mig_pod(0, &[("1g.10gb", 1)]);
    assert!(request.wants_gpu());
    assert!(!request.wants_gpu_grants());
    // FGD+ keeps an idle node's host for GPU pods: a pod of slices is one, and is not held off
    // an idle node of four GPUs, where a pod without GPUs is.
    let fgd_plus = &policies()[3];
    assert_eq!(fgd_plus.scoring, ScoringPolicy::FgdPlus);
    let node = common::mig_node(4, &[("1g.10gb", 7)], &[]);
    assert!(fgd_plus.evaluate(&node, &request).is_ok());
    let host_only = PodRequest::single(CpuMilli(100), MemMiB(128), GpuDemand::None);
    assert_eq!(
        fgd_plus.evaluate(&node, &host_only).map(|e| e.score),
        Err(RejectReason::HostHeldForGpus)
    );
}

#[test]
fn the_table_refuses_and_reports_slices_past_what_a_node_advertises() {
    let spec = NodeSpec::uniform("n", GpuMode::Exclusive, 0, "A100", MemMiB(0))
        .with_mig(mig(&[("1g.10gb", 2)]));
    let mut table = Table::rebuild(20, [spec], []);
    let mut three = PodAllocation::host_only(NodeName::new("n"), CpuMilli(0), MemMiB(0));
    three.mig = mig(&[("1g.10gb", 3)]);
    // A reservation past the pool is refused...
    assert!(matches!(
        table.reserve(PodKey::new("ns", "r"), three.clone(), 1000),
        Err(gpu_engine::TableError::NoLongerFits { .. })
    ));
    // ...and the same holding reported by the cluster is kept, and shown as an over-commit.
    table.apply(Change::PodBound {
        pod: PodKey::new("ns", "b"),
        allocation: three,
    });
    assert_eq!(
        table.check_invariants(),
        Err(vec![
            "node n MIG 1g.10gb: 3 slices held, 2 advertised".to_owned()
        ])
    );
}
