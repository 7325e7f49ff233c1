//! End-to-end scenarios: the gpu-extender binary behind a real kube-scheduler and kube-apiserver
//! (loopback control plane from `scripts/control-plane.sh`, fake GPU nodes, no kubelets).
//!
//! Each scenario gets its own control plane and runs alone (see `harness::run`). Without the
//! Kubernetes binaries the scenarios print a skip message and pass, unless
//! `GPU_EXTENDER_E2E=require` (what `make test` sets). The list of scenarios and what each proves
//! is in `docs/testing.md`.

mod harness;
mod objects;

mod plane;
