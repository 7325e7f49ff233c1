//! Tests of the allocation table: reservations and their refusals, facts from the watchers,
//! expiry, rebuild, and the invariant checker reporting every kind of over-commit that the
//! cluster can force on it.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a panic is a test failure with its location"
)]

mod common;

use common::{Held, gib, held_allocation, share, uniform, whole};
use gpu_engine::{
    Change, ComputeMilli, ContainerAllocation, CpuMilli, GpuGrant, GpuHold, GpuIndex, GpuMode,
    Grant, Hold, HolderKey, MemMiB, NodeName, NodeSpec, PodAllocation, PodKey, Policy, Table,
    TableError, fit,
};

const LIMIT: u16 = 20;

fn named(name: &str, mut spec: NodeSpec) -> NodeSpec {
    spec.name = NodeName::new(name);
    spec
}

fn key(name: &str) -> PodKey {
    PodKey::new("default", name)
}

fn node(name: &str) -> NodeName {
    NodeName::new(name)
}

/// Two nodes: "share" (2 GPUs of 16 GiB, memory sharing) and "whole" (4 exclusive GPUs).
fn two_node_table() -> Table {
    Table::rebuild(
        LIMIT,
        [
            named(
                "share",
                uniform(GpuMode::ShareMemory, 2, "Tesla-T4", 16).with_host(
                    CpuMilli(8000),
                    gib(32),
                    110,
                ),
            ),
            named("whole", uniform(GpuMode::Exclusive, 4, "A100", 80)),
        ],
        [],
    )
}

fn bound(table: &mut Table, pod: &str, on: &str, held: Held) {
    table.apply(Change::PodBound {
        pod: key(pod),
        allocation: held_allocation(&node(on), held),
    });
}

/// The observable usage of a node, for before/after comparisons.
fn usage(table: &Table, name: &str) -> String {
    let n = table.node_by_str(name).unwrap();
    format!(
        "{:?} cpu={:?} mem={:?} pods={}",
        n.gpus, n.cpu_used, n.mem_used, n.pods
    )
}

#[test]
fn reserve_then_release_restores_the_node_exactly() {
    let mut table = two_node_table();
    bound(&mut table, "a", "share", Held::Share(0, 4, 0));
    let before = usage(&table, "share");
    let request = share(8, 1, None);
    let allocation = fit(
        table.node_by_str("share").unwrap(),
        &request,
        &Policy::default(),
    )
    .unwrap();
    table.reserve(key("b"), allocation.clone(), 5_000).unwrap();
    assert_ne!(usage(&table, "share"), before);
    assert_eq!(
        table.pod(&key("b")).unwrap().hold,
        Hold::Reserved {
            expires_at_ms: 5_000
        }
    );
    assert_eq!(table.release(&key("b")), Some(allocation));
    assert_eq!(usage(&table, "share"), before);
    assert_eq!(
        table.release(&key("b")),
        None,
        "a second release frees nothing"
    );
    table.check_invariants().unwrap();
}

#[test]
fn reserve_refusals() {
    type Setup = fn(&mut Table) -> PodAllocation;
    type Expected = fn(&TableError) -> bool;
    let rows: Vec<(&str, Setup, Expected)> = vec![
        (
            "a pod that already holds an allocation",
            |table| {
                bound(table, "p", "whole", Held::Whole(&[0]));
                held_allocation(&node("whole"), Held::Whole(&[1]))
            },
            |e| matches!(e, TableError::AlreadyAllocated(pod) if pod == &key("p")),
        ),
        (
            "a node the table does not know",
            |_| held_allocation(&node("gone"), Held::Whole(&[0])),
            |e| matches!(e, TableError::UnknownNode(name) if name.as_str() == "gone"),
        ),
        (
            "a whole GPU another bind took first",
            |table| {
                let decided = fit(
                    table.node_by_str("whole").unwrap(),
                    &whole(1),
                    &Policy::default(),
                )
                .unwrap();
                table.reserve(key("first"), decided.clone(), 10).unwrap();
                decided
            },
            |e| matches!(e, TableError::NoLongerFits { detail, .. } if detail.contains("held whole by several pods")),
        ),
        (
            "GPU memory another bind took first",
            |table| {
                let decided = fit(
                    table.node_by_str("share").unwrap(),
                    &share(10, 1, None),
                    &Policy::default(),
                )
                .unwrap();
                table.reserve(key("first"), decided.clone(), 10).unwrap();
                decided
            },
            |e| matches!(e, TableError::NoLongerFits { detail, .. } if detail.contains("memory over-committed")),
        ),
        (
            "a GPU index the node does not have",
            |_| held_allocation(&node("share"), Held::Share(7, 1, 0)),
            |e| matches!(e, TableError::NoLongerFits { detail, .. } if detail.contains("no longer has")),
        ),
        (
            "host CPU another bind took first",
            |table| {
                bound(table, "big", "share", Held::Host(7000, 0));
                held_allocation(&node("share"), Held::Host(2000, 0))
            },
            |e| matches!(e, TableError::NoLongerFits { detail, .. } if detail.contains("CPU over-committed")),
        ),
    ];
    for (name, setup, expected) in rows {
        let mut table = two_node_table();
        let allocation = setup(&mut table);
        let pods_before = table.pod_count();
        let snapshot = table.clone();
        let err = table.reserve(key("p"), allocation, 10).unwrap_err();
        assert!(expected(&err), "{name}: got {err:?}");
        assert!(
            table == snapshot && table.pod_count() == pods_before,
            "{name}: a refused reservation changed the table"
        );
        table.check_invariants().unwrap();
    }
}

#[test]
fn the_per_gpu_pod_limit_is_enforced_at_reserve() {
    let mut table = Table::rebuild(2, [uniform(GpuMode::ShareMemory, 1, "T4", 16)], []);
    for pod in ["a", "b"] {
        table
            .reserve(
                key(pod),
                held_allocation(&node("n"), Held::Share(0, 1, 0)),
                10,
            )
            .unwrap();
    }
    let err = table
        .reserve(
            key("c"),
            held_allocation(&node("n"), Held::Share(0, 1, 0)),
            10,
        )
        .unwrap_err();
    assert!(
        matches!(&err, TableError::NoLongerFits { detail, .. } if detail.contains("more than 2 pods")),
        "{err:?}"
    );
    assert_eq!(table.max_shares_per_gpu(), 2);
}

#[test]
fn pod_bound_confirms_a_reservation_without_counting_it_twice() {
    let mut table = two_node_table();
    let allocation = held_allocation(&node("share"), Held::Share(1, 6, 0));
    table.reserve(key("p"), allocation.clone(), 100).unwrap();
    let reserved = usage(&table, "share");
    table.apply(Change::PodBound {
        pod: key("p"),
        allocation,
    });
    assert_eq!(usage(&table, "share"), reserved);
    assert_eq!(table.pod(&key("p")).unwrap().hold, Hold::Bound);
    assert!(
        table.expire_reservations(u64::MAX).is_empty(),
        "bound pods never expire"
    );
    table.check_invariants().unwrap();
}

#[test]
fn pod_bound_with_another_allocation_moves_the_pod() {
    let mut table = two_node_table();
    table
        .reserve(
            key("p"),
            held_allocation(&node("share"), Held::Share(0, 6, 0)),
            100,
        )
        .unwrap();
    // The record on the pod says otherwise: the record wins.
    bound(&mut table, "p", "whole", Held::Whole(&[2]));
    let share_node = table.node_by_str("share").unwrap();
    assert!(share_node.gpus.iter().all(|g| g.is_idle()) && share_node.pods == 0);
    assert!(table.node_by_str("whole").unwrap().gpus[2].is_whole());
    assert_eq!(table.pods_on(&node("share")).count(), 0);
    assert_eq!(table.pods_on(&node("whole")).count(), 1);
    table.check_invariants().unwrap();
}

#[test]
fn pod_gone_frees_its_gpus_and_unknown_pods_are_ignored() {
    let mut table = two_node_table();
    let empty = usage(&table, "whole");
    bound(&mut table, "p", "whole", Held::Whole(&[0, 1]));
    table.apply(Change::PodGone(key("unknown")));
    assert_ne!(usage(&table, "whole"), empty);
    table.apply(Change::PodGone(key("p")));
    assert_eq!(usage(&table, "whole"), empty);
    assert_eq!(table.pod_count(), 0);
    table.check_invariants().unwrap();
}

#[test]
fn reservations_expire_at_their_deadline_and_not_before() {
    let mut table = two_node_table();
    for (pod, gpu, expires) in [("early", 0, 1_000), ("late", 1, 2_000)] {
        table
            .reserve(
                key(pod),
                held_allocation(
                    &node("whole"),
                    Held::Whole(if gpu == 0 { &[0] } else { &[1] }),
                ),
                expires,
            )
            .unwrap();
    }
    bound(&mut table, "bound", "whole", Held::Whole(&[2]));
    assert!(table.expire_reservations(999).is_empty());
    assert_eq!(table.expire_reservations(1_000), vec![key("early")]);
    assert!(table.expire_reservations(1_999).is_empty());
    assert_eq!(table.expire_reservations(5_000), vec![key("late")]);
    assert_eq!(table.pod_count(), 1);
    let node = table.node_by_str("whole").unwrap();
    assert_eq!(
        node.gpus.iter().map(|g| g.is_whole()).collect::<Vec<_>>(),
        vec![false, false, true, false]
    );
    table.check_invariants().unwrap();
}

#[test]
fn node_updates_keep_their_pods_and_removal_keeps_the_records() {
    let mut table = two_node_table();
    bound(&mut table, "p", "share", Held::Share(1, 4, 0));
    let loaded = usage(&table, "share");
    // A label change (placement) re-creates the node's state from its pods.
    let relabelled = named(
        "share",
        uniform(GpuMode::ShareMemory, 2, "Tesla-T4", 16)
            .with_host(CpuMilli(8000), gib(32), 110)
            .with_placement(gpu_engine::GpuPlacement::Spread),
    );
    table.apply(Change::UpsertNode(relabelled.clone()));
    assert_eq!(usage(&table, "share"), loaded);
    table.apply(Change::RemoveNode(node("share")));
    assert!(table.node_by_str("share").is_none());
    assert_eq!(table.pod_count(), 1, "the pod's record outlives its node");
    // A pod seen bound to a node the table has not seen yet is kept too.
    bound(&mut table, "q", "share", Held::Share(0, 2, 0));
    table.apply(Change::UpsertNode(relabelled));
    let back = table.node_by_str("share").unwrap();
    assert_eq!(back.pods, 2);
    assert_eq!(back.gpus[0].mem, gib(2));
    assert_eq!(back.gpus[1].mem, gib(4));
    table.check_invariants().unwrap();
}

#[test]
fn rebuild_equals_the_incremental_history() {
    let mut table = two_node_table();
    bound(&mut table, "a", "share", Held::Share(0, 4, 0));
    bound(&mut table, "b", "whole", Held::Whole(&[1, 2]));
    table
        .reserve(
            key("c"),
            held_allocation(&node("share"), Held::Share(0, 4, 0)),
            10,
        )
        .unwrap();
    bound(&mut table, "d", "elsewhere", Held::Whole(&[0]));
    table.apply(Change::PodGone(key("a")));
    let specs: Vec<NodeSpec> = table.nodes().map(|n| n.spec.clone()).collect();
    let pods: Vec<(PodKey, PodAllocation)> = table
        .pods()
        .map(|(k, e)| (k.clone(), e.allocation.clone()))
        .collect();
    let rebuilt = Table::rebuild(LIMIT, specs, pods);
    assert!(rebuilt == table);
    assert_eq!(rebuilt.pod_count(), 3);
    assert_ne!(rebuilt, two_node_table(), "equality looks at usage");
    rebuilt.check_invariants().unwrap();
}

fn grant_share(gpu: u16, mem: MemMiB, percent: u32) -> PodAllocation {
    PodAllocation {
        node: node("n"),
        cpu: CpuMilli(0),
        memory: MemMiB(0),
        containers: vec![ContainerAllocation {
            name: "c".into(),
            gpus: vec![GpuGrant {
                gpu: GpuIndex(gpu),
                grant: Grant::Share {
                    mem,
                    compute: ComputeMilli(percent * 10),
                },
            }],
        }],
        init_containers: Vec::new(),
        mig: Vec::new(),
    }
}

/// Facts are never refused: whatever the cluster reports is kept and shows up as a violation.
#[test]
fn check_invariants_reports_every_over_commit_the_cluster_forces() {
    let spec = || uniform(GpuMode::CoreMem, 2, "A10", 24).with_host(CpuMilli(4000), gib(8), 110);
    let rows: Vec<(&str, Vec<PodAllocation>, Option<NodeSpec>, &str)> = vec![
        (
            "GPU memory",
            vec![grant_share(0, gib(20), 10), grant_share(0, gib(20), 10)],
            None,
            "GPU 0: memory over-committed",
        ),
        (
            "GPU compute",
            vec![grant_share(1, gib(1), 60), grant_share(1, gib(1), 60)],
            None,
            "GPU 1: compute over-committed",
        ),
        (
            "two whole holders",
            vec![
                held_allocation(&node("n"), Held::Whole(&[0])),
                held_allocation(&node("n"), Held::Whole(&[0])),
            ],
            None,
            "GPU 0: held whole by several pods",
        ),
        (
            "whole and shared",
            vec![
                held_allocation(&node("n"), Held::Whole(&[1])),
                grant_share(1, gib(1), 5),
            ],
            None,
            "GPU 1: both whole and shared",
        ),
        (
            "pod limit",
            (0..3).map(|_| grant_share(0, gib(1), 5)).collect(),
            None,
            "GPU 0: more than 2 pods",
        ),
        (
            "host CPU",
            vec![
                held_allocation(&node("n"), Held::Host(3000, 0)),
                held_allocation(&node("n"), Held::Host(3000, 0)),
            ],
            None,
            "node n: CPU over-committed",
        ),
        (
            "host memory",
            vec![
                held_allocation(&node("n"), Held::Host(0, 6 * 1024)),
                held_allocation(&node("n"), Held::Host(0, 6 * 1024)),
            ],
            None,
            "node n: memory over-committed",
        ),
        (
            "a node that shrank under its pods",
            vec![grant_share(1, gib(2), 10)],
            Some(uniform(GpuMode::CoreMem, 1, "A10", 24)),
            "node n: 1 holds on GPUs it no longer has",
        ),
        (
            "a node whose GPUs got smaller under its pods",
            vec![grant_share(0, gib(20), 10)],
            Some(uniform(GpuMode::CoreMem, 2, "A10", 16)),
            "GPU 0: memory over-committed",
        ),
    ];
    for (name, pods, resized, expected) in rows {
        let mut table = Table::rebuild(2, [spec()], []);
        for (i, allocation) in pods.into_iter().enumerate() {
            table.apply(Change::PodBound {
                pod: key(&format!("p{i}")),
                allocation,
            });
        }
        if let Some(resized) = resized {
            table.apply(Change::UpsertNode(resized));
        }
        let violations = table.check_invariants().unwrap_err();
        assert!(
            violations.iter().any(|v| v.contains(expected)),
            "{name}: expected {expected:?} in {violations:?}"
        );
        // The usage still equals the sum of the pods: nothing was silently dropped.
        assert!(
            !violations.iter().any(|v| v.contains("differs")),
            "{name}: {violations:?}"
        );
        // Once the offending pods are gone the node is clean again.
        let pods: Vec<PodKey> = table.pods().map(|(k, _)| k.clone()).collect();
        for pod in pods {
            table.apply(Change::PodGone(pod));
        }
        table.check_invariants().unwrap();
    }
}

#[test]
fn a_fitted_placement_is_reserved_and_the_next_fit_sees_it() {
    let mut table = two_node_table();
    let policy = Policy::default();
    let mut taken = Vec::new();
    for pod in ["a", "b", "c", "d"] {
        let node = table.node_by_str("whole").unwrap();
        let allocation = fit(node, &whole(1), &policy).unwrap();
        taken.push(allocation.containers[0].gpus[0].gpu.0);
        table.reserve(key(pod), allocation, 10).unwrap();
    }
    assert_eq!(taken, vec![0, 1, 2, 3]);
    assert!(fit(table.node_by_str("whole").unwrap(), &whole(1), &policy).is_err());
    table.check_invariants().unwrap();
    assert_eq!(table.node_count(), 2);
}

#[test]
fn gpu_conflicts_name_what_an_allocation_would_over_commit_beyond_what_is() {
    let mut table = two_node_table();
    bound(&mut table, "a", "whole", Held::Whole(&[0, 1]));
    bound(&mut table, "s", "share", Held::Share(0, 12, 0));
    let whole = |indices: &'static [u16]| held_allocation(&node("whole"), Held::Whole(indices));
    // Free GPUs, and a pod's own allocation read again: nothing.
    assert!(table.gpu_conflicts(&key("b"), &whole(&[2, 3])).is_empty());
    assert!(table.gpu_conflicts(&key("a"), &whole(&[0, 1])).is_empty());
    // A pod's own allocation moved onto its other GPUs: nothing either (its old one is set
    // aside first).
    assert!(table.gpu_conflicts(&key("a"), &whole(&[1, 2])).is_empty());
    // Another pod's GPU, one the node does not have, and memory past a card.
    let taken = table.gpu_conflicts(&key("b"), &whole(&[1, 2]));
    assert_eq!(taken, vec!["node whole GPU 1: held whole by several pods"]);
    assert_eq!(table.gpu_conflicts(&key("b"), &whole(&[9])).len(), 1);
    let share = |gib: u64| held_allocation(&node("share"), Held::Share(0, gib, 0));
    assert!(table.gpu_conflicts(&key("t"), &share(4)).is_empty());
    assert_eq!(
        table.gpu_conflicts(&key("t"), &share(8)),
        vec!["node share GPU 0: memory over-committed"]
    );
    // An over-commit the cluster already made is not the new allocation's.
    bound(&mut table, "c", "whole", Held::Whole(&[3]));
    bound(&mut table, "d", "whole", Held::Whole(&[3]));
    assert!(table.gpu_conflicts(&key("b"), &whole(&[2])).is_empty());
    // CPU and memory come from requests: a node over-committed on them conflicts with no GPU.
    let host = held_allocation(&node("share"), Held::Host(1_000_000, 0));
    assert!(table.gpu_conflicts(&key("h"), &host).is_empty());
    // An unknown node: nothing to judge against.
    let elsewhere = held_allocation(&node("gone"), Held::Whole(&[0]));
    assert!(table.gpu_conflicts(&key("b"), &elsewhere).is_empty());
}

fn claim(name: &str) -> HolderKey {
    HolderKey::new(format!("dra:default/{name}"))
}

fn whole_holds(indices: &[u16]) -> Vec<GpuHold> {
    indices
        .iter()
        .map(|&gpu| GpuHold {
            gpu: GpuIndex(gpu),
            whole: true,
            mem: MemMiB(0),
            compute: ComputeMilli(1000),
        })
        .collect()
}

#[test]
fn external_holds_keep_their_gpus_from_pods_and_release_exactly() {
    let mut table = two_node_table();
    let policy = Policy::default();
    let empty = usage(&table, "whole");
    table.apply(Change::HoldExternal {
        holder: claim("c1"),
        node: node("whole"),
        holds: whole_holds(&[0, 1]),
        mig: Vec::new(),
    });
    // No pod slot, CPU or memory: the claim's pod is counted as a pod by itself.
    let held = table.node_by_str("whole").unwrap();
    assert_eq!(held.pods, 0);
    assert!(held.gpus[0].is_whole() && held.gpus[1].is_whole());
    // Fit places around the claim's GPUs, and reserve refuses them.
    let allocation = fit(held, &whole(2), &policy).unwrap();
    let given: Vec<u16> = allocation.containers[0]
        .gpus
        .iter()
        .map(|g| g.gpu.0)
        .collect();
    assert_eq!(given, vec![2, 3]);
    let onto_claim = held_allocation(&node("whole"), Held::Whole(&[1]));
    assert!(matches!(
        table.reserve(key("x"), onto_claim.clone(), 10),
        Err(TableError::NoLongerFits { .. })
    ));
    // A record naming a claimed GPU conflicts.
    assert_eq!(
        table.gpu_conflicts(&key("x"), &onto_claim),
        vec!["node whole GPU 1: held whole by several pods"]
    );
    // A node update keeps the hold; the same hold again changes nothing.
    table.apply(Change::UpsertNode(named(
        "whole",
        uniform(GpuMode::Exclusive, 4, "A100", 80),
    )));
    table.apply(Change::HoldExternal {
        holder: claim("c1"),
        node: node("whole"),
        holds: whole_holds(&[0, 1]),
        mig: Vec::new(),
    });
    assert!(table.node_by_str("whole").unwrap().gpus[1].is_whole());
    assert_eq!(table.externals_on(&node("whole")).count(), 1);
    table.check_invariants().unwrap();
    // A changed allocation replaces the old one; a release restores the node exactly.
    table.apply(Change::HoldExternal {
        holder: claim("c1"),
        node: node("whole"),
        holds: whole_holds(&[3]),
        mig: Vec::new(),
    });
    let moved = table.node_by_str("whole").unwrap();
    assert!(!moved.gpus[0].is_whole() && moved.gpus[3].is_whole());
    table.apply(Change::ReleaseExternal(claim("c1")));
    assert_eq!(usage(&table, "whole"), empty);
    assert!(table.external(&claim("c1")).is_none());
    table.check_invariants().unwrap();
}

#[test]
fn an_external_hold_on_a_pods_gpu_is_a_visible_over_commit() {
    let mut table = two_node_table();
    bound(&mut table, "a", "whole", Held::Whole(&[0]));
    // The cluster's facts are never refused: a claim on the pod's GPU is kept and reported.
    table.apply(Change::HoldExternal {
        holder: claim("c1"),
        node: node("whole"),
        holds: whole_holds(&[0]),
        mig: Vec::new(),
    });
    let violations = table.check_invariants().unwrap_err();
    assert_eq!(
        violations,
        vec!["node whole GPU 0: held whole by several pods"]
    );
    // A hold on a node not (yet) known is kept and applied when the node appears.
    table.apply(Change::HoldExternal {
        holder: claim("c2"),
        node: node("later"),
        holds: whole_holds(&[1]),
        mig: Vec::new(),
    });
    table.apply(Change::UpsertNode(named(
        "later",
        uniform(GpuMode::Exclusive, 2, "H100", 80),
    )));
    assert!(table.node_by_str("later").unwrap().gpus[1].is_whole());
    table.apply(Change::ReleaseExternal(claim("c1")));
    table.check_invariants().unwrap();
}
