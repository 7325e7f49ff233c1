//! A rolling upgrade with two replicas, as deploy/ runs it: the pods already bound carry records
//! of every format a build has written (`tests/fixtures/records/`, as an older build's Bindings
//! left them on the pods) and one of a future version. The new build must read every old
//! record as written, refuse the future one for its version (counted corrupt, its GPUs taken
//! as its requests need, never misread), hand none of those GPUs to new pods, and a second
//! replica started beside the first (the surge of a rolling update), and later the first one
//! restarted (the rollback), must see the same table.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::harness::{
    Cluster, ExtenderLaunch, free_port, http_get, launch_extender, metric_sum, table_holdings,
};
use crate::objects::{GPU_MEM, GpuNode, Mode, NVIDIA_GPU, PodSpec, create_pod, pods, wait_settled};
use crate::up;

#[path = "../support/record_fixtures.rs"]
#[allow(
    dead_code,
    reason = "shared with tests/record_formats.rs, which uses all of it"
)]
mod record_fixtures;

const ANNOTATION: &str = "gpu-extender.io/allocation";

/// The fixtures the scenario binds, with the node kind each needs (the compute-only share needs
/// `resources.gpuCoreWithoutMemory`, a configuration of its own; `tests/record_formats.rs` reads
/// it).
const BOUND: &[(&str, &str)] = &[
    ("v1-whole-gpus.json", "whole-0"),
    ("v1-whole-gpu-without-uuid.json", "whole-0"),
    ("future-v2.json", "whole-0"),
    ("v1-memory-share.json", "share-0"),
    ("v1-memory-and-compute-share.json", "share-0"),
    ("v1-init-container-and-several-gpus.json", "share-0"),
];

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn a_rolling_upgrade_reads_every_record_format_and_loses_nothing() {
    crate::harness::run("upgrade", async |c| {
        let nodes = [
            GpuNode::new("whole-0", Mode::Exclusive, 8, "NVIDIA-A100", 40),
            GpuNode::new("share-0", Mode::Share, 4, "Tesla-T4", 16),
        ];
        let fixtures = record_fixtures::fixtures();
        // The pods an older build bound: created on their node, then given their record (a
        // Binding's annotations land on the pod the same way), before the new build starts.
        crate::objects::create_nodes(&c.client, &nodes).await?;
        let mut expected: BTreeSet<(String, u16, String)> = BTreeSet::new();
        for (i, (file, node)) in BOUND.iter().enumerate() {
            let (_, fixture) = fixtures
                .iter()
                .find(|(name, _)| name == file)
                .ok_or_else(|| anyhow!("no fixture {file}"))?;
            let name = format!("old-{i}");
            let mut pod = record_fixtures::fixture_pod(fixture, &name, "", node, ANNOTATION);
            pod.metadata.uid = None;
            pod.metadata.annotations = None;
            let created = pods(&c.client)
                .create(&Default::default(), &pod)
                .await
                .with_context(|| format!("creating {name}"))?;
            let uid = created.metadata.uid.clone().unwrap_or_default();
            let record = fixture["record"]
                .as_str()
                .unwrap_or_default()
                .replace("{{uid}}", &uid)
                .replace("{{node}}", node);
            pods(&c.client)
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION: record}}})),
                )
                .await
                .with_context(|| format!("writing {name}'s record"))?;
            for holding in fixture["expect"]["holdings"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let index = holding[1].as_u64().unwrap_or(u64::MAX);
                expected.insert(((*node).to_owned(), u16::try_from(index)?, name.clone()));
            }
        }

        // The new build starts.
        up(c, &[], "").await?;
        let report = c.inspect().await?;
        let held = table_holdings(&report);
        let missing: Vec<_> = expected.difference(&held).collect();
        ensure!(
            missing.is_empty(),
            "old records not in the table: {missing:?}\n{held:?}"
        );
        // The future record: refused for its version, its one GPU taken as a fresh bind would
        // (one the old records leave free), and counted.
        let future = held
            .iter()
            .filter(|(_, _, pod)| pod == "old-2")
            .collect::<Vec<_>>();
        ensure!(
            future.len() == 1 && future[0].0 == "whole-0" && ![0, 1, 3].contains(&future[0].1),
            "the future-version pod holds {future:?}"
        );
        let metrics = c.metrics().await?;
        let corrupt = metric_sum(&metrics, "gpu_extender_records_corrupt", &[]);
        ensure!(
            corrupt == 1.0,
            "records_corrupt is {corrupt}, not 1: {}",
            metrics
                .lines()
                .filter(|l| l.contains("records_"))
                .collect::<Vec<_>>()
                .join("\n")
        );

        // New pods go only where the old ones are not.
        let mut names = Vec::new();
        for i in 0..4 {
            let name = format!("new-whole-{i}");
            create_pod(&c.client, &PodSpec::new(&name, NVIDIA_GPU, 1)).await?;
            names.push(name);
        }
        for i in 0..3 {
            let name = format!("new-share-{i}");
            create_pod(&c.client, &PodSpec::new(&name, GPU_MEM, 4)).await?;
            names.push(name);
        }
        wait_settled(&c.client, &names, Duration::from_secs(60)).await?;
        let first = table_holdings(&c.inspect().await?);
        let whole_taken: Vec<u16> = first
            .iter()
            .filter(|(node, _, _)| node == "whole-0")
            .map(|(_, gpu, _)| *gpu)
            .collect();
        let distinct: BTreeSet<u16> = whole_taken.iter().copied().collect();
        ensure!(
            whole_taken.len() == distinct.len() && distinct.len() == 8,
            "whole GPUs handed out twice or left over: {whole_taken:?}"
        );
        ensure!(
            expected.is_subset(&first),
            "a new bind displaced an old record"
        );

        // The surge: a second replica of the new build beside the first sees the same table.
        let (listen, admin) = (free_port()?, free_port()?);
        let config = c.dir.join("extender.yaml");
        let mut second = launch_extender(&ExtenderLaunch {
            log: &c.dir.join("extender-2.log"),
            config: &config,
            kubeconfig: &c.kubeconfig(),
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], listen)),
            admin: std::net::SocketAddr::from(([127, 0, 0, 1], admin)),
            start: 1,
        })
        .await?;
        let (status, body) = http_get(
            std::net::SocketAddr::from(([127, 0, 0, 1], admin)),
            "/inspect",
        )
        .await?;
        second.kill().ok();
        second.wait().ok();
        ensure!(
            status == 200,
            "the second replica's /inspect answered {status}"
        );
        let seen_by_second = table_holdings(&serde_json::from_str(&body)?);
        ensure!(
            seen_by_second == first,
            "the replicas disagree: {:?}",
            seen_by_second
                .symmetric_difference(&first)
                .collect::<Vec<_>>()
        );

        // The rollback: the first replica restarted reads back what it and the old build wrote.
        restart_and_compare(c, &first).await
    });
}

async fn restart_and_compare(
    c: &mut Cluster,
    before: &BTreeSet<(String, u16, String)>,
) -> Result<()> {
    c.restart_extender().await?;
    let after = table_holdings(&c.inspect().await?);
    ensure!(
        &after == before,
        "the restarted extender's table differs: {:?}",
        after.symmetric_difference(before).collect::<Vec<_>>()
    );
    Ok(())
}
