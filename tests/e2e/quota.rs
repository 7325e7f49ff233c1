//! GPU quotas per team (`ElasticQuota`, issue 20): two teams on one 4-GPU node. Team b borrows
//! above its min up to its max; a pod past its max waits with the quota's reason; team a, under
//! its min, gets its guarantee back by preemption of a borrower's pod.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;

use crate::harness::metric_sum;
use crate::objects::{GpuNode, Mode, NVIDIA_GPU, PodSpec, node_of, scheduled_condition};
use crate::preemption::{SYNC_PREEMPTION, priority_class};
use crate::up_with_scheduler_flags;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Creates `spec` in `namespace` (the scenario's pods live in the teams' namespaces).
async fn create_in(client: &kube::Client, namespace: &str, spec: &PodSpec) -> Result<()> {
    let mut pod = spec.to_pod()?;
    pod.metadata.namespace = Some(namespace.to_owned());
    Api::<Pod>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("creating pod {namespace}/{}", spec.name))?;
    Ok(())
}

/// Polls `namespace/name` until `done` holds, for at most `limit`.
async fn wait_in(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    what: &str,
    limit: Duration,
    done: impl Fn(&Pod) -> bool,
) -> Result<Pod> {
    let api = Api::<Pod>::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + limit;
    loop {
        let pod = api.get_opt(name).await?;
        if let Some(pod) = &pod
            && done(pod)
        {
            return Ok(pod.clone());
        }
        if Instant::now() > deadline {
            bail!(
                "{namespace}/{name} not {what} after {limit:?}: {:?}",
                pod.as_ref().and_then(scheduled_condition)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn bound_in(client: &kube::Client, namespace: &str) -> Result<Vec<String>> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&Default::default())
        .await?;
    Ok(pods
        .items
        .iter()
        .filter(|p| node_of(p).is_some() && p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.name.clone())
        .collect())
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn quotas_borrow_refuse_past_max_and_reclaim_by_preemption() {
    crate::harness::run("quota", async |c| {
        // The CRD and the quotas exist before the extender starts (it looks for the CRD once).
        c.kubectl(&[
            "apply",
            "-f",
            &format!("{ROOT}/deploy/quota/elasticquota-crd.yaml"),
        ])
        .await?;
        c.kubectl(&[
            "wait",
            "--for=condition=Established",
            "crd/elasticquotas.scheduling.x-k8s.io",
            "--timeout=30s",
        ])
        .await?;
        let quotas = std::env::temp_dir().join(format!(
            "gpu-extender-e2e-quotas-{}.yaml",
            std::process::id()
        ));
        let mut yaml = String::new();
        for (team, min, max) in [("team-a", 2, 4), ("team-b", 2, 3)] {
            c.kubectl(&["create", "namespace", team]).await?;
            yaml.push_str(&format!(
                "---\napiVersion: scheduling.x-k8s.io/v1alpha1\nkind: ElasticQuota\nmetadata:\n  name: gpus\n  namespace: {team}\nspec:\n  min:\n    nvidia.com/gpu: {min}\n  max:\n    nvidia.com/gpu: {max}\n"
            ));
        }
        std::fs::write(&quotas, yaml)?;
        c.kubectl(&["apply", "-f", &quotas.to_string_lossy()])
            .await?;
        let _ = std::fs::remove_file(&quotas);
        let nodes = vec![GpuNode::new("quota-a100", Mode::Exclusive, 4, "A100", 80)];
        up_with_scheduler_flags(c, &nodes, "", &[SYNC_PREEMPTION]).await?;
        for (name, value) in [("low", 100), ("high", 1000)] {
            priority_class(&c.client, name, value).await?;
        }

        // Team b borrows: 3 GPUs against a min of 2, its max.
        for name in ["b1", "b2", "b3"] {
            create_in(
                &c.client,
                "team-b",
                &PodSpec::new(name, NVIDIA_GPU, 1).priority("low"),
            )
            .await?;
            wait_in(&c.client, "team-b", name, "bound", crate::BIND, |p| {
                node_of(p).is_some()
            })
            .await?;
        }
        let metrics = c.metrics().await?;
        let series = |name| {
            metric_sum(
                &metrics,
                name,
                &[("namespace", "team-b"), ("resource", NVIDIA_GPU)],
            )
        };
        ensure!(
            (
                series("gpu_extender_quota_used"),
                series("gpu_extender_quota_borrowed")
            ) == (3.0, 1.0),
            "team-b should use 3 GPUs, 1 borrowed: {metrics}"
        );

        // A fourth GPU is free, but team b is at its max: b4 waits, and says why.
        create_in(
            &c.client,
            "team-b",
            &PodSpec::new("b4", NVIDIA_GPU, 1).priority("low"),
        )
        .await?;
        let reason = "GPU quota: namespace team-b would exceed its ElasticQuota gpus max (nvidia.com/gpu: 3 used + 1 requested > 3)";
        let b4 = wait_in(
            &c.client,
            "team-b",
            "b4",
            "refused by the quota",
            crate::BIND,
            |p| scheduled_condition(p).is_some_and(|(_, _, message)| message.contains(reason)),
        )
        .await?;
        eprintln!("  b4: {:?}", scheduled_condition(&b4));

        // Team a, under its min, asks for 2 GPUs: one is free, the other comes back from team b.
        create_in(
            &c.client,
            "team-a",
            &PodSpec::new("a1", NVIDIA_GPU, 2).priority("high"),
        )
        .await?;
        wait_in(
            &c.client,
            "team-a",
            "a1",
            "bound",
            Duration::from_secs(40),
            |p| node_of(p).is_some(),
        )
        .await?;
        let left = bound_in(&c.client, "team-b").await?;
        ensure!(
            left.len() == 2,
            "one of team b's borrowed pods should be preempted: {left:?}"
        );
        ensure!(
            !left.contains(&"b4".to_owned()),
            "b4 should still wait: {left:?}"
        );
        Ok(())
    });
}
