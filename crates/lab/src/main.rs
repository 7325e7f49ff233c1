//! The `gpu-lab` binary: the commands that measure placement policies (simulate, workload,
//! cluster, replay). Composition only; the work is in `gpu-sim` and [`gpu_lab::replay`]. It is
//! built for developers and benchmarks and never shipped in the service's image.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use gpu_extender::telemetry::tracing_setup::{self, LogFlags};
use gpu_lab::replay::ReplayArgs;
use gpu_sim::SimArgs;
use gpu_sim::generate::WorkloadArgs;
use gpu_sim::vary_cluster::ClusterArgs;

// mimalloc, as in the service: `replay` runs the extender's client side and the simulator
// allocates per pod class; the same allocator keeps the lab's timings comparable.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// gpu-extender's lab: replay GPU traces under placement policies, in the simulator or through a
/// real kube-apiserver and kube-scheduler.
#[derive(Debug, Parser)]
#[command(name = "gpu-lab", version, about)]
struct Cli {
    #[command(flatten)]
    log: LogFlags,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay a GPU workload trace under placement policies (no arguments: a built-in example).
    Simulate(SimArgs),
    /// Build a harder workload for `simulate` from an openb trace, raising the share of one kind
    /// of pod (model-constrained, sharing, multi-GPU, CPU-only), as the FGD paper built its
    /// variants.
    Workload(WorkloadArgs),
    /// Build a harder cluster for `simulate --nodes` from an openb node list: a GPU model
    /// removed, a sample of the nodes, CPU or memory scaled, big nodes split.
    Cluster(ClusterArgs),
    /// Replay a trace through a real kube-apiserver, kube-scheduler and gpu-extender (a loopback
    /// plane, or --kubeconfig), or measure kube-scheduler's throughput with and without the
    /// extender (--throughput).
    Replay(Box<ReplayArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_setup::init(cli.log.log_format, "info");
    let (name, outcome) = match cli.command {
        Command::Simulate(args) => ("simulate", gpu_sim::run_cli(args)),
        Command::Workload(args) => ("workload", gpu_sim::generate::run_cli(args)),
        Command::Cluster(args) => ("cluster", gpu_sim::vary_cluster::run_cli(args)),
        Command::Replay(args) => ("replay", replay(*args)),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("gpu-lab {name}: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the replay on a new multi-threaded runtime (it drives processes and watches).
fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(gpu_lab::replay::run_cli(args))
}
