//! Helpers shared by the integration tests (`tests/rbac.rs`, `tests/deploy_manifests.rs`,
//! `tests/image.rs`, `tests/record_formats.rs`); each test crate uses a part of them.
#![allow(dead_code)]

pub mod api_calls;
pub mod manifests;
pub mod record_fixtures;
