//! gpu-extender library.
pub mod config;
pub mod engine;
pub mod k8s;
