//! Karmada's scheduler-estimator served by the extender: the `Estimator` gRPC service a
//! multi-cluster scheduler asks "how many replicas of this template can this cluster still
//! run?", answered from the allocation table with the engine's own placement
//! ([`gpu_engine::capacity`]). Off unless `estimator.listen` is set.
//!
//! [`proto`] holds the messages generated from Karmada's files, [`template`] reads a request's
//! replica template into a pod, [`workload`] finds the pods of a workload Karmada names,
//! [`server`] serves the RPCs, and [`thread`] runs the server on a thread and runtime of its own.

pub mod proto;
pub mod server;
pub mod template;
pub mod thread;
pub mod workload;

pub use server::{EstimatorService, serve, serve_tls};
pub use template::{Template, TemplateError};
pub use thread::EstimatorThread;
pub use workload::{CachedWorkloads, KubeWorkloads, WorkloadError, WorkloadSource, Workloads};
