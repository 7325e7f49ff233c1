//! The extender killed (SIGKILL) and restarted in the middle of a stream of pods: every pod ends
//! bound exactly once with a valid record, no GPU is handed out twice, and the restarted
//! extender's table agrees with the records on the pods.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};

use crate::objects::{
    GPU_MEM, GpuNode, Mode, NVIDIA_GPU, PodSpec, create_pod, events_of, list_pods, node_of,
    wait_settled,
};
use crate::record::{check_cluster, check_inspect};
use crate::up;

const PODS: usize = 60;

fn pod(i: usize) -> PodSpec {
    let name = format!("stream-{i:03}");
    if i % 6 == 5 {
        PodSpec::new(&name, NVIDIA_GPU, 1)
    } else {
        PodSpec::new(&name, GPU_MEM, [2, 4, 2, 6, 2][i % 6])
    }
}

async fn bound_count(client: &kube::Client) -> Result<usize> {
    Ok(list_pods(client)
        .await?
        .iter()
        .filter(|p| node_of(p).is_some())
        .count())
}

#[test]
fn extender_killed_mid_stream_loses_and_duplicates_nothing() {
    crate::harness::run("restart", async |c| {
        // 16 shared T4s (256 GiB) for 50 shares of ~3.2 GiB, 12 whole GPUs for 10 pods: room
        // for every pod, so every pod must end bound.
        let mut nodes: Vec<GpuNode> = (0..4)
            .map(|i| GpuNode::new(&format!("t4-{i}"), Mode::Share, 4, "Tesla-T4", 16))
            .collect();
        nodes.extend(
            (0..3).map(|i| GpuNode::new(&format!("l4-{i}"), Mode::Exclusive, 4, "NVIDIA-L4", 24)),
        );
        up(c, &nodes, "").await?;

        let client = c.client.clone();
        let producer = tokio::spawn(async move {
            for i in 0..PODS {
                create_pod(&client, &pod(i)).await?;
                tokio::time::sleep(Duration::from_millis(60)).await;
            }
            anyhow::Ok(())
        });

        // Kill once a third of the stream is bound, while pods keep coming.
        let deadline = Instant::now() + Duration::from_secs(60);
        while bound_count(&c.client).await? < PODS / 3 {
            ensure!(
                Instant::now() < deadline,
                "the first pods were not bound in 60s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        c.kill_extender()?;
        let killed_at = bound_count(&c.client).await?;
        eprintln!("  extender killed with {killed_at} of {PODS} pods bound");

        // Wait until kube-scheduler has felt the outage (a call failed) before restarting.
        let deadline = Instant::now() + Duration::from_secs(30);
        'outage: loop {
            for p in list_pods(&c.client).await? {
                if node_of(&p).is_some() {
                    continue;
                }
                let name = p.metadata.name.clone().unwrap_or_default();
                let events = events_of(&c.client, &name).await?;
                if events.iter().any(|(reason, m)| {
                    reason == "FailedScheduling" && m.contains(&c.extender_addr.to_string())
                }) {
                    eprintln!("  kube-scheduler saw the outage on {name}");
                    break 'outage;
                }
            }
            ensure!(
                Instant::now() < deadline,
                "no FailedScheduling event about the dead extender within 30s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let t0 = Instant::now();
        c.restart_extender().await?;
        producer
            .await
            .context("producer task")?
            .context("creating the stream")?;

        let names: Vec<String> = (0..PODS).map(|i| pod(i).name).collect();
        let settled = wait_settled(&c.client, &names, Duration::from_secs(120)).await?;
        let unbound: Vec<&str> = settled
            .iter()
            .filter(|p| node_of(p).is_none())
            .filter_map(|p| p.metadata.name.as_deref())
            .collect();
        ensure!(
            unbound.is_empty(),
            "pods not bound after the restart: {unbound:?}"
        );
        eprintln!(
            "  all {PODS} pods bound {:.1}s after the restart began",
            t0.elapsed().as_secs_f64()
        );

        let pods = list_pods(&c.client).await?;
        let usage = check_cluster(&nodes, &pods, &BTreeMap::new())?;
        check_inspect(&c.inspect().await?, &usage)
            .map_err(|e| anyhow!("after the restart: {e}"))?;
        Ok(())
    });
}
