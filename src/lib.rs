//! gpu-extender: a GPU-aware placement service that kube-scheduler calls as a scheduler extender.
//!
//! ```text
//!                     watch Nodes, Pods                      POST pods/binding (+ record)
//!   kube-apiserver ───────────────────▶ k8s (translate) ──▶ Table ◀── reserve ── k8s::bind
//!                                                          │  ▲                     ▲
//!                                                   read   │  │ apply(change)       │ bind
//!                                                          ▼  │                     │
//!   kube-scheduler ──── filter / prioritize / preempt ──▶ http ──▶ engine (pure) ───┘
//! ```
//!
//! Data flows one way: watchers keep the [`engine::Table`] in step with the cluster; kube-scheduler's
//! calls arrive in [`http`], which decodes, asks the pure [`engine`] on one consistent snapshot and
//! encodes. Filter and prioritize never write; only bind reserves capacity and writes to the API.
//!
//! Modules:
//! - [`config`]: the only reader of configuration files, environment and flags.
//! - [`engine`]: the placement core (model, requests, fit, policies, topology, table). No I/O.
//! - [`http`]: the extender wire protocol, verbs and routers.
//! - [`k8s`]: translation of Nodes and Pods, the allocation record, watchers and the binder.
//! - [`service`]: composition of the running service (adapter between http and k8s).
//! - [`inspect`]: the per-node, per-GPU allocation report.
//! - [`explain`]: why a pod fits or does not fit each node now.
//! - [`cli`]: the `inspect` and `explain` commands (reading the cluster or an extender).
//! - [`sim`]: the trace-replay simulator behind `gpu-extender simulate` (seeded, with I/O).
//! - [`replay`]: the same trace through a real kube-apiserver, kube-scheduler and gpu-extender
//!   (`gpu-extender replay`), and kube-scheduler's throughput with and without the extender.
//! - [`telemetry`]: Prometheus metric families and tracing setup.

pub mod cli;
pub mod config;
pub mod engine;
pub mod explain;
pub mod http;
pub mod inspect;
pub mod k8s;
pub mod objects;
pub mod replay;
pub mod service;
pub mod sim;
pub mod state;
pub mod telemetry;
