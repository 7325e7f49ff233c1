//! A slow-client attack on the extender's listeners while kube-scheduler binds a burst: hundreds
//! of connections that send their headers, or a verb's body, one byte a second, on the verbs'
//! port and on the admin port, and an HTTP/2 preface a byte a second on the Karmada estimator's. Every pod of the burst binds, no kube-scheduler call is shed, the
//! attackers are cut off at the header and body deadlines, and the extender's peak memory stays
//! under the pod's limit in `deploy/deployment.yaml`. A probe client calls filter as
//! kube-scheduler does all along; its latencies, without and with the attack, are printed for
//! docs/reliability.md (never asserted: tests do not judge wall-clock time).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::harness::{Cluster, ROOT, free_port, http_post_json, metric_sum};
use crate::objects::{
    GpuNode, Mode, NVIDIA_GPU, PodSpec, create_pod, delete_pod, node_of, wait_settled,
};
use crate::up;

/// Attacking connections per kind and listener.
const ATTACKERS: usize = 150;
/// Pods per burst: one whole GPU each, on 6 nodes of 8.
const BURST: usize = 40;
/// Each phase (calm, attacked) lasts at least this long: past the 5 s header and body
/// deadlines a few times, and several hundred probe calls.
const PHASE_AT_LEAST: Duration = Duration::from_secs(15);

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn slow_clients_on_every_listener_shed_no_scheduling_call() {
    crate::harness::run("doors", async |c| {
        let nodes: Vec<GpuNode> = (0..6)
            .map(|i| GpuNode::new(&format!("a100-{i}"), Mode::Exclusive, 8, "A100", 80))
            .collect();
        let estimator = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        up(c, &nodes, &format!("estimator:\n  listen: {estimator}\n")).await?;
        let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();

        // Without the attack.
        let (calm, calm_failures, calm_bound) = burst_with_probe(c, &names, "calm").await?;
        ensure!(
            calm_failures == 0,
            "{calm_failures} probe calls failed without an attack"
        );
        let shed_before = shed(c).await?;

        // With it: slow headers on both listeners, slow bodies on the verbs'.
        let (stop_tx, stop) = watch::channel(false);
        let cuts = Arc::new(AtomicU64::new(0));
        let mut attackers = Vec::new();
        let filter = "/scheduler/filter";
        for (addr, opening, filler) in [
            (c.extender_addr, slow_headers("POST", filter), b'a'),
            (c.extender_addr, slow_body(filter), b'a'),
            (c.admin_addr, slow_headers("GET", "/metrics"), b'a'),
            // HTTP/2's preface, then a frame header a byte a second.
            (estimator, H2_PREFACE.to_owned(), 0),
        ] {
            for _ in 0..ATTACKERS {
                attackers.push(tokio::spawn(trickle(
                    addr,
                    opening.clone(),
                    filler,
                    stop.clone(),
                    cuts.clone(),
                )));
            }
        }
        let (attacked, attacked_failures, attacked_bound) =
            burst_with_probe(c, &names, "attacked").await?;
        let metrics = c.metrics().await?;
        let _ = stop_tx.send(true);
        for attacker in attackers {
            attacker.abort();
        }

        let shed_during = shed(c).await? - shed_before;
        let too_slow = metric_sum(
            &metrics,
            "gpu_extender_request_bodies_refused_total",
            &[("reason", "too_slow")],
        );
        let cut = cuts.load(Ordering::SeqCst);
        let peak = peak_memory(c)?;
        let limit = pod_memory_limit()?;
        eprintln!(
            "  calm: {BURST} pods bound in {:.1}s; probe filter latency {calm}\n  attacked by {} \
             slow connections: {BURST} pods bound in {:.1}s; probe filter latency {attacked}\n  \
             attackers cut off {cut} times ({too_slow} bodies too slow); extender peak RSS {} \
             MiB of a {} MiB limit",
            calm_bound.as_secs_f64(),
            4 * ATTACKERS,
            attacked_bound.as_secs_f64(),
            peak >> 20,
            limit >> 20
        );
        ensure!(
            shed_during == 0.0,
            "{shed_during} verb calls shed under the attack"
        );
        ensure!(
            attacked_failures == 0,
            "{attacked_failures} probe calls failed under the attack"
        );
        ensure!(
            too_slow > 0.0,
            "no slow body was cut off at limits.bodyReadTimeoutMs"
        );
        ensure!(
            cut >= 2 * ATTACKERS as u64,
            "the attackers were cut off only {cut} times: the deadlines did not hold"
        );
        ensure!(
            peak < limit,
            "peak RSS {peak} bytes is over the pod's limit {limit}"
        );
        Ok(())
    });
}

/// Latencies of the probe's filter calls.
struct Latencies(Vec<Duration>);

impl std::fmt::Display for Latencies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut sorted = self.0.clone();
        sorted.sort();
        let at = |q: f64| {
            let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len().max(1)) - 1;
            sorted.get(i).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
        };
        write!(
            f,
            "{} calls, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            sorted.len(),
            at(0.5),
            at(0.99),
            at(1.0)
        )
    }
}

/// Creates [`BURST`] one-GPU pods named after `phase`, waits until every one is bound (and at
/// least [`PHASE_AT_LEAST`]), and deletes them again; all the while a probe calls filter every
/// 20 ms as kube-scheduler does. Returns the probe's latencies, how many of its calls did not
/// answer 200, and how long the burst took to be bound.
async fn burst_with_probe(
    c: &Cluster,
    nodes: &[String],
    phase: &str,
) -> Result<(Latencies, usize, Duration)> {
    let start = Instant::now();
    let (stop_tx, mut stop) = watch::channel(false);
    let addr = c.extender_addr;
    let body = serde_json::json!({
        "Pod": {
            "metadata": {"name": "probe", "namespace": "default", "uid": "probe-uid"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {NVIDIA_GPU: "1"}}}]}
        },
        "NodeNames": nodes,
    });
    let probe = tokio::spawn(async move {
        let mut latencies = Vec::new();
        let mut failures = 0;
        loop {
            let start = Instant::now();
            match http_post_json(addr, "/scheduler/filter", &body).await {
                Ok((200, _)) => latencies.push(start.elapsed()),
                Ok((status, text)) => {
                    failures += 1;
                    eprintln!("  probe: {status} {text}");
                }
                Err(error) => {
                    failures += 1;
                    eprintln!("  probe: {error:#}");
                }
            }
            tokio::select! {
                _ = stop.changed() => break,
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
        (Latencies(latencies), failures)
    });
    let names: Vec<String> = (0..BURST).map(|i| format!("{phase}-{i:02}")).collect();
    for name in &names {
        create_pod(&c.client, &PodSpec::new(name, NVIDIA_GPU, 1)).await?;
    }
    let settled = wait_settled(&c.client, &names, Duration::from_secs(120)).await?;
    let bound_after = start.elapsed();
    let bound = settled.iter().filter(|p| node_of(p).is_some()).count();
    if let Some(rest) = PHASE_AT_LEAST.checked_sub(start.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    let _ = stop_tx.send(true);
    let (latencies, failures) = probe.await.context("the probe task")?;
    ensure!(
        bound == BURST,
        "{phase}: {bound} of {BURST} pods bound, the others unschedulable"
    );
    for name in &names {
        delete_pod(&c.client, name).await?;
    }
    Ok((latencies, failures, bound_after))
}

/// `gpu_extender_requests_shed_total` now.
async fn shed(c: &Cluster) -> Result<f64> {
    Ok(metric_sum(
        &c.metrics().await?,
        "gpu_extender_requests_shed_total",
        &[],
    ))
}

/// The start of a request whose header lines then arrive one byte a second.
fn slow_headers(method: &str, path: &str) -> String {
    format!("{method} {path} HTTP/1.1\r\nHost: extender\r\nX-Slow: ")
}

/// A whole header of a 100 kB JSON body that then arrives one byte a second.
fn slow_body(path: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\n\
         Content-Length: 100000\r\n\r\n{{"
    )
}

/// What an HTTP/2 client sends first.
const H2_PREFACE: &str = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// One attacker: connects to `addr`, sends `opening`, then `filler` a byte a second until the
/// server cuts it off (counted in `cuts`), and again a moment later, until `stop`.
async fn trickle(
    addr: SocketAddr,
    opening: String,
    filler: u8,
    mut stop: watch::Receiver<bool>,
    cuts: Arc<AtomicU64>,
) {
    let mut first = true;
    while !*stop.borrow() {
        if !first {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        first = false;
        let Ok(mut stream) = TcpStream::connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        if stream.write_all(opening.as_bytes()).await.is_err() {
            cuts.fetch_add(1, Ordering::SeqCst);
            continue;
        }
        let mut answer = [0u8; 512];
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                read = stream.read(&mut answer) => {
                    // An HTTP/1 server speaks only to refuse (408), then closes; an HTTP/2 one
                    // speaks first (its SETTINGS). The end of the connection is the cut.
                    if matches!(read, Ok(0) | Err(_)) {
                        cuts.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                }
                () = tokio::time::sleep(Duration::from_secs(1)) => {
                    if stream.write_all(&[filler]).await.is_err() {
                        cuts.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                }
            }
        }
    }
}

/// The extender's peak resident memory (`VmHWM`), in bytes.
fn peak_memory(c: &Cluster) -> Result<u64> {
    let pid = c.extender_pid().context("the extender is not running")?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .context("no VmHWM in /proc/PID/status")?;
    Ok(kib * 1024)
}

/// The extender container's memory limit in `deploy/deployment.yaml`, in bytes.
fn pod_memory_limit() -> Result<u64> {
    let text = std::fs::read_to_string(Path::new(ROOT).join("deploy/deployment.yaml"))?;
    let deployment: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text)?;
    // The extender runs as a native sidecar: an init container that keeps running.
    let pod = &deployment["spec"]["template"]["spec"];
    let limit = ["initContainers", "containers"]
        .iter()
        .filter_map(|list| pod[*list].as_sequence())
        .flatten()
        .find(|container| container["name"].as_str() == Some("gpu-extender"))
        .and_then(|container| container["resources"]["limits"]["memory"].as_str())
        .context("the gpu-extender container's memory limit")?;
    let (number, unit) = limit.split_at(
        limit
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(limit.len()),
    );
    let number: u64 = number.parse().context("the memory limit's number")?;
    let scale = match unit {
        "Gi" => 1 << 30,
        "Mi" => 1 << 20,
        "Ki" => 1 << 10,
        "" => 1,
        other => anyhow::bail!("memory limit unit {other:?}"),
    };
    Ok(number * scale)
}
