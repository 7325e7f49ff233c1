//! The extender killed (SIGKILL), later stopped (SIGTERM), and restarted each time in the middle
//! of a stream of pods: every pod ends bound exactly once with a valid record, no GPU is handed
//! out twice, and the restarted extender's table agrees with the records on the pods.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, ensure};

use crate::objects::{
    GPU_MEM, GpuNode, Mode, NVIDIA_GPU, PodSpec, bound_count, create_pod, list_pods, node_of,
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

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
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

        // A steady stream: one pod every 100 ms, so the outages fall in the middle of it.
        let client = c.client.clone();
        let producer = tokio::spawn(async move {
            for i in 0..PODS {
                create_pod(&client, &pod(i)).await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(())
        });

        // A crash once a third of the stream is bound; a graceful stop (SIGTERM) at two thirds.
        let mut t0 = Instant::now();
        for (at, crash) in [(PODS / 3, true), (2 * PODS / 3, false)] {
            let deadline = Instant::now() + Duration::from_secs(60);
            while bound_count(&c.client).await? < at {
                ensure!(
                    Instant::now() < deadline,
                    "{at} pods were not bound within 60s"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let refused_before = c.scheduler_log_count(&c.extender_addr.to_string());
            if crash {
                c.kill_extender()?;
            } else {
                c.stop_extender();
            }
            let stopped_at = bound_count(&c.client).await?;
            eprintln!(
                "  extender {} with {stopped_at} of {PODS} pods bound",
                if crash {
                    "killed (SIGKILL)"
                } else {
                    "stopped (SIGTERM)"
                }
            );
            // Restart once kube-scheduler has failed a call to it (its log names the extender's
            // address), unless nothing was left to schedule meanwhile.
            let deadline = Instant::now() + Duration::from_secs(30);
            while c.scheduler_log_count(&c.extender_addr.to_string()) <= refused_before {
                if producer.is_finished() && bound_count(&c.client).await? == PODS {
                    break;
                }
                ensure!(
                    Instant::now() < deadline,
                    "kube-scheduler did not fail a call to the stopped extender within 30s"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            t0 = Instant::now();
            c.restart_extender().await?;
        }
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
            "  all {PODS} pods bound {:.1}s after the last restart began",
            t0.elapsed().as_secs_f64()
        );

        let pods = list_pods(&c.client).await?;
        let usage = check_cluster(&nodes, &pods, &BTreeMap::new())?;
        check_inspect(&c.inspect().await?, &usage)
            .map_err(|e| anyhow!("after the restart: {e}"))?;
        Ok(())
    });
}
