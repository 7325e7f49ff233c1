//! The extender surface: wire types mirroring k8s.io/kube-scheduler/extender/v1 and the HTTP
//! routers whose handlers decode, ask the shared state ([`crate::state`]) and encode; the accept
//! loop with every listener's limits, the body reader of the verbs, and the TLS listener that
//! serves them over HTTPS; and the client the operator commands read an extender's admin
//! surface with, and the guard on that surface's private pages.

pub mod auth;
pub mod body;
pub mod client;
pub mod listen;
pub mod server;
pub mod tls;
pub mod ui;
pub mod webhook;
pub mod wire;
