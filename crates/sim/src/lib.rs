//! The trace-replay simulator: the FGD paper's reference experiment (specified in
//! `../shared/docs/simulation.md`, the project's notes beside the clone; the protocol and usage
//! are in `docs/simulate.md`, the openb traces' origin in [`cli::OPENB_SOURCE`]) run through the same engine the
//! extender uses. Loading (`load`, `trace`), the seeded protocol
//! (`protocol`, drawn from Go's `math/rand` in `go_rand`), one run (`replay`), measurements (`metrics`), the bound no online policy exceeds (`ceiling`), and outputs (`report`, `cli`);
//! harder workloads sampled from a trace (`generate`); DRA mode, GPU pods as claims and
//! kube-scheduler's own scores (`dra`).
//! Randomness lives here, never in the engine: draws are passed into engine functions.

pub mod ceiling;
pub mod cli;
pub mod dra;
pub mod generate;
pub mod go_rand;
pub mod load;
pub mod metrics;
pub mod progress;
pub mod protocol;
pub mod reference;
pub mod replay;
pub mod report;
pub mod trace;
pub mod vary_cluster;
pub mod window;

pub use cli::{SimArgs, TraceInputs, run_cli};
pub use load::{LoadError, load_cluster, load_scenario, load_workload};
pub use metrics::{Curves, Step};
pub use replay::{Prepared, RunResult, SimPolicy, run};
pub use trace::{Cluster, SimNode, SimPod, Workload};
