//! gpu-extender: a GPU-aware placement service that kube-scheduler calls as a scheduler extender.
//!
//! ```text
//!                     watch Nodes, Pods                        POST pods/binding (+ record)
//!   kube-apiserver ───────────────────▶ k8s::watch ──write──▶ state ◀──reserve── k8s::bind
//!                                                              │ ▲                   ▲
//!                                          read, decide        │ │ ask               │ Bind
//!                                                              ▼ │                   │
//!   kube-scheduler ── filter / prioritize / preempt / bind ──▶ http ─────────────────┘
//!                                                    state ──▶ engine (pure)
//! ```
//!
//! Data flows one way: the watchers keep the shared [`state`] (the [`gpu_engine::Table`], the
//! policy in force, readiness) in step with the cluster; kube-scheduler's calls arrive in
//! [`http`], which decodes, asks the state (which asks the pure engine, the `gpu-engine` crate,
//! on one consistent snapshot) and encodes. Filter and prioritize never write; only bind reserves
//! capacity and writes to the API.
//!
//! This crate is the service, the one binary the image ships. Beside it in the workspace: the
//! placement core `gpu-engine` (crates/engine, pure: its manifest has no I/O crate), the
//! simulator `gpu-sim` (crates/sim) and the lab binary `gpu-lab` (crates/lab: simulate,
//! workload, cluster, replay), which depend on this crate and never the other way round.
//!
//! The rooms, in layers: a room imports only rooms below it (checked by `tests/architecture.rs`;
//! no module import cycles, checked by `scripts/module-graph.sh`; decision 0007).
//! 1. [`config`]: the only reader of configuration files, environment and flags;
//!    [`build_info`]: what this build is (version, commit, compiler);
//!    [`inspect`]: the per-node, per-GPU allocation report; [`explain`]: why a pod fits or does
//!    not fit each node now.
//! 2. [`objects`]: Kubernetes objects in and out: Node/Pod translation, quantities, the record.
//! 3. [`state`]: the shared state, the policy in force, the verbs' decisions, the bind seam.
//! 4. [`telemetry`]: Prometheus metric families (the state read at scrape time) and tracing.
//! 5. [`k8s`]: watchers, binder, requeue, events; [`http`]: the extender wire protocol and
//!    routers, and the client the operator commands read an extender with.
//! 6. [`service`]: composition of the running service; [`cli`]: the `inspect` and `explain`
//!    commands; [`estimator`]: Karmada's scheduler-estimator.
//! 7. [`agent`]: `gpu-extender node-agent`, the DaemonSet that publishes a node's GPUs (NVML)
//!    in the annotation the extender reads.

pub mod agent;
pub mod build_info;
pub mod cli;
pub mod config;
pub mod estimator;
pub mod explain;
pub mod http;
pub mod inspect;
pub mod k8s;
pub mod objects;
pub mod service;
pub mod state;
pub mod telemetry;
