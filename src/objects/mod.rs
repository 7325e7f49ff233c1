//! Kubernetes objects as the engine sees them: the sole owner of label, annotation and quantity
//! parsing. Translation of Nodes and Pods into engine values, DRA slices and claims read as GPUs, and the allocation record written
//! at bind and read back by the watch, `explain` and the replay. Pure functions of the object
//! and the configuration: the watchers, the HTTP layer (non-cache mode and the pod in every
//! request) and the binder all read objects through here, so none of them imports another.

pub mod admission;
pub mod autoscaling;
pub mod dra;
mod quantity;
pub mod quota;
pub mod record;
pub mod scheduling;
pub mod translate;
