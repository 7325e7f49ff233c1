//! The node agent without a GPU: the fixture-backed source (machines in tests/fixtures/gpus/)
//! read by the agent's reader, rendered as the `gpu-extender.io/gpus` annotation, and read back by
//! the extender's own node translation; publishing against a scripted API.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a panic is a test failure with its location"
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use gpu_engine::{GpuIndex, Link, MemMiB, NodeSpec};
use gpu_extender::agent::fake::FakeSource;
use gpu_extender::agent::nvml::NvmlSource;
use gpu_extender::agent::publish::{AgentMetrics, NodeAnnotations, Published, publish};
use gpu_extender::agent::source::{Reader, Reading, SourceError};
use gpu_extender::config::Config;
use gpu_extender::objects::translate::translate_node;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const KEY: &str = "gpu-extender.io/gpus";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gpus")
        .join(name)
}

fn read(path: &Path) -> Reading {
    Reader::new(FakeSource::new(path)).read().unwrap()
}

/// The agent's report as the extender reads it: a node carrying the annotation, translated
/// with no problem.
fn as_extender_reads(reading: &Reading) -> NodeSpec {
    let node = Node {
        metadata: ObjectMeta {
            name: Some("gpu-node".into()),
            annotations: Some(BTreeMap::from([(
                KEY.into(),
                reading.to_annotation().unwrap(),
            )])),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    let translation = translate_node(&node, &Config::default());
    assert!(
        translation.problems.is_empty(),
        "{:?}",
        translation.problems
    );
    translation.spec
}

fn healthy(spec: &NodeSpec) -> Vec<bool> {
    spec.gpus.iter().map(|g| g.healthy).collect()
}

#[test]
fn every_fixture_round_trips_through_the_extenders_parser() {
    // (file, GPUs, model of GPU 0, MiB of GPU 0, link 0-1)
    let cases = [
        (
            "dgx-a100.yaml",
            8,
            "NVIDIA-A100-SXM4-80GB",
            81920,
            Link::NvLink(12),
        ),
        (
            "dgx-h100.yaml",
            8,
            "NVIDIA-H100-80GB-HBM3",
            81559,
            Link::NvLink(18),
        ),
        (
            "dgx1-v100.yaml",
            8,
            "Tesla-V100-SXM2-32GB",
            32510,
            Link::NvLink(1),
        ),
        ("t4-pcie.yaml", 4, "Tesla-T4", 15360, Link::HostBridge),
        (
            "mixed.yaml",
            4,
            "NVIDIA-A100-PCIE-40GB",
            40960,
            Link::NvLink(12),
        ),
        (
            "fallen-off-bus.yaml",
            4,
            "Tesla-T4",
            15360,
            Link::HostBridge,
        ),
        (
            "a100-mig.yaml",
            8,
            "NVIDIA-A100-SXM4-40GB",
            40960,
            Link::NvLink(12),
        ),
    ];
    for (file, count, model, mib, link) in cases {
        let reading = read(&fixture(file));
        let spec = as_extender_reads(&reading);
        assert_eq!(spec.gpus.len(), count, "{file}");
        assert_eq!(spec.gpus[0].model, model, "{file}");
        assert_eq!(spec.gpus[0].memory, MemMiB(mib), "{file}");
        assert_eq!(spec.links.get(0, 1), link, "{file}");
        for (position, gpu) in spec.gpus.iter().enumerate() {
            assert_eq!(
                gpu.index,
                GpuIndex(u16::try_from(position).unwrap()),
                "{file}"
            );
            assert_eq!(
                gpu.uuid.as_deref(),
                reading.gpus[position]
                    .device
                    .as_ref()
                    .map(|d| d.uuid.as_str()),
                "{file}"
            );
        }
    }
}

#[test]
fn the_v100_cube_mesh_keeps_its_two_islands_and_numa() {
    let spec = as_extender_reads(&read(&fixture("dgx1-v100.yaml")));
    for a in 0..8 {
        for b in 0..8 {
            if a == b {
                continue;
            }
            let same_island = (a < 4) == (b < 4);
            let bridge = a % 4 == b % 4;
            let nvlink = matches!(spec.links.get(a, b), Link::NvLink(_));
            assert_eq!(nvlink, same_island || bridge, "GPU {a} - GPU {b}");
        }
    }
    assert_eq!(spec.links.get(0, 3), Link::NvLink(2));
    assert_eq!(spec.links.get(1, 4), Link::CrossSocket);
    let numa: Vec<Option<u16>> = spec.gpus.iter().map(|g| g.numa).collect();
    assert_eq!(numa, [0, 0, 0, 0, 1, 1, 1, 1].map(Some));
}

#[test]
fn the_mixed_node_lists_each_model_with_its_own_memory() {
    let spec = as_extender_reads(&read(&fixture("mixed.yaml")));
    let models: Vec<(&str, u64)> = spec
        .gpus
        .iter()
        .map(|g| (g.model.as_str(), g.memory.0))
        .collect();
    assert_eq!(
        models,
        [
            ("NVIDIA-A100-PCIE-40GB", 40960),
            ("NVIDIA-A100-PCIE-40GB", 40960),
            ("NVIDIA-A10", 23028),
            ("NVIDIA-A10", 23028),
        ]
    );
    assert_eq!(spec.links.get(2, 3), Link::SameSwitch);
    assert_eq!(spec.links.get(1, 2), Link::CrossSocket);
}

#[test]
fn a_gpu_off_the_bus_is_listed_unhealthy_and_the_rest_still_served() {
    let reading = read(&fixture("fallen-off-bus.yaml"));
    assert!(reading.gpus[2].device.is_none());
    assert!(
        reading
            .problems
            .iter()
            .any(|p| p.contains("GPU 2") && p.contains("fallen off the bus"))
    );
    assert!(reading.problems.iter().any(|p| p.contains("XID 79")));
    let spec = as_extender_reads(&reading);
    assert_eq!(healthy(&spec), [true, true, false, true]);
    // Its links are unknown, so the worst; the others keep theirs.
    assert_eq!(spec.links.get(1, 2), Link::CrossSocket);
    assert_eq!(spec.links.get(1, 3), Link::HostBridge);
}

#[test]
fn mig_enabled_gpus_are_not_offered_whole() {
    let reading = read(&fixture("a100-mig.yaml"));
    assert!(
        reading
            .to_annotation()
            .unwrap()
            .contains(r#""migEnabled":true"#)
    );
    let spec = as_extender_reads(&reading);
    assert_eq!(
        healthy(&spec),
        [false, false, true, true, true, true, true, true]
    );
}

/// A copy of a fixture in a fresh temporary file, to be edited by the test.
fn scratch(name: &str, from: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpu-extender-agent-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::copy(fixture(from), &path).unwrap();
    path
}

#[test]
fn a_critical_xid_marks_its_gpu_unhealthy_for_good_and_application_xids_do_not() {
    let path = scratch("xid.yaml", "t4-pcie.yaml");
    let mut reader = Reader::new(FakeSource::new(&path));
    assert_eq!(reader.read().unwrap().unhealthy(), 0);
    let text = std::fs::read_to_string(&path).unwrap();
    // GPU 1 gets XID 13 (a graphics engine exception: the application's), GPU 3 XID 48 (a
    // double-bit ECC error).
    let mut blocks: Vec<String> = text.split("  - uuid:").map(str::to_owned).collect();
    blocks[2].push_str("    xids: [13]\n");
    blocks[4] = blocks[4].replacen("numa: 0\n", "numa: 0\n    xids: [48]\n", 1);
    std::fs::write(&path, blocks.join("  - uuid:")).unwrap();
    let reading = reader.read().unwrap();
    assert_eq!(
        healthy(&as_extender_reads(&reading)),
        [true, true, true, false]
    );
    // The event is reported once by the driver; the GPU stays unhealthy.
    let again = reader.read().unwrap();
    assert_eq!(
        healthy(&as_extender_reads(&again)),
        [true, true, true, false]
    );
}

#[test]
fn a_missing_driver_or_unreadable_fixture_is_an_error_not_an_empty_reading() {
    let path = scratch("driver.yaml", "t4-pcie.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        format!("driverError: libnvidia-ml.so.1 not found\n{text}"),
    )
    .unwrap();
    let error = Reader::new(FakeSource::new(&path)).read().unwrap_err();
    assert_eq!(
        error.to_string(),
        "the NVIDIA driver cannot be used: libnvidia-ml.so.1 not found"
    );
    std::fs::write(&path, "gpus: [{uuid: 1}]\n").unwrap();
    let error = Reader::new(FakeSource::new(&path)).read().unwrap_err();
    assert!(
        matches!(error, SourceError::Driver(ref m) if m.contains("missing field")),
        "{error}"
    );
    let error = Reader::new(FakeSource::new(Path::new("/nonexistent/gpus.yaml")))
        .read()
        .unwrap_err();
    assert!(
        error.to_string().contains("/nonexistent/gpus.yaml"),
        "{error}"
    );
}

/// NVML through the real library, on whatever machine the test runs: where the driver is there
/// (`/dev/nvidiactl`), the reader opens it and reads every GPU with its UUID, name and memory, and
/// the extender reads the report back; where it is not, opening fails with a clear driver error.
#[test]
fn nvml_reads_the_driver_or_says_clearly_that_it_is_missing() {
    if !Path::new("/dev/nvidiactl").exists() {
        let error = NvmlSource::open().unwrap_err();
        assert!(matches!(error, SourceError::Driver(_)), "{error:?}");
        assert!(error.to_string().contains("libnvidia-ml"), "{error}");
        return;
    }
    let source = NvmlSource::open()
        .unwrap_or_else(|e| panic!("/dev/nvidiactl exists but NVML does not open: {e}"));
    let reading = Reader::new(source).read().unwrap();
    assert!(
        !reading.gpus.is_empty(),
        "the driver is there but NVML lists no GPU: {:?}",
        reading.problems
    );
    for gpu in &reading.gpus {
        let device = gpu
            .device
            .as_ref()
            .unwrap_or_else(|| panic!("GPU {} could not be read: {:?}", gpu.index, gpu.unhealthy));
        assert!(device.uuid.starts_with("GPU-"), "{device:?}");
        assert!(!device.name.trim().is_empty(), "{device:?}");
        assert!(device.memory_mib > 0, "{device:?}");
    }
    let n = reading.gpus.len();
    assert!(
        reading.links.len() == n && reading.links.iter().all(|row| row.len() == n),
        "links are not {n}x{n}: {:?}",
        reading.links
    );
    assert_eq!(as_extender_reads(&reading).gpus.len(), n);
    eprintln!(
        "NVML read {n} GPUs: {:?}",
        reading
            .gpus
            .iter()
            .filter_map(|g| g.device.as_ref().map(|d| &d.name))
            .collect::<Vec<_>>()
    );
}

/// A scripted API: the node's annotations, and every apply.
#[derive(Default)]
struct Scripted {
    annotations: Mutex<BTreeMap<String, String>>,
    applies: Mutex<Vec<String>>,
}

impl NodeAnnotations for Scripted {
    async fn read(&self, node: &str, key: &str) -> anyhow::Result<Option<String>> {
        assert_eq!(node, "gpu-node");
        Ok(self.annotations.lock().unwrap().get(key).cloned())
    }

    async fn apply(&self, node: &str, key: &str, value: &str) -> anyhow::Result<()> {
        assert_eq!(node, "gpu-node");
        self.annotations
            .lock()
            .unwrap()
            .insert(key.into(), value.into());
        self.applies.lock().unwrap().push(value.into());
        Ok(())
    }
}

#[tokio::test]
async fn publishes_only_what_changed_and_never_an_empty_report() {
    let api = Scripted::default();
    let good = read(&fixture("t4-pcie.yaml"));
    assert_eq!(
        publish(&api, "gpu-node", KEY, &good).await.unwrap(),
        Published::Applied
    );
    assert_eq!(
        publish(&api, "gpu-node", KEY, &good).await.unwrap(),
        Published::Unchanged
    );
    let empty = Reading {
        gpus: Vec::new(),
        links: Vec::new(),
        problems: Vec::new(),
    };
    assert_eq!(
        publish(&api, "gpu-node", KEY, &empty).await.unwrap(),
        Published::SkippedEmpty
    );
    let lost = read(&fixture("fallen-off-bus.yaml"));
    assert_eq!(
        publish(&api, "gpu-node", KEY, &lost).await.unwrap(),
        Published::Applied
    );
    let applies = api.applies.lock().unwrap().clone();
    assert_eq!(
        applies,
        [good.to_annotation().unwrap(), lost.to_annotation().unwrap()]
    );
}

#[test]
fn every_agent_metric_is_documented() {
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md"))
            .unwrap();
    let metrics = AgentMetrics::new().unwrap();
    assert_eq!(metrics.names().len(), 4);
    for name in metrics.names() {
        assert!(
            docs.contains(&format!("`{name}`")),
            "{name} is not in docs/metrics.md"
        );
    }
}
