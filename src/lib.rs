//! gpu-extender library.
pub mod config;
pub mod engine;
