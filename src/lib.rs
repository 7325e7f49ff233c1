pub mod config;
pub mod engine;
pub mod http;
pub mod inspect;
pub mod telemetry;
