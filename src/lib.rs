//! gpu-extender library: a GPU-aware kube-scheduler extender.

pub mod engine;
pub mod http;
pub mod inspect;
pub mod telemetry;
