//! What an operator sees: the allocation gauges on `/metrics` move as pods are bound, each bound
//! pod carries a `GpusAllocated` event naming its GPUs, and the `inspect` and `explain` commands
//! (the built binary, with the control plane's kubeconfig, and as the `kubectl inspect gpu`
//! plugin) describe the cluster and a pending pod correctly.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use crate::harness::{Cluster, EXTENDER_BIN, metric_sum};
use crate::objects::{
    GPU_MEM, GpuNode, Mode, NVIDIA_GPU, PodSpec, create_bound, create_pod, events_of,
    wait_unschedulable,
};
use crate::{BIND, up};

/// Runs the extender binary (or a link to it) with `args`; returns (success, stdout, stderr).
fn run_cli(program: &Path, args: &[&str], kubeconfig: &Path) -> Result<(bool, String, String)> {
    let mut command = Command::new(program);
    command.args(args).env("KUBECONFIG", kubeconfig);
    // Unknown GPU_EXTENDER_* variables are configuration typos to the binary; the test
    // environment's own must not reach it.
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("GPU_EXTENDER_") {
            command.env_remove(key);
        }
    }
    let output = command
        .output()
        .with_context(|| format!("running {} {args:?}", program.display()))?;
    Ok((
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

/// `gpu-extender ARGS` that must succeed; returns stdout.
fn cli_ok(c: &Cluster, args: &[&str]) -> Result<String> {
    let (ok, stdout, stderr) = run_cli(Path::new(EXTENDER_BIN), args, &c.kubeconfig())?;
    ensure!(ok, "gpu-extender {args:?} failed:\n{stderr}\n{stdout}");
    Ok(stdout)
}

/// `gpu-extender ARGS` that must succeed, its stdout decoded as JSON.
fn cli_json(c: &Cluster, args: &[&str]) -> Result<Value> {
    let stdout = cli_ok(c, args)?;
    serde_json::from_str(&stdout).with_context(|| format!("{args:?}: not JSON:\n{stdout}"))
}

/// `gpu-extender ARGS` that must fail; returns stderr.
fn cli_err(c: &Cluster, args: &[&str]) -> Result<String> {
    let (ok, stdout, stderr) = run_cli(Path::new(EXTENDER_BIN), args, &c.kubeconfig())?;
    ensure!(!ok, "gpu-extender {args:?} succeeded:\n{stdout}");
    ensure!(
        !stderr.contains("panicked"),
        "gpu-extender {args:?} panicked:\n{stderr}"
    );
    Ok(stderr)
}

/// Scrapes `/metrics` until `check` accepts it (the event publisher and the watch run
/// concurrently with the test); the last scrape is returned with the error otherwise.
async fn wait_metrics(
    c: &Cluster,
    what: &str,
    check: impl Fn(&str) -> Result<()>,
) -> Result<String> {
    let deadline = Instant::now() + BIND;
    loop {
        let text = c.metrics().await?;
        match check(&text) {
            Ok(()) => return Ok(text),
            Err(error) if Instant::now() >= deadline => {
                return Err(error.context(format!("{what}: never seen on /metrics")));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

fn gauge_is(text: &str, name: &str, labels: &[(&str, &str)], want: f64) -> Result<()> {
    let got = metric_sum(text, name, labels);
    ensure!(
        (got - want).abs() < 1e-9,
        "{name}{labels:?} is {got}, expected {want}"
    );
    Ok(())
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn metrics_events_inspect_and_explain_tell_the_story() {
    crate::harness::run("observe", async |c| {
        let nodes = vec![
            GpuNode::new("t4x2", Mode::Share, 2, "Tesla-T4", 16),
            GpuNode::new("a100", Mode::Exclusive, 1, "NVIDIA-A100", 40),
        ];
        up(c, &nodes, "bind:\n  events: true\n").await?;

        // An empty cluster: every GPU and both nodes idle.
        let before = wait_metrics(c, "an idle cluster", |m| {
            gauge_is(m, "gpu_extender_cluster_gpus", &[], 3.0)?;
            gauge_is(m, "gpu_extender_cluster_idle_gpus", &[], 3.0)?;
            gauge_is(m, "gpu_extender_idle_gpu_nodes", &[], 2.0)?;
            gauge_is(m, "gpu_extender_cluster_gpu_free", &[], 3.0)?;
            gauge_is(m, "gpu_extender_cluster_gpu_fragmented", &[], 0.0)?;
            gauge_is(
                m,
                "gpu_extender_gpu_memory_total_mib",
                &[("node", "t4x2"), ("gpu", "1")],
                16.0 * 1024.0,
            )?;
            gauge_is(
                m,
                "gpu_extender_watch_events_total",
                &[("kind", "node"), ("event", "listed")],
                2.0,
            )
        })
        .await?;
        // The node list and the pod list were each applied once at start.
        let rebuilds = metric_sum(
            &before,
            "gpu_extender_table_rebuild_duration_seconds_count",
            &[],
        );
        ensure!(rebuilds >= 2.0, "table rebuilds observed: {rebuilds}");
        let pod_applies = |m: &str| {
            metric_sum(
                m,
                "gpu_extender_watch_events_total",
                &[("kind", "pod"), ("event", "apply")],
            )
        };

        // 10 GiB on each T4 (binpack fills GPU0 first, the second share does not fit beside
        // it), and the A100 whole.
        create_bound(&c.client, &PodSpec::new("share-1", GPU_MEM, 10), BIND).await?;
        create_bound(&c.client, &PodSpec::new("share-2", GPU_MEM, 10), BIND).await?;
        create_bound(&c.client, &PodSpec::new("whole-1", NVIDIA_GPU, 1), BIND).await?;
        let after = wait_metrics(c, "three pods bound", |m| {
            gauge_is(m, "gpu_extender_cluster_idle_gpus", &[], 0.0)?;
            gauge_is(m, "gpu_extender_idle_gpu_nodes", &[], 0.0)?;
            gauge_is(
                m,
                "gpu_extender_gpu_memory_allocated_mib",
                &[("node", "t4x2")],
                20.0 * 1024.0,
            )?;
            gauge_is(
                m,
                "gpu_extender_gpu_pods",
                &[("node", "t4x2"), ("gpu", "0")],
                1.0,
            )?;
            gauge_is(
                m,
                "gpu_extender_gpu_pods",
                &[("node", "t4x2"), ("gpu", "1")],
                1.0,
            )?;
            gauge_is(
                m,
                "gpu_extender_gpu_compute_allocated",
                &[("node", "a100")],
                1.0,
            )?;
            gauge_is(m, "gpu_extender_node_gpus_in_use", &[("node", "t4x2")], 2.0)?;
            gauge_is(
                m,
                "gpu_extender_node_gpu_occupancy",
                &[("node", "a100")],
                1.0,
            )?;
            // 6 GiB left on each 16 GiB T4: 0.375 GPU each, all of it unusable by a whole-GPU
            // pod (no typical pods configured).
            gauge_is(m, "gpu_extender_cluster_gpu_free", &[], 0.75)?;
            gauge_is(m, "gpu_extender_cluster_gpu_fragmented", &[], 0.75)?;
            gauge_is(
                m,
                "gpu_extender_pod_events_total",
                &[("result", "sent")],
                3.0,
            )?;
            Ok(())
        })
        .await?;
        ensure!(
            pod_applies(&after) > pod_applies(&before),
            "pod watch events did not move"
        );

        // The bind's event names the node and the GPU.
        let events = events_of(&c.client, "share-1").await?;
        let note = events
            .iter()
            .find(|(reason, _)| reason == "GpusAllocated")
            .map(|(_, message)| message.clone())
            .with_context(|| format!("no GpusAllocated event on share-1: {events:?}"))?;
        ensure!(
            note == "bound to node t4x2: GPU0 (10 GiB)",
            "event note: {note}"
        );
        let events = events_of(&c.client, "whole-1").await?;
        ensure!(
            events
                .iter()
                .any(|(r, m)| r == "GpusAllocated" && m == "bound to node a100: GPU0 (whole)"),
            "whole-1 events: {events:?}"
        );

        // 8 GiB passes kube-scheduler's aggregate check (12 GiB free on the node) but fits
        // neither GPU: explain names the closest GPU and the shortfall.
        create_pod(&c.client, &PodSpec::new("pending", GPU_MEM, 8)).await?;
        wait_unschedulable(&c.client, "pending", BIND).await?;
        let kubeconfig = c.kubeconfig();
        let kubeconfig = kubeconfig.to_string_lossy();
        let explained = cli_ok(
            c,
            &["explain", "default/pending", "--kubeconfig", &kubeconfig],
        )?;
        eprintln!("{explained}");
        let line = |node: &str| {
            explained
                .lines()
                .find(|l| l.starts_with(&format!("{node} ")))
                .map(str::to_owned)
                .with_context(|| format!("no line for {node} in:\n{explained}"))
        };
        let t4 = line("t4x2")?;
        ensure!(
            t4.contains(" no ")
                && t4.contains("insufficient GPU memory on any single GPU")
                && t4.contains("6 GiB of 16 GiB free")
                && t4.contains("(2 GiB short)"),
            "{t4}"
        );
        let a100 = line("a100")?;
        // The exclusive node advertises no GPU memory: kube-scheduler refuses it before the
        // extender is asked, and explain says so (issue 15).
        ensure!(
            a100.contains("kube-scheduler NodeResourcesFit: Insufficient aliyun.com/gpu-mem"),
            "{a100}"
        );
        ensure!(explained.contains("Fits 0 of 2 node(s)"), "{explained}");
        ensure!(
            t4.contains("closest is GPU0"),
            "equals name the lowest index: {t4}"
        );
        let json: Value = cli_json(
            c,
            &[
                "explain",
                "default/pending",
                "-o",
                "json",
                "--kubeconfig",
                &kubeconfig,
            ],
        )?;
        ensure!(
            json["nodes"][1]["reason"] == "insufficient_gpu_memory",
            "{json}"
        );
        let bound = cli_ok(c, &["explain", "share-2", "--kubeconfig", &kubeconfig])?;
        ensure!(
            bound.contains("is bound to node t4x2 with GPU1 (10 GiB)"),
            "{bound}"
        );

        // inspect from the API server, without the extender.
        let text = cli_ok(c, &["inspect", "--kubeconfig", &kubeconfig])?;
        eprintln!("{text}");
        let row = text
            .lines()
            .find(|l| l.starts_with("t4x2 "))
            .with_context(|| format!("no t4x2 row:\n{text}"))?;
        ensure!(row.matches("10/16").count() == 2, "{row}");
        ensure!(text.contains("a100 GPU0: default/whole-1"), "{text}");
        ensure!(text.contains("t4x2 GPU0: default/share-1"), "{text}");
        ensure!(
            text.contains("Allocated/Total GPU Memory In Cluster:\n60/72 (83%)"),
            "{text}"
        );
        // The same report from the extender's /inspect, filtered by model, as JSON.
        let from_api: Value = cli_json(c, &["inspect", "-o", "json", "--kubeconfig", &kubeconfig])?;
        let from_extender: Value = cli_json(
            c,
            &[
                "inspect",
                "-o",
                "json",
                "--from",
                &format!("http://{}", c.admin_addr),
            ],
        )?;
        ensure!(
            from_api == from_extender,
            "the API server's and the extender's reports differ:\n{from_api}\n{from_extender}"
        );
        let t4_only: Value = cli_json(
            c,
            &[
                "inspect",
                "-o",
                "json",
                "--model",
                "t4",
                "--kubeconfig",
                &kubeconfig,
            ],
        )?;
        ensure!(
            t4_only["nodes"].as_array().map(Vec::len) == Some(1) && t4_only["totals"]["gpus"] == 2,
            "{t4_only}"
        );

        // As a kubectl plugin: the binary linked as kubectl-inspect-gpu.
        let plugin = c.dir.join("kubectl-inspect-gpu");
        std::os::unix::fs::symlink(EXTENDER_BIN, &plugin)?;
        let (ok, stdout, stderr) =
            run_cli(&plugin, &["--node", "a100", "--no-pods"], &c.kubeconfig())?;
        ensure!(ok, "kubectl-inspect-gpu failed: {stderr}");
        ensure!(
            stdout.starts_with("NAME") && stdout.contains("a100") && !stdout.contains("t4x2"),
            "{stdout}"
        );

        // Bad input: clear errors, no panic.
        let error = cli_err(c, &["explain", "default/nope", "--kubeconfig", &kubeconfig])?;
        ensure!(error.contains("pod default/nope not found"), "{error}");
        let error = cli_err(
            c,
            &["inspect", "--node", "nope", "--kubeconfig", &kubeconfig],
        )?;
        ensure!(error.contains("node nope is not in the report"), "{error}");
        let error = cli_err(c, &["inspect", "--from", "http://127.0.0.1:1"])?;
        ensure!(error.contains("cannot connect"), "{error}");
        Ok(())
    });
}
