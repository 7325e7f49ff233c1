//! Requeue nudges: once the table frees capacity on a node, touch the pods kube-scheduler has
//! given up on that now fit there, so that it retries them at once.
//!
//! Why this exists: when only the extender turned a pod away (kube-scheduler's own aggregate fit
//! passed), kube-scheduler records no rejecting plugin, so any cluster event requeues the pod. A
//! pod that finishes is such an event, and kube-scheduler reacts to it within milliseconds,
//! while the extender learns of the same event through its own watch, which can be a few
//! milliseconds behind. The retry is then answered from the older table, the pod goes back to
//! the unschedulable pool, and nothing retries it until kube-scheduler's periodic flush (five
//! minutes) while the freed GPU sits idle. A metadata update on the pod itself is an event that
//! requeues it; the extender makes that update only after its table has freed the capacity.
//!
//! What is touched: pending GPU pods whose `PodScheduled` condition says `Unschedulable`, that
//! fit one of the freed nodes now (the engine's own `fit`), at most `requeue.maxPodsPerNode` per
//! freed node (oldest first) and each at most once per `requeue.minIntervalSeconds`. The choice
//! is [`choose`], a pure function; [`run`] is the loop around it.
//!
//! Also touched: pods filter turned away while a node kube-scheduler did not send would have
//! taken them (its `percentageOfNodesToScore` window hid every node with room). Nothing frees
//! capacity for them, so without a touch they wait for an unrelated cluster event or
//! kube-scheduler's periodic flush; retried, kube-scheduler starts its window elsewhere. Once
//! kube-scheduler has marked such a pod unschedulable it is touched if some node still fits it
//! ([`choose_missed`]), under the same once-per-interval limit.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use tracing::{debug, warn};

use super::api::{BindTime, PodTouch};
use super::lease::Writer;
use super::watch::is_unschedulable;
use crate::config::Config;
use crate::objects::translate::pod_request;
use crate::state::{ApiError, ClusterState, PolicyCell};
use crate::telemetry::Metrics;
use gpu_engine::{NodeName, PodKey, PodRequest, Policy, Table};

/// A pod waiting for room, as [`choose`] needs it.
#[derive(Clone, Debug)]
pub struct Waiting {
    pub key: PodKey,
    pub request: PodRequest,
    /// Creation time in seconds since the epoch (0 when unknown): older pods are touched first.
    pub created: i64,
}

/// The pods to touch: for each freed node in name order, up to `per_node` waiting pods (oldest
/// first, a pod at most once) whose request fits that node's current usage.
pub fn choose(
    table: &Table,
    policy: &Policy,
    freed: &BTreeSet<NodeName>,
    waiting: &[Waiting],
    per_node: usize,
) -> Vec<PodKey> {
    let mut ordered: Vec<&Waiting> = waiting.iter().collect();
    ordered.sort_by(|a, b| a.created.cmp(&b.created).then_with(|| a.key.cmp(&b.key)));
    let mut chosen = Vec::new();
    let mut taken: HashSet<&PodKey> = HashSet::new();
    for node in freed {
        let Some(state) = table.node(node) else {
            continue;
        };
        let mut on_node = 0;
        for pod in &ordered {
            if on_node == per_node {
                break;
            }
            if !taken.contains(&pod.key) && policy.places(state, &pod.request) {
                taken.insert(&pod.key);
                chosen.push(pod.key.clone());
                on_node += 1;
            }
        }
    }
    chosen
}

/// Of the waiting pods, those in `missed` (turned away behind kube-scheduler's window) that some
/// node of `table` still fits, oldest first.
pub fn choose_missed(
    table: &Table,
    policy: &Policy,
    missed: &HashMap<PodKey, u64>,
    waiting: &[Waiting],
) -> Vec<PodKey> {
    let mut ordered: Vec<&Waiting> = waiting
        .iter()
        .filter(|pod| missed.contains_key(&pod.key))
        .collect();
    ordered.sort_by(|a, b| a.created.cmp(&b.created).then_with(|| a.key.cmp(&b.key)));
    ordered
        .into_iter()
        .filter(|pod| table.nodes().any(|node| policy.places(node, &pod.request)))
        .map(|pod| pod.key.clone())
        .collect()
}

/// How often a window-missed pod is looked for among the unschedulable ones: kube-scheduler
/// marks it so within milliseconds of the filter.
const MISSED_RECHECK: Duration = Duration::from_millis(200);
/// How long a window-missed pod is looked for before it is let go (deleted, bound by a retry of
/// kube-scheduler's own, or never marked).
const MISSED_KEEP_MS: u64 = 5_000;

/// Touches the chosen pods whenever capacity is freed or a pod was turned away behind
/// kube-scheduler's window, until the task is dropped.
pub async fn run<A: PodTouch>(
    state: Arc<ClusterState>,
    cfg: Arc<Config>,
    policy: PolicyCell,
    api: A,
    metrics: Metrics,
    epoch: Instant,
    writer: Writer,
) {
    let min_interval_ms = cfg.requeue.min_interval_seconds.saturating_mul(1000);
    let per_node = usize::from(cfg.requeue.max_pods_per_node);
    let mut last_touched: HashMap<PodKey, u64> = HashMap::new();
    // Window-missed pods not touched yet, with when they were noted (monotonic ms).
    let mut missed: HashMap<PodKey, u64> = HashMap::new();
    loop {
        if missed.is_empty() {
            state.freed_wakeup().await;
        } else {
            tokio::select! {
                () = state.freed_wakeup() => {}
                () = tokio::time::sleep(MISSED_RECHECK) => {}
            }
        }
        // Frees come in bursts (a job's pods ending together): take them in one round.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let freed = state.take_freed();
        // Only the replica holding the writer Lease touches pods (src/k8s/lease.rs); the others
        // let the frees go, as the writer sees the same ones.
        if !writer.holds() {
            state.take_window_missed();
            missed.clear();
            continue;
        }
        let time = BindTime::now(epoch);
        let now = time.monotonic_ms;
        for key in state.take_window_missed() {
            missed.entry(key).or_insert(now);
        }
        missed.retain(|_, at| now.saturating_sub(*at) < MISSED_KEEP_MS);
        if freed.is_empty() && missed.is_empty() {
            continue;
        }
        last_touched.retain(|_, at| now.saturating_sub(*at) < min_interval_ms);
        let candidates = if freed.is_empty() {
            // Only window-missed pods to look at: look each up rather than scan every pending
            // pod, as the recheck may come every 200 ms.
            missed
                .keys()
                .filter_map(|key| state.pod(key).map(|pod| (key.clone(), pod)))
                .filter(|(_, pod)| is_unschedulable(pod))
                .collect()
        } else {
            state.pending_pods(is_unschedulable)
        };
        let waiting: Vec<Waiting> = candidates
            .into_iter()
            .filter(|(key, _)| !last_touched.contains_key(key))
            .filter_map(|(key, pod)| waiting_pod(key, &pod, &cfg))
            .collect();
        if waiting.is_empty() {
            continue;
        }
        let chosen = {
            let table = state.read();
            let policy = policy.load();
            let mut chosen = choose(&table, &policy, &freed, &waiting, per_node);
            for key in choose_missed(&table, &policy, &missed, &waiting) {
                if !chosen.contains(&key) {
                    chosen.push(key);
                }
            }
            chosen
        };
        // Any new value makes the update; the time tells a reader when it happened.
        let stamp = (time.unix_nanos / 1_000_000_000).to_string();
        for key in chosen {
            let (namespace, name) = key.as_str().split_once('/').unwrap_or(("default", ""));
            let result = api
                .touch_pod(namespace, name, &cfg.annotations.requeue, &stamp)
                .await;
            let label = match &result {
                Ok(()) => "touched",
                Err(ApiError::NotFound(_)) => "gone",
                Err(_) => "error",
            };
            metrics.requeue_touches.with_label_values(&[label]).inc();
            match result {
                Ok(()) => debug!(pod = %key, "asked kube-scheduler to retry the pod"),
                Err(ApiError::NotFound(_)) => {}
                Err(error) => warn!(pod = %key, %error, "could not touch a waiting pod"),
            }
            missed.remove(&key);
            last_touched.insert(key, now);
        }
    }
}

/// The pod's request, if it asks for GPUs in a form the extender reads.
pub fn waiting_pod(key: PodKey, pod: &Pod, cfg: &Config) -> Option<Waiting> {
    let request = pod_request(pod, cfg).ok().flatten()?;
    let created = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |time| time.0.as_second());
    Some(Waiting {
        key,
        request,
        created,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Test fixtures are literals.
mod tests {
    use serde_json::json;

    use super::*;
    use crate::objects::translate::node_spec;
    use gpu_engine::{Change, PodAllocation, fit};

    /// A memory-sharing node of `gpus` 16 GiB T4s.
    fn share_node(name: &str, gpus: u32) -> k8s_openapi::api::core::v1::Node {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {
                "ack.node.gpu.schedule": "share",
                "aliyun.accelerator/nvidia_name": "T4",
                "aliyun.accelerator/nvidia_mem": "16GiB",
                "aliyun.accelerator/nvidia_count": gpus.to_string()}},
            "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"}}
        }))
        .unwrap()
    }

    fn share_pod(name: &str, gib: u64) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {
                "cpu": "1", "aliyun.com/gpu-mem": gib.to_string()}}}]}
        }))
        .unwrap()
    }

    fn waiting(name: &str, gib: u64, created: i64) -> Waiting {
        let pod = share_pod(name, gib);
        Waiting {
            key: PodKey::new("ns", name),
            request: pod_request(&pod, &Config::default()).unwrap().unwrap(),
            created,
        }
    }

    /// A table with `nodes` (name, GPUs), each GPU holding `held` GiB of one pod per GPU.
    fn table(nodes: &[(&str, u32)], held: u64) -> (Table, Policy) {
        let cfg = Config::default();
        let policy = cfg.engine_policy();
        let mut table = Table::new(20);
        for (name, gpus) in nodes {
            let node = share_node(name, *gpus);
            table.apply(Change::UpsertNode(node_spec(&node, &cfg).unwrap()));
            if held == 0 {
                continue;
            }
            for gpu in 0..*gpus {
                let holder = format!("{name}-holder-{gpu}");
                let request = waiting(&holder, held, 0).request;
                let state = table.node(&NodeName::new(name)).unwrap();
                let allocation: PodAllocation = fit(state, &request, &policy).unwrap();
                table.apply(Change::PodBound {
                    pod: PodKey::new("ns", &holder),
                    allocation,
                });
            }
        }
        (table, policy)
    }

    fn freed(names: &[&str]) -> BTreeSet<NodeName> {
        names.iter().copied().map(NodeName::new).collect()
    }

    fn keys(names: &[&str]) -> Vec<PodKey> {
        names.iter().map(|n| PodKey::new("ns", n)).collect()
    }

    #[test]
    fn window_missed_pods_are_touched_where_some_node_still_fits_them_oldest_first() {
        // 12 GiB held on each 16 GiB GPU of `a` and `b`: 4 GiB pods fit, 8 GiB pods do not.
        let (table, policy) = table(&[("a", 2), ("b", 1)], 12);
        let waiting = [
            waiting("big", 8, 1),
            waiting("young", 4, 30),
            waiting("old", 4, 10),
            waiting("not-missed", 4, 0),
        ];
        let missed: HashMap<PodKey, u64> = keys(&["big", "young", "old", "gone"])
            .into_iter()
            .map(|key| (key, 0))
            .collect();
        let chosen = choose_missed(&table, &policy, &missed, &waiting);
        assert_eq!(chosen, keys(&["old", "young"]));
        assert!(choose_missed(&table, &policy, &HashMap::new(), &waiting).is_empty());
    }

    #[test]
    fn only_pods_that_fit_a_freed_node_are_touched_oldest_first() {
        // 12 GiB held on each 16 GiB GPU of `a`: 4 GiB pods fit, 8 GiB pods do not.
        let (table, policy) = table(&[("a", 2)], 12);
        let waiting = [
            waiting("big", 8, 1),
            waiting("young", 4, 30),
            waiting("old", 4, 10),
        ];
        let chosen = choose(&table, &policy, &freed(&["a"]), &waiting, 4);
        assert_eq!(chosen, keys(&["old", "young"]));
    }

    #[test]
    fn at_most_per_node_pods_per_freed_node_and_each_pod_once() {
        let (table, policy) = table(&[("a", 1), ("b", 1)], 0);
        let waiting = [
            waiting("p1", 4, 1),
            waiting("p2", 4, 2),
            waiting("p3", 4, 3),
        ];
        let chosen = choose(&table, &policy, &freed(&["a", "b"]), &waiting, 2);
        // a takes the two oldest, b the next: nobody is touched twice.
        assert_eq!(chosen, keys(&["p1", "p2", "p3"]));
        let chosen = choose(&table, &policy, &freed(&["a"]), &waiting, 1);
        assert_eq!(chosen, keys(&["p1"]));
    }

    #[test]
    fn unknown_or_unfreed_nodes_touch_nothing() {
        let (table, policy) = table(&[("a", 1), ("b", 1)], 0);
        let waiting = [waiting("p", 4, 1)];
        assert!(choose(&table, &policy, &freed(&["gone"]), &waiting, 4).is_empty());
        assert!(choose(&table, &policy, &freed(&[]), &waiting, 4).is_empty());
        assert_eq!(
            choose(&table, &policy, &freed(&["b"]), &waiting, 4),
            keys(&["p"])
        );
    }

    #[test]
    fn unschedulable_means_pending_with_kube_schedulers_verdict() {
        let with_condition = |node: Option<&str>, status: &str, reason: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": "ns"},
                "spec": {"nodeName": node, "containers": []},
                "status": {"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": status, "reason": reason}]}
            }))
            .unwrap()
        };
        use crate::k8s::watch::is_unschedulable;
        assert!(is_unschedulable(&with_condition(
            None,
            "False",
            "Unschedulable"
        )));
        assert!(!is_unschedulable(&with_condition(
            None,
            "False",
            "SchedulerError"
        )));
        assert!(!is_unschedulable(&with_condition(
            Some("n"),
            "False",
            "Unschedulable"
        )));
        assert!(!is_unschedulable(&with_condition(None, "True", "")));
        assert!(!is_unschedulable(&share_pod("fresh", 4)));
    }
}
