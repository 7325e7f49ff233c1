//! Every KubeSchedulerConfiguration shipped in `scheduler-config/` is loaded by a real
//! kube-scheduler and schedules a GPU pod through the extender; the extender's metrics move as it
//! does.

use std::time::Instant;

use anyhow::{Context, Result, ensure};

use crate::BIND;
use crate::harness::{ROOT, metric_sum};
use crate::objects::{GPU_MEM, GpuNode, Mode, PodSpec, create_bound, create_nodes};
use crate::record::record_of;

/// The scheduler configurations in the repository, sorted.
fn shipped_configs() -> Result<Vec<String>> {
    let dir = std::path::Path::new(ROOT).join("scheduler-config");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".yaml") || f.ends_with(".yml"))
        .map(|f| format!("scheduler-config/{f}"))
        .collect();
    files.sort();
    Ok(files)
}

/// The profile a GPU pod should select under this configuration: `gpu-scheduler` when the file
/// has it, else the last profile (the default scheduler extended in place).
fn gpu_profile(path: &str) -> Result<String> {
    let text = std::fs::read_to_string(std::path::Path::new(ROOT).join(path))?;
    let config: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text)?;
    ensure!(
        config["apiVersion"].as_str() == Some("kubescheduler.config.k8s.io/v1"),
        "{path}: apiVersion {:?}",
        config["apiVersion"]
    );
    let names: Vec<String> = config["profiles"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|p| p["schedulerName"].as_str().map(str::to_owned))
        .collect();
    if names.iter().any(|n| n == crate::harness::GPU_SCHEDULER) {
        return Ok(crate::harness::GPU_SCHEDULER.to_owned());
    }
    Ok(names
        .last()
        .cloned()
        .unwrap_or_else(|| "default-scheduler".to_owned()))
}

/// Whether the configuration's extender lists `managedResources` (is called only for pods
/// that ask for them).
fn lists_managed_resources(path: &str) -> Result<bool> {
    let text = std::fs::read_to_string(std::path::Path::new(ROOT).join(path))?;
    let config: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text)?;
    Ok(config["extenders"][0].get("managedResources").is_some())
}

fn counter(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_sum(text, name, labels)
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn each_shipped_scheduler_config_schedules_a_gpu_pod_through_the_extender() {
    crate::harness::run("configs", async |c| {
        let configs = shipped_configs()?;
        ensure!(configs.len() >= 2, "scheduler-config/ holds {configs:?}");
        create_nodes(
            &c.client,
            &[GpuNode::new("t4", Mode::Share, 4, "Tesla-T4", 16)],
        )
        .await?;
        c.start_extender("").await?;
        for (i, config) in configs.iter().enumerate() {
            let profile = gpu_profile(config)?;
            let t0 = Instant::now();
            c.start_scheduler(config).await?;
            let before = c.metrics().await?;
            let name = format!("via-{i}");
            let pod = create_bound(
                &c.client,
                &PodSpec::new(&name, GPU_MEM, 2).scheduler(&profile),
                BIND,
            )
            .await
            .with_context(|| format!("{config} (profile {profile})"))?;
            let record = record_of(&pod).with_context(|| config.clone())?;
            let after = c.metrics().await?;
            let moved = |name: &str, labels: &[(&str, &str)]| {
                counter(&after, name, labels) - counter(&before, name, labels)
            };
            for (verb, outcome) in [("filter", "ok"), ("bind", "ok")] {
                let labels = [("verb", verb), ("outcome", outcome)];
                ensure!(
                    moved("gpu_extender_requests_total", &labels) >= 1.0,
                    "{config}: gpu_extender_requests_total{{verb={verb},outcome={outcome}}} did \
                     not move"
                );
            }
            ensure!(
                moved("gpu_extender_binds_total", &[]) >= 1.0,
                "{config}: gpu_extender_binds_total did not move"
            );
            ensure!(
                moved(
                    "gpu_extender_request_duration_seconds_count",
                    &[("verb", "filter")]
                ) >= 1.0,
                "{config}: the filter latency histogram did not move"
            );
            // A pod without GPUs: a configuration with `managedResources` schedules it without
            // the extender (on the default profile); the dedicated GPU scheduler, which has
            // none, sends the extender every pod of its profile, and the policy places it.
            let plain = format!("plain-{i}");
            let dedicated = !lists_managed_resources(config)?;
            let before = c.metrics().await?;
            create_bound(
                &c.client,
                &PodSpec::empty(&plain)
                    .container("main", &[])
                    .scheduler(if dedicated {
                        profile.as_str()
                    } else {
                        "default-scheduler"
                    }),
                BIND,
            )
            .await
            .with_context(|| format!("{config}: a pod without GPUs"))?;
            let after_plain = c.metrics().await?;
            let calls = |text: &str| counter(text, "gpu_extender_requests_total", &[]);
            if dedicated {
                ensure!(
                    calls(&after_plain) > calls(&before),
                    "{config}: a pod without GPUs of the dedicated scheduler missed the extender"
                );
            } else {
                ensure!(
                    calls(&after_plain) == calls(&before),
                    "{config}: a pod without GPUs reached the extender"
                );
            }
            eprintln!(
                "  {config}: pod {name} ({profile}) bound to {} GPU {:?} in {:.1}s",
                record.node,
                record.all_gpus(),
                t0.elapsed().as_secs_f64()
            );
        }
        Ok(())
    });
}
