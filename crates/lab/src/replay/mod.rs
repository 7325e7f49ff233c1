//! The in-cluster replay (`gpu-lab replay`): the trace `simulate` replays, offered pod by
//! pod to a real kube-apiserver, kube-scheduler and gpu-extender, measured as `simulate` measures
//! it; and its throughput mode (kube-scheduler's pods/s with and without the extender). An
//! operator tool: it creates nodes and pods with the operator's own rights, never the extender's.
//! The mapping from trace rows to objects (`objects`), the processes of a loopback plane
//! (`plane`), one replay (`run`), the throughput mode (`throughput`), the command's arguments
//! (`args`) and the command (`cli`).

pub mod args;
pub mod cli;
pub mod objects;
pub mod plane;
pub mod run;
pub mod throughput;

pub use args::{ReplayArgs, ThroughputArgs};
pub use cli::run_cli;
