pub mod config;
pub mod engine;
pub mod http;
pub mod inspect;
pub mod k8s;
pub mod telemetry;
