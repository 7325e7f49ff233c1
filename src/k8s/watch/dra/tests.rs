//! The feed's DRA side: scripted ResourceSlice and ResourceClaim events next to Node and Pod
//! events, the table checked after each step.

#![allow(clippy::unwrap_used, reason = "test fixtures")]

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher::Event;
use serde_json::json;

use super::super::Feed;
use crate::config::Config;
use crate::k8s::dra::{DraEvent, Unavailable};
use crate::objects::dra::claim_holder;
use crate::objects::dra::fixtures::{
    claim, claim_pod, gpu, mig, mig_slice, pending_claim, pending_mig_claim, slice,
};
use crate::state::{ClusterState, TableWriter};
use gpu_engine::{
    CpuMilli, GpuDemand, MemMiB, MigProfile, MigSlices, NodeName, PodRequest, Policy,
    ScoringPolicy, fit,
};

fn feed() -> Feed {
    let mut feed = Feed::new(
        TableWriter::new(ClusterState::new(20)),
        Arc::new(Config::default()),
        Arc::new(Policy::default()),
    );
    feed.watch_dra();
    feed
}

/// A node whose GPUs only a DRA driver publishes: no GPU capacity, no GPU labels.
fn dra_node(name: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"}}
    }))
    .unwrap()
}

/// A node whose device plugin advertises 2 whole GPUs, with the node agent's UUIDs.
fn plugin_node(name: &str, uuids: [&str; 2]) -> Node {
    let detail = json!({"version": 1, "gpus": [
        {"index": 0, "uuid": uuids[0], "model": "A100", "memoryMiB": 81920},
        {"index": 1, "uuid": uuids[1], "model": "A100", "memoryMiB": 81920},
    ]});
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"gpu-extender.io/gpus": detail.to_string()}},
        "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": "2"}}
    }))
    .unwrap()
}

fn nodes(feed: &mut Feed, nodes: &[Node]) {
    feed.apply_node_event(&Event::Init);
    for node in nodes {
        feed.apply_node_event(&Event::InitApply(node.clone()));
    }
    feed.apply_node_event(&Event::InitDone);
}

fn no_pods(feed: &mut Feed) {
    feed.apply_pod_event(&Event::<Pod>::Init);
    feed.apply_pod_event(&Event::<Pod>::InitDone);
}

fn slices(feed: &mut Feed, list: Vec<k8s_openapi::api::resource::v1::ResourceSlice>) {
    feed.apply_dra_event(DraEvent::Slice(Ok(Event::Init)));
    for slice in list {
        feed.apply_dra_event(DraEvent::Slice(Ok(Event::InitApply(slice))));
    }
    feed.apply_dra_event(DraEvent::Slice(Ok(Event::InitDone)));
}

fn claims(feed: &mut Feed, list: Vec<k8s_openapi::api::resource::v1::ResourceClaim>) {
    feed.apply_dra_event(DraEvent::Claim(Ok(Event::Init)));
    for claim in list {
        feed.apply_dra_event(DraEvent::Claim(Ok(Event::InitApply(claim))));
    }
    feed.apply_dra_event(DraEvent::Claim(Ok(Event::InitDone)));
}

fn four_gpus(node: &str) -> k8s_openapi::api::resource::v1::ResourceSlice {
    slice(
        &format!("{node}-gpus"),
        "gpu.nvidia.com",
        node,
        1,
        1,
        vec![
            gpu(0, "GPU-0"),
            gpu(1, "GPU-1"),
            gpu(2, "GPU-2"),
            gpu(3, "GPU-3"),
        ],
    )
}

/// Whole GPUs of `node` held, by index.
fn held(feed: &Feed, node: &str) -> Vec<u16> {
    let table = feed.state().read();
    let state = table.node_by_str(node).unwrap();
    state
        .spec
        .gpus
        .iter()
        .zip(state.gpus.iter())
        .filter(|(_, usage)| usage.is_whole())
        .map(|(gpu, _)| gpu.index.0)
        .collect()
}

fn whole(count: u64) -> PodRequest {
    PodRequest::single(CpuMilli(100), MemMiB(100), GpuDemand::whole(count).unwrap())
}

#[test]
fn a_dra_node_takes_its_gpus_from_slices_and_claims_hold_them() {
    let mut feed = feed();
    nodes(&mut feed, &[dra_node("d1")]);
    no_pods(&mut feed);
    assert!(!feed.state().is_ready(), "DRA lists not applied yet");
    slices(&mut feed, vec![four_gpus("d1")]);
    claims(
        &mut feed,
        vec![claim("c", &[("d1", "gpu-1"), ("d1", "gpu-2")], &["p"])],
    );
    assert!(feed.state().is_ready());
    let table = feed.state().read();
    let node = table.node_by_str("d1").unwrap();
    assert_eq!(node.spec.gpus.len(), 4);
    assert_eq!(node.spec.gpus[0].uuid.as_deref(), Some("GPU-0"));
    drop(table);
    assert_eq!(held(&feed, "d1"), vec![1, 2]);
    // The extender never gives out a claimed GPU.
    let table = feed.state().read();
    let allocation = fit(
        table.node_by_str("d1").unwrap(),
        &whole(2),
        &Policy::default(),
    )
    .unwrap();
    let given: Vec<u16> = allocation.containers[0]
        .gpus
        .iter()
        .map(|g| g.gpu.0)
        .collect();
    assert_eq!(given, vec![0, 3]);
    assert!(
        fit(
            table.node_by_str("d1").unwrap(),
            &whole(3),
            &Policy::default()
        )
        .is_err()
    );
    drop(table);
    // Views: the claim, its pod and its GPUs.
    let report = feed.state().report();
    let dra = report.dra.as_ref().unwrap();
    assert!(dra.served);
    assert_eq!(dra.counts.gpus, 4);
    assert_eq!(dra.claims[0].claim, "team/c");
    assert_eq!(dra.claims[0].node.as_deref(), Some("d1"));
    assert_eq!(dra.claims[0].gpus, vec![1, 2]);
    assert_eq!(dra.claims[0].pods, vec!["team/p".to_owned()]);
    let gpu1 = &report.nodes[0].gpus[1];
    assert_eq!(gpu1.claims[0].claim, "team/c");
    assert_eq!(gpu1.claims[0].pods, vec!["team/p".to_owned()]);
    assert!(!gpu1.is_idle());
    assert_eq!(report.totals.idle_gpus, 2);
    assert!(
        report
            .to_text(true)
            .contains("d1 GPU1: claim team/c (pods team/p)")
    );
    // Deallocated: the GPUs are free again.
    let mut released = claim("c", &[], &[]);
    released.status.as_mut().unwrap().allocation = None;
    feed.apply_dra_event(DraEvent::Claim(Ok(Event::Apply(released))));
    assert!(held(&feed, "d1").is_empty());
    assert!(
        feed.state()
            .read()
            .external(&claim_holder("team/c"))
            .is_none()
    );
    feed.state().read().check_invariants().unwrap();
}

#[test]
fn slices_before_their_node_and_a_deleted_claim() {
    let mut feed = feed();
    slices(&mut feed, vec![four_gpus("d1")]);
    claims(&mut feed, vec![claim("c", &[("d1", "gpu-3")], &[])]);
    no_pods(&mut feed);
    nodes(&mut feed, &[dra_node("d1")]);
    assert!(feed.state().is_ready());
    assert_eq!(held(&feed, "d1"), vec![3]);
    feed.apply_dra_event(DraEvent::Claim(Ok(Event::Delete(claim(
        "c",
        &[("d1", "gpu-3")],
        &[],
    )))));
    assert!(held(&feed, "d1").is_empty());
    // The slice goes: the node has no GPUs of its own.
    feed.apply_dra_event(DraEvent::Slice(Ok(Event::Delete(four_gpus("d1")))));
    assert!(
        feed.state()
            .read()
            .node_by_str("d1")
            .unwrap()
            .spec
            .gpus
            .is_empty()
    );
}

#[test]
fn a_relist_releases_claims_deleted_while_away() {
    let mut feed = feed();
    nodes(&mut feed, &[dra_node("d1")]);
    no_pods(&mut feed);
    slices(&mut feed, vec![four_gpus("d1")]);
    claims(
        &mut feed,
        vec![
            claim("a", &[("d1", "gpu-0")], &[]),
            claim("b", &[("d1", "gpu-1")], &[]),
        ],
    );
    assert_eq!(held(&feed, "d1"), vec![0, 1]);
    claims(&mut feed, vec![claim("b", &[("d1", "gpu-1")], &[])]);
    assert_eq!(held(&feed, "d1"), vec![1]);
    feed.state().read().check_invariants().unwrap();
}

#[test]
fn a_node_offered_both_ways_is_said_and_claims_match_by_uuid() {
    let mut feed = feed();
    // The node agent lists the GPUs in the other order than the DRA driver's indices.
    nodes(&mut feed, &[plugin_node("both", ["GPU-1", "GPU-0"])]);
    no_pods(&mut feed);
    slices(
        &mut feed,
        vec![slice(
            "both-gpus",
            "gpu.nvidia.com",
            "both",
            1,
            1,
            vec![gpu(0, "GPU-0"), gpu(1, "GPU-1")],
        )],
    );
    claims(&mut feed, vec![claim("c", &[("both", "gpu-0")], &[])]);
    // The device plugin's GPUs stay; the claim holds the GPU with its UUID (index 1 here).
    assert_eq!(held(&feed, "both"), vec![1]);
    let report = feed.state().report();
    assert_eq!(
        report.dra.as_ref().unwrap().nodes_offered_both_ways,
        vec!["both".to_owned()]
    );
    assert!(
        report
            .to_text(false)
            .contains("node both offers its GPUs both through the device plugin and a DRA driver")
    );
    let (_, _, both_ways) = feed.state().dra_counts().unwrap();
    assert_eq!(both_ways, 1);
    // Gone, and back without its device plugin: no longer offered both ways.
    let node = plugin_node("both", ["GPU-1", "GPU-0"]);
    feed.apply_node_event(&Event::Delete(node));
    assert_eq!(feed.state().dra_counts().unwrap().2, 0);
    nodes(&mut feed, &[plugin_node("both", ["GPU-1", "GPU-0"])]);
    assert_eq!(feed.state().dra_counts().unwrap().2, 1);
    // The metrics count the DRA devices, the claim's GPU and the node offered both ways.
    let metrics = crate::telemetry::Metrics::new().unwrap();
    metrics
        .watch_state(
            Arc::clone(feed.state().reader()),
            crate::state::PolicyCell::from(Policy::default()),
        )
        .unwrap();
    let text = metrics.render().unwrap();
    for line in [
        "gpu_extender_dra_served 1",
        "gpu_extender_dra_devices{type=\"gpu\"} 2",
        "gpu_extender_dra_claims_allocated 1",
        "gpu_extender_dra_gpus_held 1",
        "gpu_extender_dra_nodes_offered_both_ways 1",
        "gpu_extender_dra_slice_problems{kind=\"pool_waiting\"} 0",
    ] {
        assert!(text.contains(line), "{line} not in:\n{text}");
    }
}

#[test]
fn partial_pools_and_mig_slices() {
    let mut feed = feed();
    nodes(&mut feed, &[dra_node("m1")]);
    no_pods(&mut feed);
    // One of two slices: nothing is offered, and the claim waits for the rest.
    let first = slice("m1-a", "gpu.nvidia.com", "m1", 1, 2, vec![gpu(0, "GPU-0")]);
    let second = slice(
        "m1-b",
        "gpu.nvidia.com",
        "m1",
        1,
        2,
        vec![mig("gpu-1-mig-0", 1, "GPU-1", 40)],
    );
    slices(&mut feed, vec![first]);
    claims(
        &mut feed,
        vec![claim("slice", &[("m1", "gpu-1-mig-0")], &["p"])],
    );
    assert!(
        feed.state()
            .read()
            .node_by_str("m1")
            .unwrap()
            .spec
            .gpus
            .is_empty()
    );
    let report = feed.state().report();
    let dra = report.dra.unwrap();
    assert!(
        dra.problems
            .iter()
            .any(|p| p.contains("1 of 2 ResourceSlices of generation 1 seen")),
        "{:?}",
        dra.problems
    );
    assert!(
        dra.claims[0].problems[0].contains("waiting for the rest"),
        "{:?}",
        dra.claims
    );
    // The rest arrives: GPU 0 whole and GPU 1 split, with the claim on a slice of GPU 1.
    feed.apply_dra_event(DraEvent::Slice(Ok(Event::Apply(second))));
    let table = feed.state().read();
    let node = table.node_by_str("m1").unwrap();
    assert_eq!(node.spec.gpus.len(), 2);
    assert!(
        !node.spec.gpus[1].healthy,
        "a MIG card is never given whole"
    );
    assert_eq!(node.gpus[1].mem, MemMiB(40_960));
    assert_eq!(node.gpus[1].shares, 1);
    drop(table);
    let report = feed.state().report();
    let claim_on = &report.nodes[0].gpus[1].claims[0];
    assert_eq!(claim_on.mig_memory_mib, Some(40_960));
    assert!(report.dra.unwrap().claims[0].problems.is_empty());
}

#[test]
fn without_dra_the_feed_is_ready_on_nodes_and_pods() {
    let mut feed = feed();
    nodes(&mut feed, &[dra_node("d1")]);
    no_pods(&mut feed);
    assert!(!feed.state().is_ready());
    feed.apply_dra_event(DraEvent::Unavailable(Unavailable::NotServed));
    assert!(feed.state().is_ready());
    assert!(!feed.state().report().dra.unwrap().served);
    assert!(
        feed.state()
            .read()
            .node(&NodeName::new("d1"))
            .unwrap()
            .spec
            .gpus
            .is_empty()
    );
}

#[test]
fn prioritize_ranks_nodes_for_a_pods_gpu_claims_with_the_policy() {
    let mut feed = feed();
    nodes(&mut feed, &[dra_node("d1"), dra_node("d2")]);
    no_pods(&mut feed);
    slices(&mut feed, vec![four_gpus("d1"), four_gpus("d2")]);
    // d2 already has a claim's GPU taken; a pending claim asks for one more.
    claims(
        &mut feed,
        vec![
            claim("held", &[("d2", "gpu-0")], &["p0"]),
            pending_claim("wants", "gpu.nvidia.com", 1),
            pending_claim("too-many", "gpu.nvidia.com", 4),
        ],
    );
    let cfg = Config::default();
    let policy = crate::state::PolicyCell::from(Policy::default());
    let verbs = crate::state::Verbs {
        cluster: feed.state(),
        policy: &policy,
        config: &cfg,
    };
    let names = ["d1", "d2"];
    let pod = claim_pod("p", "wants");
    let scores = verbs.prioritize_claims(Some(&pod), crate::state::Offered::Names(&names));
    let score = |node: &str| scores.iter().find(|(n, _)| *n == node).map(|(_, s)| *s);
    // Binpack: the busier node first.
    assert!(score("d2") > score("d1"), "{scores:?}");
    // Four GPUs fit d1 only.
    let pod = claim_pod("p", "too-many");
    let scores = verbs.prioritize_claims(Some(&pod), crate::state::Offered::Names(&names));
    let score = |node: &str| {
        scores
            .iter()
            .find(|(n, _)| *n == node)
            .map(|(_, s)| *s)
            .unwrap_or(0)
    };
    assert!(score("d1") > 0 && score("d2") == 0, "{scores:?}");
    // The main stanza's prioritize (every pod of the dedicated profile reaches it) ranks the
    // claim pod alike, not as a CPU-only pod.
    let pod = claim_pod("p", "wants");
    assert_eq!(
        verbs.prioritize(Some(&pod), crate::state::Offered::Names(&names)),
        verbs.prioritize_claims(Some(&pod), crate::state::Offered::Names(&names)),
    );
    // Filter narrows nothing for it, even where the policy's filter passes only its best
    // nodes: kube-scheduler's DRA plugin judges the devices.
    let best_only = crate::state::PolicyCell::from(Policy {
        filter_best_only: true,
        ..Policy::default()
    });
    let narrowing = crate::state::Verbs {
        policy: &best_only,
        ..verbs
    };
    let decision = narrowing.filter(Some(&pod), crate::state::Offered::Names(&names));
    assert!(
        matches!(decision, crate::state::FilterDecision::PassAll),
        "{decision:?}"
    );
    // No opinion on a pod without claims of a known class, nor on the main stanza's GPU pods.
    let plain: Pod = serde_json::from_value(json!({
        "metadata": {"name": "x", "namespace": "team"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]},
    }))
    .unwrap();
    assert!(
        verbs
            .prioritize_claims(Some(&plain), crate::state::Offered::Names(&names))
            .is_empty()
    );
    assert!(
        verbs
            .prioritize_claims(
                Some(&claim_pod("p", "unknown")),
                crate::state::Offered::Names(&names)
            )
            .is_empty()
    );
}

/// One card of `node` split into seven `1g.10gb` MIG slices, as NVIDIA's driver publishes it.
fn seven_slices(node: &str) -> k8s_openapi::api::resource::v1::ResourceSlice {
    let devices = (0..7)
        .map(|i| {
            mig_slice(
                &format!("gpu-0-mig-{i}"),
                0,
                &format!("GPU-{node}"),
                "1g.10gb",
                10,
            )
        })
        .collect();
    slice(
        &format!("{node}-gpus"),
        "gpu.nvidia.com",
        node,
        1,
        1,
        devices,
    )
}

/// A claim of `mig.nvidia.com` asking for one `1g.10gb` slice, as NVIDIA's demos write it.
const ONE_1G_10GB: &str = "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'";

/// Slices of `1g.10gb` held on `node`, and the memory held on its card.
fn slices_held(feed: &Feed, node: &str) -> (u32, MemMiB) {
    let table = feed.state().read();
    let state = table.node_by_str(node).unwrap();
    let profile = MigProfile::parse("1g.10gb").unwrap();
    (state.mig_held_of(&profile), state.gpus[0].mem)
}

#[test]
fn mig_claims_hold_a_dra_nodes_slices_and_pods_asking_slices_are_packed() {
    let mut feed = feed();
    nodes(&mut feed, &[dra_node("a"), dra_node("b")]);
    no_pods(&mut feed);
    slices(&mut feed, vec![seven_slices("a"), seven_slices("b")]);
    let held_claim = || {
        claim(
            "held",
            &[("b", "gpu-0-mig-0"), ("b", "gpu-0-mig-1")],
            &["p0"],
        )
    };
    claims(
        &mut feed,
        vec![
            held_claim(),
            pending_mig_claim("wants", "mig.nvidia.com", 1, &[ONE_1G_10GB]),
            pending_mig_claim("seven", "mig.nvidia.com", 7, &[ONE_1G_10GB]),
            pending_mig_claim("any", "mig.nvidia.com", 1, &[]),
        ],
    );
    // Each node's pool is its slices; the card they split is never given whole.
    {
        let table = feed.state().read();
        for node in ["a", "b"] {
            let state = table.node_by_str(node).unwrap();
            assert_eq!(
                state.spec.mig,
                vec![MigSlices::new(MigProfile::parse("1g.10gb").unwrap(), 7)]
            );
            assert!(!state.spec.gpus[0].healthy);
        }
        table.check_invariants().unwrap();
    }
    // The claim holds two slices of b, and their memory of its card.
    assert_eq!(slices_held(&feed, "a"), (0, MemMiB(0)));
    assert_eq!(slices_held(&feed, "b"), (2, MemMiB(20 << 10)));
    let report = crate::inspect::report(&feed.state().read());
    let b = report.nodes.iter().find(|node| node.name == "b").unwrap();
    assert_eq!(
        (b.mig[0].held, b.mig[0].free, &b.mig[0].claims),
        (
            2,
            5,
            &vec![crate::inspect::MigClaim {
                claim: "team/held".into(),
                slices: 2
            }]
        )
    );
    let cfg = Config::default();
    let names = ["a", "b"];
    let pod = claim_pod("p", "wants");
    for scoring in ScoringPolicy::ALL {
        let policy = crate::state::PolicyCell::from(Policy::scoring(scoring));
        let verbs = crate::state::Verbs {
            cluster: feed.state(),
            policy: &policy,
            config: &cfg,
        };
        let scores = verbs.prioritize_claims(Some(&pod), crate::state::Offered::Names(&names));
        let score = |node: &str| scores.iter().find(|(n, _)| *n == node).unwrap().1;
        if scoring == ScoringPolicy::Spread {
            assert!(score("a") > score("b"), "{scoring:?}: {scores:?}");
        } else {
            assert!(score("b") > score("a"), "{scoring:?}: {scores:?}");
        }
        // Both routes rank alike; filter narrows nothing.
        assert_eq!(
            verbs.prioritize(Some(&pod), crate::state::Offered::Names(&names)),
            scores
        );
        let decision = verbs.filter(Some(&pod), crate::state::Offered::Names(&names));
        assert!(
            matches!(decision, crate::state::FilterDecision::PassAll),
            "{decision:?}"
        );
        // Seven slices fit a only; a claim naming no profile gets no opinion.
        let seven = verbs.prioritize_claims(
            Some(&claim_pod("p", "seven")),
            crate::state::Offered::Names(&names),
        );
        let score = |node: &str| seven.iter().find(|(n, _)| *n == node).unwrap().1;
        assert!(score("a") > 0 && score("b") == 0, "{scoring:?}: {seven:?}");
        assert!(
            verbs
                .prioritize_claims(
                    Some(&claim_pod("p", "any")),
                    crate::state::Offered::Names(&names)
                )
                .is_empty()
        );
    }
    // Deallocated: its slices and memory go; allocated again, then deleted: gone again.
    let event = |claim| DraEvent::Claim(Ok(Event::Apply(claim)));
    feed.apply_dra_event(event(claim("held", &[], &["p0"])));
    assert_eq!(slices_held(&feed, "b"), (0, MemMiB(0)));
    feed.apply_dra_event(event(held_claim()));
    assert_eq!(slices_held(&feed, "b"), (2, MemMiB(20 << 10)));
    feed.apply_dra_event(DraEvent::Claim(Ok(Event::Delete(held_claim()))));
    assert_eq!(slices_held(&feed, "b"), (0, MemMiB(0)));
    feed.state().read().check_invariants().unwrap();
}
