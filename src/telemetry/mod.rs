//! Observability: the Prometheus metric families the service exports and the tracing setup.

pub mod metrics;
pub mod tracing_setup;

pub use metrics::Metrics;
