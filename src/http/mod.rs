//! The extender surface: wire types mirroring k8s.io/kube-scheduler/extender/v1, the verbs
//! that ask the engine, and the HTTP routers.

pub mod server;
pub mod verbs;
pub mod wire;
