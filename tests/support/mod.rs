//! Helpers shared by the deployment tests (`tests/rbac.rs`, `tests/deploy_manifests.rs`); each
//! test crate uses a part of them.
#![allow(dead_code)]

pub mod api_calls;
pub mod manifests;
