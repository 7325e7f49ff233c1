//! Translation's unit tests: nodes, pods and their error messages.

use k8s_openapi::api::core::v1::{Node, Pod};

use super::node::parse_label_memory;
use super::*;
use crate::config::Config;
use gpu_engine::ComputeMilli;
use gpu_engine::{
    CpuMilli, GpuDemand, GpuIndex, GpuMode, GpuPlacement, Link, MemMiB, TopologyPreference,
};
use serde_json::json;

fn cfg() -> Config {
    Config::default()
}

fn node(value: serde_json::Value) -> Node {
    serde_json::from_value(value).unwrap()
}

fn pod(value: serde_json::Value) -> Pod {
    serde_json::from_value(value).unwrap()
}

fn pod_with(containers: serde_json::Value) -> Pod {
    pod(json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": containers}}))
}

fn one(resources: serde_json::Value) -> Pod {
    pod_with(json!([{"name": "c", "resources": {"requests": resources, "limits": {}}}]))
}

fn err(pod: &Pod) -> String {
    pod_request(pod, &cfg()).unwrap_err().to_string()
}

// ------------------------------------------------------------------ nodes

#[test]
fn ack_labels_make_identical_gpus_and_allocatable_the_host() {
    let n = node(json!({
        "metadata": {"name": "gpu-a", "labels": {
            "ack.node.gpu.schedule": "cgpu",
            "ack.node.gpu.placement": "spread",
            "aliyun.accelerator/nvidia_name": "Tesla-V100-SXM2-32GB",
            "aliyun.accelerator/nvidia_mem": "32510MiB",
            "aliyun.accelerator/nvidia_count": "4"}},
        "status": {
            "capacity": {"cpu": "64", "memory": "256Gi", "pods": "110", "aliyun.com/gpu-mem": "124"},
            "allocatable": {"cpu": "63500m", "memory": "250Gi", "pods": "110"}}
    }));
    let spec = node_spec(&n, &cfg()).unwrap();
    assert_eq!(spec.name.as_str(), "gpu-a");
    assert_eq!(spec.mode, GpuMode::ShareMemory);
    assert_eq!(spec.placement, GpuPlacement::Spread);
    assert_eq!(spec.gpus.len(), 4);
    assert_eq!(spec.gpus[3].index, GpuIndex(3));
    assert_eq!(spec.gpus[0].model, "Tesla-V100-SXM2-32GB");
    assert_eq!(spec.gpus[0].memory, MemMiB(32510));
    assert_eq!(spec.cpu, CpuMilli(63_500));
    assert_eq!(spec.memory, MemMiB(250 * 1024));
    assert_eq!(spec.max_pods, 110);
}

#[test]
fn gfd_labels_are_the_fallback() {
    let n = node(json!({
        "metadata": {"name": "n", "labels": {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "nvidia.com/gpu.memory": "81920",
            "nvidia.com/gpu.count": "8"}}
    }));
    let spec = node_spec(&n, &cfg()).unwrap();
    assert_eq!(spec.mode, GpuMode::Exclusive);
    assert_eq!(spec.gpus.len(), 8);
    assert_eq!(spec.gpus[0].model, "NVIDIA-A100-SXM4-80GB");
    assert_eq!(spec.gpus[0].memory, MemMiB(81920));
}

#[test]
fn capacity_gives_the_count_and_share_memory_when_labels_are_absent() {
    let n = node(json!({
        "metadata": {"name": "n", "labels": {"ack.node.gpu.schedule": "share"}},
        "status": {"capacity": {"aliyun.com/gpu-count": "2", "aliyun.com/gpu-mem": "30"}}
    }));
    let spec = node_spec(&n, &cfg()).unwrap();
    assert_eq!(spec.gpus.len(), 2);
    assert_eq!(spec.gpus[0].memory, MemMiB(15 * 1024));
    assert_eq!(spec.gpus[0].model, UNKNOWN_MODEL);

    let n =
        node(json!({"metadata": {"name": "n"}, "status": {"capacity": {"nvidia.com/gpu": "8"}}}));
    assert_eq!(node_spec(&n, &cfg()).unwrap().gpus.len(), 8);

    let n = node(json!({"metadata": {"name": "cpu-only"}, "status": {"capacity": {"cpu": "8"}}}));
    let spec = node_spec(&n, &cfg()).unwrap();
    assert!(spec.gpus.is_empty());
    assert_eq!(spec.cpu, CpuMilli(8000));
}

#[test]
fn label_memory_forms() {
    assert_eq!(parse_label_memory("16160MiB"), Some(16160));
    assert_eq!(parse_label_memory("32GiB"), Some(32768));
    assert_eq!(parse_label_memory("15109"), Some(15109));
    assert_eq!(parse_label_memory("lots"), None);
    assert_eq!(parse_label_memory("16TB"), None);
}

#[test]
fn modes() {
    for (value, mode) in [
        ("default", GpuMode::Exclusive),
        ("cgpu", GpuMode::ShareMemory),
        ("share", GpuMode::ShareMemory),
        ("mps", GpuMode::ShareMemory),
        ("core_mem", GpuMode::CoreMem),
        ("topology", GpuMode::Topology),
    ] {
        let n =
            node(json!({"metadata": {"name": "n", "labels": {"ack.node.gpu.schedule": value}}}));
        assert_eq!(node_spec(&n, &cfg()).unwrap().mode, mode, "{value}");
    }
    let n = node(json!({"metadata": {"name": "n", "labels": {
            "ack.node.gpu.schedule": "shared", "aliyun.accelerator/nvidia_count": "4"}}}));
    let err = node_spec(&n, &cfg()).unwrap_err().to_string();
    assert!(err.contains("\"shared\" is not a GPU mode"), "{err}");
    let lenient = translate_node(&n, &cfg());
    assert!(
        lenient.spec.gpus.is_empty(),
        "an unreadable mode offers no GPUs"
    );
    assert_eq!(lenient.problems.len(), 1);
}

#[test]
fn bad_labels_and_quantities_are_problems_not_panics() {
    let n = node(json!({
        "metadata": {"name": "n", "labels": {
            "ack.node.gpu.placement": "sideways",
            "aliyun.accelerator/nvidia_count": "four",
            "aliyun.accelerator/nvidia_mem": "lots"}},
        "status": {"allocatable": {"cpu": "many", "memory": "-1Gi", "pods": "1.5"},
                   "capacity": {"nvidia.com/gpu": "2"}}
    }));
    let t = translate_node(&n, &cfg());
    assert_eq!(t.spec.gpus.len(), 2, "count falls back to capacity");
    assert_eq!(t.spec.placement, GpuPlacement::Binpack);
    let text: Vec<String> = t.problems.iter().map(ToString::to_string).collect();
    assert_eq!(text.len(), 6, "{text:#?}");
    assert!(
        text.iter()
            .any(|t| t.contains("expected binpack or spread"))
    );
    assert!(text.iter().any(|t| t.contains("allocatable cpu=\"many\"")));
    assert!(node_spec(&n, &cfg()).is_err());

    let n = node(
        json!({"metadata": {"name": "n", "labels": {"aliyun.accelerator/nvidia_count": "65"}}}),
    );
    let t = translate_node(&n, &cfg());
    assert!(t.spec.gpus.is_empty());
    assert_eq!(t.problems, vec![TranslateError::TooManyGpus(65)]);
}

#[test]
fn the_detail_annotation_gives_per_gpu_facts_and_links() {
    let detail = json!({
        "version": 1,
        "gpus": [
            {"index": 0, "uuid": "GPU-a", "model": "A100", "memoryMiB": 81920, "numa": 0, "healthy": true},
            {"index": 1, "uuid": "GPU-b", "model": "A100", "memoryMiB": 81920, "numa": 0},
            {"index": 2, "uuid": "GPU-c", "numa": 1, "healthy": false}
        ],
        "links": [["X", "NV12", "SYS"], ["NV12", "X", "PHB"], ["SYS", "PHB", "X"]]
    });
    let n = node(json!({
        "metadata": {"name": "n",
            "labels": {"aliyun.accelerator/nvidia_name": "A10", "aliyun.accelerator/nvidia_mem": "24GiB",
                       "aliyun.accelerator/nvidia_count": "3"},
            "annotations": {"gpu-extender.io/gpus": detail.to_string()}}
    }));
    let spec = node_spec(&n, &cfg()).unwrap();
    assert_eq!(spec.gpus.len(), 3);
    assert_eq!(spec.gpus[0].uuid.as_deref(), Some("GPU-a"));
    assert!(spec.gpus[1].healthy);
    assert!(!spec.gpus[2].healthy);
    assert_eq!(
        spec.gpus[2].model, "A10",
        "missing model comes from the labels"
    );
    assert_eq!(spec.gpus[2].memory, MemMiB(24 * 1024));
    assert_eq!(spec.gpus[2].numa, Some(1));
    assert_eq!(spec.links.get(0, 1), Link::NvLink(12));
    assert_eq!(spec.links.get(1, 2), Link::HostBridge);
    assert_eq!(spec.links.get(2, 0), Link::CrossSocket);
}

/// A report of `healthy` healthy GPUs (model H100), then `mig` MIG-enabled and `sick` unhealthy ones.
fn report(healthy: u16, sick: u16, mig: u16) -> String {
    let gpus: Vec<serde_json::Value> = (0..healthy + sick + mig)
        .map(|i| {
            json!({"index": i, "model": "H100", "memoryMiB": 81920,
                   "healthy": i < healthy + mig, "migEnabled": i >= healthy && i < healthy + mig})
        })
        .collect();
    json!({"version": 1, "gpus": gpus}).to_string()
}

#[test]
fn a_report_offering_more_gpus_than_the_device_plugin_advertises_is_not_used() {
    // 64 healthy H100s on a node whose device plugin serves 2 GPUs: the 2 from capacity, of an
    // unknown model, and the reason.
    let n = node(json!({
        "metadata": {"name": "n", "annotations": {"gpu-extender.io/gpus": report(64, 0, 0)}},
        "status": {"capacity": {"nvidia.com/gpu": "2"}, "allocatable": {"nvidia.com/gpu": "2"}}
    }));
    let t = translate_node(&n, &cfg());
    assert_eq!(t.spec.gpus.len(), 2);
    assert_eq!(t.spec.gpus[0].model, UNKNOWN_MODEL);
    assert_eq!(t.problems.len(), 1, "{:?}", t.problems);
    assert!(t.problems[0].is_detail_annotation());
    assert_eq!(
        t.problems[0].to_string(),
        "node annotation gpu-extender.io/gpus is not valid, GPUs are taken from labels instead: \
         it offers 64 healthy GPUs, more than the 2 the node's device plugin advertises \
         (capacity nvidia.com/gpu); a report is trusted only up to that count"
    );

    // One more than advertised is as untrusted as 62 more.
    let n = node(json!({
        "metadata": {"name": "n", "annotations": {"gpu-extender.io/gpus": report(3, 0, 0)}},
        "status": {"capacity": {"nvidia.com/gpu": "2"}}
    }));
    assert_eq!(translate_node(&n, &cfg()).spec.gpus[0].model, UNKNOWN_MODEL);

    // A sharing node counts its GPUs in aliyun.com/gpu-count.
    let n = node(json!({
        "metadata": {"name": "n", "labels": {"ack.node.gpu.schedule": "cgpu"},
                     "annotations": {"gpu-extender.io/gpus": report(4, 0, 0)}},
        "status": {"capacity": {"aliyun.com/gpu-mem": "64", "aliyun.com/gpu-count": "2"}}
    }));
    let t = translate_node(&n, &cfg());
    assert_eq!(t.spec.gpus.len(), 2);
    assert!(
        t.problems[0]
            .to_string()
            .contains("(capacity aliyun.com/gpu-count)"),
        "{}",
        t.problems[0]
    );
}

#[test]
fn a_report_within_the_device_plugins_count_is_used_and_only_offered_gpus_count() {
    // 2 healthy, 1 unhealthy (fallen off the bus, dropped by the device plugin) and 1 in MIG
    // mode (its instances are the device plugin's) on a node advertising 2 whole GPUs: all four
    // listed, only the two healthy ones offered.
    let n = node(json!({
        "metadata": {"name": "n", "annotations": {"gpu-extender.io/gpus": report(2, 1, 1)}},
        "status": {"capacity": {"nvidia.com/gpu": "2"}}
    }));
    let spec = node_spec(&n, &cfg()).unwrap();
    assert_eq!(spec.gpus.len(), 4);
    assert_eq!(spec.gpus.iter().filter(|g| g.healthy).count(), 2);
    assert_eq!(spec.gpus[0].model, "H100");

    // A sharing node whose device plugin advertises only the memory: no count to bound the
    // report by, so it is used as it is.
    let n = node(json!({
        "metadata": {"name": "n", "labels": {"ack.node.gpu.schedule": "cgpu"},
                     "annotations": {"gpu-extender.io/gpus": report(4, 0, 0)}},
        "status": {"capacity": {"aliyun.com/gpu-mem": "320"}}
    }));
    assert_eq!(node_spec(&n, &cfg()).unwrap().gpus.len(), 4);
}

#[test]
fn a_garbage_detail_annotation_falls_back_to_labels_with_a_clear_error() {
    let labels =
        json!({"aliyun.accelerator/nvidia_count": "2", "aliyun.accelerator/nvidia_name": "T4"});
    for (garbage, expected) in [
        ("not json", "expected"),
        (r#"{"version": 2, "gpus": []}"#, "version 2"),
        (
            r#"{"version": 1, "gpus": [{"index": 0}, {"index": 0}]}"#,
            "listed twice",
        ),
        (
            r#"{"version": 1, "gpus": [{"index": 0, "colour": "red"}]}"#,
            "unknown field",
        ),
        (
            r#"{"version": 1, "gpus": [{"index": 0}, {"index": 1}], "links": [["X"]]}"#,
            "2x2",
        ),
        (
            r#"{"version": 1, "gpus": [{"index": 0}, {"index": 1}], "links": [["X","NV2"],["NV3","X"]]}"#,
            "symmetric",
        ),
        (
            r#"{"version": 1, "gpus": [{"index": 0}, {"index": 1}], "links": [["X","QPI"],["QPI","X"]]}"#,
            "unknown link",
        ),
        (
            r#"{"version": 1, "gpus": [{"index": 0}, {"index": 1}], "links": [["NV1","NV1"],["NV1","X"]]}"#,
            "must be \"X\"",
        ),
        (
            r#"{"version": 1, "gpus": [{"index": -1}]}"#,
            "invalid value",
        ),
    ] {
        let n = node(json!({"metadata": {"name": "n", "labels": labels,
                "annotations": {"gpu-extender.io/gpus": garbage}}}));
        let t = translate_node(&n, &cfg());
        assert_eq!(t.spec.gpus.len(), 2, "fell back to labels for {garbage}");
        assert_eq!(t.spec.gpus[0].model, "T4");
        assert_eq!(t.problems.len(), 1, "{garbage}");
        assert!(t.problems[0].is_detail_annotation());
        let message = t.problems[0].to_string();
        assert!(message.contains("gpu-extender.io/gpus"), "{message}");
        assert!(message.contains(expected), "{garbage}: {message}");
    }
}

// ------------------------------------------------------------------ pods

#[test]
fn no_gpu_resource_means_none() {
    assert_eq!(pod_request(&one(json!({"cpu": "1"})), &cfg()), Ok(None));
    assert_eq!(
        pod_request(&one(json!({"nvidia.com/gpu": "0"})), &cfg()),
        Ok(None)
    );
    assert!(names_gpu_resource(
        &one(json!({"nvidia.com/gpu": "0"})),
        &cfg()
    ));
    assert!(!names_gpu_resource(&one(json!({"cpu": "1"})), &cfg()));
    let no_spec = pod(json!({"metadata": {"name": "p"}}));
    assert_eq!(pod_request(&no_spec, &cfg()), Ok(None));
}

#[test]
fn whole_topology_and_shared_demands() {
    let req = pod_request(
        &one(json!({"nvidia.com/gpu": "2", "cpu": "1", "memory": "2Gi"})),
        &cfg(),
    )
    .unwrap()
    .unwrap();
    assert_eq!(req.containers[0].gpu, GpuDemand::Whole { count: 2 });
    assert_eq!(req.cpu, CpuMilli(1000));
    assert_eq!(req.memory, MemMiB(2048));

    let req = pod_request(&one(json!({"aliyun.com/gpu": "4"})), &cfg())
        .unwrap()
        .unwrap();
    assert_eq!(req.containers[0].gpu, GpuDemand::Topology { count: 4 });

    let req = pod_request(
        &one(json!({"aliyun.com/gpu-mem": "8", "aliyun.com/gpu-core.percentage": "30"})),
        &cfg(),
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        req.containers[0].gpu,
        GpuDemand::Share {
            gpus: 1,
            mem_per_gpu: MemMiB(8192),
            compute_per_gpu: ComputeMilli(300)
        }
    );

    // Limits alone count as the request, and "1000m" is a whole 1.
    let p = pod_with(json!([{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1000m"}}}]));
    let req = pod_request(&p, &cfg()).unwrap().unwrap();
    assert_eq!(req.containers[0].gpu, GpuDemand::Whole { count: 1 });
}

#[test]
fn the_gpu_count_label_splits_memory() {
    let mut p = one(json!({"aliyun.com/gpu-mem": "16"}));
    p.metadata.labels = Some([("aliyun.com/gpu-count".to_owned(), "2".to_owned())].into());
    let req = pod_request(&p, &cfg()).unwrap().unwrap();
    assert_eq!(
        req.containers[0].gpu,
        GpuDemand::Share {
            gpus: 2,
            mem_per_gpu: MemMiB(8192),
            compute_per_gpu: ComputeMilli(0)
        }
    );
    p.metadata.labels = Some([("aliyun.com/gpu-count".to_owned(), "3".to_owned())].into());
    assert_eq!(
        err(&p),
        "container c: GPU memory 16 GiB cannot be split evenly over 3 GPUs"
    );
    p.metadata.labels = Some([("aliyun.com/gpu-count".to_owned(), "two".to_owned())].into());
    assert!(
        err(&p).starts_with("pod label aliyun.com/gpu-count=\"two\""),
        "{}",
        err(&p)
    );
    p.metadata.labels = Some([("aliyun.com/gpu-count".to_owned(), "0".to_owned())].into());
    assert!(err(&p).contains("at least 1"));
}

#[test]
fn malformed_gpu_requests_are_clear_errors() {
    assert_eq!(
        err(&one(json!({"nvidia.com/gpu": "500m"}))),
        "container c: nvidia.com/gpu quantity \"500m\" must be a whole number"
    );
    assert_eq!(
        err(&one(json!({"nvidia.com/gpu": "-1"}))),
        "container c: nvidia.com/gpu quantity \"-1\" must not be negative"
    );
    assert!(err(&one(json!({"nvidia.com/gpu": "one"}))).contains("not a Kubernetes quantity"));
    assert!(err(&one(json!({"aliyun.com/gpu-mem": "8Gi"}))).contains("counted in GiB"));
    assert!(
        err(&one(
            json!({"aliyun.com/gpu-mem": "4", "aliyun.com/gpu-core.percentage": "33"})
        ))
        .contains("multiple of 5")
    );
    assert!(
        err(&one(json!({"aliyun.com/gpu-core.percentage": "50"}))).contains("needs a GPU memory")
    );
    assert!(
        err(&one(
            json!({"nvidia.com/gpu": "1", "aliyun.com/gpu-mem": "4"})
        ))
        .contains("only one of")
    );
    assert!(err(&one(json!({"nvidia.com/gpu": "65"}))).contains("too many GPUs"));
    assert!(
        err(&one(json!({"nvidia.com/gpu": "1", "cpu": "lots"})))
            .contains("container c: cpu quantity")
    );
}

#[test]
fn init_containers_and_sidecars_follow_kubernetes() {
    let p = pod(json!({"metadata": {"name": "p"}, "spec": {
        "initContainers": [
            {"name": "setup", "resources": {"requests": {"cpu": "4", "memory": "1Gi", "aliyun.com/gpu-mem": "4"}}},
            {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}},
            {"name": "late", "resources": {"requests": {"cpu": "2", "memory": "8Gi"}}}
        ],
        "containers": [
            {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "2Gi", "aliyun.com/gpu-mem": "8"}}},
            {"name": "b", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}
        ],
        "overhead": {"cpu": "100m", "memory": "64Mi"}
    }}));
    let req = pod_request(&p, &cfg()).unwrap().unwrap();
    // cpu: max(apps 2 + sidecar 0.5, setup 4, sidecar 0.5 + late 2) + overhead = 4.1
    assert_eq!(req.cpu, CpuMilli(4100));
    // memory: max(3Gi + 512Mi, 1Gi, 512Mi + 8Gi) + 64Mi
    assert_eq!(req.memory, MemMiB(8 * 1024 + 512 + 64));
    let names: Vec<&str> = req.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        ["a", "b", "proxy"],
        "sidecars run with the app containers"
    );
    assert_eq!(req.init_containers.len(), 2);
    assert_eq!(req.init_containers[0].gpu.gpu_count(), 1);

    // A GPU only in an init container still makes a GPU pod.
    let p = pod(json!({"metadata": {"name": "p"}, "spec": {
            "initContainers": [{"name": "i", "resources": {"requests": {"nvidia.com/gpu": "1"}}}],
            "containers": [{"name": "c"}]}}));
    assert!(pod_request(&p, &cfg()).unwrap().is_some());
}

#[test]
fn pod_level_resources_replace_the_container_sum() {
    let p = pod(json!({"metadata": {"name": "p"}, "spec": {
            "resources": {"requests": {"cpu": "8"}},
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}}}]}}));
    let req = pod_request(&p, &cfg()).unwrap().unwrap();
    assert_eq!(req.cpu, CpuMilli(8000));
    assert_eq!(req.memory, MemMiB(1024));
}

#[test]
fn annotations_become_constraints() {
    let mut p = one(json!({"nvidia.com/gpu": "2"}));
    p.metadata.annotations = Some(
        [
            ("gpu-extender.io/model-include", "A100*, H100-SXM5-80GB"),
            ("gpu-extender.io/model-exclude", "A100-PCIE-40GB"),
            ("gpu-extender.io/min-gpu-memory", "40Gi"),
            ("gpu-extender.io/placement", "spread"),
            ("gpu-extender.io/topology", "required"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into(),
    );
    let c = pod_request(&p, &cfg()).unwrap().unwrap().constraints;
    assert_eq!(c.include_models.len(), 2);
    assert!(c.include_models[0].matches("A100-SXM4-80GB"));
    assert!(c.exclude_models[0].matches("a100-pcie-40gb"));
    assert_eq!(c.min_memory_per_gpu, Some(MemMiB(40 * 1024)));
    assert_eq!(c.placement, Some(GpuPlacement::Spread));
    assert_eq!(c.topology, TopologyPreference::Required);

    for (key, value, expected) in [
        ("gpu-extender.io/model-include", "A100|H100", "not valid"),
        ("gpu-extender.io/min-gpu-memory", "40", "needs a unit"),
        (
            "gpu-extender.io/min-gpu-memory",
            "forty",
            "not a Kubernetes quantity",
        ),
        (
            "gpu-extender.io/placement",
            "pack",
            "expected binpack or spread",
        ),
        (
            "gpu-extender.io/topology",
            "must",
            "expected required or preferred",
        ),
    ] {
        p.metadata.annotations = Some([(key.to_owned(), value.to_owned())].into());
        let message = err(&p);
        assert!(
            message.starts_with(&format!("pod annotation {key}")),
            "{message}"
        );
        assert!(message.contains(expected), "{message}");
    }
}

#[test]
fn configured_names_are_used() {
    let mut cfg = cfg();
    cfg.resources.gpu_mem = "nvidia.com/gpumem".into();
    cfg.resources.gpu_core = "nvidia.com/gpucores".into();
    let p = one(json!({"nvidia.com/gpumem": "4", "nvidia.com/gpucores": "50"}));
    let req = pod_request(&p, &cfg).unwrap().unwrap();
    assert_eq!(req.containers[0].gpu.gpu_count(), 1);
    assert_eq!(
        pod_request(&one(json!({"aliyun.com/gpu-mem": "4"})), &cfg),
        Ok(None)
    );
}

// ------------------------------------------------------------------ MIG

/// `(profile, count)` pairs of a spec or request.
fn mig_of(slices: &[gpu_engine::MigSlices]) -> Vec<(String, u32)> {
    slices
        .iter()
        .map(|s| (s.profile.to_string(), s.count))
        .collect()
}

#[test]
fn mig_slices_are_read_from_allocatable_and_garbage_is_reported() {
    let n = node(json!({
        "metadata": {"name": "mig-a"},
        "status": {
            "capacity": {"nvidia.com/mig-1g.10gb": "9"},
            "allocatable": {
                "cpu": "64", "nvidia.com/gpu": "0",
                "nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "2",
                "nvidia.com/mig-1g.10gb.me": "0",
                "nvidia.com/mig-big": "1", "nvidia.com/mig-2g.20gb": "1.5"}}
    }));
    let translation = translate_node(&n, &cfg());
    assert_eq!(
        mig_of(&translation.spec.mig),
        [("1g.10gb".to_owned(), 7), ("3g.40gb".to_owned(), 2)],
        "allocatable, by profile; a profile advertised 0 times holds nothing"
    );
    let problems: Vec<String> = translation
        .problems
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].contains("nvidia.com/mig-2g.20gb=\"1.5\": must be a whole number"),
        "{problems:?}"
    );
    assert!(
        problems[1].contains("nvidia.com/mig-big: \"big\" is not a MIG profile"),
        "{problems:?}"
    );
    assert!(
        node_spec(&n, &cfg()).is_err(),
        "strict reading refuses the node"
    );
}

#[test]
fn gfd_counted_mig_cards_are_never_given_whole() {
    let labels = json!({
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/gpu.count": "8"});
    // `mixed`: two cards whole, six in MIG mode; GFD counts all eight.
    let mixed = node(json!({
        "metadata": {"name": "n", "labels": labels},
        "status": {"allocatable": {"nvidia.com/gpu": "2", "nvidia.com/mig-3g.40gb": "12"}}
    }));
    let spec = node_spec(&mixed, &cfg()).unwrap();
    let healthy: Vec<bool> = spec.gpus.iter().map(|g| g.healthy).collect();
    assert_eq!(
        healthy,
        [true, true, false, false, false, false, false, false]
    );
    // Every card in MIG mode: the device plugin advertises no whole GPU at all.
    let all_mig = node(json!({
        "metadata": {"name": "n", "labels": labels},
        "status": {"allocatable": {"nvidia.com/mig-3g.40gb": "16"}}
    }));
    let spec = node_spec(&all_mig, &cfg()).unwrap();
    assert!(spec.gpus.iter().all(|g| !g.healthy) && spec.gpus.len() == 8);
    // No MIG slices advertised: the labels' cards are whole, as before.
    let plain = node(json!({"metadata": {"name": "n", "labels": labels}}));
    assert!(
        node_spec(&plain, &cfg())
            .unwrap()
            .gpus
            .iter()
            .all(|g| g.healthy)
    );
}

#[test]
fn the_single_strategy_reads_its_slices_from_the_labels_not_the_cards_report() {
    // GFD under `single`: count, memory and product describe the MIG slices the device plugin
    // advertises as `nvidia.com/gpu`; the node agent's report lists the cards, all in MIG mode.
    let n = node(json!({
        "metadata": {"name": "n",
            "labels": {
                "nvidia.com/mig.strategy": "single",
                "nvidia.com/gpu.product": "A100-SXM4-40GB-MIG-1g.5gb",
                "nvidia.com/gpu.memory": "4864",
                "nvidia.com/gpu.count": "56"},
            "annotations": {"gpu-extender.io/gpus": report(0, 0, 8)}},
        "status": {"allocatable": {"nvidia.com/gpu": "56"}}
    }));
    let translation = translate_node(&n, &cfg());
    assert!(
        translation.problems.is_empty(),
        "{:?}",
        translation.problems
    );
    let spec = translation.spec;
    assert_eq!(spec.gpus.len(), 56);
    assert!(spec.gpus.iter().all(|g| g.healthy));
    assert_eq!(spec.gpus[0].model, "A100-SXM4-40GB-MIG-1g.5gb");
    assert_eq!(spec.gpus[0].memory, MemMiB(4864));
    // The same report without the label is read: eight cards, none offered whole.
    let mut labels = n.metadata.labels.clone().unwrap();
    labels.remove("nvidia.com/mig.strategy");
    let mut mixed = n.clone();
    mixed.metadata.labels = Some(labels);
    let spec = node_spec(&mixed, &cfg()).unwrap();
    assert_eq!(spec.gpus.len(), 8);
    assert!(spec.gpus.iter().all(|g| !g.healthy));
}

#[test]
fn mig_requests_are_the_pods_all_containers_together() {
    let p = pod(
        json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {
        "initContainers": [{"name": "init", "resources": {"limits": {"nvidia.com/mig-3g.40gb": "2"}}}],
        "containers": [
            {"name": "a", "resources": {"requests": {"nvidia.com/mig-1g.10gb": "1"}}},
            {"name": "b", "resources": {"limits": {
                "nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-3g.40gb": "1"}}},
            {"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb.me": "0"}}}]}}),
    );
    let request = pod_request(&p, &cfg()).unwrap().unwrap();
    // 1 + 2 of 1g.10gb in the app containers; 3g.40gb: the init container's 2 beats the app's 1;
    // a profile asked 0 times asks for nothing.
    assert_eq!(
        mig_of(&request.mig),
        [("1g.10gb".to_owned(), 3), ("3g.40gb".to_owned(), 2)]
    );
    assert!(request.containers.iter().all(|c| c.gpu == GpuDemand::None));
    assert!(request.wants_gpu() && !request.wants_gpu_grants());
    assert!(names_gpu_resource(&p, &cfg()));
    // Only zero amounts: the pod names a MIG resource, and asks for nothing.
    let zero = one(json!({"nvidia.com/mig-1g.10gb": "0"}));
    assert!(names_gpu_resource(&zero, &cfg()));
    assert_eq!(pod_request(&zero, &cfg()), Ok(None));
    // With a whole GPU besides.
    let both = one(json!({"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "1"}));
    let request = pod_request(&both, &cfg()).unwrap().unwrap();
    assert_eq!(request.containers[0].gpu, GpuDemand::Whole { count: 1 });
    assert_eq!(mig_of(&request.mig), [("1g.10gb".to_owned(), 1)]);
}

#[test]
fn malformed_mig_requests_are_clear_errors() {
    for (resources, expected) in [
        (
            json!({"nvidia.com/mig-3g": "1"}),
            "container c: \"3g\" is not a MIG profile: expected <compute>g.<memory>gb",
        ),
        (
            json!({"nvidia.com/mig-1c.3g.20gb": "1"}),
            "container c: \"1c.3g.20gb\" is not a MIG profile",
        ),
        (
            json!({"nvidia.com/mig-1g.10gb": "-1"}),
            "container c: nvidia.com/mig-1g.10gb quantity \"-1\" must not be negative",
        ),
        (
            json!({"nvidia.com/mig-1g.10gb": "500m"}),
            "container c: nvidia.com/mig-1g.10gb quantity \"500m\" must be a whole number",
        ),
        (
            json!({"nvidia.com/mig-1g.10gb": "lots"}),
            "container c: nvidia.com/mig-1g.10gb quantity \"lots\" not a Kubernetes quantity",
        ),
    ] {
        let p = one(resources);
        assert!(err(&p).starts_with(expected), "{} for {expected}", err(&p));
        assert!(names_gpu_resource(&p, &cfg()));
    }
}

#[test]
fn link_cells_read_back_as_the_same_link() {
    for link in [
        Link::NvLink(1),
        Link::NvLink(18),
        Link::SameSwitch,
        Link::HostBridge,
        Link::CrossSocket,
    ] {
        assert_eq!(parse_link(&link_cell(link)), Some(link));
    }
}
