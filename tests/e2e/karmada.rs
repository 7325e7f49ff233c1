//! Karmada's own estimator client against the extender's scheduler-estimator
//! (`estimator.listen`): tests/karmada-client (Karmada v1.18.2's `SchedulerEstimator`, dialled
//! with Karmada's `grpcconnection`) asks how many replicas of a GPU-share template the cluster
//! can run; then that many pods, and two more, arrive one after another through the real
//! kube-scheduler and extender, and exactly the estimate is bound. Karmada's default
//! `GeneralEstimator`, fed the cluster's summed allocatable (what Karmada's cluster status
//! controller reports), promises more, before the pods and after. Then a Deployment's replicas
//! wait in the full cluster, and Karmada's client asks how many have been unschedulable
//! (`GetUnschedulableReplicas`): those of the Deployment's current ReplicaSet only. Over mutual
//! TLS (`estimator.tls`), on this machine's address off loopback (where the extender requires
//! client certificates), Karmada's client is answered with its CA and certificate, and not
//! without; a handshake without a client certificate is refused with TLS's alert; and SIGTERM
//! stops the estimator's own thread with the rest.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use gpu_test_support::port::host_address;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{ListParams, PostParams};
use rcgen::ExtendedKeyUsagePurpose;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};

use crate::harness::{Cluster, ROOT, free_port};
use crate::objects::{
    GPU_MEM, GpuNode, Mode, NS, NVIDIA_GPU, PodSpec, create_pod, node_of, pods as pods_api,
    wait_settled, wait_unschedulable,
};
use crate::tls::{Ca, write};
use crate::up;

/// The karmada-client binary: `$GPU_TEST_KARMADA_CLIENT`, else built (once, into the cache)
/// by scripts/karmada-client.sh.
fn karmada_client() -> Result<PathBuf> {
    static BIN: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    built_once(&BIN, "GPU_TEST_KARMADA_CLIENT", "scripts/karmada-client.sh")
}

/// The path `$env` names, else the last line `script` prints (building a tool into the cache),
/// found once per test process (`cell` keeps it).
pub fn built_once(
    cell: &OnceLock<std::result::Result<PathBuf, String>>,
    env: &str,
    script: &str,
) -> Result<PathBuf> {
    cell.get_or_init(|| {
        if let Some(path) = std::env::var_os(env) {
            return Ok(PathBuf::from(path));
        }
        let output = Command::new(Path::new(ROOT).join(script))
            .output()
            .map_err(|e| format!("cannot run {script}: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "{script} failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .last()
            .map(PathBuf::from)
            .ok_or_else(|| format!("{script} printed no path"))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// Karmada's answers for `template` (a work/v1alpha2 ReplicaRequirements): the accurate
/// estimator's (ours, over gRPC) and the general estimator's over `summary`.
fn estimate(c: &Cluster, addr: &str, template: &Value, summary: &Value) -> Result<(i64, i64)> {
    estimate_dialled(c, addr, template, summary, &[])
}

/// [`estimate`] with karmada-client's TLS flags `tls` (`--ca-file` and so on).
fn estimate_dialled(
    c: &Cluster,
    addr: &str,
    template: &Value,
    summary: &Value,
    tls: &[String],
) -> Result<(i64, i64)> {
    let dir = c.dir.join("karmada");
    std::fs::create_dir_all(&dir)?;
    let template_path = dir.join("template.json");
    let summary_path = dir.join("summary.json");
    std::fs::write(&template_path, template.to_string())?;
    std::fs::write(&summary_path, summary.to_string())?;
    let output = Command::new(karmada_client()?)
        .args([
            "estimate",
            "--addr",
            addr,
            "--cluster",
            "member",
            "--template",
        ])
        .arg(&template_path)
        .arg("--summary")
        .arg(&summary_path)
        .args(tls)
        .output()
        .context("running karmada-client")?;
    if !output.status.success() {
        bail!(
            "karmada-client estimate failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let answer: Value = serde_json::from_slice(&output.stdout).with_context(|| {
        format!(
            "karmada-client printed {:?}",
            String::from_utf8_lossy(&output.stdout)
        )
    })?;
    let read = |key: &str| {
        answer[key]
            .as_i64()
            .ok_or_else(|| anyhow!("no {key} in {answer}"))
    };
    Ok((read("accurate")?, read("general")?))
}

/// How a TLS client without a certificate fares against the estimator at `addr` (trusting
/// `ca_pem`, offering gRPC's `h2`): the error its first read after the handshake gets, which
/// carries the server's alert. An answer is an error of this function.
fn refused_without_certificate(addr: SocketAddr, ca_pem: &str) -> Result<String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes())?)?;
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let socket = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    socket.set_read_timeout(Some(Duration::from_secs(5)))?;
    let name = ServerName::try_from(addr.ip().to_string())?;
    let connection = rustls::ClientConnection::new(Arc::new(config), name)?;
    let mut tls = rustls::StreamOwned::new(connection, socket);
    // In TLS 1.3 the client's side of the handshake ends before the server has judged the
    // (missing) certificate: its verdict arrives with the first read.
    if let Err(error) = tls
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .and_then(|()| tls.flush())
    {
        return Ok(error.to_string());
    }
    let mut answer = [0u8; 64];
    match tls.read(&mut answer) {
        Ok(0) => bail!("the estimator closed the connection without a TLS alert"),
        Ok(n) => bail!("the estimator answered a client without a certificate ({n} bytes)"),
        Err(error) => Ok(error.to_string()),
    }
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn karmada_estimator_over_mutual_tls() {
    crate::harness::run("karmada_estimator_tls", async |c| {
        let dir = c.dir.join("estimator-tls");
        std::fs::create_dir_all(&dir)?;
        // Off loopback, as karmada-scheduler reaches it: there the extender requires client
        // certificates (tests/cli.rs shows it refusing to start without).
        let host = host_address().unwrap_or_else(|| {
            eprintln!(
                "karmada_estimator_over_mutual_tls: this machine has no address off loopback; \
                 the estimator is tested on 127.0.0.1 only"
            );
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        });
        let serving = Ca::new("estimator serving CA")?;
        let clients = Ca::new("karmada-scheduler client CA")?;
        let (cert, key, _) =
            serving.leaf(&[&host.to_string()], ExtendedKeyUsagePurpose::ServerAuth)?;
        let (client_cert, client_key, _) =
            clients.leaf(&["karmada-scheduler"], ExtendedKeyUsagePurpose::ClientAuth)?;
        let file = |name: &str, text: &str| -> Result<String> {
            Ok(write(&dir.join(name), text)?.display().to_string())
        };
        let (cert, key) = (file("tls.crt", &cert)?, file("tls.key", &key)?);
        let client_ca = file("client-ca.crt", &clients.pem)?;
        let ca = file("ca.crt", &serving.pem)?;
        let (client_cert, client_key) = (
            file("client.crt", &client_cert)?,
            file("client.key", &client_key)?,
        );
        let socket = SocketAddr::new(host, free_port()?);
        let addr = socket.to_string();
        eprintln!("karmada_estimator_over_mutual_tls: the estimator listens on {addr}");
        up(
            c,
            &[GpuNode::new("t4-a", Mode::Share, 4, "Tesla-T4", 16)],
            &format!(
                "estimator:\n  listen: \"{addr}\"\n  cluster: member\n  tls:\n    certFile: {cert}\n    \
                 keyFile: {key}\n    clientCaFile: {client_ca}\n"
            ),
        )
        .await?;
        let template = json!({ "namespace": "default", "resourceRequest": { GPU_MEM: "10" } });
        let summary = summary(c, &BTreeMap::from([(GPU_MEM, 10u64)]), 0).await?;
        let flag = |name: &str, value: &str| [format!("--{name}"), value.to_owned()];
        let trusted: Vec<String> = [
            flag("ca-file", &ca),
            flag("cert-file", &client_cert),
            flag("key-file", &client_key),
        ]
        .concat();
        // As karmada-scheduler with --scheduler-estimator-ca-file, -cert-file and -key-file:
        // one 10 GiB replica per 16 GiB T4.
        let (accurate, _) = estimate_dialled(c, &addr, &template, &summary, &trusted)?;
        ensure!(
            accurate == 4,
            "estimate over mutual TLS: {accurate}, expected 4"
        );
        // No client certificate, a CA that did not sign the server's, or plain gRPC: no answer.
        let refused = [
            ("no client certificate", flag("ca-file", &ca).to_vec()),
            (
                "the wrong CA",
                [
                    flag("ca-file", &client_ca),
                    flag("cert-file", &client_cert),
                    flag("key-file", &client_key),
                ]
                .concat(),
            ),
            ("plain gRPC", Vec::new()),
        ];
        for (what, mut args) in refused {
            // A refused handshake fails only when the dial gives up.
            args.extend(flag("dial-timeout", "1s"));
            ensure!(
                estimate_dialled(c, &addr, &template, &summary, &args).is_err(),
                "{what}: the estimator answered"
            );
        }
        // The refusal is the handshake's: TLS's alert for a missing client certificate.
        let serving_pem = serving.pem.clone();
        let refusal =
            tokio::task::spawn_blocking(move || refused_without_certificate(socket, &serving_pem))
                .await??;
        ensure!(
            refusal.contains("CertificateRequired"),
            "a client without a certificate: {refusal}"
        );

        // SIGTERM stops the estimator's own thread and runtime with the rest: the extender
        // drains, and its last word is that it stopped (not killed after the grace period).
        c.stop_extender();
        let log = std::fs::read_to_string(c.dir.join("extender.log"))?;
        let last_run = log
            .rsplit("===== extender start #")
            .next()
            .unwrap_or_default();
        let lines: Vec<&str> = last_run.lines().collect();
        ensure!(
            lines
                .iter()
                .any(|line| line.trim_end().ends_with("stopped")),
            "the extender did not stop cleanly; its log ends:\n{}",
            lines[lines.len().saturating_sub(10)..].join("\n")
        );
        Ok(())
    });
}

/// Karmada's `GetUnschedulableReplicas` for Deployment `name`, through its own client: how many
/// of its replicas have been unschedulable longer than `threshold` (a Go duration).
fn unschedulable(addr: &str, name: &str, threshold: &str) -> Result<i64> {
    let output = Command::new(karmada_client()?)
        .args(["unschedulable", "--addr", addr, "--cluster", "member"])
        .args(["--namespace", NS, "--name", name, "--threshold", threshold])
        .output()
        .context("running karmada-client")?;
    if !output.status.success() {
        bail!(
            "karmada-client unschedulable failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let answer: Value = serde_json::from_slice(&output.stdout)?;
    answer["unschedulable"]
        .as_i64()
        .ok_or_else(|| anyhow!("no unschedulable in {answer}"))
}

/// Deployment `name` as the Deployment controller leaves it mid-rollout: its current
/// ReplicaSet with `current` pods and an older one (another template) with `old`, each pod
/// asking 10 GiB of GPU memory. Returns the pods' names.
async fn workload_pods(c: &Cluster, name: &str, current: usize, old: usize) -> Result<Vec<String>> {
    let labels = json!({ "app": name });
    let template = |image: &str| {
        let pod = PodSpec::new("template", GPU_MEM, 10).to_pod()?;
        let mut spec = serde_json::to_value(pod.spec)?;
        spec["containers"][0]["image"] = json!(image);
        Ok::<_, anyhow::Error>(json!({ "metadata": { "labels": labels }, "spec": spec }))
    };
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": NS },
        "spec": {
            "replicas": current,
            "selector": { "matchLabels": labels },
            "template": template("registry.k8s.io/pause:3.10")?,
        },
    }))?;
    let deployment = Api::<Deployment>::namespaced(c.client.clone(), NS)
        .create(&PostParams::default(), &deployment)
        .await?;
    let owner = |kind: &str, name: &str, uid: Option<&String>| {
        json!([{ "apiVersion": "apps/v1", "kind": kind, "name": name,
                 "uid": uid.cloned().unwrap_or_default(), "controller": true }])
    };
    let mut names = Vec::new();
    for (hash, image, pods) in [
        ("current", "registry.k8s.io/pause:3.10", current),
        ("old", "registry.k8s.io/pause:3.9", old),
    ] {
        let rs_name = format!("{name}-{hash}");
        let mut rs_template = template(image)?;
        rs_template["metadata"]["labels"]["pod-template-hash"] = json!(hash);
        let replica_set: ReplicaSet = serde_json::from_value(json!({
            "metadata": {
                "name": rs_name, "namespace": NS,
                "labels": rs_template["metadata"]["labels"],
                "ownerReferences": owner("Deployment", name, deployment.metadata.uid.as_ref()),
            },
            "spec": {
                "replicas": pods,
                "selector": { "matchLabels": rs_template["metadata"]["labels"] },
                "template": rs_template,
            },
        }))?;
        let replica_set = Api::<ReplicaSet>::namespaced(c.client.clone(), NS)
            .create(&PostParams::default(), &replica_set)
            .await?;
        for i in 0..pods {
            let pod_name = format!("{rs_name}-{i}");
            let mut pod = PodSpec::new(&pod_name, GPU_MEM, 10)
                .label("app", name)
                .label("pod-template-hash", hash)
                .to_pod()?;
            pod.metadata.owner_references = Some(serde_json::from_value(owner(
                "ReplicaSet",
                &rs_name,
                replica_set.metadata.uid.as_ref(),
            ))?);
            pods_api(&c.client)
                .create(&PostParams::default(), &pod)
                .await?;
            names.push(pod_name);
        }
    }
    Ok(names)
}

/// What Karmada's cluster status controller reports: the nodes' allocatable summed, and what
/// `bound` pods of `per_pod` each have taken.
async fn summary(c: &Cluster, per_pod: &BTreeMap<&str, u64>, bound: u64) -> Result<Value> {
    let nodes = Api::<Node>::all(c.client.clone())
        .list(&ListParams::default())
        .await?;
    let mut allocatable: BTreeMap<String, u64> = BTreeMap::new();
    for node in &nodes.items {
        let status = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
        for (name, quantity) in status.into_iter().flatten() {
            // Plain integers (the fake nodes' GPU resources, cpu, pods); memory is not asked.
            if let Ok(amount) = quantity.0.parse::<u64>() {
                *allocatable.entry(name.clone()).or_default() += amount;
            }
        }
    }
    let allocated: BTreeMap<&str, String> = per_pod
        .iter()
        .map(|(name, amount)| (*name, (amount * bound).to_string()))
        .chain([("pods", bound.to_string())])
        .collect();
    let allocatable: BTreeMap<String, String> = allocatable
        .into_iter()
        .map(|(name, amount)| (name, amount.to_string()))
        .collect();
    Ok(json!({ "allocatable": allocatable, "allocated": allocated }))
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn karmada_estimator_answers_what_the_extender_places() {
    crate::harness::run("karmada_estimator", async |c| {
        let client = karmada_client()?;
        // The vendored protos are the pinned Karmada's (the build checks it too; this catches a
        // proto/ edited after the client was built).
        let check = Command::new(&client)
            .args(["check-protos", &format!("{ROOT}/proto")])
            .output()?;
        ensure!(
            check.status.success(),
            "proto/ does not match: {}",
            String::from_utf8_lossy(&check.stderr)
        );

        let nodes = [
            GpuNode::new("t4-a", Mode::Share, 4, "Tesla-T4", 16),
            GpuNode::new("t4-b", Mode::Share, 4, "Tesla-T4", 16),
            GpuNode::new("t4-c", Mode::Share, 4, "Tesla-T4", 16).label("zone", "b"),
            GpuNode::new("l4", Mode::Exclusive, 2, "NVIDIA-L4", 24),
        ];
        let port = free_port()?;
        let addr = format!("127.0.0.1:{port}");
        up(
            c,
            &nodes,
            &format!("estimator:\n  listen: {addr}\n  cluster: member\n"),
        )
        .await?;

        // 10 GiB of one 16 GiB T4: one replica per GPU, 12 in all; summed GPU memory (3 x 64
        // GiB) would hold 19.
        let per_pod = BTreeMap::from([(GPU_MEM, 10u64), ("cpu", 1)]);
        let template = json!({
            "namespace": "default",
            "resourceRequest": { GPU_MEM: "10", "cpu": "1" },
        });
        let (accurate, general) = estimate(c, &addr, &template, &summary(c, &per_pod, 0).await?)?;
        ensure!(accurate == 12, "accurate estimate {accurate}, expected 12");
        ensure!(
            general == 19,
            "Karmada's general estimate {general}, expected 19 (192 GiB / 10)"
        );

        // Node claims travel: zone=b is t4-c alone; whole GPUs only the exclusive node has.
        let zone_b = json!({
            "namespace": "default",
            "nodeClaim": { "nodeSelector": { "zone": "b" } },
            "resourceRequest": { GPU_MEM: "10" },
        });
        let (zone_b, _) = estimate(c, &addr, &zone_b, &summary(c, &per_pod, 0).await?)?;
        ensure!(zone_b == 4, "zone=b estimate {zone_b}, expected 4");
        let whole = json!({ "namespace": "default", "resourceRequest": { NVIDIA_GPU: "1" } });
        let (whole, _) = estimate(c, &addr, &whole, &summary(c, &per_pod, 0).await?)?;
        ensure!(whole == 2, "whole-GPU estimate {whole}, expected 2");

        // The replicas arrive one after another, two more than the estimate.
        let names: Vec<String> = (0..accurate + 2).map(|i| format!("replica-{i}")).collect();
        for name in &names {
            create_pod(&c.client, &PodSpec::new(name, GPU_MEM, 10).with("cpu", 1)).await?;
        }
        let settled = wait_settled(&c.client, &names, std::time::Duration::from_secs(60)).await?;
        let bound = settled.iter().filter(|p| node_of(p).is_some()).count() as i64;
        ensure!(
            bound == accurate,
            "{bound} replicas bound, the estimate was {accurate}"
        );

        // Full: the extender now answers 0, while the summed view still promises 7 more
        // (192 - 120 GiB), replicas that would wait in this cluster.
        let after = summary(c, &per_pod, bound as u64).await?;
        let (accurate_after, general_after) = estimate(c, &addr, &template, &after)?;
        ensure!(
            accurate_after == 0,
            "estimate after the replicas: {accurate_after}"
        );
        ensure!(
            general_after == 7,
            "Karmada's general estimate after the replicas: {general_after}, expected 7"
        );
        // A Deployment's replicas arriving at the full cluster: Karmada's descheduler asks how
        // many have waited. No controller-manager runs here, so the Deployment, its current
        // and an old ReplicaSet and their pods are made as the Deployment controller makes them.
        let waiting = workload_pods(c, "trainer", 3, 1).await?;
        for name in &waiting {
            wait_unschedulable(&c.client, name, std::time::Duration::from_secs(30)).await?;
        }
        // The watch delivers the verdicts a moment after the API server has them.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        let mut counted = unschedulable(&addr, "trainer", "0s")?;
        while counted != 3 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            counted = unschedulable(&addr, "trainer", "0s")?;
        }
        ensure!(
            counted == 3,
            "unschedulable replicas of the current ReplicaSet: {counted}, expected 3 (the old \
             ReplicaSet's pod and the bare pods not counted)"
        );
        let within_an_hour = unschedulable(&addr, "trainer", "1h")?;
        ensure!(
            within_an_hour == 0,
            "replicas unschedulable for over an hour: {within_an_hour}"
        );

        let metrics = c.metrics().await?;
        let answered = crate::harness::metric_sum(
            &metrics,
            "gpu_extender_estimator_requests_total",
            &[("method", "MaxAvailableReplicas"), ("code", "OK")],
        );
        ensure!(answered == 4.0, "estimator requests counted OK: {answered}");
        Ok(())
    });
}
