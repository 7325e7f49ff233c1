//! Observability: the Prometheus metric families the service exports (counted as things happen,
//! or read from the shared state at scrape time) and the tracing setup.

pub mod metrics;
pub mod state_collector;
pub mod tracing_setup;

pub use metrics::Metrics;
