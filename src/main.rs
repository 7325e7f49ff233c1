//! The `gpu-extender` binary: parses the command line and hands each subcommand to the library.
//! Composition only; no decisions are made here.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use gpu_extender::config::ConfigFlags;
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
    /// Validate a configuration file (and flags and environment) and print the result.
    CheckConfig(ConfigFlags),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_setup::init(cli.log_format);
    match cli.command {
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
    }
}
