//! The `simulate` command: arguments, input resolution (openb folder, CSV or YAML files, or the
//! built-in example), runs spread over threads with a progress bar, and the output files.
//! `main.rs` only parses [`SimArgs`] and calls [`run_cli`].

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{Context, bail};

use super::load::{self, parse_scenario};
use super::progress::Progress;
use super::replay::{self, Prepared, RunResult, SimPolicy};
use super::report;
use super::trace::{Cluster, Workload};
use gpu_engine::ScoringPolicy;

/// The built-in example scenario (also `crates/sim/sim-small.yaml`): what runs with no arguments.
pub const EXAMPLE_SCENARIO: &str = include_str!("../sim-small.yaml");

/// The openb node list's file name inside a trace folder.
pub const OPENB_NODES: &str = "openb_node_list_gpu_node.csv";

/// Where the openb traces come from and how to point the tool at them: for messages about a
/// missing trace folder (here and in the tests that need it).
pub const OPENB_SOURCE: &str = "the openb traces are Alibaba's public GPU cluster trace \
    cluster-trace-gpu-v2023 (https://github.com/alibaba/clusterdata, folder \
    cluster-trace-gpu-v2023: openb_node_list_gpu_node.csv and openb_pod_list_*.csv); download \
    that folder and pass it as --trace-dir DIR (the trace tests read ../shared/traces/openb \
    beside the clone; a symbolic link there works)";

/// Where a cluster and its workloads come from: an openb folder, CSV or YAML files, a YAML
/// scenario, or (none of these) the built-in example. `simulate` and `replay` read them alike.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct TraceInputs {
    /// Folder with the openb trace (`openb_node_list_gpu_node.csv`, `openb_pod_list_<name>.csv`).
    #[arg(long, value_name = "DIR")]
    pub trace_dir: Option<PathBuf>,

    /// Pod lists to replay: openb names (default, gpushare40, multigpu20, gpuspec10, cpu050)
    /// looked up in --trace-dir, or CSV/YAML files. Defaults to `default` with --trace-dir.
    #[arg(long = "trace", value_name = "NAME|FILE", value_delimiter = ',')]
    pub traces: Vec<String>,

    /// Node list (CSV or YAML); defaults to the node list of --trace-dir.
    #[arg(long, value_name = "FILE")]
    pub nodes: Option<PathBuf>,

    /// A YAML scenario with both nodes and pods (see docs/simulate.md).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["trace_dir", "nodes"])]
    pub scenario: Option<PathBuf>,
}

/// Replay a GPU workload trace against a cluster under several placement policies.
#[derive(Clone, Debug, clap::Args)]
pub struct SimArgs {
    #[command(flatten)]
    pub inputs: TraceInputs,

    /// Policies, comma-separated: random, dot-product, gpu-clustering, gpu-packing, best-fit,
    /// fgd, and engine policies as engine-NAME. `all` = the six reference policies and ours.
    #[arg(long, value_delimiter = ',', default_value = "all")]
    pub policies: Vec<String>,

    /// Seeds: a list and/or inclusive ranges, e.g. `42..51` or `1,5,9`.
    #[arg(long, default_value = "42..51")]
    pub seeds: String,

    /// Inflate (or shrink) the arrivals to this multiple of GPU capacity; 0 replays the trace
    /// as it is.
    #[arg(long, default_value_t = 1.3, allow_negative_numbers = true)]
    pub tune: f64,

    /// Where to write summary.md, runs.csv, discrete.csv, steps.csv and alloc-TRACE.svg
    /// (created if absent; the default is relative to the current directory).
    #[arg(long, value_name = "DIR", default_value = "sim-out")]
    pub out: PathBuf,

    /// Which runs get per-step rows in steps.csv (all seeds can be hundreds of MB).
    #[arg(long, value_enum, default_value_t = StepRows::FirstSeed)]
    pub steps: StepRows,

    /// Worker threads (default: all cores).
    #[arg(long)]
    pub jobs: Option<usize>,

    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,

    /// Replay departures: pods are submitted in order of their trace creation time and leave
    /// at their deletion time (every pod needs both, e.g. a `gpu-lab workload --stretch`
    /// file).
    #[arg(long)]
    pub departures: bool,

    /// Replay kube-scheduler's `percentageOfNodesToScore` window: each pod chooses only among
    /// the nodes kube-scheduler would send the extender with this setting (0: its adaptive
    /// default, what the shipped scheduler configuration uses). Without it every node is a
    /// candidate, as in the FGD paper's simulator.
    #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u32).range(0..=100))]
    pub percentage_of_nodes_to_score: Option<u32>,

    /// With --percentage-of-nodes-to-score: retry a pod the window turned away while a node
    /// outside it had room, with kube-scheduler's next windows until one holds such a node, as
    /// the extender's requeue nudge (requeue.enabled) has kube-scheduler do in a cluster. Such
    /// pods are still counted as window misses.
    #[arg(long, requires = "percentage_of_nodes_to_score")]
    pub retry_window_misses: bool,

    /// DRA mode: every GPU pod asks for whole GPUs through a ResourceClaim of the DeviceClass
    /// gpu.nvidia.com (a share of a GPU claims one device) and kube-scheduler's own scores
    /// choose the node, with the extender's DRA ranking added under an engine policy; policies
    /// kube-default (kube-scheduler alone) and the engine policies; `all` = kube-default and
    /// fgd-plus.
    #[arg(long)]
    pub dra: bool,
}

/// Which runs keep per-step rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StepRows {
    None,
    FirstSeed,
    All,
}

/// Parses `42..51`, `42-51`, `1,5,9` or a mix into a list of seeds.
pub fn parse_seeds(text: &str) -> anyhow::Result<Vec<u64>> {
    let mut seeds = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let range = part.split_once("..").or_else(|| part.split_once('-'));
        match range {
            Some((from, to)) => {
                let from: u64 = from
                    .trim()
                    .parse()
                    .with_context(|| format!("seed {from:?}"))?;
                let to: u64 = to
                    .trim()
                    .trim_start_matches('=')
                    .parse()
                    .with_context(|| format!("seed {to:?}"))?;
                if to < from {
                    bail!("seed range {part} is empty");
                }
                seeds.extend(from..=to);
            }
            None => seeds.push(part.parse().with_context(|| format!("seed {part:?}"))?),
        }
    }
    if seeds.is_empty() {
        bail!("no seeds given");
    }
    Ok(seeds)
}

/// Parses the policy list (`all` expands to the reference policies and ours).
pub fn parse_policies(names: &[String]) -> anyhow::Result<Vec<SimPolicy>> {
    let mut policies = Vec::new();
    for name in names {
        let expanded: Vec<SimPolicy> = if name.trim().eq_ignore_ascii_case("all") {
            default_policies()
        } else {
            vec![SimPolicy::parse(name).map_err(|error| {
                anyhow::anyhow!("{error}; known policies: {}", known_policies().join(", "))
            })?]
        };
        for policy in expanded {
            if !policies.contains(&policy) {
                policies.push(policy);
            }
        }
    }
    Ok(policies)
}

/// Parses the policy list for DRA mode (`dra`) or not: in DRA mode `all` is
/// [`dra_policies`], and only kube-scheduler alone and the engine policies run (kube-scheduler
/// places every pod; the extender can only rank); outside it `kube-default` is refused.
pub fn parse_policies_in(names: &[String], dra: bool) -> anyhow::Result<Vec<SimPolicy>> {
    if !dra {
        let policies = parse_policies(names)?;
        if policies.contains(&SimPolicy::KubeDefault) {
            bail!(
                "{} is kube-scheduler alone placing pods whose GPUs are DRA claims: give --dra",
                replay::KUBE_DEFAULT
            );
        }
        return Ok(policies);
    }
    let mut policies = Vec::new();
    for name in names {
        let expanded = if name.trim().eq_ignore_ascii_case("all") {
            dra_policies()
        } else {
            parse_policies(std::slice::from_ref(name))?
        };
        for policy in expanded {
            if let SimPolicy::Reference(_) = policy {
                bail!(
                    "--dra: {} is not a policy of DRA mode, where kube-scheduler places every \
                     pod and the extender only ranks nodes; use {} or an engine policy \
                     (engine-binpack, engine-spread, engine-fgd, fgd-plus)",
                    policy.name(),
                    replay::KUBE_DEFAULT
                );
            }
            if !policies.contains(&policy) {
                policies.push(policy);
            }
        }
    }
    Ok(policies)
}

/// What `all` stands for in DRA mode: kube-scheduler alone, and with the extender ranking under
/// fgd-plus.
pub fn dra_policies() -> Vec<SimPolicy> {
    vec![
        SimPolicy::KubeDefault,
        SimPolicy::engine(ScoringPolicy::FgdPlus),
    ]
}

/// The policies `all` stands for.
pub fn default_policies() -> Vec<SimPolicy> {
    SimPolicy::references()
        .chain(replay::own_policies())
        .collect()
}

fn known_policies() -> Vec<String> {
    SimPolicy::references()
        .chain(replay::engine_policies())
        .chain([SimPolicy::KubeDefault])
        .map(SimPolicy::name)
        .collect()
}

impl TraceInputs {
    /// Resolves the inputs to one cluster and its workloads.
    pub fn resolve(&self) -> anyhow::Result<(Cluster, Vec<Workload>)> {
        let args = self;
        if let Some(path) = &args.scenario {
            let scenario = load::load_scenario(path)?;
            let cluster = scenario
                .cluster
                .with_context(|| format!("{}: the scenario has no nodes", path.display()))?;
            let mut workloads: Vec<Workload> = scenario.workload.into_iter().collect();
            for trace in &args.traces {
                workloads.push(load::load_workload(Path::new(trace))?);
            }
            if workloads.is_empty() {
                bail!(
                    "{}: the scenario has no pods and no --trace was given",
                    path.display()
                );
            }
            return Ok((cluster, workloads));
        }
        if args.trace_dir.is_none() && args.nodes.is_none() && args.traces.is_empty() {
            let scenario = parse_scenario(Path::new("built-in example"), EXAMPLE_SCENARIO)?;
            let (Some(cluster), Some(workload)) = (scenario.cluster, scenario.workload) else {
                bail!("the built-in example lacks nodes or pods");
            };
            return Ok((cluster, vec![workload]));
        }
        if let Some(dir) = &args.trace_dir
            && !dir.join(OPENB_NODES).is_file()
        {
            bail!(
                "--trace-dir {}: no {OPENB_NODES} there; {OPENB_SOURCE}",
                dir.display()
            );
        }
        let nodes = match (&args.nodes, &args.trace_dir) {
            (Some(path), _) => path.clone(),
            (None, Some(dir)) => dir.join(OPENB_NODES),
            (None, None) => bail!("give --nodes or --trace-dir (or --scenario)"),
        };
        let cluster = load::load_cluster(&nodes)?;
        let names: Vec<String> = if args.traces.is_empty() {
            vec!["default".to_owned()]
        } else {
            args.traces.clone()
        };
        let mut workloads = Vec::new();
        for name in names {
            let path = match &args.trace_dir {
                Some(dir) if !name.contains('/') && !name.contains('.') => {
                    let path = dir.join(format!("openb_pod_list_{name}.csv"));
                    if !path.is_file() {
                        bail!(
                            "--trace {name}: no {} in --trace-dir {}; {OPENB_SOURCE}",
                            path.file_name()
                                .map_or_else(String::new, |f| f.to_string_lossy().into_owned()),
                            dir.display()
                        );
                    }
                    path
                }
                _ => PathBuf::from(&name),
            };
            workloads.push(load::load_workload(&path)?);
        }
        Ok((cluster, workloads))
    }
}

/// One (trace, policy, seed) to run.
struct Job {
    trace: usize,
    policy: SimPolicy,
    seed: u64,
    keep_steps: bool,
}

/// Runs the whole matrix of workloads × policies × seeds on `jobs` threads (all cores when
/// `None`), in a stable output order: by workload, then policy, then seed.
pub fn run_matrix(
    prepared: &[Prepared],
    policies: &[SimPolicy],
    seeds: &[u64],
    tune: f64,
    steps: StepRows,
    jobs: Option<usize>,
    progress: &Progress,
) -> Vec<RunResult> {
    let mut queue = Vec::new();
    for trace in 0..prepared.len() {
        for &policy in policies {
            for (i, &seed) in seeds.iter().enumerate() {
                let keep_steps = match steps {
                    StepRows::None => false,
                    StepRows::FirstSeed => i == 0,
                    StepRows::All => true,
                };
                queue.push(Job {
                    trace,
                    policy,
                    seed,
                    keep_steps,
                });
            }
        }
    }
    let threads = jobs
        .or_else(|| std::thread::available_parallelism().ok().map(usize::from))
        .unwrap_or(1)
        .clamp(1, queue.len().max(1));
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<RunResult>>> = Mutex::new(vec![None; queue.len()]);
    let tick = |pods: u64| progress.inc(pods);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = queue.get(index) else { break };
                    let result = replay::run(
                        &prepared[job.trace],
                        job.policy,
                        job.seed,
                        tune,
                        job.keep_steps,
                        &tick,
                    );
                    if let Ok(mut slots) = results.lock() {
                        slots[index] = Some(result);
                    }
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_default()
        .into_iter()
        .flatten()
        .collect()
}

/// The `simulate` command.
pub fn run_cli(args: SimArgs) -> anyhow::Result<()> {
    let seeds = parse_seeds(&args.seeds)?;
    let policies = parse_policies_in(&args.policies, args.dra)?;
    if !args.tune.is_finite() || args.tune < 0.0 {
        bail!("--tune must be a non-negative number, got {}", args.tune);
    }
    let (cluster, workloads) = args.inputs.resolve()?;
    let prepared: Vec<Prepared> = workloads
        .iter()
        .map(|workload| {
            let mut prepared = if args.dra {
                Prepared::new_dra(&cluster, workload)
            } else {
                Prepared::new(&cluster, workload)
            };
            if let Some(percent) = args.percentage_of_nodes_to_score {
                prepared = prepared.with_scheduler_window(percent);
                if args.retry_window_misses {
                    prepared = prepared.with_window_retries();
                }
            }
            if args.departures {
                prepared.with_departures()
            } else {
                Ok(prepared)
            }
        })
        .collect::<anyhow::Result<_>>()?;
    println!(
        "cluster {}: {} nodes, {} GPUs; {} workload(s), {} policies, {} seed(s), arrivals to {:.0}% of GPU capacity",
        cluster.name,
        cluster.nodes().len(),
        cluster.gpu_count(),
        workloads.len(),
        policies.len(),
        seeds.len(),
        args.tune * 100.0
    );
    if let (Some(percent), Some(window)) = (
        args.percentage_of_nodes_to_score,
        prepared.first().and_then(Prepared::scheduler_window),
    ) {
        println!(
            "kube-scheduler window (percentageOfNodesToScore {percent}{}): each pod chooses among \
             the first {window} nodes that pass kube-scheduler's own filters, on a walk that \
             starts where the previous pod's stopped{}",
            if percent == 0 { ", adaptive" } else { "" },
            if args.retry_window_misses {
                "; a pod no window node has room for, while another node has, is retried with \
                 the next windows"
            } else {
                ""
            }
        );
    }
    if args.dra {
        println!(
            "DRA mode: each GPU pod claims whole devices of DeviceClass {} (a share of a GPU \
             claims one), alloc % counts whole devices held; kube-scheduler's own scores \
             (LeastAllocated + BalancedAllocation) choose the node, the extender's ranking \
             added x{} under an engine policy; the DRA allocator takes the first free devices",
            crate::dra::DEVICE_CLASS,
            crate::dra::EXTENDER_WEIGHT
        );
    }
    let total_pods: u64 = prepared
        .iter()
        .map(|p| {
            seeds
                .iter()
                .map(|&seed| p.plan(seed, args.tune).0.order.len() as u64)
                .sum::<u64>()
        })
        .sum::<u64>()
        * policies.len() as u64;
    let progress = Progress::new(total_pods, !args.quiet);
    let started = Instant::now();
    let results = run_matrix(
        &prepared, &policies, &seeds, args.tune, args.steps, args.jobs, &progress,
    );
    progress.finish();
    let elapsed = started.elapsed();
    let written = write_outputs(&args.out, &results, args.tune)?;
    print!("{}", report::summary_markdown(&results));
    println!(
        "{} runs in {:.1} s; {written}",
        results.len(),
        elapsed.as_secs_f64(),
    );
    Ok(())
}

/// What [`write_outputs`] wrote, for the command to tell the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// The output folder, absolute.
    pub dir: PathBuf,
    /// Whether the folder was created (it did not exist before).
    pub created: bool,
    /// The files written into it, in order.
    pub files: Vec<String>,
}

impl std::fmt::Display for Written {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "wrote {} to {}{}",
            self.files.join(", "),
            self.dir.display(),
            if self.created { " (created)" } else { "" }
        )
    }
}

/// Writes every output file into `out`, creating it if needed.
pub fn write_outputs(out: &Path, results: &[RunResult], tune: f64) -> anyhow::Result<Written> {
    let created = !out.exists();
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let dir = std::path::absolute(out).unwrap_or_else(|_| out.to_owned());
    let files = std::cell::RefCell::new(Vec::new());
    let write = |name: &str, text: String| -> anyhow::Result<()> {
        let path = out.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        files.borrow_mut().push(name.to_owned());
        Ok(())
    };
    write("summary.md", report::summary_markdown(results))?;
    write("runs.csv", report::runs_csv(results)?)?;
    write("discrete.csv", report::discrete_csv(results, tune)?)?;
    write("steps.csv", report::steps_csv(results)?)?;
    let groups = report::group(results);
    let mut traces: Vec<&str> = groups.iter().map(|g| g.trace).collect();
    traces.dedup();
    for trace in traces {
        let of_trace: Vec<&report::Group<'_>> =
            groups.iter().filter(|g| g.trace == trace).collect();
        let file = format!("alloc-{}.svg", file_safe(trace));
        write(&file, report::alloc_svg(trace, &of_trace)?)?;
    }
    Ok(Written {
        dir,
        created,
        files: files.into_inner(),
    })
}

fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_parse_lists_and_inclusive_ranges() {
        assert_eq!(parse_seeds("42..45").unwrap(), [42, 43, 44, 45]);
        assert_eq!(parse_seeds("1,5-6, 9").unwrap(), [1, 5, 6, 9]);
        assert_eq!(parse_seeds("3..=4").unwrap(), [3, 4]);
        assert!(parse_seeds("9..3").is_err());
        assert!(parse_seeds("x").is_err());
        assert!(parse_seeds("").is_err());
    }

    #[test]
    fn policies_parse_names_and_all() {
        let all = parse_policies(&["all".to_owned()]).unwrap();
        assert!(all.len() >= 6);
        let picked = parse_policies(&["fgd".to_owned(), "best-fit".to_owned()]).unwrap();
        assert_eq!(picked.len(), 2);
        let err = parse_policies(&["nope".to_owned()]).unwrap_err();
        assert!(err.to_string().contains("known policies: random"), "{err}");
    }

    #[test]
    fn dra_mode_runs_kube_scheduler_alone_and_the_engine_policies_only() {
        let names = |list: &[&str]| list.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            parse_policies_in(&names(&["all"]), true).unwrap(),
            dra_policies()
        );
        let picked = parse_policies_in(&names(&["kube-default", "engine-binpack"]), true).unwrap();
        assert_eq!(picked[0], SimPolicy::KubeDefault);
        assert_eq!(picked[1], SimPolicy::engine(ScoringPolicy::Binpack));
        let error = parse_policies_in(&names(&["fgd"]), true).unwrap_err();
        assert!(
            error.to_string().contains("not a policy of DRA mode"),
            "{error}"
        );
        let error = parse_policies_in(&names(&["kube-default"]), false).unwrap_err();
        assert!(error.to_string().contains("give --dra"), "{error}");
        assert!(
            !parse_policies_in(&names(&["all"]), false)
                .unwrap()
                .contains(&SimPolicy::KubeDefault)
        );
    }

    #[test]
    fn a_trace_dir_without_the_traces_says_where_they_come_from() {
        let empty =
            std::env::temp_dir().join(format!("gpu-extender-no-traces-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        let inputs = TraceInputs {
            trace_dir: Some(empty.clone()),
            ..TraceInputs::default()
        };
        let err = inputs.resolve().unwrap_err().to_string();
        assert!(err.contains(OPENB_NODES), "{err}");
        assert!(err.contains("cluster-trace-gpu-v2023"), "{err}");
        assert!(err.contains("github.com/alibaba/clusterdata"), "{err}");
        std::fs::write(
            empty.join(OPENB_NODES),
            "sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,1,T4\n",
        )
        .unwrap();
        let inputs = TraceInputs {
            trace_dir: Some(empty.clone()),
            traces: vec!["gpushare40".into()],
            ..TraceInputs::default()
        };
        let err = inputs.resolve().unwrap_err().to_string();
        assert!(err.contains("openb_pod_list_gpushare40.csv"), "{err}");
        assert!(err.contains("cluster-trace-gpu-v2023"), "{err}");
        let _ = std::fs::remove_dir_all(empty);
    }

    #[test]
    fn the_built_in_example_parses() {
        let scenario = parse_scenario(Path::new("example"), EXAMPLE_SCENARIO).unwrap();
        assert!(scenario.cluster.is_some() && scenario.workload.is_some());
    }
}
