//! The `gpu-extender` binary: parses the command line and hands each subcommand to the library.
//! Composition only; no decisions are made here.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use gpu_extender::config::ConfigFlags;
use gpu_extender::service::{ServeArgs, serve};
use gpu_extender::sim::{SimArgs, run_cli};
use gpu_extender::telemetry::tracing_setup::{self, LogFormat};

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
    /// Replay a GPU workload trace under placement policies (no arguments: a built-in example).
    Simulate(SimArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_setup::init(cli.log_format);
    match cli.command {
        Command::Serve(args) => {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    eprintln!("cannot start the async runtime: {error}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(serve(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("gpu-extender: {error:#}");
                    ExitCode::FAILURE
                }
            }
        }
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
        Command::Simulate(args) => match run_cli(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("gpu-extender simulate: {error:#}");
                ExitCode::FAILURE
            }
        },
    }
}
