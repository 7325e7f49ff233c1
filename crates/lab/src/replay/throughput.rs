//! The throughput mode of `replay`: on one loopback plane, N one-GPU pods created as fast as the
//! API allows against M eight-GPU nodes, timed until all are bound, once through gpu-extender
//! (the `gpu-scheduler` profile) and once without it (the default profile, whole GPUs counted by
//! kube-scheduler alone), the same kube-scheduler with the same client QPS, back to back. Reports
//! pods/s, their ratio, the CPU each process spent per pod, and the time the extender's filter
//! handler took per pod (of kube-scheduler's serial cycle, the part the extender answers in).

use std::collections::HashSet;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher::{self, Event};

use gpu_test_support::bins::k8s_bins;
use gpu_test_support::metrics::series_value;

use super::args::ReplayArgs;
use super::objects::{GpuApi, NAMESPACE, OWNER_LABEL, extender_config, pod_object};
use super::plane::{DEFAULT_SCHEDULER, GPU_SCHEDULER, Plane, SHIPPED_PROFILE, cpu_time};
use super::run::{clean_up, create_cluster};
use gpu_engine::{CpuMilli, MemMiB, ScoringPolicy, TypicalPods};
use gpu_sim::{Cluster, SimNode, SimPod};

/// One timed batch.
#[derive(Clone, Debug)]
pub struct Measurement {
    pub with_extender: bool,
    pub pods: usize,
    pub elapsed: Duration,
    /// CPU spent per process during the batch.
    pub cpu: Vec<(&'static str, Duration)>,
    /// The extender's filter calls during the batch, from its metrics (with the extender only).
    pub filter: Option<FilterCalls>,
}

/// Filter calls the extender answered and the time its handler took for them (decoding the
/// request and deciding; not reading the body off the socket or writing the answer).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FilterCalls {
    pub calls: f64,
    pub seconds: f64,
}

impl FilterCalls {
    const CALLS: &str = r#"gpu_extender_request_duration_seconds_count{verb="filter"}"#;
    const SECONDS: &str = r#"gpu_extender_request_duration_seconds_sum{verb="filter"}"#;

    /// The totals so far in the extender's metrics text; none before the first filter call.
    fn read(metrics: &str) -> Self {
        Self {
            calls: series_value(metrics, Self::CALLS).unwrap_or(0.0),
            seconds: series_value(metrics, Self::SECONDS).unwrap_or(0.0),
        }
    }

    fn since(self, before: Self) -> Self {
        Self {
            calls: self.calls - before.calls,
            seconds: self.seconds - before.seconds,
        }
    }
}

impl Measurement {
    pub fn pods_per_second(&self) -> f64 {
        self.pods as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Wall-clock milliseconds per pod: kube-scheduler's cycle where it is the bottleneck.
    pub fn ms_per_pod(&self) -> f64 {
        self.elapsed.as_secs_f64() * 1000.0 / self.pods.max(1) as f64
    }

    /// The extender's filter handler time in milliseconds per pod.
    pub fn filter_ms_per_pod(&self) -> Option<f64> {
        self.filter
            .map(|f| f.seconds * 1000.0 / self.pods.max(1) as f64)
    }

    /// The extender's filter calls per pod: more than one means pods were tried again.
    pub fn filter_calls_per_pod(&self) -> Option<f64> {
        self.filter.map(|f| f.calls / self.pods.max(1) as f64)
    }

    /// The CPU every measured process spent, in milliseconds per pod.
    pub fn cpu_ms_per_pod(&self) -> f64 {
        let total: Duration = self.cpu.iter().map(|(_, cpu)| *cpu).sum();
        total.as_secs_f64() * 1000.0 / self.pods.max(1) as f64
    }
}

/// The throughput run.
pub async fn run_throughput(args: &ReplayArgs) -> Result<()> {
    let t = &args.throughput;
    ensure!(
        args.kubeconfig.is_none(),
        "--throughput runs on a loopback plane only (it restarts kube-scheduler)"
    );
    ensure!(
        t.node_count > 0 && t.pod_count > 0,
        "--throughput-nodes and --throughput-pods must be positive"
    );
    ensure!(
        t.pod_count <= t.node_count * 8,
        "{} one-GPU pods do not fit on {} nodes of 8 GPUs",
        t.pod_count,
        t.node_count
    );
    // Before anything starts: a wrong path would otherwise surface only after the plane and
    // 1,000 nodes are up, as a failed start of the extender.
    if let Some(program) = &t.extender {
        ensure!(
            program.is_file(),
            "--throughput-extender {}: no such program (build it first, e.g. cargo build --release --example bare_extender)",
            program.display()
        );
    }
    let cluster = Cluster::new(
        "throughput",
        (0..t.node_count)
            .map(|i| SimNode {
                name: format!("gpu-{i:05}"),
                cpu: CpuMilli(96_000),
                memory: MemMiB(786_432),
                gpus: 8,
                model: "A100".into(),
            })
            .collect(),
    );
    let config = extender_config(
        ScoringPolicy::Binpack,
        &TypicalPods::default(),
        &gpu_sim::Workload::new("none", Vec::new()),
    );
    let run_id = "throughput";
    let bins = k8s_bins(&args.repo)?;
    let mut plane = Plane::start(&args.repo, &bins, args.keep)?;
    if args.extender_https {
        plane.serve_extender_over_https()?;
    }
    let client = plane.client().await?;
    let started = Instant::now();
    create_cluster(&client, &cluster, run_id, &config, GpuApi::DevicePlugin).await?;
    eprintln!(
        "throughput: {} nodes created in {:.1} s",
        t.node_count,
        started.elapsed().as_secs_f64()
    );
    let extender = match &t.extender {
        Some(program) => program.clone(),
        None => args.extender_bin()?,
    };
    let mut measurements = Vec::new();
    // Round 0 warms up and is not reported: the first batch on a fresh plane (an empty watch
    // cache, a just-started extender and kube-scheduler) ran 10-20% slower than the rounds after
    // it, and it was always the batch with the extender.
    for round in 0..=t.rounds.max(1) {
        for with_extender in [true, false] {
            // With: the replay's scheduler configuration (the dedicated GPU scheduler unless
            // --scheduler-config says otherwise, with --percentage-of-nodes-to-score applied);
            // without: the shipped default profile alone, at kube-scheduler's own adaptive
            // window, the cluster the variants are weighed against.
            let mut setup = args.scheduler_setup()?;
            setup.client_qps = Some(t.qps);
            if !with_extender {
                setup.base = SHIPPED_PROFILE.to_owned();
                setup.with_extender = false;
                setup.percentage_of_nodes_to_score = None;
            }
            if with_extender {
                plane
                    .start_extender(&extender, &config, &args.extender_set)
                    .await?;
            } else {
                plane.stop_extender();
            }
            plane.start_scheduler(&setup).await?;
            let scheduler = if with_extender {
                GPU_SCHEDULER
            } else {
                DEFAULT_SCHEDULER
            };
            let measurement = measure(
                &client,
                &plane,
                t.pod_count,
                scheduler,
                with_extender,
                run_id,
                &config,
            )
            .await
            .with_context(|| format!("round {round}"))?;
            eprintln!(
                "throughput {} {}: {} pods in {:.1} s = {:.1} pods/s",
                if round == 0 {
                    "warm-up (not reported)".to_owned()
                } else {
                    format!("round {round}")
                },
                if with_extender {
                    "with the extender"
                } else {
                    "without"
                },
                measurement.pods,
                measurement.elapsed.as_secs_f64(),
                measurement.pods_per_second()
            );
            if round > 0 {
                measurements.push(measurement);
            }
            delete_pods(&client, run_id).await?;
        }
    }
    plane.stop_extender();
    let _ = plane.stop_scheduler().await;
    clean_up(&client, run_id, GpuApi::DevicePlugin).await?;
    let mut report = report(&measurements, t.node_count);
    if let Some(program) = &t.extender {
        writeln!(report, "the extender: {}", program.display())?;
    }
    print!("{report}");
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let path = args.out.join("throughput.md");
    std::fs::write(&path, &report).with_context(|| format!("writing {}", path.display()))?;
    println!("results in {}", path.display());
    Ok(())
}

/// Creates `count` one-GPU pods as fast as the API takes them and waits until all are bound.
async fn measure(
    client: &kube::Client,
    plane: &Plane,
    count: usize,
    scheduler: &str,
    with_extender: bool,
    run_id: &str,
    config: &gpu_extender::config::Config,
) -> Result<Measurement> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let watch_config = watcher::Config::default().labels(&format!("{OWNER_LABEL}={run_id}"));
    let mut stream = std::pin::pin!(watcher::watcher(pods.clone(), watch_config));
    // The watch is established (listed) before the first pod exists.
    loop {
        match stream.next().await {
            Some(Ok(Event::InitDone)) => break,
            Some(_) => {}
            None => bail!("the pod watch ended before it started"),
        }
    }
    let pids = plane.pids();
    let filter_before = filter_calls(plane, with_extender).await?;
    let cpu_before: Vec<Option<Duration>> = pids.iter().map(|&(_, pid)| cpu_time(pid)).collect();
    let template = SimPod {
        name: "tp".into(),
        cpu: CpuMilli(1000),
        memory: MemMiB(1024),
        gpus: 1,
        milli: 1000,
        gpu_spec: String::new(),
        models: Vec::new(),
        lifetime: None,
    };
    let objects: Vec<Pod> = (0..count)
        .map(|i| {
            pod_object(
                &template,
                i,
                scheduler,
                run_id,
                config,
                GpuApi::DevicePlugin,
            )
        })
        .collect::<Result<_, _>>()?;
    let started = Instant::now();
    let creating = {
        let pods = pods.clone();
        tokio::spawn(async move {
            futures::stream::iter(objects)
                .map(|pod| {
                    let pods = pods.clone();
                    async move { pods.create(&PostParams::default(), &pod).await.map(|_| ()) }
                })
                .buffer_unordered(32)
                .try_collect::<Vec<()>>()
                .await
        })
    };
    let mut bound = HashSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    while bound.len() < count {
        let event = tokio::time::timeout_at(deadline, stream.next())
            .await
            .map_err(|_| anyhow::anyhow!("{} of {count} pods bound after 600 s", bound.len()))?;
        match event {
            Some(Ok(Event::Apply(pod))) => {
                if pod.spec.as_ref().is_some_and(|s| s.node_name.is_some())
                    && let Some(name) = pod.metadata.name
                {
                    bound.insert(name);
                }
            }
            Some(_) => {}
            None => bail!("the pod watch ended"),
        }
    }
    let elapsed = started.elapsed();
    creating.await?.context("creating the pods")?;
    let cpu = pids
        .iter()
        .zip(cpu_before)
        .filter_map(|(&(name, pid), before)| Some((name, cpu_time(pid)?.saturating_sub(before?))))
        .collect();
    let filter = match (filter_calls(plane, with_extender).await?, filter_before) {
        (Some(after), Some(before)) => Some(after.since(before)),
        _ => None,
    };
    Ok(Measurement {
        with_extender,
        pods: count,
        elapsed,
        cpu,
        filter,
    })
}

/// The extender's filter totals so far, when it runs.
async fn filter_calls(plane: &Plane, with_extender: bool) -> Result<Option<FilterCalls>> {
    if !with_extender {
        return Ok(None);
    }
    let metrics = plane
        .extender_metrics()
        .await
        .context("reading the extender's metrics")?;
    Ok(Some(FilterCalls::read(&metrics)))
}

/// Deletes the batch's pods and waits until they are gone.
async fn delete_pods(client: &kube::Client, run_id: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let selector = ListParams::default().labels(&format!("{OWNER_LABEL}={run_id}"));
    pods.delete_collection(
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
        &selector,
    )
    .await
    .context("deleting the batch's pods")?;
    let started = Instant::now();
    while !pods.list_metadata(&selector).await?.items.is_empty() {
        ensure!(
            started.elapsed() < Duration::from_secs(120),
            "the batch's pods were not gone 120 s after their deletion"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// The measurements as a Markdown table, with the ratio of the means.
pub fn report(measurements: &[Measurement], nodes: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n| setup | pods | nodes | seconds | pods/s | CPU ms per pod: kube-scheduler | kube-apiserver | etcd | gpu-extender | all | extender filter ms per pod |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    for m in measurements {
        let per_pod = |name: &str| {
            m.cpu
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, cpu)| format!("{:.2}", cpu.as_secs_f64() * 1000.0 / m.pods as f64))
                .unwrap_or_else(|| "-".into())
        };
        let _ = writeln!(
            out,
            "| {} | {} | {nodes} | {:.1} | {:.1} | {} | {} | {} | {} | {:.2} | {} |",
            if m.with_extender {
                "with gpu-extender"
            } else {
                "without (baseline)"
            },
            m.pods,
            m.elapsed.as_secs_f64(),
            m.pods_per_second(),
            per_pod("kube-scheduler"),
            per_pod("kube-apiserver"),
            per_pod("etcd"),
            per_pod("gpu-extender"),
            m.cpu_ms_per_pod(),
            m.filter_ms_per_pod()
                .map_or_else(|| "-".to_owned(), |ms| format!("{ms:.3}")),
        );
    }
    // The mean over one setup's batches of what `of` gives (batches where it gives nothing are
    // left out).
    let mean = |with: bool, of: fn(&Measurement) -> Option<f64>| {
        let values: Vec<f64> = measurements
            .iter()
            .filter(|m| m.with_extender == with)
            .filter_map(of)
            .collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    };
    if let (Some(with), Some(without)) = (
        mean(true, |m| Some(m.pods_per_second())),
        mean(false, |m| Some(m.pods_per_second())),
    ) {
        let _ = writeln!(
            out,
            "\nwith / without: {with:.1} / {without:.1} pods/s = {:.2}x",
            with / without
        );
    }
    // On shared cores pods/s follows the CPU all processes spend per pod: the sum and its ratio
    // say how much of a change in pods/s is CPU, beside the per-process columns.
    if let (Some(with), Some(without)) = (
        mean(true, |m| Some(m.cpu_ms_per_pod())),
        mean(false, |m| Some(m.cpu_ms_per_pod())),
    ) {
        let _ = writeln!(
            out,
            "CPU per pod, all processes: {with:.2} / {without:.2} ms = {:.2}x",
            with / without
        );
    }
    // Where the processes have cores to spare, pods/s follows kube-scheduler's serial cycle: what
    // the extender adds to each pod's time, against what its filter handler itself took.
    if let (Some(with), Some(without), Some(filter), Some(calls)) = (
        mean(true, |m| Some(m.ms_per_pod())),
        mean(false, |m| Some(m.ms_per_pod())),
        mean(true, Measurement::filter_ms_per_pod),
        mean(true, Measurement::filter_calls_per_pod),
    ) {
        let _ = writeln!(
            out,
            "time per pod: {with:.3} / {without:.3} ms ({:+.3} ms); the extender's filter handler: {filter:.3} ms of it ({calls:.2} filter calls per pod)",
            with - without
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(with_extender: bool, seconds: u64, cpu_ms: &[(&'static str, u64)]) -> Measurement {
        Measurement {
            with_extender,
            pods: 1000,
            elapsed: Duration::from_secs(seconds),
            cpu: cpu_ms
                .iter()
                .map(|(name, ms)| (*name, Duration::from_millis(*ms)))
                .collect(),
            filter: with_extender.then_some(FilterCalls {
                calls: 1000.0,
                seconds: 0.25,
            }),
        }
    }

    #[test]
    fn filter_calls_are_read_from_the_extenders_own_metrics_text() {
        let metrics = gpu_extender::telemetry::metrics::Metrics::new().expect("metrics");
        let before = FilterCalls::read(&metrics.render().expect("render"));
        assert_eq!(before, FilterCalls::default(), "no filter call yet");
        let filter = metrics.request_duration.with_label_values(&["filter"]);
        filter.observe(0.002);
        filter.observe(0.003);
        // Other verbs do not count.
        metrics
            .request_duration
            .with_label_values(&["bind"])
            .observe(1.0);
        let after = FilterCalls::read(&metrics.render().expect("render"));
        let batch = after.since(before);
        assert_eq!(batch.calls, 2.0);
        assert!((batch.seconds - 0.005).abs() < 1e-12, "{batch:?}");
    }

    #[test]
    fn the_report_gives_both_ratios_and_each_process_per_pod() {
        let report = report(
            &[
                measured(true, 4, &[("kube-scheduler", 2000), ("gpu-extender", 3000)]),
                measured(false, 2, &[("kube-scheduler", 4000)]),
            ],
            10,
        );
        assert!(
            report.contains("with / without: 250.0 / 500.0 pods/s = 0.50x"),
            "{report}"
        );
        assert!(
            report.contains("CPU per pod, all processes: 5.00 / 4.00 ms = 1.25x"),
            "{report}"
        );
        assert!(
            report.contains("| 2.00 | - | - | 3.00 | 5.00 |"),
            "{report}"
        );
        assert!(
            report.contains("| 4.00 | - | - | - | 4.00 | - |"),
            "{report}"
        );
        assert!(report.contains("| 5.00 | 0.250 |"), "{report}");
        assert!(
            report.contains(
                "time per pod: 4.000 / 2.000 ms (+2.000 ms); the extender's filter handler: 0.250 ms of it (1.00 filter calls per pod)"
            ),
            "{report}"
        );
    }
}
