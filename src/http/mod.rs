//! The extender surface: wire types mirroring k8s.io/kube-scheduler/extender/v1 and the HTTP
//! routers whose handlers decode, ask the shared state ([`crate::state`]) and encode.

pub mod server;
pub mod wire;
