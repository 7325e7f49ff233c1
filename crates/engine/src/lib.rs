//! The pure placement engine: can a pod fit a node, exactly where, how good is that, and the
//! table of what is allocated. No I/O, async, clock, randomness or locks: everything here is
//! built from plain values and answers from plain values, so the extender, the simulator and the
//! inspect tool ask one core the same questions.
//!
//! ```
//! use gpu_engine::{GpuDemand, GpuMode, MemMiB, CpuMilli, NodeSpec, NodeState, PodRequest, Policy};
//! let node = NodeState::new(NodeSpec::uniform("gpu-a", GpuMode::ShareMemory, 4, "T4", MemMiB(16_384)));
//! let pod = PodRequest::single(CpuMilli(1000), MemMiB(1024), GpuDemand::share(8, 1, None).unwrap());
//! let placed = Policy::default().evaluate(&node, &pod).unwrap();
//! assert_eq!(placed.allocation.containers[0].gpus.len(), 1);
//! ```

// No printing either (clippy.toml fences the rest of std's I/O, the clock and locks).
#![deny(clippy::print_stdout, clippy::print_stderr, clippy::dbg_macro)]

pub mod allocation;
pub mod capacity;
pub mod evaluate;
pub mod fit;
pub mod mig;
pub mod model;
pub mod policy;
pub mod quota;
pub mod request;
pub mod state;
pub mod table;
pub mod topology;

pub use allocation::{ContainerAllocation, GpuGrant, GpuHold, Grant, PodAllocation};
pub use capacity::{max_replicas, replicas_on};
pub use evaluate::AlikeScores;
pub use fit::{RejectReason, fit, fit_choosing};
pub use mig::{BadMigProfile, MigProfile, MigSlices};
pub use model::{
    ComputeMilli, CpuMilli, Gpu, GpuIndex, GpuMode, GpuPlacement, HolderKey, Link, LinkMatrix,
    MemMiB, NodeName, NodeSpec, PodKey, WHOLE_GPU_COMPUTE,
};
pub use policy::learn::{TYPICAL_COVERAGE, learn_typical, typical_from_classes};
pub use policy::typical::{TypicalPod, TypicalPods};
pub use policy::{Evaluation, Policy, ScoringPolicy, ShareChoice};
pub use request::{
    ContainerRequest, GpuConstraints, GpuDemand, ModelPattern, PodRequest, RequestError,
    ShareRules, TopologyPreference,
};
pub use state::{GpuUsage, NodeState, PerGpu, shape_hash};
pub use table::{Change, ExternalHold, Hold, PodEntry, Table, TableError};
pub use topology::TopologyIndex;
