//! Keeps the label [`LARGEST_FREE_LABEL`] current on every memory-sharing node
//! (`webhook.labelNodes`): the most GPU memory free on any one of its healthy GPUs, which the
//! admission webhook's node affinity asks of a share pod, so that cluster-autoscaler's
//! simulation sees what only the extender knew (src/objects/autoscaling.rs). Only the holder of
//! the writer Lease writes. Writes are coalesced: a round every [`ROUND`] at most, only when the
//! table has changed, and one merge patch per node whose value differs from what the watch
//! shows; a value already sent is not sent again while the watch catches up.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tracing::warn;

use crate::k8s::lease::Writer;
use crate::objects::autoscaling::{LARGEST_FREE_LABEL, largest_free_mib};
use crate::state::ClusterState;
use crate::telemetry::Metrics;
use gpu_engine::NodeName;

/// The shortest time between two rounds: binds and releases within it cost one patch per node.
pub const ROUND: Duration = Duration::from_millis(200);

/// What each memory-sharing node's label should say now.
pub fn desired_labels(cluster: &ClusterState) -> Vec<(NodeName, u64)> {
    let table = cluster.read();
    let max_shares = table.max_shares_per_gpu();
    table
        .nodes()
        .filter_map(|node| Some((node.spec.name.clone(), largest_free_mib(node, max_shares)?)))
        .collect()
}

/// The patches of one round: each node of `desired` whose label the watch `shown` differently,
/// unless that very value was sent already (the watch has not shown it yet). `sent` remembers
/// what is in flight: entries the watch has caught up with, and nodes gone, are dropped.
pub fn plan(
    desired: &[(NodeName, u64)],
    shown: impl Fn(&NodeName) -> Option<u64>,
    sent: &mut HashMap<NodeName, u64>,
) -> Vec<(NodeName, u64)> {
    let mut patches = Vec::new();
    let mut still_sent = HashMap::with_capacity(sent.len());
    for (node, value) in desired {
        if shown(node) == Some(*value) {
            continue;
        }
        if sent.get(node) != Some(value) {
            patches.push((node.clone(), *value));
        }
        still_sent.insert(node.clone(), *value);
    }
    *sent = still_sent;
    patches
}

/// Keeps the labels current until the task is dropped (see the module's documentation).
pub async fn run(
    cluster: Arc<ClusterState>,
    client: kube::Client,
    writer: Writer,
    metrics: Metrics,
) {
    let nodes: Api<Node> = Api::all(client);
    let mut sent: HashMap<NodeName, u64> = HashMap::new();
    let mut seen_writes = None;
    let mut retry = false;
    loop {
        tokio::time::sleep(ROUND).await;
        if !writer.holds() || !cluster.is_ready() {
            // Another replica may write meanwhile: what was sent from here says nothing then.
            sent.clear();
            seen_writes = None;
            continue;
        }
        let writes = cluster.writes();
        if seen_writes == Some(writes) && !retry {
            continue;
        }
        seen_writes = Some(writes);
        retry = false;
        let desired = desired_labels(&cluster);
        let patches = {
            let claims = cluster.node_claims();
            let shown = |node: &NodeName| {
                claims
                    .get(node)
                    .and_then(|c| c.label(LARGEST_FREE_LABEL))
                    .and_then(|v| v.parse().ok())
            };
            plan(&desired, shown, &mut sent)
        };
        for (node, value) in patches {
            let patch =
                json!({ "metadata": { "labels": { LARGEST_FREE_LABEL: value.to_string() } } });
            match nodes
                .patch(
                    node.as_str(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => metrics
                    .node_label_writes
                    .with_label_values(&["patched"])
                    .inc(),
                Err(error) => {
                    warn!(node = node.as_str(), %error, "cannot patch the largest free share label");
                    metrics
                        .node_label_writes
                        .with_label_values(&["error"])
                        .inc();
                    sent.remove(&node);
                    retry = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(n: &str) -> NodeName {
        NodeName::new(n)
    }

    #[test]
    fn only_changed_values_are_sent_and_only_once() {
        let mut sent = HashMap::new();
        let desired = vec![(name("a"), 24_576), (name("b"), 4_096), (name("c"), 0)];
        let shown = HashMap::from([(name("a"), 24_576), (name("b"), 8_192)]);
        let patches = plan(&desired, |n| shown.get(n).copied(), &mut sent);
        assert_eq!(patches, vec![(name("b"), 4_096), (name("c"), 0)]);
        // The watch has not caught up: nothing is sent twice.
        assert!(plan(&desired, |n| shown.get(n).copied(), &mut sent).is_empty());
        // A newer value for b is sent although the older one is still in flight.
        let desired = vec![(name("a"), 24_576), (name("b"), 2_048), (name("c"), 0)];
        assert_eq!(
            plan(&desired, |n| shown.get(n).copied(), &mut sent),
            vec![(name("b"), 2_048)]
        );
        // Caught up, or gone: forgotten.
        let shown = HashMap::from([(name("a"), 24_576), (name("b"), 2_048), (name("c"), 0)]);
        assert!(plan(&desired[..2], |n| shown.get(n).copied(), &mut sent).is_empty());
        assert!(sent.is_empty(), "{sent:?}");
    }

    /// The writes the label costs per placement at 1,000 memory-sharing nodes of 4 A10s
    /// (24 GiB): 6,000 shares of 1-24 GiB, each on the first node that fits from a random start
    /// (spread over the pool, the most label changes), then releases and placements alternating, the label planned after every event (each bind in a
    /// round of its own) and after every 20 events (100 binds a second in 200 ms rounds), the
    /// watch caught up between rounds. docs/benchmarks.md gives the numbers. Run:
    /// `cargo test -p gpu-extender --lib node_label::tests::writes_per_placement -- --ignored --nocapture`
    #[test]
    #[ignore = "a measurement; docs/benchmarks.md gives its numbers"]
    fn writes_per_placement_at_1000_nodes() {
        use gpu_engine::{
            Change, GpuDemand, GpuMode, MemMiB, NodeSpec, PodKey, PodRequest, Policy, ShareRules,
            Table, fit,
        };
        let mut table = Table::new(8);
        for i in 0..1000 {
            table.apply(Change::UpsertNode(NodeSpec::uniform(
                &format!("n{i:04}"),
                GpuMode::ShareMemory,
                4,
                "NVIDIA-A10",
                MemMiB(24_576),
            )));
        }
        let names: Vec<NodeName> = table.nodes().map(|n| n.spec.name.clone()).collect();
        let policy = Policy::default();
        let sizes = [1u64, 2, 4, 4, 8, 8, 12, 16, 20, 24];
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let labels = |table: &Table| -> Vec<(NodeName, u64)> {
            table
                .nodes()
                .filter_map(|n| Some((n.spec.name.clone(), largest_free_mib(n, 8)?)))
                .collect()
        };
        let mut runs = [(1usize, HashMap::new(), 0u64), (20, HashMap::new(), 0u64)];
        for (_, shown, _) in &mut runs {
            *shown = labels(&table).into_iter().collect::<HashMap<_, _>>();
        }
        let (mut placed, mut released, mut refused) = (0u64, 0u64, 0u64);
        let mut bound: Vec<PodKey> = Vec::new();
        for event in 0..12_000u64 {
            let place = event < 6_000 || event % 2 == 0;
            if place {
                let gib = sizes[next(sizes.len())];
                let demand = GpuDemand::share_under(gib, 1, None, ShareRules::default()).unwrap();
                let request = PodRequest::single(gpu_engine::CpuMilli(0), MemMiB(0), demand);
                let start = next(names.len());
                let found = (0..names.len())
                    .map(|k| &names[(start + k) % names.len()])
                    .find_map(|name| fit(table.node(name)?, &request, &policy).ok());
                match found {
                    Some(allocation) => {
                        let pod = PodKey::new("default", &format!("p{event}"));
                        table.apply(Change::PodBound {
                            pod: pod.clone(),
                            allocation,
                        });
                        bound.push(pod);
                        placed += 1;
                    }
                    None => refused += 1,
                }
            } else if !bound.is_empty() {
                let pod = bound.swap_remove(next(bound.len()));
                table.release(&pod);
                released += 1;
            }
            for (every, shown, writes) in &mut runs {
                if (event + 1) % *every as u64 == 0 {
                    let mut sent = HashMap::new();
                    let patches = plan(&labels(&table), |n| shown.get(n).copied(), &mut sent);
                    *writes += patches.len() as u64;
                    shown.extend(patches);
                }
            }
        }
        let events = (placed + released) as f64;
        for (every, _, writes) in &runs {
            eprintln!(
                "rounds of {every} event(s): {writes} label writes for {placed} placements and {released} releases ({refused} refused): {:.3} writes per bind or release",
                *writes as f64 / events
            );
            assert!(*writes as f64 <= events, "more than one write per event");
        }
        assert!(runs[1].2 <= runs[0].2, "coalescing added writes");
    }
}
