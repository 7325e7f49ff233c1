//! Structured logging: one subscriber for the process, JSON or human-readable, filtered by
//! `GPU_EXTENDER_LOG`, else `RUST_LOG` (default `info`).

use tracing_subscriber::EnvFilter;

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line, for log pipelines.
    Json,
    /// Readable text, for terminals.
    Text,
}

/// Installs the global subscriber; a second call is a no-op (tests call it repeatedly).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_env("GPU_EXTENDER_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
