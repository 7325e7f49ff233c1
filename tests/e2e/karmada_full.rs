//! The full Karmada scenario (issue 21): a karmada-apiserver (this repository's kube-apiserver
//! with the aggregation layer), Karmada's aggregated apiserver, controller-manager and two
//! karmada-schedulers, all built from Karmada v1.18.2's module by scripts/karmada-bins.sh; two
//! member clusters (loopback control planes, each with its gpu-extender serving the
//! scheduler-estimator and its kube-scheduler) registered in Push mode. A GPU Deployment is
//! divided by the scheduler that has only Karmada's general estimator (the members' summed
//! resources, from the Cluster status the controller-manager writes), then withdrawn, and the
//! same Deployment divided by the scheduler that asks our estimators: the first over-promises
//! member1, the second divides the replicas by what each member really holds, and member1's
//! kube-scheduler and extender bind exactly what our estimator answered.
//!
//! Too heavy for `make test` (three control planes, four Karmada processes, a cold build of
//! several minutes): `make test-karmada` builds the binaries and runs it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use serde_json::{Value, json};

use crate::harness::{Cluster, free_port, metric_sum};
use crate::karmada::built_once;
use crate::objects::{GPU_MEM, GpuNode, Mode, PodSpec, create_pod, node_of, wait_settled};
use crate::up;

/// Environment variable: the folder scripts/karmada-bins.sh fills (Karmada's binaries, crds/).
const KARMADA_BIN_ENV: &str = "GPU_TEST_KARMADA_BIN";
/// The port karmada-scheduler looks an estimator Service's port up by (its default).
const ESTIMATOR_SERVICE_PORT: u16 = 10352;
/// The replicas of the GPU Deployment: what the two members can really hold together.
const REPLICAS: i64 = 24;
/// How long Karmada may take to report the members Ready and to schedule a binding.
const KARMADA_WAIT: Duration = Duration::from_secs(90);

/// Karmada's binaries: `$GPU_TEST_KARMADA_BIN`, else built once by scripts/karmada-bins.sh.
fn karmada_bins() -> Result<PathBuf> {
    static DIR: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    built_once(&DIR, KARMADA_BIN_ENV, "scripts/karmada-bins.sh")
}

/// One member cluster: its name in Karmada, its plane, its extender's estimator port.
struct Member<'a> {
    name: &'static str,
    plane: &'a Cluster,
    estimator_port: u16,
}

#[test]
#[ignore = "end-to-end, heavy (three control planes and Karmada's): `make test-karmada` runs it, not `make test`"]
fn karmada_divides_replicas_by_what_each_member_holds() {
    // Built before the scenario's clock starts: a cold build takes minutes.
    let bins = match karmada_bins() {
        Ok(bins) => bins,
        Err(error) => panic!("e2e karmada_full: no Karmada binaries: {error:#}"),
    };
    crate::harness::run("karmada_full", async |member1| {
        let mut member2 = member1.start_beside("karmada_full-member2", &[]).await?;
        let mut karmada = member1
            .start_beside("karmada_full-host", &[("CP_FRONT_PROXY", "1")])
            .await?;
        let outcome = scenario(member1, &mut member2, &karmada, &bins).await;
        if outcome.is_err() {
            member2.failed = true;
            karmada.failed = true;
        }
        outcome
    });
}

/// The scenario proper, on started planes (its steps: the module's documentation).
async fn scenario(
    member1: &mut Cluster,
    member2: &mut Cluster,
    karmada: &Cluster,
    bins: &std::path::Path,
) -> Result<()> {
    // member1: 8 T4s of 16 GiB over two nodes, 128 GiB in all; a 10 GiB share takes a GPU of
    // its own, so 8 replicas fit while the sum promises 12. member2: 4 A100s of 40 GiB, 4
    // shares each: 16 replicas, which its sum promises too.
    let port1 = free_port()?;
    let port2 = loop {
        let port = free_port()?;
        if port != port1 {
            break port;
        }
    };
    let estimator = |name: &str, port: u16| {
        format!("estimator:\n  listen: 127.0.0.1:{port}\n  cluster: {name}\n")
    };
    up(
        member1,
        &[
            GpuNode::new("m1-t4-a", Mode::Share, 4, "Tesla-T4", 16),
            GpuNode::new("m1-t4-b", Mode::Share, 4, "Tesla-T4", 16),
        ],
        &estimator("member1", port1),
    )
    .await?;
    up(
        member2,
        &[GpuNode::new(
            "m2-a100",
            Mode::Share,
            4,
            "A100-SXM4-40GB",
            40,
        )],
        &estimator("member2", port2),
    )
    .await?;

    let t0 = Instant::now();
    let bin_dir = bins.display().to_string();
    let karmada_env = [("KARMADA_BIN_DIR", bin_dir.as_str())];
    karmada
        .control_plane_with_env(&["karmada"], &karmada_env)
        .await?;
    let members = [
        Member {
            name: "member1",
            plane: member1,
            estimator_port: port1,
        },
        Member {
            name: "member2",
            plane: member2,
            estimator_port: port2,
        },
    ];
    // The estimator Services first: karmada-scheduler connects when it sees a Cluster.
    for member in &members {
        register(karmada, member).await?;
    }
    // One scheduler asks the members' estimators (the default scheduler name); the other has
    // only Karmada's general estimator.
    karmada
        .control_plane_with_env(
            &[
                "karmada-scheduler",
                "accurate",
                "--enable-scheduler-estimator=true",
                "--scheduler-estimator-timeout=10s",
            ],
            &karmada_env,
        )
        .await?;
    karmada
        .control_plane_with_env(
            &[
                "karmada-scheduler",
                "general",
                "--scheduler-name=general-scheduler",
                "--enable-scheduler-estimator=false",
            ],
            &karmada_env,
        )
        .await?;
    let summaries = wait_members_ready(karmada).await?;
    eprintln!(
        "e2e karmada_full: Karmada up, members Ready in {:.1}s",
        t0.elapsed().as_secs_f64()
    );

    // What Karmada's general estimator makes of each member's summed resources.
    let request = BTreeMap::from([(GPU_MEM, 10u64), ("cpu", 1)]);
    let general: BTreeMap<&str, i64> = members
        .iter()
        .map(|m| {
            let summary = summaries
                .get(m.name)
                .ok_or_else(|| anyhow!("no resource summary for {}", m.name))?;
            Ok((m.name, general_estimate(summary, &request)?))
        })
        .collect::<Result<_>>()?;
    ensure!(
        general == BTreeMap::from([("member1", 12), ("member2", 16)]),
        "Karmada's general estimate from the members' resource summaries: {general:?}, \
         expected 12 (128 GiB / 10) and 16"
    );

    // One Deployment at a time: without karmada-webhook the ResourceBindings carry no
    // permanent ID of their own, and Karmada's binding controller would take the other
    // binding's Works for orphans of this one and delete them. Each binding's Works reach the
    // members: each gets the Deployment with its share of the replicas.
    propagate(karmada, "gpu-work-general", "general-scheduler").await?;
    let promised = scheduled_clusters(karmada, "gpu-work-general-deployment").await?;
    wait_member_deployments(&members, "gpu-work-general", &promised).await?;
    withdraw(karmada, "gpu-work-general").await?;
    propagate(karmada, "gpu-work", "default-scheduler").await?;
    let accurate = scheduled_clusters(karmada, "gpu-work-deployment").await?;
    wait_member_deployments(&members, "gpu-work", &accurate).await?;
    eprintln!(
        "e2e karmada_full: divided with our estimators {accurate:?}, with the general one \
         {promised:?}"
    );
    // Divided by available replicas (8 : 16), 24 replicas are exactly what each can hold.
    ensure!(
        accurate == BTreeMap::from([("member1".to_owned(), 8), ("member2".to_owned(), 16)]),
        "ResourceBinding gpu-work-deployment: {accurate:?}, expected member1 8, member2 16 \
         (the extenders' estimates)"
    );
    ensure!(
        promised.values().sum::<i64>() == REPLICAS,
        "the general scheduler placed {promised:?}, not {REPLICAS} replicas"
    );
    let over = promised.get("member1").copied().unwrap_or(0);
    ensure!(
        over > 8,
        "the general estimator was expected to send member1 more than it holds (12 : 16 of \
         24, about 10), got {promised:?}"
    );
    for member in &members {
        let answered = metric_sum(
            &member.plane.metrics().await?,
            "gpu_extender_estimator_requests_total",
            &[("method", "MaxAvailableReplicas"), ("code", "OK")],
        );
        ensure!(
            answered >= 1.0,
            "{}'s extender answered no MaxAvailableReplicas call",
            member.name
        );
    }
    // The members' pods (no kube-controller-manager runs there, so the test creates the
    // replicas the general division sent member1, and member2's accurate share): member1's
    // kube-scheduler and extender bind exactly what our estimator answered.
    for (member, count, prefix) in [(&members[0], over, "promised"), (&members[1], 16, "share")] {
        let names: Vec<String> = (0..count).map(|i| format!("{prefix}-{i}")).collect();
        for name in &names {
            create_pod(
                &member.plane.client,
                &PodSpec::new(name, GPU_MEM, 10).with("cpu", 1),
            )
            .await?;
        }
        let settled = wait_settled(&member.plane.client, &names, Duration::from_secs(60)).await?;
        let bound = settled.iter().filter(|p| node_of(p).is_some()).count() as i64;
        let fits = accurate.get(member.name).copied().unwrap_or(0);
        ensure!(
            bound == fits,
            "{}: {bound} of {count} replicas bound, our estimator answered {fits}",
            member.name
        );
    }
    Ok(())
}

/// Registers `member` with Karmada: its estimator Service (ExternalName 127.0.0.1, target port
/// the extender's estimator listener), the Secret with its API server's token and CA, and the
/// Push-mode Cluster.
async fn register(karmada: &Cluster, member: &Member<'_>) -> Result<()> {
    let kubeconfig: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(member.plane.kubeconfig()).context("member kubeconfig")?,
    )?;
    let field = |path: &[&str]| -> Result<String> {
        let mut value = &kubeconfig;
        for key in path {
            value = match key.parse::<usize>() {
                Ok(index) => &value[index],
                Err(_) => &value[*key],
            };
        }
        value
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("no {} in the member kubeconfig", path.join(".")))
    };
    let server = field(&["clusters", "0", "cluster", "server"])?;
    let ca = field(&["clusters", "0", "cluster", "certificate-authority-data"])?;
    let token = field(&["users", "0", "user", "token"])?;
    let objects = json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {
                    "name": format!("karmada-scheduler-estimator-{}", member.name),
                    "namespace": "karmada-system",
                },
                "spec": {
                    "type": "ExternalName",
                    "externalName": "127.0.0.1",
                    "ports": [{
                        "name": "estimator",
                        "port": ESTIMATOR_SERVICE_PORT,
                        "targetPort": member.estimator_port,
                    }],
                },
            },
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": { "name": member.name, "namespace": "karmada-cluster" },
                // `caBundle` holds the PEM, so its base64 is the kubeconfig's field as is.
                "data": { "caBundle": ca },
                "stringData": { "token": token },
            },
            {
                "apiVersion": "cluster.karmada.io/v1alpha1",
                "kind": "Cluster",
                "metadata": { "name": member.name },
                "spec": {
                    "syncMode": "Push",
                    "apiEndpoint": server,
                    "secretRef": { "namespace": "karmada-cluster", "name": member.name },
                },
            },
        ],
    });
    apply(karmada, &format!("register-{}", member.name), &objects).await
}

/// `kubectl apply` of `objects` on the Karmada plane (through a file named after `what`).
async fn apply(karmada: &Cluster, what: &str, objects: &Value) -> Result<()> {
    let path = karmada.dir.join(format!("{what}.json"));
    std::fs::write(&path, objects.to_string())?;
    karmada
        .kubectl(&["apply", "-f", &path.display().to_string()])
        .await?;
    Ok(())
}

/// Waits until both Clusters are Ready with a resource summary (the controller-manager's
/// cluster status controller, every 2 s here); returns each one's `status.resourceSummary`.
async fn wait_members_ready(karmada: &Cluster) -> Result<BTreeMap<String, Value>> {
    let deadline = Instant::now() + KARMADA_WAIT;
    loop {
        let list: Value = serde_json::from_str(
            &karmada
                .kubectl(&["get", "clusters.cluster.karmada.io", "-o", "json"])
                .await?,
        )?;
        let ready: BTreeMap<String, Value> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|cluster| {
                let conditions = cluster["status"]["conditions"].as_array();
                conditions
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    && cluster["status"]["resourceSummary"]["allocatable"].is_object()
            })
            .filter_map(|cluster| {
                Some((
                    cluster["metadata"]["name"].as_str()?.to_owned(),
                    cluster["status"]["resourceSummary"].clone(),
                ))
            })
            .collect();
        if ready.len() == 2 {
            return Ok(ready);
        }
        if Instant::now() > deadline {
            bail!(
                "the members were not Ready with a resource summary within {}s: {}",
                KARMADA_WAIT.as_secs(),
                list["items"]
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Karmada's general estimate for one replica of `request` over a member's resource summary:
/// for each requested resource, (allocatable - allocated - allocating) / request, the smallest.
fn general_estimate(summary: &Value, request: &BTreeMap<&str, u64>) -> Result<i64> {
    let amount = |part: &str, name: &str| -> Result<u64> {
        match summary[part][name].as_str() {
            None => Ok(0),
            Some(text) => plain_quantity(text)
                .ok_or_else(|| anyhow!("{part}.{name} = {text:?} is not a plain quantity")),
        }
    };
    let mut fit = i64::MAX;
    for (name, per_replica) in request {
        let free = amount("allocatable", name)?
            .saturating_sub(amount("allocated", name)?)
            .saturating_sub(amount("allocating", name)?);
        fit = fit.min(i64::try_from(free / per_replica)?);
    }
    Ok(fit)
}

/// A quantity with no suffix (`"128"`), or CPU in millicores rounding down (`"128000m"`).
fn plain_quantity(text: &str) -> Option<u64> {
    match text.strip_suffix('m') {
        Some(milli) => milli.parse::<u64>().ok().map(|m| m / 1000),
        None => text.parse().ok(),
    }
}

/// Creates the GPU Deployment `name` (REPLICAS replicas of 10 GiB of GPU memory and a CPU) and
/// a PropagationPolicy for it naming `scheduler`: both members, Divided by each one's available
/// replicas.
async fn propagate(karmada: &Cluster, name: &str, scheduler: &str) -> Result<()> {
    let objects = json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": { "name": name, "namespace": "default" },
                "spec": {
                    "replicas": REPLICAS,
                    "selector": { "matchLabels": { "app": name } },
                    "template": {
                        "metadata": { "labels": { "app": name } },
                        "spec": {
                            "schedulerName": crate::harness::GPU_SCHEDULER,
                            "containers": [{
                                "name": "work",
                                "image": "registry.k8s.io/pause:3.10",
                                "resources": {
                                    "limits": { GPU_MEM: "10", "cpu": "1" },
                                    "requests": { GPU_MEM: "10", "cpu": "1" },
                                },
                            }],
                        },
                    },
                },
            },
            {
                "apiVersion": "policy.karmada.io/v1alpha1",
                "kind": "PropagationPolicy",
                // The permanent ID karmada-webhook's mutation would add (the webhook is not
                // run here): the detector copies it onto the ResourceBinding, and
                // karmada-scheduler skips bindings without one.
                "metadata": {
                    "name": name,
                    "namespace": "default",
                    "labels": { "propagationpolicy.karmada.io/permanent-id": format!("{name}-policy") },
                },
                "spec": {
                    "schedulerName": scheduler,
                    "resourceSelectors": [
                        { "apiVersion": "apps/v1", "kind": "Deployment", "name": name },
                    ],
                    "placement": {
                        "clusterAffinity": { "clusterNames": ["member1", "member2"] },
                        "replicaScheduling": {
                            "replicaSchedulingType": "Divided",
                            "replicaDivisionPreference": "Weighted",
                            "weightPreference": { "dynamicWeight": "AvailableReplicas" },
                        },
                    },
                },
            },
        ],
    });
    apply(karmada, name, &objects).await
}

/// The ResourceBinding `binding`'s `spec.clusters` once scheduled: replicas by member.
async fn scheduled_clusters(karmada: &Cluster, binding: &str) -> Result<BTreeMap<String, i64>> {
    let deadline = Instant::now() + KARMADA_WAIT;
    loop {
        let found = karmada
            .kubectl(&[
                "get",
                "resourcebindings.work.karmada.io",
                "-n",
                "default",
                "-o",
                "json",
            ])
            .await?;
        let list: Value = serde_json::from_str(&found)?;
        let rb = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|rb| rb["metadata"]["name"] == binding);
        if let Some(clusters) = rb.and_then(|rb| rb["spec"]["clusters"].as_array())
            && !clusters.is_empty()
        {
            return clusters
                .iter()
                .map(|c| {
                    let name = c["name"].as_str().ok_or_else(|| anyhow!("no name: {c}"))?;
                    let replicas = c["replicas"]
                        .as_i64()
                        .ok_or_else(|| anyhow!("no replicas: {c}"))?;
                    Ok((name.to_owned(), replicas))
                })
                .collect();
        }
        if Instant::now() > deadline {
            bail!(
                "ResourceBinding {binding} not scheduled within {}s: {}",
                KARMADA_WAIT.as_secs(),
                rb.cloned().unwrap_or(Value::Null)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Deletes the Deployment `name`, its policy and its ResourceBinding from Karmada, waiting until
/// the binding is gone (its finalizer removes its Works, and they their objects in the
/// members). No kube-controller-manager runs on the Karmada plane, so nothing collects the
/// binding when its Deployment goes.
async fn withdraw(karmada: &Cluster, name: &str) -> Result<()> {
    karmada
        .kubectl(&["delete", "-n", "default", "propagationpolicy", name])
        .await?;
    karmada
        .kubectl(&["delete", "-n", "default", "deployment", name])
        .await?;
    let binding = format!("{name}-deployment");
    karmada
        .kubectl(&[
            "delete",
            "-n",
            "default",
            "resourcebinding",
            &binding,
            "--wait=true",
        ])
        .await?;
    Ok(())
}

/// Waits until every member `division` gives replicas has Deployment `name` with them
/// (Karmada's execution controller applies it).
async fn wait_member_deployments(
    members: &[Member<'_>],
    name: &str,
    division: &BTreeMap<String, i64>,
) -> Result<()> {
    for member in members {
        if let Some(&replicas) = division.get(member.name) {
            wait_member_deployment(member, name, replicas).await?;
        }
    }
    Ok(())
}

/// Waits until Karmada's execution controller has created Deployment `name` in `member` with
/// `replicas`.
async fn wait_member_deployment(member: &Member<'_>, name: &str, replicas: i64) -> Result<()> {
    let deadline = Instant::now() + KARMADA_WAIT;
    loop {
        let found = member
            .plane
            .kubectl(&["get", "deployments", "-n", "default", "-o", "json"])
            .await?;
        let list: Value = serde_json::from_str(&found)?;
        let got = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["metadata"]["name"] == name)
            .and_then(|d| d["spec"]["replicas"].as_i64());
        if got == Some(replicas) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{}: Deployment {name} has {got:?} replicas after {}s, expected {replicas}",
                member.name,
                KARMADA_WAIT.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
