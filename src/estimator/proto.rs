//! Karmada's scheduler-estimator messages and the `Estimator` server trait, generated at build
//! time by build.rs from proto/ (Karmada v1.18.2's files; see proto/README.md).

#![allow(
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic,
    reason = "generated code"
)]

include!(concat!(env!("OUT_DIR"), "/estimator_protos.rs"));

pub use github::com::karmada_io::karmada::pkg::estimator::{pb, service};
/// The Kubernetes messages Karmada's requests carry (node selector terms, tolerations).
pub use k8s::io::api::core::v1 as core;
/// Kubernetes' `resource.Quantity` on the wire.
pub use k8s::io::apimachinery::pkg::api::resource;
