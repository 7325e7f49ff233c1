//! gpu-extender library.
pub mod engine;
