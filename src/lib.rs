//! gpu-extender library.
pub mod engine;
pub mod sim;
