//! The Kubernetes side: translating Nodes and Pods into engine values (the sole owner of label,
//! annotation and quantity parsing), the allocation record written at bind, the watch feed that
//! keeps the engine's table equal to the cluster, the requeue task that asks kube-scheduler to
//! retry waiting pods once capacity frees, and the modules that write to the API (bind:
//! Bindings, requeue's metadata touch, and events: the bind's Event on the pod). The engine never
//! sees a Kubernetes type.

pub mod bind;
pub mod events;
pub mod learn;
mod quantity;
pub mod record;
pub mod requeue;
pub mod translate;
pub mod watch;
