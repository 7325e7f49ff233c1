//! The image against what it is built from and what runs it, in every `cargo test` (no Docker,
//! no base image, no network): the Dockerfile's user, ports, entrypoint and command against
//! `deploy/` and the Helm chart; the chart's `appVersion` and image tag against `Cargo.toml`;
//! and the build context `.dockerignore` sends against what the service's build reads. Building
//! from that context and running the binary as the image runs it needs cargo, a control plane
//! and umoci: that is the end-to-end scenario `tests/e2e/image.rs`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic is a test failure with its location"
)]

mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use gpu_extender::config::Config;
use gpu_test_support::image::{Dockerfile, build_context, sent};
use serde_yaml_ng::Value;
use support::manifests::{find, parse_documents};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn dockerfile() -> Dockerfile {
    Dockerfile::parse(&read("Dockerfile"))
}

/// The image's user as `(uid, gid)`, from `USER uid:gid`.
fn image_user() -> (u64, u64) {
    let file = dockerfile();
    let user = file.last_final("USER").expect("the final stage sets USER");
    let (uid, gid) = user.split_once(':').expect("USER uid:gid");
    (uid.parse().unwrap(), gid.parse().unwrap())
}

/// The container named `name` of a workload object (in containers or init containers).
fn container<'a>(workload: &'a Value, name: &str) -> &'a Value {
    let spec = &workload["spec"]["template"]["spec"];
    ["containers", "initContainers"]
        .iter()
        .flat_map(|list| spec[*list].as_sequence().into_iter().flatten())
        .find(|c| c["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// A container runs the image's entrypoint and the subcommand `first_arg`: it must not override
/// the entrypoint, and its arguments start with the subcommand.
fn assert_runs_the_image(container: &Value, first_arg: &str, origin: &str) {
    assert!(
        container["command"].is_null(),
        "{origin}: the container overrides the image's ENTRYPOINT"
    );
    assert_eq!(
        container["args"][0].as_str(),
        Some(first_arg),
        "{origin}: the container's first argument"
    );
}

fn assert_runs_as_the_image_user(workload: &Value, origin: &str) {
    let (uid, gid) = image_user();
    let context = &workload["spec"]["template"]["spec"]["securityContext"];
    assert_eq!(
        context["runAsUser"].as_u64(),
        Some(uid),
        "{origin}: runAsUser"
    );
    assert_eq!(
        context["runAsGroup"].as_u64(),
        Some(gid),
        "{origin}: runAsGroup"
    );
    assert_eq!(context["runAsNonRoot"].as_bool(), Some(true), "{origin}");
}

#[test]
fn the_dockerfile_and_deploy_agree_on_user_ports_entrypoint_and_command() {
    let file = dockerfile();
    assert_eq!(
        file.exec_form("ENTRYPOINT").unwrap(),
        vec!["/usr/local/bin/gpu-extender"]
    );
    let command = file.exec_form("CMD").unwrap();
    assert_eq!(command, vec!["serve"], "the image's default command");
    let (uid, gid) = image_user();
    assert!(uid != 0 && gid != 0, "the image runs as root");

    // The ports the image exposes are the ones the service listens on, by default and as
    // deploy/ configures it.
    let exposed: BTreeSet<u16> = file.exposed_ports().into_iter().collect();
    let defaults = Config::default();
    let shipped = read("deploy/gpu-extender-config.yaml");
    let shipped = Config::from_sources(Some(("deploy", &shipped)), &[], &[]).unwrap();
    for (what, addr) in [
        ("default server.listen", defaults.server.listen),
        ("default server.adminListen", defaults.server.admin_listen),
        ("deploy/ server.listen", shipped.server.listen),
        ("deploy/ server.adminListen", shipped.server.admin_listen),
    ] {
        assert!(
            exposed.contains(&addr.port()),
            "{what} {addr} is not among the image's EXPOSE ports {exposed:?}"
        );
    }

    let deploy = parse_documents(&read("deploy/deployment.yaml"), "deploy/deployment.yaml");
    let scheduler = find(&deploy, "Deployment", "gpu-scheduler");
    assert_runs_as_the_image_user(scheduler, "deploy/deployment.yaml");
    let extender = container(scheduler, "gpu-extender");
    assert_runs_the_image(extender, &command[0], "deploy/deployment.yaml gpu-extender");
    for port in extender["ports"].as_sequence().into_iter().flatten() {
        let port = port["containerPort"].as_u64().unwrap();
        assert!(
            exposed.contains(&u16::try_from(port).unwrap()),
            "containerPort {port} is not exposed by the image"
        );
    }
    assert_eq!(
        extender["securityContext"]["readOnlyRootFilesystem"].as_bool(),
        Some(true),
        "the image is made to run on a read-only root"
    );

    let agent = parse_documents(
        &read("deploy/node-agent/daemonset.yaml"),
        "deploy/node-agent/daemonset.yaml",
    );
    let agent = find(&agent, "DaemonSet", "gpu-extender-node-agent");
    assert_runs_as_the_image_user(agent, "deploy/node-agent/daemonset.yaml");
    assert_runs_the_image(
        container(agent, "node-agent"),
        "node-agent",
        "deploy/node-agent/daemonset.yaml",
    );
}

/// The chart's templates are Go templates, so they are read as text here (their rendered
/// objects are checked against deploy/'s in `tests/deploy_manifests.rs` when helm is there):
/// the same user, no entrypoint override, and the default subcommand first.
#[test]
fn the_helm_chart_runs_the_image_as_the_dockerfile_says() {
    let (uid, gid) = image_user();
    for template in ["deployment.yaml", "node-agent.yaml"] {
        let text = read(&format!("deploy/helm/gpu-extender/templates/{template}"));
        assert!(
            text.contains(&format!("runAsUser: {uid}"))
                && text.contains(&format!("runAsGroup: {gid}")),
            "{template}: the pod does not run as {uid}:{gid}"
        );
        let image_lines: Vec<usize> = text
            .lines()
            .enumerate()
            .filter(|(_, line)| line.contains("include \"gpu-extender.image\""))
            .map(|(n, _)| n)
            .collect();
        assert!(
            !image_lines.is_empty(),
            "{template} runs no gpu-extender image"
        );
        let lines: Vec<&str> = text.lines().collect();
        for at in image_lines {
            // The container's own keys, up to the next container.
            let own: Vec<&str> = lines[at + 1..]
                .iter()
                .take_while(|line| !line.trim_start().starts_with("- name:"))
                .copied()
                .collect();
            assert!(
                !own.iter()
                    .any(|line| line.trim_start().starts_with("command:")),
                "{template}: a gpu-extender container overrides the ENTRYPOINT"
            );
            let first_arg = own
                .iter()
                .skip_while(|line| !line.trim_start().starts_with("args:"))
                .nth(1)
                .map(|line| line.trim().trim_start_matches("- ").to_owned());
            assert!(
                matches!(first_arg.as_deref(), Some("serve" | "node-agent")),
                "{template}: the first argument is {first_arg:?}"
            );
        }
    }
}

#[test]
fn the_chart_and_deploy_follow_the_crate_version() {
    let version = env!("CARGO_PKG_VERSION");
    let chart: Value =
        serde_yaml_ng::from_str(&read("deploy/helm/gpu-extender/Chart.yaml")).unwrap();
    assert_eq!(
        chart["appVersion"].as_str(),
        Some(version),
        "Chart.yaml appVersion must be Cargo.toml's version"
    );
    let values: Value =
        serde_yaml_ng::from_str(&read("deploy/helm/gpu-extender/values.yaml")).unwrap();
    let tag = values["image"]["tag"].as_str().unwrap_or_default();
    assert!(
        tag.is_empty() || tag == version,
        "values.yaml image.tag {tag:?}: leave it empty (the appVersion) or make it {version}"
    );
    assert!(
        read("deploy/helm/gpu-extender/templates/_helpers.tpl")
            .contains(".Values.image.tag | default .Chart.AppVersion"),
        "the chart's image tag no longer defaults to its appVersion"
    );
    let kustomization: Value = serde_yaml_ng::from_str(&read("deploy/kustomization.yaml")).unwrap();
    let image = kustomization["images"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|image| image["name"].as_str() == Some("gpu-extender"))
        .expect("deploy/kustomization.yaml sets the gpu-extender image");
    assert_eq!(
        image["newTag"].as_str(),
        Some(version),
        "deploy/kustomization.yaml newTag"
    );
}

/// What the service's build reads that `.dockerignore` must let through: the workspace and
/// member manifests, the lock file, the build script and its `proto/` input, and every file the
/// compiled sources pull in with `include_str!`/`include_bytes!` (test modules left out: the
/// image builds no tests). Each is returned with why it is needed.
fn build_inputs() -> Vec<(PathBuf, String)> {
    let root = Path::new(ROOT);
    let mut inputs: Vec<(PathBuf, String)> = ["Cargo.toml", "Cargo.lock", "build.rs", "proto"]
        .iter()
        .map(|p| (PathBuf::from(p), "the build".to_owned()))
        .collect();
    let manifest = read("Cargo.toml");
    let members = manifest
        .lines()
        .find(|line| line.trim_start().starts_with("members"))
        .expect("a workspace members list");
    for member in members.split('"').skip(1).step_by(2) {
        inputs.push((
            normalize(&Path::new(member).join("Cargo.toml")),
            "cargo loads every member's manifest".to_owned(),
        ));
    }
    for dir in ["src", "crates/engine/src"] {
        for file in rust_sources(&root.join(dir)) {
            if file.file_name().is_some_and(|name| name == "tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let compiled = text.split("#[cfg(test)]").next().unwrap_or_default();
            for macro_name in ["include_str!(\"", "include_bytes!(\""] {
                for rest in compiled.split(macro_name).skip(1) {
                    let relative = rest.split('"').next().unwrap_or_default();
                    let target = file.parent().unwrap().join(relative);
                    let target = normalize(&target);
                    let inside = target.strip_prefix(root).map(Path::to_path_buf);
                    inputs.push((
                        inside.unwrap_or(target),
                        format!("{} includes it", file.strip_prefix(root).unwrap().display()),
                    ));
                }
            }
        }
    }
    inputs
}

fn rust_sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The inputs a `.dockerignore` (its text) keeps out of the context, with why each is needed.
fn missing_inputs(dockerignore: &str) -> Vec<String> {
    build_inputs()
        .into_iter()
        .filter(|(path, _)| path.is_absolute() || !sent(dockerignore, &path.to_string_lossy()))
        .map(|(path, why)| format!("{} ({why})", path.display()))
        .collect()
}

#[test]
fn the_build_context_holds_everything_the_build_reads() {
    let missing = missing_inputs(&read(".dockerignore"));
    assert!(
        missing.is_empty(),
        ".dockerignore keeps out what the image's build reads: {missing:#?}"
    );
    // And every context path the Dockerfile copies is in the context.
    let context: Vec<PathBuf> = build_context(Path::new(ROOT)).unwrap();
    for source in dockerfile().context_sources() {
        let source = source.trim_end_matches('/');
        assert!(
            context
                .iter()
                .any(|file| file == Path::new(source) || file.starts_with(source)),
            "the Dockerfile copies {source}, which the build context does not have"
        );
    }
}

/// The check fails on the context this Dockerfile had before the build script arrived (issue
/// 61): `build.rs` and `proto/` were left out, and the sources included files from outside it.
#[test]
fn the_build_context_check_catches_the_context_that_could_not_build() {
    let before = "*\n!Cargo.toml\n!Cargo.lock\n!src/\n!benches/\n";
    let missing = missing_inputs(before);
    assert!(
        missing.iter().any(|m| m.starts_with("build.rs ")),
        "{missing:?}"
    );
    assert!(
        missing.iter().any(|m| m.starts_with("proto ")),
        "{missing:?}"
    );
    assert!(
        missing
            .iter()
            .any(|m| m.starts_with("crates/engine/Cargo.toml ")),
        "{missing:?}"
    );
}

#[test]
fn the_default_listeners_are_the_image_ports() {
    let defaults = Config::default();
    let exposed: Vec<u16> = dockerfile().exposed_ports();
    let ports: Vec<u16> = [defaults.server.listen, defaults.server.admin_listen]
        .iter()
        .map(SocketAddr::port)
        .collect();
    assert_eq!(
        exposed, ports,
        "EXPOSE lists the verbs' port, then the admin port"
    );
}
