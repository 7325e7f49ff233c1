//! The `gpu-extender` binary: parses the command line and hands each subcommand to the library.
//! Composition only; no decisions are made here.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use gpu_extender::agent::AgentArgs;
use gpu_extender::cli::{self, ExplainArgs, InspectArgs};
use gpu_extender::config::ConfigFlags;
use gpu_extender::replay::ReplayArgs;
use gpu_extender::service::{ServeArgs, serve};
use gpu_extender::sim::generate::WorkloadArgs;
use gpu_extender::sim::vary_cluster::ClusterArgs;
use gpu_extender::sim::{SimArgs, run_cli};
use gpu_extender::telemetry::tracing_setup::{self, LogFormat};

// mimalloc instead of glibc's malloc: the extender allocates per request and per watch event
// (node-name lists, decoded pods), and the allocator was a sixth of its CPU in the scheduling
// loop (docs/benchmarks.md, "Throughput").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// GPU-aware placement for Kubernetes: a kube-scheduler extender.
#[derive(Debug, Parser)]
#[command(name = "gpu-extender", version, about)]
struct Cli {
    /// Log format on stderr.
    #[arg(
        long,
        value_enum,
        default_value = "text",
        global = true,
        env = "GPU_EXTENDER_LOG_FORMAT"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the extender verbs and the admin endpoints until SIGTERM.
    Serve(ServeArgs),
    /// Validate a configuration file (and flags and environment) and print the result.
    CheckConfig(ConfigFlags),
    /// Show GPU allocation per node and per GPU, with the pods on each GPU and cluster totals
    /// (also `kubectl inspect gpu`, see docs/operations.md).
    Inspect(InspectArgs),
    /// Explain, for every node, whether a pod fits now and if not exactly why.
    Explain(ExplainArgs),
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
    /// Run on a GPU node: read its GPUs (NVML) and publish them as the node's
    /// gpu-extender.io/gpus annotation (see docs/node-agent.md).
    NodeAgent(AgentArgs),
}

/// Installed as `kubectl-inspect-gpu`, the binary is the kubectl plugin `kubectl inspect gpu`:
/// kubectl runs it with the plugin's own arguments only.
const KUBECTL_PLUGIN: &str = "kubectl-inspect-gpu";

fn main() -> ExitCode {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let invoked_as = args
        .first()
        .and_then(|arg0| std::path::Path::new(arg0).file_name())
        .and_then(|name| name.to_str())
        .map(str::to_owned);
    if invoked_as.as_deref() == Some(KUBECTL_PLUGIN) {
        args.insert(1, "inspect".into());
    }
    let cli = Cli::parse_from(args);
    // The commands that print a report keep stderr to warnings unless asked for more.
    let default_level = match cli.command {
        Command::Inspect(_) | Command::Explain(_) | Command::CheckConfig(_) => "warn",
        Command::Serve(_)
        | Command::Simulate(_)
        | Command::Replay(_)
        | Command::NodeAgent(_)
        | Command::Workload(_)
        | Command::Cluster(_) => "info",
    };
    tracing_setup::init(cli.log_format, default_level);
    match cli.command {
        Command::Serve(args) => {
            block_on(serve(args)).map_or(ExitCode::FAILURE, |()| ExitCode::SUCCESS)
        }
        Command::Inspect(args) => print(block_on(cli::inspect(args))),
        Command::Explain(args) => print(block_on(cli::explain(args))),
        Command::CheckConfig(flags) => match flags.load() {
            Ok(config) => {
                println!("{config}");
                eprintln!("configuration is valid");
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("{error}");
                ExitCode::from(2)
            }
        },
        Command::Replay(args) => block_on(gpu_extender::replay::run_cli(*args))
            .map_or(ExitCode::FAILURE, |()| ExitCode::SUCCESS),
        Command::NodeAgent(args) => block_on(gpu_extender::agent::run(args))
            .map_or(ExitCode::FAILURE, |()| ExitCode::SUCCESS),
        Command::Simulate(args) => match run_cli(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("gpu-extender simulate: {error:#}");
                ExitCode::FAILURE
            }
        },
        Command::Workload(args) => match gpu_extender::sim::generate::run_cli(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("gpu-extender workload: {error:#}");
                ExitCode::FAILURE
            }
        },
        Command::Cluster(args) => match gpu_extender::sim::vary_cluster::run_cli(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("gpu-extender cluster: {error:#}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Runs `future` to completion on a new runtime; errors are printed and give `None`.
fn block_on<T>(future: impl std::future::Future<Output = anyhow::Result<T>>) -> Option<T> {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start the async runtime: {error}");
            return None;
        }
    };
    match runtime.block_on(future) {
        Ok(value) => Some(value),
        Err(error) => {
            eprintln!("gpu-extender: {error:#}");
            None
        }
    }
}

/// Prints a command's output; a failed command exits 1 (its error is already printed).
fn print(output: Option<String>) -> ExitCode {
    match output {
        Some(text) => {
            print!("{text}");
            if !text.ends_with('\n') {
                println!();
            }
            ExitCode::SUCCESS
        }
        None => ExitCode::FAILURE,
    }
}
