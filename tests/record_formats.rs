//! Every allocation record format a build has ever written (`tests/fixtures/records/`) is read
//! by this build as its fixture says, and a record of a future version is refused for its
//! version, never misread: the contract that makes a rolling upgrade, and a rollback, lose
//! nothing (docs/install.md, "Upgrading and rolling back").

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic is a test failure with its location"
)]

mod support;

use std::path::Path;

use gpu_engine::Grant;
use gpu_extender::config::Config;
use gpu_extender::objects::record::{RECORD_VERSION, decode};
use serde_json::{Value, json};
use support::record_fixtures::{FIXTURES, fixture_pod, fixtures};

#[test]
fn every_written_format_is_read_as_its_fixture_says() {
    let config = Config::default();
    let fixtures = fixtures();
    assert!(
        fixtures
            .iter()
            .filter(|(name, _)| name.starts_with("v1-"))
            .count()
            >= 6,
        "the fixtures are missing: {FIXTURES}"
    );
    for (name, fixture) in &fixtures {
        let pod = fixture_pod(
            fixture,
            "p",
            "uid-1",
            "gpu-a",
            &config.annotations.allocation,
        );
        let decoded = decode(&pod, &config);
        if let Some(error) = fixture["expect"]["error"].as_str() {
            let message = decoded.expect_err(name).to_string();
            assert!(message.contains(error), "{name}: {message}");
            continue;
        }
        let allocation = decoded
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .expect(name);
        assert_eq!(allocation.node.as_str(), "gpu-a", "{name}");
        let mut held: Vec<Value> = allocation
            .containers
            .iter()
            .chain(&allocation.init_containers)
            .flat_map(|c| {
                c.gpus.iter().map(move |grant| {
                    let amount = match grant.grant {
                        Grant::Whole => json!("whole"),
                        Grant::Share { mem, compute } => json!([mem.0, compute.0]),
                    };
                    json!([c.name, grant.gpu.0, amount])
                })
            })
            .collect();
        let mut expected = fixture["expect"]["holdings"].as_array().unwrap().clone();
        let key = |v: &Value| v.to_string();
        held.sort_by_key(key);
        expected.sort_by_key(key);
        assert_eq!(held, expected, "{name}");
    }
}

#[test]
fn the_fixtures_cover_the_version_this_build_writes() {
    assert_eq!(
        RECORD_VERSION, 1,
        "a new record version needs fixtures of its own here, and docs/install.md's upgrade \
         steps (a build that reads it must ship before the one that writes it)"
    );
    assert!(Path::new(FIXTURES).join("future-v2.json").is_file());
}
