//! The `replay` command's arguments ([`ReplayArgs`], with the throughput mode's
//! [`ThroughputArgs`]) and the scheduler configuration they select; the runs (`cli`) and the
//! throughput measurement (`throughput`) both read them.

use std::path::PathBuf;

use anyhow::{Context, Result};

use super::plane::{GPU_SCHEDULER, SchedulerSetup};
use gpu_sim::cli::TraceInputs;

/// Replay a GPU workload trace through a real kube-apiserver, kube-scheduler and gpu-extender.
#[derive(Clone, Debug, clap::Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub inputs: TraceInputs,

    /// Extender policies, comma-separated: binpack, spread, fgd, fgd-plus. Each runs on a fresh
    /// loopback plane; with --kubeconfig, name the policy the cluster's extender runs.
    #[arg(long, value_delimiter = ',', default_value = "binpack")]
    pub policies: Vec<String>,

    /// Seeds: a list and/or inclusive ranges, e.g. `42..44` or `42,45`.
    #[arg(long, default_value = "42")]
    pub seeds: String,

    /// Inflate (or shrink) the arrivals to this multiple of GPU capacity, as `simulate`.
    #[arg(long, default_value_t = 1.3, allow_negative_numbers = true)]
    pub tune: f64,

    /// Where to write summary.md, runs.csv, discrete.csv, steps.csv, alloc-TRACE.svg (and with
    /// --compare, simulate/ and compare.csv).
    #[arg(long, value_name = "DIR", default_value = "replay-out")]
    pub out: PathBuf,

    /// Also run `simulate` on the same sequence and print both curves and their difference.
    #[arg(long)]
    pub compare: bool,

    /// Replay departures, as `simulate --departures`: pods are offered in order of their trace
    /// creation time, and before each one the bound pods whose deletion time has come are
    /// deleted (every pod needs both times, e.g. a `gpu-lab workload --stretch` file).
    #[arg(long)]
    pub departures: bool,

    /// DRA mode, as `simulate --dra`: the nodes' GPUs are published as ResourceSlices of NVIDIA's
    /// driver, each GPU pod asks for whole devices through a ResourceClaim, and kube-scheduler
    /// allocates them. Policies: kube-default (kube-scheduler alone, no extender) and the
    /// extender's (its DRA stanza ranks the nodes).
    #[arg(long, conflicts_with = "departures")]
    pub dra: bool,

    /// Replay in the cluster this kubeconfig names (its kube-scheduler and gpu-extender decide)
    /// instead of a loopback plane. Only the replay's own nodes and namespace are created.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// The scheduler profile the replayed pods name.
    #[arg(long, default_value = GPU_SCHEDULER)]
    pub scheduler_name: String,

    /// KubeSchedulerConfiguration to run instead of the shipped dedicated GPU scheduler
    /// (scheduler-config/gpu-scheduler-dedicated.yaml; loopback plane only; its extender URL and
    /// kubeconfig are filled in).
    #[arg(long, value_name = "FILE")]
    pub scheduler_config: Option<PathBuf>,

    /// Set kube-scheduler's percentageOfNodesToScore (loopback plane only; default: the file's,
    /// or kube-scheduler's adaptive default).
    #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u32).range(0..=100))]
    pub percentage_of_nodes_to_score: Option<u32>,

    /// kube-scheduler's client QPS (burst twice that); default: kube-scheduler's own (50).
    #[arg(long, value_name = "QPS", value_parser = clap::value_parser!(u32).range(1..))]
    pub scheduler_qps: Option<u32>,

    /// Override a key of the replay's extender configuration (repeatable), as `serve --set`,
    /// e.g. `policy.filterBestOnly=false` (loopback plane only).
    #[arg(long, value_name = "KEY=VALUE")]
    pub extender_set: Vec<String>,

    /// Serve the extender over HTTPS (`server.tls`, with a CA and a certificate for 127.0.0.1
    /// that the replay makes with openssl), kube-scheduler calling it with `enableHTTPS` and
    /// that CA, as in a cluster where the extender is not a loopback sidecar (loopback plane
    /// only).
    #[arg(long)]
    pub extender_https: bool,

    /// Seconds one pod may stay undecided before the replay fails.
    #[arg(long, default_value_t = 60)]
    pub decision_timeout: u64,

    /// The gpu-extender checkout whose scripts/control-plane.sh runs the loopback plane.
    #[arg(long, value_name = "DIR", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))]
    pub repo: PathBuf,

    /// The gpu-extender binary the loopback plane runs as the extender (default: the
    /// `gpu-extender` beside this `gpu-lab`, as cargo builds them into one directory).
    #[arg(long, value_name = "PATH")]
    pub extender_bin: Option<PathBuf>,

    /// Keep the loopback plane's directory (logs, configurations) after the run.
    #[arg(long)]
    pub keep: bool,

    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,

    #[command(flatten)]
    pub throughput: ThroughputArgs,
}

/// The throughput mode's flags (part of `replay`).
#[derive(Clone, Debug, clap::Args)]
pub struct ThroughputArgs {
    /// Measure kube-scheduler's pods/s with and without the extender instead of replaying a
    /// trace (loopback plane only).
    #[arg(long = "throughput")]
    pub enabled: bool,

    /// Nodes of 8 GPUs in the throughput mode.
    #[arg(long = "throughput-nodes", default_value_t = 1000)]
    pub node_count: usize,

    /// One-GPU pods per measurement in the throughput mode.
    #[arg(long = "throughput-pods", default_value_t = 2000)]
    pub pod_count: usize,

    /// Measurements of each setup, alternating (with, without, with, ...), after one warm-up
    /// round of both that is not reported.
    #[arg(long = "throughput-rounds", default_value_t = 1)]
    pub rounds: usize,

    /// kube-scheduler's client QPS in the throughput mode (raised from its default 50 so that
    /// its own Binding writes are not throttled in the baseline).
    #[arg(long = "throughput-qps", default_value_t = 1000)]
    pub qps: u32,

    /// Run this program as the extender in the throughput mode instead of this gpu-extender,
    /// with the arguments `serve` gets (e.g. `examples/bare_extender.rs`, to measure what the
    /// extender protocol itself costs kube-scheduler).
    #[arg(long = "throughput-extender", value_name = "PROGRAM")]
    pub extender: Option<PathBuf>,
}

impl ReplayArgs {
    /// The scheduler configuration runs start from.
    pub fn scheduler_setup(&self) -> Result<SchedulerSetup> {
        let mut setup = SchedulerSetup::shipped();
        if let Some(path) = &self.scheduler_config {
            setup.base = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
        }
        setup.percentage_of_nodes_to_score = self.percentage_of_nodes_to_score;
        setup.client_qps = self.scheduler_qps;
        Ok(setup)
    }
}

impl ReplayArgs {
    /// The extender binary a loopback plane runs: `--extender-bin`, else `gpu-extender` beside
    /// the running program.
    pub fn extender_bin(&self) -> anyhow::Result<PathBuf> {
        if let Some(path) = &self.extender_bin {
            return Ok(path.clone());
        }
        let lab = std::env::current_exe()
            .map_err(|error| anyhow::anyhow!("finding the gpu-lab binary: {error}"))?;
        let beside = lab.with_file_name("gpu-extender");
        anyhow::ensure!(
            beside.is_file(),
            "no gpu-extender binary beside {} (build it with `cargo build -p gpu-extender`, or \
             pass --extender-bin)",
            lab.display()
        );
        Ok(beside)
    }
}
