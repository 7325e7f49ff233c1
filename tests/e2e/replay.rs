//! `gpu-lab replay`: the simulator's trace through a real kube-apiserver, kube-scheduler and
//! gpu-extender. The real loop must place as `simulate` does, in its own loopback plane or in a
//! cluster a kubeconfig names; bad input gets a clear error and leaves nothing behind.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, ListParams, PostParams};

use crate::harness::{self, Cluster, EXTENDER_BIN, ROOT};

/// The replay's owner label and namespace (crates/lab/src/replay/objects.rs).
const OWNER_LABEL: &str = "gpu-extender.io/replay";
const NAMESPACE: &str = "gpu-extender-replay";

/// The largest difference in GPU allocation (points of capacity) allowed between the real loop
/// and `simulate` at any arrival point. The two differ only where the policy scores several
/// nodes equal: `simulate` prefers the node its seeded permutation ranks first, the extender the
/// node its name hash ranks first. On the built-in example both policies below measured 0.00 at
/// every point (docs/benchmarks.md "In-cluster replay"); half a point leaves room for a tie
/// between unlike nodes without letting a real divergence (a decision kube-scheduler made
/// instead of the policy: 4.1 points on this example before decision 0006) through.
const TOLERANCE: f64 = 0.5;

/// The lab binary, which cargo builds into the directory of the extender this test runs (`make
/// test-e2e` builds it first: the e2e tests belong to the service's package, which cannot name
/// another package's binary).
fn lab_bin() -> Result<PathBuf> {
    let lab = Path::new(EXTENDER_BIN).with_file_name("gpu-lab");
    ensure!(
        lab.is_file(),
        "{} is missing: build it with `cargo build -p gpu-lab` (make test-e2e does)",
        lab.display()
    );
    Ok(lab)
}

fn replay(args: &[&str], bins: &Path) -> Result<Output> {
    Command::new(lab_bin()?)
        .arg("replay")
        .args(["--repo", ROOT, "--quiet"])
        .args(args)
        .env("GPU_TEST_K8S_BIN", bins)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .context("running gpu-lab replay")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The loopback planes' working directories that exist now.
fn plane_dirs() -> Vec<PathBuf> {
    std::fs::read_dir(std::env::temp_dir())
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("gpu-extender-replay-"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Checks compare.csv: every arrival point within [`TOLERANCE`], for every policy given.
fn check_compare(out: &Path, policies: &[&str]) -> Result<()> {
    let compare = std::fs::read_to_string(out.join("compare.csv"))
        .with_context(|| format!("reading {}", out.join("compare.csv").display()))?;
    for policy in policies {
        let mut rows = 0;
        let mut worst: (f64, String) = (0.0, String::new());
        for line in compare.lines().skip(1) {
            let fields: Vec<&str> = line.split(',').collect();
            ensure!(fields.len() == 7, "compare.csv row {line:?}");
            let name = fields[1].strip_prefix("engine-").unwrap_or(fields[1]);
            if name != *policy {
                continue;
            }
            rows += 1;
            let difference: f64 = fields[6].parse()?;
            if difference.abs() > worst.0.abs() {
                worst = (difference, line.to_owned());
            }
        }
        ensure!(rows > 100, "{policy}: {rows} arrival points compared");
        ensure!(
            worst.0.abs() <= TOLERANCE,
            "{policy}: the real loop differs from simulate by {:+.2} points (row {})",
            worst.0,
            worst.1
        );
    }
    Ok(())
}

/// Checks decisions.csv against runs.csv: one row per submitted pod, numbered in arrival order,
/// as many unschedulable as the run counts failed, every bound pod on one of the replay's
/// nodes, none where `simulate` does not fit it, and binpack's all on its best node.
fn check_decisions(out: &Path) -> Result<()> {
    let decisions = std::fs::read_to_string(out.join("decisions.csv"))?;
    let runs = std::fs::read_to_string(out.join("runs.csv"))?;
    let mut lines = decisions.lines();
    ensure!(lines.next() == Some("trace,policy,seed,arrival,pod,node,choice"));
    let rows: Vec<Vec<&str>> = lines.map(|line| line.split(',').collect()).collect();
    ensure!(rows.iter().all(|row| row.len() == 7), "decisions.csv rows");
    for run in runs.lines().skip(1) {
        let fields: Vec<&str> = run.split(',').collect();
        let (policy, pods, failed) = (fields[1], fields[3].parse::<usize>()?, fields[5]);
        let mine: Vec<&Vec<&str>> = rows.iter().filter(|row| row[1] == policy).collect();
        ensure!(
            mine.len() == pods,
            "{policy}: {} rows for {pods} pods",
            mine.len()
        );
        ensure!(
            mine.iter()
                .enumerate()
                .all(|(i, row)| row[3] == (i + 1).to_string()),
            "{policy}: arrivals out of order"
        );
        let unschedulable = mine.iter().filter(|row| row[6] == "unschedulable").count();
        ensure!(
            unschedulable.to_string() == failed,
            "{policy}: {unschedulable} unschedulable rows, runs.csv says {failed} failed"
        );
        for row in &mine {
            let bound = ["best", "below_best"].contains(&row[6]);
            ensure!(
                bound == row[5].starts_with("replay-") && (bound || row[6] == "unschedulable"),
                "{policy}: row {row:?}"
            );
        }
        if policy.ends_with("binpack") {
            ensure!(mine.iter().all(|row| row[6] != "below_best"));
        }
    }
    Ok(())
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn replay_the_real_loop_places_as_simulate_does() {
    harness::run_with_bins("replay_the_real_loop_places_as_simulate_does", |bins| {
        let out = tempfile_dir("replay-out")?;
        let before = plane_dirs();
        let output = replay(
            &[
                "--policies",
                "binpack,fgd-plus",
                "--compare",
                "--out",
                &out.to_string_lossy(),
            ],
            bins,
        )?;
        ensure!(output.status.success(), "replay failed:\n{}", text(&output));
        let printed = text(&output);
        ensure!(
            printed.contains("simulate vs the real loop"),
            "no comparison printed:\n{printed}"
        );
        // 32 nodes, fewer than kube-scheduler's 100-node floor: it sends every node it finds
        // feasible, so a node outside the candidates is one it refused, and a window miss
        // counted here would be the check disagreeing with kube-scheduler.
        let misses = printed
            .lines()
            .filter(|line| line.contains("gpu_extender_filter_window_misses_total"))
            .collect::<Vec<_>>();
        ensure!(
            misses.len() == 2 && misses.iter().all(|line| line.starts_with("replay: 0 ")),
            "the window misses, one line per policy, all 0:\n{printed}"
        );
        // For the same reason binpack (whose scores no trailing scarcity measure moves) binds
        // every pod to a node it scores as high as any in the cluster, and neither policy binds
        // a pod where `simulate`'s model of the state does not fit it.
        let choices = printed
            .lines()
            .filter(|line| line.contains("bound pods went to a node the policy scores below"))
            .collect::<Vec<_>>();
        ensure!(
            choices.len() == 2
                && choices[0].starts_with("replay: 0 of ")
                && choices.iter().all(|line| !line.contains("does not fit")),
            "the choice lines, binpack's first with none below the best:\n{printed}"
        );
        for file in [
            "runs.csv",
            "discrete.csv",
            "steps.csv",
            "summary.md",
            "compare.csv",
            "decisions.csv",
        ] {
            ensure!(out.join(file).is_file(), "{file} was not written");
        }
        ensure!(out.join("simulate/discrete.csv").is_file());
        check_compare(&out, &["binpack", "fgd-plus"])?;
        check_decisions(&out)?;
        let after = plane_dirs();
        ensure!(
            after.iter().all(|dir| before.contains(dir)),
            "the loopback plane was left behind: {after:?}"
        );
        std::fs::remove_dir_all(&out).ok();
        Ok(())
    });
}

/// Four nodes of 4 GPUs; eight GPU pods claiming one device each (two of them for a share of a
/// GPU, which claims a whole device in DRA mode) and two small CPU-only pods.
const DRA_SCENARIO: &str = "\
name: dra-spread
nodes:
  - name: n
    count: 4
    cpu_milli: 64000
    memory_mib: 262144
    gpus: 4
    model: T4
pods:
  - name: whole
    count: 6
    cpu_milli: 4000
    memory_mib: 8192
    gpus: 1
  - name: share
    count: 2
    cpu_milli: 4000
    memory_mib: 8192
    gpus: 1
    gpu_milli: 500
  - name: cpu
    count: 2
    cpu_milli: 100
    memory_mib: 100
";

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn replay_dra_claims_are_allocated_where_the_extender_ranked() {
    harness::run_with_bins(
        "replay_dra_claims_are_allocated_where_the_extender_ranked",
        |bins| {
            let dir = tempfile_dir("replay-dra")?;
            let scenario = dir.join("scenario.yaml");
            std::fs::write(&scenario, DRA_SCENARIO)?;
            let out = dir.join("out");
            let output = replay(
                &[
                    "--scenario",
                    &scenario.to_string_lossy(),
                    "--dra",
                    "--tune",
                    "0",
                    "--policies",
                    "kube-default,binpack",
                    "--compare",
                    "--out",
                    &out.to_string_lossy(),
                ],
                bins,
            )?;
            ensure!(output.status.success(), "replay failed:\n{}", text(&output));
            let printed = text(&output);
            ensure!(
                printed.contains("kube-scheduler alone")
                    && printed.contains("kube-scheduler with the extender's DRA stanza"),
                "both setups:\n{printed}"
            );
            // Every pod bound (a GPU pod's node read from its claim's allocation: the replay
            // fails on a bound pod whose claim is not allocated there), each to a node
            // kube-scheduler's totals rank best as `simulate --dra` computes them.
            let decisions = std::fs::read_to_string(out.join("decisions.csv"))?;
            let rows: Vec<Vec<&str>> = decisions
                .lines()
                .skip(1)
                .map(|line| line.split(',').collect())
                .collect();
            ensure!(rows.len() == 20, "10 pods under each policy: {decisions}");
            ensure!(
                rows.iter().all(|row| row[6] == "best"),
                "every pod bound to the best node:\n{decisions}"
            );
            // GPU pods per node: kube-scheduler alone spreads them two to a node (LeastAllocated
            // prefers the emptier node); the extender's ranking under binpack fills two nodes.
            let gpu_pods_per_node = |policy: &str| {
                let mut per_node: std::collections::BTreeMap<&str, usize> = Default::default();
                for row in rows.iter().filter(|row| row[1] == policy) {
                    if !row[4].contains("-cpu-") {
                        *per_node.entry(row[5]).or_default() += 1;
                    }
                }
                per_node.into_values().collect::<Vec<_>>()
            };
            ensure!(
                gpu_pods_per_node("kube-default") == [2, 2, 2, 2],
                "kube-scheduler alone: {:?}\n{decisions}",
                gpu_pods_per_node("kube-default")
            );
            ensure!(
                gpu_pods_per_node("engine-binpack") == [4, 4],
                "with the extender's ranking: {:?}\n{decisions}",
                gpu_pods_per_node("engine-binpack")
            );
            // And `simulate --dra` allocates the same at every arrival point.
            let compare = std::fs::read_to_string(out.join("compare.csv"))?;
            let differences: Vec<f64> = compare
                .lines()
                .skip(1)
                .map(|line| line.rsplit(',').next().unwrap_or_default().parse())
                .collect::<Result<_, _>>()?;
            ensure!(
                !differences.is_empty() && differences.iter().all(|d| d.abs() < 1e-9),
                "simulate --dra against the real loop:\n{compare}"
            );
            std::fs::remove_dir_all(&dir).ok();
            Ok(())
        },
    );
}

/// A small cluster and a workload whose pods leave (`creation_time`, `deletion_time`), in the
/// openb CSV layout: 8 nodes of 8 GPUs and 16 of 2 (96 GPUs), and 240 pods arriving every 10 s
/// that live 1,200 to 2,800 s: the cluster fills (`simulate` turns 8 pods away under either
/// policy, seed 42) and empties again as they leave (86.5% in use at the end). Drawn from a
/// fixed linear congruential sequence, so every run replays the same workload.
fn departures_workload(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let nodes = dir.join("nodes.csv");
    let mut text = String::from("sn,cpu_milli,memory_mib,gpu,model\n");
    for i in 0..8 {
        text.push_str(&format!("big-{i},96000,786432,8,V100M32\n"));
    }
    for i in 0..16 {
        text.push_str(&format!("small-{i},64000,262144,2,T4\n"));
    }
    std::fs::write(&nodes, text)?;
    let pods = dir.join("pods.csv");
    let mut text = String::from(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time\n",
    );
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut draw = |below: u64| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % below
    };
    for i in 0..240u64 {
        // Shares, whole GPUs, two and four GPUs, CPU-only pods.
        let (gpus, milli) = match draw(10) {
            0..=2 => (1, [250, 460, 500][draw(3) as usize]),
            3..=5 => (1, 1000),
            6 => (2, 1000),
            7 => (4, 1000),
            _ => (0, 0),
        };
        let cpu = 2000 + 2000 * draw(6);
        let created = 10 * i;
        let deleted = created + 1200 + 200 * draw(9);
        text.push_str(&format!(
            "dep-{i:03},{cpu},{},{gpus},{milli},,{created},{deleted}\n",
            cpu * 4
        ));
    }
    std::fs::write(&pods, text)?;
    Ok((nodes, pods))
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn replay_with_departures_frees_what_leaves_as_simulate_does() {
    harness::run_with_bins(
        "replay_with_departures_frees_what_leaves_as_simulate_does",
        |bins| {
            let out = tempfile_dir("replay-departures-out")?;
            let (nodes, pods) = departures_workload(&out)?;
            let output = replay(
                &[
                    "--nodes",
                    &nodes.to_string_lossy(),
                    "--trace",
                    &pods.to_string_lossy(),
                    "--departures",
                    "--policies",
                    "binpack,fgd-plus",
                    "--compare",
                    "--out",
                    &out.join("result").to_string_lossy(),
                ],
                bins,
            )?;
            ensure!(output.status.success(), "replay failed:\n{}", text(&output));
            let result = out.join("result");
            check_compare(&result, &["binpack", "fgd-plus"])?;
            check_decisions(&result)?;
            // The cluster filled: what a departure frees decides whether later pods fit, so a
            // view that missed one would turn pods away that `simulate` places.
            let runs = std::fs::read_to_string(result.join("runs.csv"))?;
            for run in runs.lines().skip(1) {
                let failed: usize = run.split(',').nth(5).context("runs.csv row")?.parse()?;
                ensure!(
                    failed > 0,
                    "no pod was turned away, the cluster never filled: {run}"
                );
            }
            // Departures happened in the real loop: the GPUs in use fell between two arrivals
            // (steps.csv: arrived then used milli-GPU, per pod, each run's rows in order).
            let steps = std::fs::read_to_string(result.join("steps.csv"))?;
            let mut header = steps
                .lines()
                .next()
                .context("steps.csv is empty")?
                .split(',');
            let used_column = header
                .position(|name| name == "used_milli")
                .context("steps.csv has no used_milli column")?;
            let used: Vec<(String, f64)> = steps
                .lines()
                .skip(1)
                .filter_map(|line| {
                    let fields: Vec<&str> = line.split(',').collect();
                    let run = fields.get(..3)?.join(",");
                    Some((run, fields.get(used_column)?.parse().ok()?))
                })
                .collect();
            let falls = used
                .windows(2)
                .filter(|pair| pair[0].0 == pair[1].0 && pair[1].1 < pair[0].1)
                .count();
            ensure!(
                falls > 10,
                "the GPUs in use fell {falls} times: pods did not leave"
            );
            std::fs::remove_dir_all(&out).ok();
            Ok(())
        },
    );
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn replay_the_throughput_mode_measures_both_setups() {
    harness::run_with_bins("replay_the_throughput_mode_measures_both_setups", |bins| {
        let out = tempfile_dir("throughput-out")?;
        let output = replay(
            &[
                "--throughput",
                "--throughput-nodes",
                "20",
                "--throughput-pods",
                "60",
                "--out",
                &out.to_string_lossy(),
            ],
            bins,
        )?;
        ensure!(
            output.status.success(),
            "throughput failed:\n{}",
            text(&output)
        );
        let report = std::fs::read_to_string(out.join("throughput.md"))?;
        for needle in [
            "with gpu-extender",
            "without (baseline)",
            "with / without:",
            "CPU per pod, all processes:",
        ] {
            ensure!(
                report.contains(needle),
                "{needle:?} missing from:\n{report}"
            );
        }
        // Every process's CPU is accounted for, the extender's only in the run it took part in.
        let with = report
            .lines()
            .find(|l| l.starts_with("| with gpu-extender"))
            .context("no row with the extender")?;
        // | setup | pods | nodes | seconds | pods/s | kube-scheduler | kube-apiserver | etcd | gpu-extender | all |
        let extender_cpu = with.split('|').nth(9).map(str::trim).unwrap_or("-");
        ensure!(
            extender_cpu.parse::<f64>().is_ok_and(|ms| ms > 0.0),
            "the extender's CPU is missing: {with}"
        );
        std::fs::remove_dir_all(&out).ok();
        Ok(())
    });
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn replay_into_a_cluster_by_kubeconfig_and_leave_it_as_it_was() {
    harness::run(
        "replay_into_a_cluster_by_kubeconfig_and_leave_it_as_it_was",
        async |c: &mut Cluster| {
            // The cluster's own extender and kube-scheduler, set up as a replay needs them
            // (docs/simulate.md "In a real cluster").
            c.start_extender(
                "resources:\n  gpuCorePercentStep: 1\n  gpuCoreWithoutMemory: true\n\
                 policy:\n  filterBestOnly: true\n  maxPodsPerSharedGpu: 1000\n",
            )
            .await?;
            c.start_scheduler("scheduler-config/gpu-scheduler-dedicated.yaml")
                .await?;
            let bins = std::env::var_os(harness::BIN_ENV)
                .map(PathBuf::from)
                .unwrap_or_default();
            let out = tempfile_dir("replay-kubeconfig-out")?;
            let output = replay(
                &[
                    "--kubeconfig",
                    &c.kubeconfig().to_string_lossy(),
                    "--policies",
                    "binpack",
                    "--compare",
                    "--out",
                    &out.to_string_lossy(),
                ],
                &bins,
            )?;
            ensure!(output.status.success(), "replay failed:\n{}", text(&output));
            check_compare(&out, &["binpack"])?;
            ensure_nothing_left(&c.client).await?;
            std::fs::remove_dir_all(&out).ok();
            Ok(())
        },
    );
}

#[test]
#[ignore = "end-to-end: needs the Kubernetes binaries; make test runs it, or cargo test --test e2e -- --ignored"]
fn replay_refuses_bad_input_clearly_and_leaves_nothing() {
    harness::run(
        "replay_refuses_bad_input_clearly_and_leaves_nothing",
        async |c: &mut Cluster| {
            let bins = std::env::var_os(harness::BIN_ENV)
                .map(PathBuf::from)
                .unwrap_or_default();
            let before = plane_dirs();

            // A trace folder that does not exist: named in the error, before anything starts.
            let output = replay(&["--trace-dir", "/nonexistent/openb"], &bins)?;
            ensure!(!output.status.success(), "a missing trace was accepted");
            ensure!(
                text(&output).contains("/nonexistent/openb"),
                "the error does not name the folder:\n{}",
                text(&output)
            );

            // An unreachable API server.
            let unreachable = c.dir.join("unreachable.kubeconfig");
            let kubeconfig = std::fs::read_to_string(c.kubeconfig())?;
            let port = harness::free_port()?;
            let rewritten: String = kubeconfig
                .lines()
                .map(|line| {
                    if line.trim_start().starts_with("server:") {
                        format!("    server: https://127.0.0.1:{port}")
                    } else {
                        line.to_owned()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n");
            std::fs::write(&unreachable, rewritten)?;
            let output = replay(&["--kubeconfig", &unreachable.to_string_lossy()], &bins)?;
            ensure!(!output.status.success(), "an unreachable API was accepted");
            ensure!(
                text(&output).contains("is the API server reachable?"),
                "unclear error:\n{}",
                text(&output)
            );

            // A node of the replay's name prefix that is not the replay's.
            let nodes: Api<Node> = Api::all(c.client.clone());
            let foreign: Node = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "replay-someone-elses"},
            }))?;
            nodes.create(&PostParams::default(), &foreign).await?;
            let count = nodes
                .list_metadata(&ListParams::default())
                .await?
                .items
                .len();
            let output = replay(&["--kubeconfig", &c.kubeconfig().to_string_lossy()], &bins)?;
            ensure!(!output.status.success(), "a foreign node was ignored");
            ensure!(
                text(&output).contains("replay-someone-elses"),
                "the error does not name the node:\n{}",
                text(&output)
            );
            ensure!(
                nodes
                    .list_metadata(&ListParams::default())
                    .await?
                    .items
                    .len()
                    == count,
                "the refused replay created nodes"
            );
            ensure_nothing_left(&c.client).await?;
            let after = plane_dirs();
            ensure!(
                after.iter().all(|dir| before.contains(dir)),
                "a loopback plane was left behind: {after:?}"
            );
            Ok(())
        },
    );
}

/// No node carries the replay's label and its namespace is gone (or going).
async fn ensure_nothing_left(client: &kube::Client) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let labelled = nodes
        .list_metadata(&ListParams::default().labels(OWNER_LABEL))
        .await?;
    ensure!(
        labelled.items.is_empty(),
        "{} replay nodes were left behind",
        labelled.items.len()
    );
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if let Some(namespace) = namespaces.get_metadata_opt(NAMESPACE).await?
        && namespace.metadata.deletion_timestamp.is_none()
    {
        bail!("namespace {NAMESPACE} was left behind");
    }
    Ok(())
}

/// A fresh directory under the system's temporary directory.
fn tempfile_dir(name: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("gpu-extender-e2e-{name}-{}", std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
