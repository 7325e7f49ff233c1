//! The shared state of the running service, in a room of its own: the allocation table and what
//! the watch knows of pending pods ([`ClusterState`]), the policy in force ([`PolicyCell`]), one
//! call's consistent view of both ([`Snapshot`]), the verbs' decisions taken on it (filter,
//! prioritize, preempt: [`verbs`], [`decide`]) and the bind seam ([`Bind`]). The watchers write
//! it, the HTTP layer and the binder read it and reserve in it; it imports none of them, only
//! the pure [`gpu_engine`] and the object readers of [`crate::objects`].

pub mod binding;
pub mod cluster;
pub mod decide;
pub mod policy;
pub mod quota;
pub mod rejected;
pub mod snapshot;
pub mod verbs;

pub use binding::{ApiError, Bind, BindError, BindOutcome, BindRequest};
pub use cluster::{
    ClusterState, EventCounts, FeedStats, RecordRejections, TableWriter, VictimRank, monotonic_ms,
};
pub use decide::{FilterVerdict, NotReady, Proposal};
pub use policy::PolicyCell;
pub use snapshot::Snapshot;
pub use verbs::{FilterDecision, Offered, Verbs};
