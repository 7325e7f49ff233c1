//! The `replay` command: one run per (policy, seed) on a fresh loopback plane (or on
//! the cluster a kubeconfig names), the outputs `simulate` writes, and the `--compare` summary
//! of the real loop against `simulate` at every arrival point. `main.rs` only parses
//! [`ReplayArgs`] and calls [`run_cli`].

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::args::ReplayArgs;
use super::objects::{dns_name, extender_config, with_extender_set};
use gpu_test_support::bins::k8s_bins;

use gpu_test_support::metrics::series_value;
use gpu_test_support::plane::client_from;

use super::plane::{Plane, SchedulerSetup};
use super::run::{
    ChoiceTally, Decision, PodDecision, ReplayPlan, Replayed, clean_up, create_claims,
    create_cluster, gpu_api, refuse_foreign_objects, replay_pods,
};
use super::throughput::run_throughput;
use gpu_engine::ScoringPolicy;
use gpu_sim::cli::{parse_seeds, write_outputs};
use gpu_sim::{Cluster, Prepared, RunResult};

/// The `replay` command.
pub async fn run_cli(args: ReplayArgs) -> Result<()> {
    if args.throughput.enabled {
        if args.dra {
            bail!("--dra replays a trace; the throughput mode measures device-plugin GPU pods");
        }
        return run_throughput(&args).await;
    }
    let seeds = parse_seeds(&args.seeds)?;
    let policies = parse_replay_policies(&args.policies, args.dra)?;
    if !args.tune.is_finite() || args.tune < 0.0 {
        bail!("--tune must be a non-negative number, got {}", args.tune);
    }
    let (cluster, workloads) = args.inputs.resolve()?;
    if args.kubeconfig.is_some()
        && (args.scheduler_config.is_some()
            || args.percentage_of_nodes_to_score.is_some()
            || args.scheduler_qps.is_some()
            || !args.extender_set.is_empty()
            || args.extender_https)
    {
        bail!(
            "--scheduler-config, --percentage-of-nodes-to-score, --scheduler-qps, \
             --extender-set and --extender-https configure the loopback plane; with --kubeconfig \
             the cluster's own kube-scheduler and gpu-extender decide"
        );
    }
    let setup = args.scheduler_setup()?;
    let mut real = Vec::new();
    let mut simulated = Vec::new();
    // Per run of `real`, in the same order: what became of each pod.
    let mut decisions: Vec<Vec<PodDecision>> = Vec::new();
    for workload in &workloads {
        let prepared = if args.dra {
            Prepared::new_dra(&cluster, workload)
        } else {
            Prepared::new(&cluster, workload)
        };
        let prepared = if args.departures {
            prepared.with_departures()?
        } else {
            prepared
        };
        for &scoring in &policies {
            for &seed in &seeds {
                let replayed = replay_one(&args, &setup, &cluster, &prepared, scoring, seed)
                    .await
                    .with_context(|| {
                        format!(
                            "replaying {} under {} (seed {seed})",
                            prepared.trace,
                            policy_name(scoring)
                        )
                    })?;
                eprintln!(
                    "replay {} {} seed {seed}: {} pods in {:.1} s ({:.1} pods/s), {} unschedulable",
                    prepared.trace,
                    policy_name(scoring),
                    replayed.result.pods,
                    replayed.elapsed.as_secs_f64(),
                    replayed.result.pods as f64 / replayed.elapsed.as_secs_f64().max(1e-9),
                    replayed.result.failed,
                );
                eprintln!("{}", choices_line(&replayed.choices, args.dra));
                if args.compare {
                    // The policy the extender ran, its FGD+ knobs as configured.
                    simulated.push(gpu_sim::replay::run(
                        &prepared,
                        replayed.result.policy,
                        seed,
                        args.tune,
                        true,
                        &|_| {},
                    ));
                }
                real.push(replayed.result);
                decisions.push(replayed.decisions);
            }
        }
    }
    let written = write_outputs(&args.out, &real, args.tune)?;
    let path = args.out.join("decisions.csv");
    std::fs::write(&path, decisions_csv(&real, &decisions)?)
        .with_context(|| format!("writing {}", path.display()))?;
    print!("{}", gpu_sim::report::summary_markdown(&real));
    if args.compare {
        let simulate = write_outputs(&args.out.join("simulate"), &simulated, args.tune)?;
        let path = args.out.join("compare.csv");
        std::fs::write(&path, compare_csv(&simulated, &real)?)
            .with_context(|| format!("writing {}", path.display()))?;
        print!("{}", compare_summary(&simulated, &real));
        println!("{simulate}; compare.csv to {}", written.dir.display());
    }
    println!("{written}");
    Ok(())
}

/// Parses the extender policy names.
pub fn parse_scoring(names: &[String]) -> Result<Vec<ScoringPolicy>> {
    let mut policies = Vec::new();
    for name in names {
        let policy = ScoringPolicy::ALL
            .into_iter()
            .find(|p| p.as_str() == name.trim())
            .with_context(|| {
                let known: Vec<&str> = ScoringPolicy::ALL.iter().map(|p| p.as_str()).collect();
                format!("unknown policy {name:?}; known: {}", known.join(", "))
            })?;
        if !policies.contains(&policy) {
            policies.push(policy);
        }
    }
    Ok(policies)
}

/// The extender policy names, and in DRA mode (`dra`) `kube-default` for kube-scheduler alone
/// (`None`: no extender).
pub fn parse_replay_policies(names: &[String], dra: bool) -> Result<Vec<Option<ScoringPolicy>>> {
    let mut policies = Vec::new();
    for name in names {
        let policy = if name.trim() == gpu_sim::replay::KUBE_DEFAULT {
            if !dra {
                bail!(
                    "{} is kube-scheduler alone placing pods whose GPUs are DRA claims: give --dra",
                    gpu_sim::replay::KUBE_DEFAULT
                );
            }
            None
        } else {
            parse_scoring(std::slice::from_ref(name))?.first().copied()
        };
        if !policies.contains(&policy) {
            policies.push(policy);
        }
    }
    Ok(policies)
}

/// A replay policy's name: the extender's policy, or `kube-default`.
fn policy_name(scoring: Option<ScoringPolicy>) -> &'static str {
    scoring.map_or(gpu_sim::replay::KUBE_DEFAULT, ScoringPolicy::as_str)
}

/// What the candidates kube-scheduler sent cost the policy's choices, in one line. In DRA mode
/// (`dra`) kube-scheduler's totals (its own scores, the extender's ranking added) rank the nodes.
fn choices_line(choices: &ChoiceTally, dra: bool) -> String {
    let mut line = if dra {
        format!(
            "replay: {} of {} bound pods went to a node kube-scheduler's totals (its own scores \
             and the extender's ranking, as simulate --dra computes them) rank below the best \
             fitting node of the whole cluster",
            choices.below_best, choices.bound
        )
    } else {
        format!(
            "replay: {} of {} bound pods went to a node the policy scores below the best \
             fitting node of the whole cluster (a node kube-scheduler did not send the extender)",
            choices.below_best, choices.bound
        )
    };
    if let Some(first) = choices.first_below {
        let _ = write!(line, "; the first was arrival {}", first + 1);
    }
    let _ = write!(
        line,
        "; {} of {} unschedulable pods fit a node of the whole cluster",
        choices.unschedulable_fit, choices.unschedulable
    );
    if choices.retried > 0 {
        let _ = write!(
            line,
            "; {} turned away while a node had room (a window that hid it, or right after \
             departures) were bound on kube-scheduler's retry",
            choices.retried
        );
    }
    if choices.not_fit > 0 {
        let _ = write!(
            line,
            "; {} went to a node `simulate` does not fit them on",
            choices.not_fit
        );
    }
    line
}

/// One (workload, policy, seed) through the real loop, on a fresh loopback plane or in the
/// kubeconfig's cluster; everything created is removed afterwards, also on failure.
async fn replay_one(
    args: &ReplayArgs,
    setup: &SchedulerSetup,
    cluster: &Cluster,
    prepared: &Prepared,
    scoring: Option<ScoringPolicy>,
    seed: u64,
) -> Result<Replayed> {
    // Without the extender (kube-default) the configuration only names the resources the
    // objects ask for; its policy is not run.
    let config = with_extender_set(
        extender_config(
            scoring.unwrap_or(ScoringPolicy::Binpack),
            prepared.typical(),
            prepared.workload(),
        ),
        &args.extender_set,
    )?;
    config
        .validate()
        .context("the replay's extender configuration")?;
    // A label value: the names the objects module makes are of that shape.
    let run_id = format!(
        "{}-{}-{seed}",
        dns_name(&prepared.trace),
        policy_name(scoring)
    );
    let api = gpu_api(prepared);
    let plan = ReplayPlan {
        prepared,
        cluster,
        scoring,
        seed,
        tune: args.tune,
        scheduler_name: &args.scheduler_name,
        run_id: &run_id,
        config: &config,
        progress: !args.quiet,
        decision_timeout: Duration::from_secs(args.decision_timeout),
    };
    if let Some(kubeconfig) = &args.kubeconfig {
        let client = client_from(kubeconfig).await?;
        refuse_foreign_objects(&client).await?;
        let outcome = async {
            let names = create_cluster(&client, cluster, &run_id, &config, api).await?;
            create_claims(&client, &plan).await?;
            replay_pods(&client, &plan, &names).await
        }
        .await;
        let cleaned = clean_up(&client, &run_id, api).await;
        let replayed = outcome?;
        cleaned?;
        return Ok(replayed);
    }
    let started = Instant::now();
    let bins = k8s_bins(&args.repo)?;
    let mut plane = Plane::start(&args.repo, &bins, args.keep)?;
    if args.extender_https {
        plane.serve_extender_over_https()?;
    }
    let client = plane.client().await?;
    refuse_foreign_objects(&client).await?;
    let names = create_cluster(&client, cluster, &run_id, &config, api).await?;
    let claims = create_claims(&client, &plan).await?;
    // The extender and kube-scheduler start after the nodes (and in DRA mode the slices and
    // claims) exist, so both begin with all of them in their caches (the extender is ready only
    // once its table holds every node). In DRA mode kube-default runs kube-scheduler alone, and
    // an extender policy has the extender rank through the DRA stanza only.
    let with_extender = !args.dra || scoring.is_some();
    if with_extender {
        let extender = args.extender_bin()?;
        plane
            .start_extender(&extender, &config, &args.extender_set)
            .await?;
    }
    let setup = SchedulerSetup {
        with_extender,
        dra_stanza: args.dra && with_extender,
        ..setup.clone()
    };
    plane.start_scheduler(&setup).await?;
    if args.dra {
        eprintln!(
            "replay: DRA mode, {claims} ResourceClaims created; {}",
            if with_extender {
                "kube-scheduler with the extender's DRA stanza"
            } else {
                "kube-scheduler alone"
            }
        );
    }
    eprintln!(
        "replay: {} nodes, {} up in {:.1} s ({})",
        names.len(),
        if with_extender {
            "extender and kube-scheduler"
        } else {
            "kube-scheduler"
        },
        started.elapsed().as_secs_f64(),
        plane.dir().display()
    );
    let replayed = replay_pods(&client, &plan, &names).await?;
    if args.dra {
        // No filter calls: the DRA stanza only ranks.
        return Ok(replayed);
    }
    match window_misses(&plane).await {
        Ok(misses) => eprintln!(
            "replay: {misses} filter calls fitted none of kube-scheduler's candidates while \
             a node it did not send would have taken the pod \
             (gpu_extender_filter_window_misses_total)"
        ),
        Err(error) => eprintln!("replay: the extender's metrics could not be read: {error:#}"),
    }
    Ok(replayed)
}

/// The extender's `gpu_extender_filter_window_misses_total`, read from its metrics.
async fn window_misses(plane: &Plane) -> Result<u64> {
    const NAME: &str = "gpu_extender_filter_window_misses_total";
    let text = plane.extender_metrics().await?;
    series_value(&text, NAME)
        .map(|value| value as u64)
        .with_context(|| format!("no {NAME} sample in the extender's metrics"))
}

/// Arrival points where both curves have a value: `(k, simulate, real)`.
fn paired(simulated: &RunResult, real: &RunResult) -> Vec<(usize, f64, f64)> {
    simulated
        .curves
        .alloc
        .iter()
        .zip(&real.curves.alloc)
        .enumerate()
        .filter_map(|(k, (s, r))| Some((k, (*s)?, (*r)?)))
        .collect()
}

/// One row of `decisions.csv`: what became of one submitted pod.
#[derive(serde::Serialize)]
struct DecisionRow<'a> {
    trace: &'a str,
    policy: &'a str,
    seed: u64,
    arrival: usize,
    pod: &'a str,
    node: &'a str,
    choice: &'a str,
}

/// `trace,policy,seed,arrival,pod,node,choice` for every pod each run submitted
/// (`decisions[i]` of `real[i]`), in arrival order (from 1): the node it was bound to (empty
/// when unschedulable) and how that node ranks among the cluster's as the policy scores them
/// (`best`, `below_best`, `not_fit`), or `unschedulable`.
fn decisions_csv(real: &[RunResult], decisions: &[Vec<PodDecision>]) -> Result<String, csv::Error> {
    let header = [
        "trace", "policy", "seed", "arrival", "pod", "node", "choice",
    ];
    let names: Vec<String> = real.iter().map(|r| r.policy.name()).collect();
    let rows = real
        .iter()
        .zip(&names)
        .zip(decisions)
        .flat_map(|((result, policy), run)| {
            run.iter().enumerate().map(move |(index, decided)| {
                let (node, choice) = match &decided.decision {
                    Decision::Bound { node, choice } => (node.as_str(), choice.as_str()),
                    Decision::Unschedulable => ("", "unschedulable"),
                };
                DecisionRow {
                    trace: &result.trace,
                    policy,
                    seed: result.seed,
                    arrival: index + 1,
                    pod: &decided.pod,
                    node,
                    choice,
                }
            })
        });
    gpu_sim::report::csv_text(header, rows)
}

/// One row of `compare.csv`: the two curves at one arrival point, and real minus simulated.
#[derive(serde::Serialize)]
struct CompareRow<'a> {
    trace: &'a str,
    policy: &'a str,
    seed: u64,
    arrived_percent: usize,
    simulate: String,
    replay: String,
    difference: String,
}

/// `trace,policy,seed,arrived_percent,simulate,replay,difference` for every arrival point.
pub fn compare_csv(simulated: &[RunResult], real: &[RunResult]) -> Result<String, csv::Error> {
    let header = [
        "trace",
        "policy",
        "seed",
        "arrived_percent",
        "simulate",
        "replay",
        "difference",
    ];
    let names: Vec<String> = real.iter().map(|r| r.policy.name()).collect();
    let rows = simulated
        .iter()
        .zip(real)
        .zip(&names)
        .flat_map(|((s, r), name)| {
            paired(s, r)
                .into_iter()
                .map(move |(k, sim, rep)| CompareRow {
                    trace: &r.trace,
                    policy: name,
                    seed: r.seed,
                    arrived_percent: k,
                    simulate: format!("{sim:.2}"),
                    replay: format!("{rep:.2}"),
                    difference: format!("{:.2}", rep - sim),
                })
        });
    gpu_sim::report::csv_text(header, rows)
}

/// The largest difference at any arrival point from 1% on, and where.
pub fn largest_gap(simulated: &RunResult, real: &RunResult) -> Option<(usize, f64)> {
    paired(simulated, real)
        .into_iter()
        .filter(|&(k, _, _)| k >= 1)
        .map(|(k, s, r)| (k, r - s))
        .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
}

/// Both curves every 10 points from 50%, and the largest gap anywhere.
pub fn compare_summary(simulated: &[RunResult], real: &[RunResult]) -> String {
    let mut out = String::new();
    for (s, r) in simulated.iter().zip(real) {
        let _ = writeln!(
            out,
            "\n{} {} seed {}: GPU allocation %, simulate vs the real loop",
            r.trace,
            r.policy.name(),
            r.seed
        );
        let _ = writeln!(out, "arrived  simulate  replay  difference");
        for (k, sim, rep) in paired(s, r)
            .into_iter()
            .filter(|(k, _, _)| *k >= 50 && k % 10 == 0)
        {
            let _ = writeln!(out, "{k:>6}%  {sim:>8.2}  {rep:>6.2}  {:>+10.2}", rep - sim);
        }
        if let Some((k, gap)) = largest_gap(s, r) {
            let _ = writeln!(
                out,
                "largest difference: {gap:+.2} points at {k}% arrived; unschedulable pods: \
                 simulate {}, replay {}",
                s.failed, r.failed
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};
    use gpu_sim::replay::ChoiceRank;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: ReplayArgs,
    }

    /// `simulate`'s run of the built-in example under each policy, seed 42.
    fn example_runs<const N: usize>(policies: [ScoringPolicy; N]) -> [RunResult; N] {
        let scenario = gpu_sim::load::parse_scenario(
            std::path::Path::new("example"),
            gpu_sim::cli::EXAMPLE_SCENARIO,
        )
        .unwrap();
        let prepared = Prepared::new(&scenario.cluster.unwrap(), &scenario.workload.unwrap());
        policies.map(|scoring| {
            gpu_sim::replay::run(
                &prepared,
                gpu_sim::SimPolicy::engine(scoring),
                42,
                1.3,
                false,
                &|_| {},
            )
        })
    }

    #[test]
    fn compare_csv_pairs_the_curves_at_every_arrival_point() {
        let simulated = example_runs([ScoringPolicy::Binpack]);
        let real = example_runs([ScoringPolicy::Spread]);
        let csv = compare_csv(&simulated, &real).unwrap();
        let mut lines = csv.lines();
        assert_eq!(
            lines.next(),
            Some("trace,policy,seed,arrived_percent,simulate,replay,difference")
        );
        let pairs = paired(&simulated[0], &real[0]);
        let (k, sim, rep) = pairs[100];
        let row = format!(
            "small-example,engine-spread,42,{k},{sim:.2},{rep:.2},{:.2}",
            rep - sim
        );
        assert_eq!(lines.nth(100), Some(row.as_str()));
        assert_eq!(csv.lines().count(), 1 + pairs.len());
    }

    #[test]
    fn decisions_csv_lists_every_pod_of_every_run_under_one_header() {
        let real = example_runs([ScoringPolicy::Binpack, ScoringPolicy::FgdPlus]);
        let bound = |pod: &str, node: &str, choice| PodDecision {
            pod: pod.to_owned(),
            decision: Decision::Bound {
                node: node.to_owned(),
                choice,
            },
        };
        let decisions = [
            vec![
                bound("p-1", "replay-a", ChoiceRank::Best),
                PodDecision {
                    pod: "p-2".to_owned(),
                    decision: Decision::Unschedulable,
                },
            ],
            vec![bound("p-1", "replay-b", ChoiceRank::BelowBest)],
        ];
        let csv = decisions_csv(&real, &decisions).unwrap();
        assert_eq!(
            csv.lines().collect::<Vec<_>>(),
            [
                "trace,policy,seed,arrival,pod,node,choice",
                "small-example,engine-binpack,42,1,p-1,replay-a,best",
                "small-example,engine-binpack,42,2,p-2,,unschedulable",
                "small-example,fgd-plus,42,1,p-1,replay-b,below_best",
            ]
        );
    }

    #[tokio::test]
    async fn departures_without_lifetimes_are_refused_before_anything_starts() {
        // The built-in example's pods have no creation or deletion time.
        let args = Wrapper::try_parse_from([
            "replay".as_ref(),
            "--departures".as_ref(),
            // A checkout without the control-plane script: had the check not come first, the
            // run would fail there instead.
            "--repo".as_ref(),
            std::env::temp_dir().as_os_str(),
        ])
        .unwrap()
        .args;
        assert!(args.departures);
        let error = format!("{:#}", run_cli(args).await.unwrap_err());
        assert!(
            error.contains("needed for departures") && error.contains("creation_time"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_missing_throughput_extender_is_refused_before_anything_starts() {
        let missing = std::env::temp_dir().join("gpu-extender-no-such-extender");
        let args = Wrapper::try_parse_from([
            "replay".as_ref(),
            "--throughput".as_ref(),
            "--throughput-extender".as_ref(),
            missing.as_os_str(),
            // A checkout without the control-plane script: had the check not come first, the
            // run would fail there instead.
            "--repo".as_ref(),
            std::env::temp_dir().as_os_str(),
        ])
        .unwrap()
        .args;
        let error = crate::replay::throughput::run_throughput(&args)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--throughput-extender") && error.contains("no such program"),
            "{error}"
        );
    }

    #[test]
    fn the_command_line_is_consistent_and_parses() {
        Wrapper::command().debug_assert();
        let parsed = Wrapper::try_parse_from([
            "replay",
            "--trace-dir",
            "t",
            "--trace",
            "default",
            "--policies",
            "binpack,fgd-plus",
            "--seeds",
            "42..43",
            "--compare",
            "--percentage-of-nodes-to-score",
            "100",
        ])
        .unwrap()
        .args;
        assert_eq!(parse_scoring(&parsed.policies).unwrap().len(), 2);
        assert_eq!(parsed.percentage_of_nodes_to_score, Some(100));
        assert!(!parsed.throughput.enabled);
        assert_eq!(parsed.throughput.extender, None);
        let bare = Wrapper::try_parse_from([
            "replay",
            "--throughput",
            "--throughput-extender",
            "target/release/examples/bare_extender",
        ])
        .unwrap()
        .args;
        assert_eq!(
            bare.throughput.extender.as_deref(),
            Some(std::path::Path::new(
                "target/release/examples/bare_extender"
            ))
        );
        assert!(
            Wrapper::try_parse_from(["replay", "--percentage-of-nodes-to-score", "101"]).is_err()
        );
        let error = parse_scoring(&["binpak".to_owned()])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("known: binpack, spread, fgd, fgd-plus"),
            "{error}"
        );
    }
}
