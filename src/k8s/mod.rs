//! The Kubernetes side of the service: the watch feed that keeps the shared state's table equal
//! to the cluster, the binder, the `ElasticQuota` watcher (GPU quotas),
//! the Dynamic Resource Allocation watches (dra: ResourceSlices and ResourceClaims), the requeue task that asks kube-scheduler to retry waiting pods
//! once capacity frees, the quota reclaimer that evicts borrowers for a team under its `min`, the
//! writer Lease that lets one replica alone run those two (lease), and
//! the modules that write to the API (api: Bindings, requeue's metadata touch, evictions;
//! events: the Events on pods for binds and reclaims), and kube-apiserver's protobuf encoding
//! (proto: the Pod watch's messages and the Binding). Objects are read through
//! [`crate::objects`]; what is shared with the HTTP layer lives in [`crate::state`].

pub mod api;
pub mod bind;
pub mod dra;
pub mod events;
pub mod lease;
pub mod node_label;
pub(crate) mod proto;
pub mod quota;
pub mod reclaim;
pub mod requeue;
pub mod watch;
