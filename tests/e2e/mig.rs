//! MIG slices of NVIDIA's device plugin (`mixed` strategy, docs/mig.md) end to end: nodes whose
//! cards are all in MIG mode advertise `nvidia.com/mig-1g.10gb` and no whole GPU; pods asking for
//! slices reach the extender through the shipped profile configuration's `managedResources`, are
//! packed by binpack onto the node whose slices are already in use, and `/inspect`, the metrics
//! and the web view (in Chromium) show them holding the slices, after a restart of the extender
//! too.

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use crate::objects::{GpuNode, Mode, NVIDIA_GPU, PodSpec, create_bound, node_of};
use crate::web_view::{drawn_page, node_row};
use crate::{BIND, up};

const MIG_1G: &str = "nvidia.com/mig-1g.10gb";

/// An 80 GB A100 node whose two cards are in MIG mode: seven `1g.10gb` slices, no whole GPU.
fn mig_node(name: &str) -> GpuNode {
    GpuNode::new(name, Mode::Exclusive, 2, "NVIDIA-A100-SXM4-80GB", 80)
        .advertise(NVIDIA_GPU, 0)
        .advertise(MIG_1G, 7)
}

/// The `/inspect` report of node `name`.
pub(crate) fn node<'a>(report: &'a Value, name: &str) -> Result<&'a Value> {
    report["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|node| node["name"] == name)
        .with_context(|| format!("node {name} is not in /inspect"))
}

/// Node `name`'s `1g.10gb` pool in `/inspect`: (advertised, held, free, holders).
fn pool(report: &Value, name: &str) -> Result<(u64, u64, u64, Vec<String>)> {
    let pool = node(report, name)?["mig"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|pool| pool["profile"] == "1g.10gb")
        .with_context(|| format!("node {name} shows no 1g.10gb pool"))?;
    let count = |field: &str| pool[field].as_u64().unwrap_or(u64::MAX);
    let holders = pool["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|holder| {
            format!(
                "{} x{}",
                holder["pod"].as_str().unwrap_or("?"),
                holder["slices"]
            )
        })
        .collect();
    Ok((count("advertised"), count("held"), count("free"), holders))
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn mig_pods_are_packed_onto_the_node_whose_slices_are_in_use() {
    crate::harness::run("mig", async |c| {
        let whole = GpuNode::new("whole", Mode::Exclusive, 2, "NVIDIA-A100-SXM4-80GB", 80);
        up(c, &[mig_node("mig-a"), mig_node("mig-b"), whole], "").await?;

        // One pod pinned to mig-b puts its slices in use.
        create_bound(
            &c.client,
            &PodSpec::new("first", MIG_1G, 1).on("mig-b"),
            BIND,
        )
        .await?;
        // Two more, free to go to either MIG node: binpack packs both onto mig-b, whose
        // slices are in use, and leaves mig-a's cards untouched.
        for name in ["second", "third"] {
            let pod = create_bound(&c.client, &PodSpec::new(name, MIG_1G, 1), BIND).await?;
            ensure!(
                node_of(&pod) == Some("mig-b"),
                "{name} went to {:?}, not to mig-b whose slices are in use",
                node_of(&pod)
            );
        }

        let holders = ["default/first x1", "default/second x1", "default/third x1"];
        let report = c.inspect().await?;
        let (advertised, held, free, pods) = pool(&report, "mig-b")?;
        ensure!(
            (advertised, held, free) == (7, 3, 4) && pods == holders,
            "mig-b: {advertised} advertised, {held} held, {free} free, held by {pods:?}"
        );
        ensure!(
            pool(&report, "mig-a")?.1 == 0,
            "mig-a's slices are untouched"
        );
        // The cards GFD-style labels count are in MIG mode: never offered whole.
        let cards = node(&report, "mig-b")?["gpus"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        ensure!(
            cards.len() == 2 && cards.iter().all(|gpu| gpu["healthy"] == false),
            "mig-b's cards: {cards:?}"
        );
        ensure!(
            node(&report, "whole")?.get("mig").is_none(),
            "a node without slices shows none"
        );
        ensure!(
            report["totals"]["migSlices"] == 14 && report["totals"]["migSlicesHeld"] == 3,
            "totals: {}",
            report["totals"]
        );
        let metrics = c.metrics().await?;
        for line in [
            r#"gpu_extender_mig_slices{node="mig-b",profile="1g.10gb",state="held"} 3"#,
            r#"gpu_extender_mig_slices{node="mig-a",profile="1g.10gb",state="free"} 7"#,
            r#"gpu_extender_cluster_mig_slices{profile="1g.10gb",state="held"} 3"#,
        ] {
            ensure!(metrics.contains(line), "missing {line} in /metrics");
        }

        // The web view draws each node's pool with its holders.
        let dom = drawn_page(c)?;
        let row = node_row(&dom, "mig-b")?;
        ensure!(
            row.contains(
                "data-mig-profile=\"1g.10gb\" data-mig-held=\"3\" data-mig-advertised=\"7\" data-mig-pods=\"default/first default/second default/third\""
            ),
            "mig-b's row: {row}"
        );
        ensure!(
            dom.contains("data-total=\"mig\"><b>3 / 14</b>"),
            "the MIG total is not drawn"
        );

        // The record names no slice: a restarted extender rebuilds the holdings from the pods.
        c.restart_extender().await?;
        let (_, held, _, pods) = pool(&c.inspect().await?, "mig-b")?;
        ensure!(
            held == 3 && pods == holders,
            "after a restart mig-b shows {held} held by {pods:?}"
        );
        Ok(())
    });
}
