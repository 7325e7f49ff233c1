//! Watch-feed tests: scripted Node and Pod events, the table checked after each step.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;

use super::*;
use crate::objects::translate::node_spec;
use crate::state::ClusterState;
use gpu_engine::{Grant, Hold};

fn cfg() -> Arc<Config> {
    Arc::new(Config::default())
}

fn feed() -> Feed {
    Feed::new(
        TableWriter::new(ClusterState::new(20)),
        cfg(),
        Arc::new(Policy::default()),
    )
}

/// A 4-GPU memory-sharing node of 16 GiB T4s.
fn share_node(name: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            "ack.node.gpu.schedule": "share",
            "aliyun.accelerator/nvidia_name": "T4",
            "aliyun.accelerator/nvidia_mem": "16GiB",
            "aliyun.accelerator/nvidia_count": "4"}},
        "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"}}
    }))
    .unwrap()
}

/// A 2-GPU exclusive node.
fn whole_node(name: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"aliyun.accelerator/nvidia_count": "2"}},
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}}
    }))
    .unwrap()
}

fn pod(name: &str, uid: &str, node: Option<&str>, requests: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": requests}}]},
        "status": {"phase": if node.is_some() { "Running" } else { "Pending" }}
    }))
    .unwrap()
}

fn share_pod(name: &str, uid: &str, node: Option<&str>, gib: u64) -> Pod {
    pod(
        name,
        uid,
        node,
        json!({"cpu": "1", "memory": "1Gi", "aliyun.com/gpu-mem": gib.to_string()}),
    )
}

/// `pod`, bound to `node` with the record a bind would have written.
fn recorded(mut pod: Pod, node: &Node) -> (Pod, PodAllocation) {
    let cfg = Config::default();
    let spec = node_spec(node, &cfg).unwrap();
    let request = pod_request(&pod, &cfg).unwrap().unwrap();
    let allocation = fit(&NodeState::new(spec.clone()), &request, &Policy::default()).unwrap();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    pod.metadata.annotations = Some(crate::objects::record::encode(
        &allocation,
        &spec,
        &uid,
        0,
        &cfg,
    ));
    if let Some(s) = pod.spec.as_mut() {
        s.node_name = Some(spec.name.to_string());
    }
    (pod, allocation)
}

fn key(name: &str) -> PodKey {
    PodKey::new("ns", name)
}

fn init<K: Clone>(objects: &[K]) -> Vec<Event<K>> {
    let mut events = vec![Event::Init];
    events.extend(objects.iter().cloned().map(Event::InitApply));
    events.push(Event::InitDone);
    events
}

fn list_nodes(feed: &mut Feed, nodes: &[Node]) {
    for event in init(nodes) {
        feed.apply_node_event(&event);
    }
}

fn list_pods(feed: &mut Feed, pods: &[Pod]) {
    for event in init(pods) {
        feed.apply_pod_event(&event);
    }
}

fn gpu_mem_used(feed: &Feed, node: &str) -> u64 {
    let table = feed.state().read();
    table
        .node_by_str(node)
        .map(|n| n.gpus.iter().map(|g| g.mem.0).sum())
        .unwrap_or(0)
}

fn assert_invariants(feed: &Feed) {
    if let Err(violations) = feed.state().read().check_invariants() {
        panic!("invariants broken: {violations:#?}");
    }
}

#[test]
fn ready_only_after_both_initial_lists() {
    let mut feed = feed();
    let node = share_node("gpu-a");
    let (bound, allocation) = recorded(share_pod("p", "u1", None, 4), &node);

    feed.apply_node_event(&Event::Init);
    feed.apply_node_event(&Event::InitApply(node.clone()));
    assert_eq!(
        feed.state().read().node_count(),
        0,
        "a list is applied only when complete"
    );
    feed.apply_node_event(&Event::InitDone);
    assert_eq!(feed.state().read().node_count(), 1);
    assert!(!feed.state().is_ready(), "pods not listed yet");

    list_pods(&mut feed, &[bound]);
    assert!(feed.state().is_ready());
    let table = feed.state().read();
    let entry = table.pod(&key("p")).unwrap();
    assert_eq!(entry.allocation, allocation);
    assert_eq!(entry.hold, Hold::Bound);
    drop(table);
    assert_eq!(gpu_mem_used(&feed, "gpu-a"), 4096);
    let stats = feed.state().stats();
    assert_eq!(
        (
            stats.nodes,
            stats.pods_bound,
            stats.node_lists,
            stats.pod_lists
        ),
        (1, 1, 1, 1)
    );
    assert_invariants(&feed);
}

#[test]
fn pods_come_and_go() {
    let mut feed = feed();
    let node = share_node("gpu-a");
    list_nodes(&mut feed, std::slice::from_ref(&node));
    list_pods(&mut feed, &[]);

    // Pending: cached for the binder, nothing held.
    let pending = share_pod("p", "u1", None, 4);
    feed.apply_pod_event(&Event::Apply(pending));
    assert!(feed.state().pod(&key("p")).is_some());
    assert_eq!(feed.state().read().pod_count(), 0);

    // Bound with a record: holds exactly the record. The pod itself is no longer kept (its use
    // is in the table), its UID is (preemption names victims by UID).
    let (mut bound, _) = recorded(share_pod("p", "u1", None, 4), &node);
    if let Some(spec) = bound.spec.as_mut() {
        spec.priority = Some(7);
    }
    feed.apply_pod_event(&Event::Apply(bound.clone()));
    assert_eq!(gpu_mem_used(&feed, "gpu-a"), 4096);
    assert!(feed.state().pod(&key("p")).is_none());
    assert_eq!(feed.state().pod_key_for_uid("u1"), Some(key("p")));
    // Its rank as a quota reclaim's victim: its priority (no creation time in this fixture).
    assert_eq!(
        feed.state().rank(&key("p")),
        Some(crate::state::VictimRank {
            priority: 7,
            created_s: 0,
            terminating: false,
        })
    );
    // A repeated event (a status update) changes nothing.
    feed.apply_pod_event(&Event::Apply(bound.clone()));
    assert_eq!(gpu_mem_used(&feed, "gpu-a"), 4096);
    assert_invariants(&feed);

    // Finished: freed at once.
    let mut done = bound.clone();
    if let Some(status) = done.status.as_mut() {
        status.phase = Some("Succeeded".into());
    }
    feed.apply_pod_event(&Event::Apply(done));
    assert_eq!(gpu_mem_used(&feed, "gpu-a"), 0);
    assert!(feed.state().pod(&key("p")).is_none());
    assert_eq!(feed.state().pod_key_for_uid("u1"), None);
    assert_eq!(feed.state().rank(&key("p")), None);
    assert_eq!(feed.state().stats().pods_bound, 0);

    // Deleted: freed too.
    let (other, _) = recorded(share_pod("q", "u2", None, 8), &node);
    feed.apply_pod_event(&Event::Apply(other.clone()));
    assert_eq!(gpu_mem_used(&feed, "gpu-a"), 8192);
    feed.apply_pod_event(&Event::Delete(other));
    assert_eq!(gpu_mem_used(&feed, "gpu-a"), 0);
    assert_eq!(feed.state().read().pod_count(), 0);
    assert_invariants(&feed);
}

#[test]
fn a_relist_drops_what_it_no_longer_lists_and_swaps_atomically() {
    let mut feed = feed();
    let (a, b) = (share_node("gpu-a"), share_node("gpu-b"));
    list_nodes(&mut feed, &[a.clone(), b.clone()]);
    let (p, _) = recorded(share_pod("p", "u1", None, 4), &a);
    let (q, _) = recorded(share_pod("q", "u2", None, 2), &b);
    list_pods(&mut feed, &[p.clone(), q]);
    assert_eq!(feed.state().read().pod_count(), 2);

    // The watch broke and relists: q was deleted meanwhile, r appeared.
    let (r, _) = recorded(share_pod("r", "u3", None, 1), &a);
    feed.apply_pod_event(&Event::Init);
    feed.apply_pod_event(&Event::InitApply(p));
    feed.apply_pod_event(&Event::InitApply(r));
    assert_eq!(
        feed.state().read().pod_count(),
        2,
        "readers see the old state until the list is complete"
    );
    feed.apply_pod_event(&Event::InitDone);
    let table = feed.state().read();
    assert!(table.pod(&key("p")).is_some());
    assert!(table.pod(&key("q")).is_none());
    assert!(table.pod(&key("r")).is_some());
    drop(table);
    assert_eq!(gpu_mem_used(&feed, "gpu-a"), 5 * 1024);
    assert_eq!(gpu_mem_used(&feed, "gpu-b"), 0);

    // Node relist without gpu-b removes it.
    list_nodes(&mut feed, std::slice::from_ref(&a));
    assert!(feed.state().read().node_by_str("gpu-b").is_none());
    assert_eq!(feed.state().stats().node_lists, 2);
    assert_invariants(&feed);
}

#[test]
fn bound_gpu_pods_without_a_usable_record_count_what_they_request() {
    let mut feed = feed();
    let node = share_node("gpu-a");
    list_nodes(&mut feed, std::slice::from_ref(&node));
    let missing = share_pod("missing", "u1", Some("gpu-a"), 6);
    let (mut corrupt, _) = recorded(share_pod("corrupt", "u2", None, 3), &node);
    corrupt.metadata.annotations = Some(
        [(
            "gpu-extender.io/allocation".to_owned(),
            "{garbage".to_owned(),
        )]
        .into(),
    );
    let (mut copied, _) = recorded(share_pod("copied", "u3", None, 2), &node);
    copied.metadata.uid = Some("u-other".into());
    list_pods(&mut feed, &[missing.clone(), corrupt, copied]);

    let stats = feed.state().stats();
    assert_eq!(stats.records_missing, 1);
    assert_eq!(
        stats.records_corrupt, 2,
        "a copied record counts as corrupt"
    );
    assert_eq!(stats.pods_bound, 3);
    assert_eq!(gpu_mem_used(&feed, "gpu-a"), 11 * 1024);
    assert_invariants(&feed);

    // Repeated events do not re-place them (no churn, no repeated warnings).
    let before = feed.state().read().pod(&key("missing")).cloned();
    feed.apply_pod_event(&Event::Apply(missing));
    assert_eq!(feed.state().read().pod(&key("missing")).cloned(), before);
    assert_eq!(gpu_mem_used(&feed, "gpu-a"), 11 * 1024);
}

#[test]
fn an_inferred_pod_that_does_not_fit_is_kept_visible() {
    let mut feed = feed();
    let node = whole_node("gpu-w");
    list_nodes(&mut feed, std::slice::from_ref(&node));
    // Two recorded pods hold both GPUs; a third, bound by someone else, also claims one.
    let (a, _) = recorded(pod("a", "ua", None, json!({"nvidia.com/gpu": "2"})), &node);
    let over = pod("over", "uo", Some("gpu-w"), json!({"nvidia.com/gpu": "1"}));
    let huge = pod(
        "huge",
        "uh",
        Some("gpu-w"),
        json!({"nvidia.com/gpu": "3", "cpu": "1"}),
    );
    list_pods(&mut feed, &[a, over, huge]);
    let stats = feed.state().stats();
    assert_eq!(stats.records_missing, 2);
    assert_eq!(stats.unplaceable, 1, "3 GPUs never fit a 2-GPU node");
    let table = feed.state().read();
    assert!(
        table.pod(&key("over")).unwrap().allocation.has_gpus(),
        "placed on the empty node: the cluster's over-commit is a fact"
    );
    assert!(!table.pod(&key("huge")).unwrap().allocation.has_gpus());
    let violations = table.check_invariants().unwrap_err();
    assert!(
        violations
            .iter()
            .any(|v| v.contains("held whole by several pods")),
        "{violations:?}"
    );
}

#[test]
fn pods_listed_before_their_node_wait_for_it() {
    let mut feed = feed();
    let node = share_node("gpu-late");
    let (recorded_pod, _) = recorded(share_pod("r", "u1", None, 4), &node);
    let unrecorded = share_pod("n", "u2", Some("gpu-late"), 2);
    let cpu_only = pod("cpu", "u3", Some("gpu-late"), json!({"cpu": "2"}));
    list_pods(&mut feed, &[recorded_pod, unrecorded, cpu_only]);
    list_nodes(&mut feed, &[]);
    assert!(feed.state().is_ready());
    assert_eq!(feed.state().stats().waiting_for_node, 1);
    assert_eq!(
        feed.state().read().pod_count(),
        2,
        "recorded and CPU-only pods are kept"
    );

    feed.apply_node_event(&Event::Apply(node));
    let stats = feed.state().stats();
    assert_eq!(stats.waiting_for_node, 0);
    assert_eq!(stats.records_missing, 1);
    assert_eq!(gpu_mem_used(&feed, "gpu-late"), 6 * 1024);
    let table = feed.state().read();
    let state = table.node_by_str("gpu-late").unwrap();
    assert_eq!(state.cpu_used, CpuMilli(4000), "1 + 1 + 2 CPUs");
    assert_eq!(state.pods, 3);
    drop(table);
    assert_invariants(&feed);
}

#[test]
fn a_bind_reservation_survives_pending_events_and_is_confirmed_by_the_watch() {
    let mut feed = feed();
    let node = share_node("gpu-a");
    list_nodes(&mut feed, std::slice::from_ref(&node));
    list_pods(&mut feed, &[]);
    let (bound, allocation) = recorded(share_pod("p", "u1", None, 4), &node);
    feed.state()
        .write()
        .reserve(key("p"), allocation.clone(), 10_000)
        .unwrap();

    feed.apply_pod_event(&Event::Apply(share_pod("p", "u1", None, 4)));
    assert_eq!(
        feed.state().read().pod(&key("p")).map(|e| e.hold),
        Some(Hold::Reserved {
            expires_at_ms: 10_000
        })
    );
    feed.apply_pod_event(&Event::Apply(bound));
    assert_eq!(
        feed.state().read().pod(&key("p")).map(|e| e.hold),
        Some(Hold::Bound)
    );
    assert!(
        feed.state().expire_reservations(20_000).is_empty(),
        "confirmed holds never expire"
    );
    assert_eq!(gpu_mem_used(&feed, "gpu-a"), 4096);
}

#[test]
fn a_recreated_pod_frees_its_predecessor() {
    let mut feed = feed();
    let node = share_node("gpu-a");
    list_nodes(&mut feed, std::slice::from_ref(&node));
    let (old, _) = recorded(share_pod("p", "old", None, 8), &node);
    list_pods(&mut feed, std::slice::from_ref(&old));
    assert_eq!(gpu_mem_used(&feed, "gpu-a"), 8192);

    feed.apply_pod_event(&Event::Apply(share_pod("p", "new", None, 2)));
    assert_eq!(gpu_mem_used(&feed, "gpu-a"), 0, "the old pod was deleted");
    // A late delete of the old pod must not touch the new one's reservation.
    feed.state()
        .write()
        .reserve(
            key("p"),
            recorded(share_pod("p", "new", None, 2), &node).1,
            1000,
        )
        .unwrap();
    feed.apply_pod_event(&Event::Delete(old));
    assert!(feed.state().read().pod(&key("p")).is_some());
}

#[test]
fn nodes_change_and_vanish_without_losing_pods() {
    let mut feed = feed();
    let node = share_node("gpu-a");
    list_nodes(&mut feed, std::slice::from_ref(&node));
    let (p, _) = recorded(share_pod("p", "u1", None, 4), &node);
    list_pods(&mut feed, &[p]);

    // Relabelled to spread: the pod is kept on the new spec.
    let mut relabelled = node.clone();
    if let Some(labels) = relabelled.metadata.labels.as_mut() {
        labels.insert("ack.node.gpu.placement".into(), "spread".into());
    }
    feed.apply_node_event(&Event::Apply(relabelled.clone()));
    assert_eq!(gpu_mem_used(&feed, "gpu-a"), 4096);

    feed.apply_node_event(&Event::Delete(relabelled.clone()));
    assert!(feed.state().read().node_by_str("gpu-a").is_none());
    assert_eq!(
        feed.state().read().pod_count(),
        1,
        "the pod's record is kept"
    );
    feed.apply_node_event(&Event::Apply(relabelled));
    assert_eq!(
        gpu_mem_used(&feed, "gpu-a"),
        4096,
        "and counted again when the node returns"
    );
    assert_invariants(&feed);
}

#[test]
fn node_problems_are_counted_and_the_node_still_serves() {
    let mut feed = feed();
    let mut node = share_node("gpu-a");
    node.metadata.annotations =
        Some([("gpu-extender.io/gpus".to_owned(), "not json".to_owned())].into());
    list_nodes(&mut feed, std::slice::from_ref(&node));
    assert_eq!(feed.state().stats().nodes_with_problems, 1);
    assert_eq!(
        feed.state()
            .read()
            .node_by_str("gpu-a")
            .map(|n| n.spec.gpus.len()),
        Some(4)
    );
    feed.watch_error();
    assert_eq!(feed.state().stats().watch_errors, 1);

    // The count follows the node: repaired, broken again, gone, and after a pod event.
    feed.apply_node_event(&Event::Apply(share_node("gpu-a")));
    assert_eq!(feed.state().stats().nodes_with_problems, 0);
    feed.apply_node_event(&Event::Apply(node.clone()));
    feed.apply_node_event(&Event::Apply(share_node("gpu-b")));
    assert_eq!(feed.state().stats().nodes_with_problems, 1);
    feed.apply_pod_event(&Event::Apply(share_pod("p", "u", None, 4)));
    assert_eq!(feed.state().stats().nodes_with_problems, 1);
    feed.apply_node_event(&Event::Delete(node));
    assert_eq!(feed.state().stats().nodes_with_problems, 0);
    assert_eq!(feed.state().stats().nodes, 1);
}

#[test]
fn slim_pods_keep_what_translation_reads() {
    let cfg = Config::default();
    let mut p = share_pod("p", "u", Some("gpu-a"), 4);
    p.metadata.labels = Some(BTreeMap::from([
        ("aliyun.com/gpu-count".to_owned(), "2".to_owned()),
        ("app".to_owned(), "x".to_owned()),
    ]));
    p.metadata.annotations = Some(BTreeMap::from([
        ("gpu-extender.io/placement".to_owned(), "spread".to_owned()),
        (
            "kubectl.kubernetes.io/last-applied-configuration".to_owned(),
            "x".repeat(10_000),
        ),
    ]));
    if let Some(spec) = p.spec.as_mut() {
        spec.scheduler_name = Some("gpu-scheduler".to_owned());
    }
    let slim = slim_pod(&p, &cfg);
    assert_eq!(pod_request(&slim, &cfg), pod_request(&p, &cfg));
    assert_eq!(
        slim.spec.as_ref().and_then(|s| s.scheduler_name.as_deref()),
        Some("gpu-scheduler"),
        "bind reads it"
    );
    assert_eq!(slim.metadata.labels.as_ref().map(BTreeMap::len), Some(1));
    assert_eq!(
        slim.metadata.annotations.as_ref().map(BTreeMap::len),
        Some(1)
    );
    let node = share_node("n");
    assert_eq!(
        node_spec(&slim_node(&node), &cfg).unwrap().gpus,
        node_spec(&node, &cfg).unwrap().gpus
    );
}

#[test]
fn a_pod_naming_zero_gpus_is_not_missing_a_record() {
    let mut feed = feed();
    list_nodes(&mut feed, &[share_node("gpu-a")]);
    let zero = pod(
        "zero",
        "u1",
        Some("gpu-a"),
        json!({"nvidia.com/gpu": "0", "cpu": "3"}),
    );
    list_pods(&mut feed, &[zero]);
    let stats = feed.state().stats();
    assert_eq!((stats.pods_bound, stats.records_missing), (1, 0));
    assert_eq!(
        feed.state().read().node_by_str("gpu-a").map(|n| n.cpu_used),
        Some(CpuMilli(3000))
    );
}

/// Pods filter turned away behind kube-scheduler's window wait for the requeue task, each once,
/// and no more of them than a bound while no task takes them.
#[test]
fn window_missed_pods_are_kept_for_the_requeue_task_up_to_a_bound() {
    let state = ClusterState::new(20);
    state.note_window_miss(PodKey::new("ns", "a"));
    state.note_window_miss(PodKey::new("ns", "a"));
    state.note_window_miss(PodKey::new("ns", "b"));
    let taken: Vec<String> = state
        .take_window_missed()
        .iter()
        .map(|key| key.as_str().to_owned())
        .collect();
    assert_eq!(taken, ["ns/a", "ns/b"]);
    assert!(state.take_window_missed().is_empty());
    for i in 0..10_000 {
        state.note_window_miss(PodKey::new("ns", &format!("p{i}")));
    }
    assert_eq!(state.take_window_missed().len(), 4096);
}

/// The requeue task learns where capacity was freed, and which pending pods kube-scheduler has
/// given up on (see `k8s::requeue`).
#[test]
fn freed_capacity_and_unschedulable_pods_are_recorded_for_the_requeue_task() {
    let mut feed = feed();
    let node = share_node("gpu-a");
    list_nodes(&mut feed, std::slice::from_ref(&node));
    list_pods(&mut feed, &[]);
    let names =
        |set: BTreeSet<NodeName>| set.into_iter().map(|n| n.to_string()).collect::<Vec<_>>();
    // A new node is new capacity.
    assert_eq!(names(feed.state().take_freed()), ["gpu-a"]);
    assert!(feed.state().take_freed().is_empty());

    // A bound pod frees nothing while it runs; finishing frees its node.
    let (bound, _) = recorded(share_pod("p", "u1", None, 4), &node);
    feed.apply_pod_event(&Event::Apply(bound.clone()));
    assert!(feed.state().take_freed().is_empty());
    feed.apply_pod_event(&Event::Delete(bound));
    assert_eq!(names(feed.state().take_freed()), ["gpu-a"]);

    // A lapsed reservation frees its node too.
    let (_, allocation) = recorded(share_pod("r", "u3", None, 4), &node);
    feed.state()
        .write()
        .reserve(key("r"), allocation, 100)
        .unwrap();
    assert!(feed.state().expire_reservations(50).is_empty());
    assert!(feed.state().take_freed().is_empty());
    assert_eq!(feed.state().expire_reservations(100), [key("r")]);
    assert_eq!(names(feed.state().take_freed()), ["gpu-a"]);
    assert_eq!(feed.state().stats().reservations_expired, 1);

    // Pending pods: only those with kube-scheduler's Unschedulable verdict are listed, and the
    // slimmed cache keeps that verdict.
    let mut waiting = share_pod("w", "u2", None, 8);
    feed.apply_pod_event(&Event::Apply(waiting.clone()));
    assert!(feed.state().pending_pods(is_unschedulable).is_empty());
    waiting.status = Some(
        serde_json::from_value(json!({
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                            "message": "0/1 nodes are available"}]
        }))
        .unwrap(),
    );
    feed.apply_pod_event(&Event::Apply(waiting));
    let listed = feed.state().pending_pods(is_unschedulable);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].0, key("w"));
}

#[test]
fn watch_events_are_counted_by_kind_and_type() {
    let mut feed = feed();
    list_nodes(&mut feed, &[share_node("a"), whole_node("b")]);
    feed.apply_node_event(&Event::Apply(share_node("a")));
    feed.apply_node_event(&Event::Delete(whole_node("b")));
    list_pods(&mut feed, &[]);
    feed.apply_pod_event(&Event::Apply(share_pod("p", "u1", Some("a"), 2)));
    // One node list and one pod list applied: two rebuild times, taken once.
    assert_eq!(feed.state().take_rebuild_times().len(), 2);
    assert!(feed.state().take_rebuild_times().is_empty());
    let stats = feed.state().stats();
    assert_eq!(
        stats.node_events,
        EventCounts {
            apply: 1,
            delete: 1,
            listed: 2
        }
    );
    assert_eq!(
        stats.pod_events,
        EventCounts {
            apply: 1,
            delete: 0,
            listed: 0
        }
    );
}

/// The record of `pod` rewritten by `edit` (a tenant's patch of the annotation).
fn forged(mut pod: Pod, edit: impl FnOnce(&mut serde_json::Value)) -> Pod {
    let key = Config::default().annotations.allocation;
    let annotations = pod
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    let mut record: serde_json::Value =
        serde_json::from_str(annotations.get(&key).map_or("{}", String::as_str)).unwrap();
    edit(&mut record);
    annotations.insert(key, record.to_string());
    pod
}

fn held(feed: &Feed, pod: &str) -> Option<Vec<(u16, u64)>> {
    let table = feed.state().read();
    let entry = table.pod(&key(pod))?;
    Some(
        entry
            .allocation
            .containers
            .iter()
            .flat_map(|c| &c.gpus)
            .map(|g| match g.grant {
                Grant::Whole => (g.gpu.0, 0),
                Grant::Share { mem, .. } => (g.gpu.0, mem.0),
            })
            .collect(),
    )
}

#[test]
fn a_record_is_fixed_once_bound_and_forgeries_are_not_applied() {
    let mut feed = feed();
    let node = share_node("n1");
    list_nodes(&mut feed, std::slice::from_ref(&node));
    let (a, _) = recorded(share_pod("a", "uid-a", None, 8), &node);
    let (b, _) = recorded(share_pod("b", "uid-b", None, 4), &node);
    list_pods(&mut feed, &[a.clone(), b.clone()]);
    let a_holds = held(&feed, "a").unwrap();
    let b_holds = held(&feed, "b").unwrap();
    assert_eq!(a_holds, vec![(0, 8192)]);
    let rejected = |feed: &Feed| feed.state().stats().records_rejected;

    // Fewer GPUs' worth (a smaller share), after bind: not applied.
    let smaller = forged(a.clone(), |r| {
        r["containers"][0]["gpus"][0]["memoryMiB"] = json!(1024)
    });
    feed.apply_pod_event(&Event::Apply(smaller));
    assert_eq!(held(&feed, "a").unwrap(), a_holds);
    // Removed: what it said stays.
    let mut removed = a.clone();
    removed.metadata.annotations = None;
    feed.apply_pod_event(&Event::Apply(removed));
    assert_eq!(held(&feed, "a").unwrap(), a_holds);
    // Garbage: the same.
    let garbage = forged(b.clone(), |r| *r = json!("nonsense"));
    feed.apply_pod_event(&Event::Apply(garbage));
    assert_eq!(held(&feed, "b").unwrap(), b_holds);
    let counts = rejected(&feed);
    assert_eq!((counts.changed, counts.removed), (2, 1), "{counts:?}");
    // The original record again is the one applied: nothing more counted.
    feed.apply_pod_event(&Event::Apply(a.clone()));
    assert_eq!(rejected(&feed).changed, 2);
    assert_eq!(feed.state().stats().records_corrupt, 0);
    // Kept for inspect and an Event, the latest refusal a pod: a removed, b changed.
    let kept: Vec<(String, String, String)> = feed
        .state()
        .rejected_records()
        .into_iter()
        .map(|r| (r.pod, r.uid, r.reason))
        .collect();
    assert_eq!(
        kept,
        vec![
            ("ns/a".to_owned(), "uid-a".to_owned(), "removed".to_owned()),
            ("ns/b".to_owned(), "uid-b".to_owned(), "changed".to_owned()),
        ]
    );
    assert_eq!(feed.state().take_untold_rejections().len(), 2);
    // Forgotten with the pod.
    feed.apply_pod_event(&Event::Delete(a));
    assert_eq!(feed.state().rejected_records().len(), 1);
    assert_invariants(&feed);
}

#[test]
fn records_that_are_not_what_the_pod_asks_or_take_others_gpus_are_not_applied() {
    let mut feed = feed();
    let node = whole_node("w1");
    list_nodes(&mut feed, std::slice::from_ref(&node));
    let whole_pod =
        |name: &str, uid: &str| pod(name, uid, None, json!({"cpu": "1", "nvidia.com/gpu": "1"}));
    let (holder, _) = recorded(whole_pod("holder", "uid-h"), &node);
    list_pods(&mut feed, std::slice::from_ref(&holder));
    assert_eq!(held(&feed, "holder").unwrap(), vec![(0, 0)]);

    // A pod pinned to the node with a record naming the GPU the holder has: not applied, the
    // pod is placed from its own request on the GPU left free.
    let (thief, _) = recorded(whole_pod("thief", "uid-t"), &node);
    feed.apply_pod_event(&Event::Apply(thief));
    assert_eq!(held(&feed, "thief").unwrap(), vec![(1, 0)]);
    assert_eq!(feed.state().stats().records_rejected.conflict, 1);

    // A pod that asks for no GPU, pinned with a record claiming one: counted as asking none.
    let (mut greedy, _) = recorded(whole_pod("greedy", "uid-g"), &node);
    if let Some(spec) = greedy.spec.as_mut() {
        spec.containers[0].resources = Some(
            serde_json::from_value(json!({"requests": {"cpu": "1", "nvidia.com/gpu": "0"}}))
                .unwrap(),
        );
    }
    feed.apply_pod_event(&Event::Apply(greedy));
    assert_eq!(held(&feed, "greedy").unwrap(), Vec::<(u16, u64)>::new());
    // More GPUs than asked for, and a GPU the node does not have.
    let (extra, _) = recorded(whole_pod("extra", "uid-x"), &node);
    let extra = forged(extra, |r| {
        r["containers"][0]["gpus"] =
            json!([{"index": 0, "whole": true}, {"index": 1, "whole": true}]);
    });
    feed.apply_pod_event(&Event::Apply(extra));
    let (absent, _) = recorded(whole_pod("absent", "uid-y"), &node);
    let absent = forged(absent, |r| {
        r["containers"][0]["gpus"][0]["index"] = json!(7)
    });
    feed.apply_pod_event(&Event::Apply(absent));
    let counts = feed.state().stats().records_rejected;
    assert_eq!(counts.mismatch, 3, "{counts:?}");
    // Neither took the holder's GPU.
    assert_eq!(held(&feed, "holder").unwrap(), vec![(0, 0)]);
}

/// A node of MIG cards only: seven `1g.10gb` slices advertised.
fn mig_node(name: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "nvidia.com/mig-1g.10gb": "7"}}
    }))
    .unwrap()
}

/// A restart rebuilds MIG holdings from the pods alone: a pod bound with the record a bind
/// writes (which names no slice) and a pod bound by someone else, without a record, both hold
/// the slices they ask for; a pod that finishes gives them back.
#[test]
fn mig_slices_are_rebuilt_from_the_bound_pods_requests() {
    let node = mig_node("m");
    let slices = |n: &str| json!({"cpu": "1", "nvidia.com/mig-1g.10gb": n});
    let (with_record, _) = recorded(pod("a", "uid-a", None, slices("2")), &node);
    let without = pod("b", "uid-b", Some("m"), slices("1"));
    let mut feed = feed();
    list_nodes(&mut feed, std::slice::from_ref(&node));
    list_pods(&mut feed, &[with_record, without.clone()]);
    assert_invariants(&feed);
    let held = |feed: &Feed| {
        let table = feed.state().read();
        let node = table.node_by_str("m").unwrap();
        (
            node.mig_held.iter().map(|s| s.count).sum::<u32>(),
            node.pods,
        )
    };
    assert_eq!(held(&feed), (3, 2));
    let stats = feed.state().stats();
    assert_eq!(
        stats.records_missing, 1,
        "the pod bound by someone else is counted as such"
    );
    let mut finished = without;
    finished.status.as_mut().unwrap().phase = Some("Succeeded".into());
    feed.apply_pod_event(&Event::Apply(finished));
    assert_eq!(held(&feed), (2, 1));
    assert_invariants(&feed);
}
