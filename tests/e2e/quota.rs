//! GPU quotas per team (`ElasticQuota`, issue 20): two teams on one 4-GPU node. Team b borrows
//! above its min up to its max; a pod past its max waits with the quota's reason; team a, under
//! its min, gets its guarantee back by preemption of a borrower's pod. Then where kube-scheduler
//! cannot preempt (borrowers of equal priority), the extender reclaims through the Eviction API,
//! a PodDisruptionBudget sending it to another node; and a quota over a group of namespaces
//! refuses a pod past its max counted across both.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, PostParams};

use crate::harness::{ExtenderLaunch, free_port, http_get, launch_extender, metric_sum};
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

/// Applies `yaml` with kubectl (through a file: the harness's kubectl reads no stdin).
async fn apply(c: &crate::harness::Cluster, what: &str, yaml: &str) -> Result<()> {
    let path = std::env::temp_dir().join(format!(
        "gpu-extender-e2e-{what}-{}.yaml",
        std::process::id()
    ));
    std::fs::write(&path, yaml)?;
    let applied = c.kubectl(&["apply", "-f", &path.to_string_lossy()]).await;
    let _ = std::fs::remove_file(&path);
    applied.map(drop)
}

/// Installs the ElasticQuota CRD and creates, for each `(namespace, min, max, group)`, the
/// namespace and its quota `gpus` in whole GPUs; `group` lists further namespaces (created too)
/// in the quota's group annotation. Quotas exist before the extender starts (it looks for the
/// CRD once).
async fn quotas(c: &crate::harness::Cluster, teams: &[(&str, u32, u32, &[&str])]) -> Result<()> {
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
    let mut yaml = String::new();
    for (team, min, max, group) in teams {
        c.kubectl(&["create", "namespace", team]).await?;
        for other in *group {
            c.kubectl(&["create", "namespace", other]).await?;
        }
        let annotation = if group.is_empty() {
            String::new()
        } else {
            format!(
                "  annotations:\n    quota.scheduling.koordinator.sh/namespaces: '{}'\n",
                serde_json::to_string(group)?
            )
        };
        yaml.push_str(&format!(
            "---\napiVersion: scheduling.x-k8s.io/v1alpha1\nkind: ElasticQuota\nmetadata:\n  name: gpus\n  namespace: {team}\n{annotation}spec:\n  min:\n    nvidia.com/gpu: {min}\n  max:\n    nvidia.com/gpu: {max}\n"
        ));
    }
    apply(c, "quotas", &yaml).await
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn quotas_borrow_refuse_past_max_and_reclaim_by_preemption() {
    crate::harness::run("quota", async |c| {
        quotas(c, &[("team-a", 2, 4, &[]), ("team-b", 2, 3, &[])]).await?;
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

/// Whether kube-scheduler marked the pod unschedulable.
fn unschedulable(pod: &Pod) -> bool {
    scheduled_condition(pod)
        .is_some_and(|(status, reason, _)| status == "False" && reason == "Unschedulable")
}

/// Waits for a `GpuQuotaReclaim` event in `namespace` whose note names `pod` (events are
/// published in the background, after the eviction), and returns its note.
async fn reclaim_event(client: &kube::Client, namespace: &str, pod: &str) -> Result<String> {
    let api = Api::<Event>::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let notes: Vec<String> = api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("GpuQuotaReclaim"))
            .filter_map(|e| e.note)
            .collect();
        if let Some(note) = notes.iter().find(|note| note.contains(pod)) {
            return Ok(note.clone());
        }
        if Instant::now() > deadline {
            bail!("no GpuQuotaReclaim event in {namespace} names {pod}: {notes:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Where kube-scheduler cannot preempt (the borrowers' priority equals the claimant's), the
/// extender evicts them through the Eviction API: team b borrows both 2-GPU nodes; team a,
/// under its min, asks for 2 GPUs. The newest borrower's node is tried first, but a
/// PodDisruptionBudget covers that pod: the eviction is refused (429), nothing there is evicted,
/// and the other node's borrower goes instead; team a's pod is bound there. Also: a quota over
/// two namespaces refuses a pod past its max counted across both.
#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn quotas_reclaim_by_eviction_respecting_budgets_and_group_quotas() {
    crate::harness::run("quota-reclaim", async |c| {
        quotas(
            c,
            &[
                ("team-a", 2, 4, &[]),
                ("team-b", 0, 4, &[]),
                ("team-g", 0, 2, &["team-g2"]),
            ],
        )
        .await?;
        let nodes = vec![
            GpuNode::new("reclaim-1", Mode::Exclusive, 2, "A100", 80).label("pool", "reclaim"),
            GpuNode::new("reclaim-2", Mode::Exclusive, 2, "A100", 80).label("pool", "reclaim"),
            GpuNode::new("group-1", Mode::Exclusive, 4, "A100", 80),
        ];
        let config = "quota:\n  reclaim:\n    intervalSeconds: 1\n    coolDownSeconds: 30\nwriterLease:\n  durationSeconds: 6\n";
        up_with_scheduler_flags(c, &nodes, config, &[SYNC_PREEMPTION]).await?;
        priority_class(&c.client, "same", 500).await?;
        // A second replica with reclaim on, as deploy/ runs two: only the writer Lease's holder
        // evicts, so each victim is evicted once (the eviction requests are counted below).
        let second_admin = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let mut second = launch_extender(&ExtenderLaunch {
            log: &c.dir.join("extender-2.log"),
            config: &c.dir.join("extender.yaml"),
            kubeconfig: &c.kubeconfig(),
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], free_port()?)),
            admin: second_admin,
            start: 1,
        })
        .await?;
        let outcome = reclaim_with_two_replicas(c, &mut second, second_admin).await;
        second.kill().ok();
        second.wait().ok();
        outcome
    });
}

/// `gpu_extender_writer` of the replica whose admin port is `admin`.
async fn writer_gauge(admin: std::net::SocketAddr) -> Result<f64> {
    let (_, text) = http_get(admin, "/metrics").await?;
    Ok(metric_sum(&text, "gpu_extender_writer", &[]))
}

/// Polls until `done` holds of the first and second replica's writer gauges (a replica that no
/// longer answers reads 0).
async fn wait_writers(
    c: &crate::harness::Cluster,
    second: std::net::SocketAddr,
    what: &str,
    done: impl Fn(f64, f64) -> bool,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let first = writer_gauge(c.admin_addr).await.unwrap_or(0.0);
        let second = writer_gauge(second).await.unwrap_or(0.0);
        if done(first, second) {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{what}: writers {first} and {second}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Eviction requests kube-apiserver has served (dry runs included).
async fn eviction_posts(c: &crate::harness::Cluster) -> Result<(f64, Vec<String>)> {
    let served = c.kubectl(&["get", "--raw", "/metrics"]).await?;
    let lines = served
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_request_total{") && l.contains(r#"subresource="eviction""#)
        })
        .map(str::to_owned)
        .collect();
    let posts = metric_sum(
        &served,
        "apiserver_request_total",
        &[("subresource", "eviction"), ("verb", "POST")],
    );
    Ok((posts, lines))
}

async fn reclaim_with_two_replicas(
    c: &mut crate::harness::Cluster,
    second: &mut std::process::Child,
    second_admin: std::net::SocketAddr,
) -> Result<()> {
    {
        wait_writers(c, second_admin, "one writer", |a, b| a + b == 1.0).await?;

        // A quota over team-g and team-g2, max 2: one GPU in each, and a third waits, with the
        // group's reason.
        for (namespace, name) in [("team-g", "g1"), ("team-g2", "g2")] {
            create_in(
                &c.client,
                namespace,
                &PodSpec::new(name, NVIDIA_GPU, 1).on("group-1"),
            )
            .await?;
            wait_in(&c.client, namespace, name, "bound", crate::BIND, |p| {
                node_of(p).is_some()
            })
            .await?;
        }
        create_in(
            &c.client,
            "team-g2",
            &PodSpec::new("g3", NVIDIA_GPU, 1).on("group-1"),
        )
        .await?;
        let reason = "GPU quota: namespaces team-g,team-g2 would exceed their ElasticQuota gpus max (nvidia.com/gpu: 2 used + 1 requested > 2)";
        wait_in(
            &c.client,
            "team-g2",
            "g3",
            "refused by the group's quota",
            crate::BIND,
            |p| scheduled_condition(p).is_some_and(|(_, _, message)| message.contains(reason)),
        )
        .await?;

        // Team b borrows all four GPUs, one pod per node; b2 is the newer and has a budget
        // (with no disruption controller running, a budget allows no eviction at all).
        for (name, node) in [("b1", "reclaim-1"), ("b2", "reclaim-2")] {
            let spec = PodSpec::new(name, NVIDIA_GPU, 2)
                .priority("same")
                .label("app", name)
                .on(node);
            create_in(&c.client, "team-b", &spec).await?;
            wait_in(&c.client, "team-b", name, "bound", crate::BIND, |p| {
                node_of(p).is_some()
            })
            .await?;
            // Running, as a kubelet would say: the Eviction API ignores budgets for pending pods.
            c.kubectl(&[
                "patch",
                "pod",
                name,
                "-n",
                "team-b",
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}"#,
            ])
            .await?;
            // Creation times are in whole seconds: b2 must be the newer.
            tokio::time::sleep(Duration::from_millis(1100)).await;
        }
        apply(
            c,
            "pdb",
            "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: keep-b2\n  namespace: team-b\nspec:\n  minAvailable: 1\n  selector:\n    matchLabels:\n      app: b2\n",
        )
        .await?;

        // a1 may only go to the pool team b fills (group-1 has room, and borrowers of its own).
        let mut a1 = PodSpec::new("a1", NVIDIA_GPU, 2).priority("same");
        a1.node_selector.insert("pool".into(), "reclaim".into());
        create_in(&c.client, "team-a", &a1).await?;
        let refused = wait_in(&c.client, "team-a", "a1", "refused", crate::BIND, |p| {
            unschedulable(p) || node_of(p).is_some()
        })
        .await?;
        let first_refusal = Instant::now();
        ensure!(
            node_of(&refused).is_none(),
            "a1 should wait for the reclaim first"
        );
        let a1 = wait_in(
            &c.client,
            "team-a",
            "a1",
            "bound",
            Duration::from_secs(60),
            |p| node_of(p).is_some(),
        )
        .await?;
        let waited = first_refusal.elapsed();
        eprintln!("  a1: first refusal to bind in {} ms", waited.as_millis());
        ensure!(
            node_of(&a1) == Some("reclaim-1"),
            "a1 should get b1's node: {:?}",
            node_of(&a1)
        );
        let left = bound_in(&c.client, "team-b").await?;
        ensure!(
            left == ["b2"],
            "b1 evicted, b2 kept by its budget: {left:?}"
        );
        let metrics = c.metrics().await?;
        let reclaims = |result| {
            metric_sum(
                &metrics,
                "gpu_extender_quota_reclaims_total",
                &[("result", result)],
            )
        };
        ensure!(
            reclaims("evicted") == 1.0 && reclaims("pdb_blocked") >= 1.0,
            "one reclaim done after at least one refused by the budget: {metrics}"
        );
        ensure!(
            metric_sum(&metrics, "gpu_extender_quota_evictions_total", &[]) == 1.0,
            "exactly one pod evicted: {metrics}"
        );
        eprintln!(
            "  reclaims: {} evicted, {} refused by the budget",
            reclaims("evicted"),
            reclaims("pdb_blocked"),
        );
        // The evicted pod's event names the pod it went for, and a1's the evicted pod.
        reclaim_event(&c.client, "team-b", "team-a/a1").await?;
        reclaim_event(&c.client, "team-a", "team-b/b1").await?;
        // The API calls of the reclaim, as kube-apiserver counts them (only the extender evicts
        // here): a dry run refused by the budget, then a dry run and the eviction.
        let (posts, evictions) = eviction_posts(c).await?;
        eprintln!("  evictions served: {evictions:#?}");
        ensure!(
            posts == 3.0,
            "three eviction requests (two dry runs, one eviction): {evictions:?}"
        );

        let report = c.inspect().await?;
        let group = report["quotas"]
            .as_array()
            .and_then(|q| q.iter().find(|q| q["namespace"] == "team-g"))
            .cloned()
            .unwrap_or_default();
        ensure!(
            group["also"] == serde_json::json!(["team-g2"]) && group["resources"][0]["used"] == 2.0,
            "inspect shows the group and its use together: {group}"
        );

        // The writer killed: the other replica takes the duty over within the Lease's duration,
        // and evicts nothing twice (b2 stays, kept by its budget; b1 is gone).
        if writer_gauge(c.admin_addr).await? == 1.0 {
            c.kill_extender()?;
            wait_writers(c, second_admin, "the second takes over", |_, b| b == 1.0).await?;
        } else {
            second.kill().ok();
            second.wait().ok();
            wait_writers(c, second_admin, "the first takes over", |a, _| a == 1.0).await?;
        }
        let (posts, _) = eviction_posts(c).await?;
        ensure!(
            posts == 3.0,
            "an eviction repeated after the takeover: {posts}"
        );
        Ok(())
    }
}
