//! Structured logging: one subscriber for the process, on stderr, JSON or human-readable,
//! filtered by `GPU_EXTENDER_LOG`, else `RUST_LOG`, else the command's default level. Text is
//! coloured only when stderr is a terminal.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line, for log pipelines.
    Json,
    /// Readable text, for terminals.
    Text,
}

/// The log flags every binary of the workspace takes (`gpu-extender`, `gpu-lab`), before or
/// after its subcommand.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct LogFlags {
    /// Log format on stderr.
    #[arg(
        long,
        value_enum,
        default_value = "text",
        global = true,
        env = "GPU_EXTENDER_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
}

/// Installs the global subscriber; a second call is a no-op (tests call it repeatedly).
/// `default_level` applies when neither `GPU_EXTENDER_LOG` nor `RUST_LOG` is set: `info` for the
/// service, `warn` for the commands whose output is on stdout (`inspect`, `explain`).
pub fn init(format: LogFormat, default_level: &str) {
    let filter = EnvFilter::try_from_env("GPU_EXTENDER_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
