//! The `gpu-extender` binary: parses the command line and hands each subcommand to the library.
//! Composition only; no decisions are made here.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use gpu_extender::agent::AgentArgs;
use gpu_extender::cli::{self, ExplainArgs, InspectArgs};
use gpu_extender::config::ConfigFlags;
use gpu_extender::service::{ServeArgs, serve};
use gpu_extender::telemetry::tracing_setup::{self, LogFlags};

// mimalloc instead of glibc's malloc: the extender allocates per request and per watch event
// (node-name lists, decoded pods), and the allocator was a sixth of its CPU in the scheduling
// loop (docs/benchmarks.md, "Throughput").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// GPU-aware placement for Kubernetes: a kube-scheduler extender.
#[derive(Debug, Parser)]
#[command(name = "gpu-extender", version = gpu_extender::build_info::LONG_VERSION, about)]
struct Cli {
    #[command(flatten)]
    log: LogFlags,
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
        Command::Serve(_) | Command::NodeAgent(_) => "info",
    };
    tracing_setup::init(cli.log.log_format, default_level);
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
        Command::NodeAgent(args) => block_on(gpu_extender::agent::run(args))
            .map_or(ExitCode::FAILURE, |()| ExitCode::SUCCESS),
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
