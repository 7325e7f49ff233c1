//! The allocation record: which GPUs each container of a bound pod holds, written as annotations
//! on the Binding (the API server copies them onto the pod, so binding and record are one write)
//! and read back by the watch to rebuild the table after a restart. Pure: the assume time is an
//! argument, never read here. The format is documented in `docs/annotations.md`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::translate::{TranslateError, pod_host_request, pod_mig_request};
use crate::config::Config;
use gpu_engine::{
    ComputeMilli, ContainerAllocation, GpuDemand, GpuGrant, GpuIndex, Grant, MemMiB, NodeName,
    NodeSpec, PodAllocation, PodRequest,
};

/// The record's format version.
pub const RECORD_VERSION: u32 = 1;

/// gpushare device plugin: the GPU index (indices, comma-separated, when the pod shares several).
pub const GPUSHARE_IDX: &str = "ALIYUN_COM_GPU_MEM_IDX";
/// gpushare device plugin: the pod's GPU memory, in the `gpuMem` resource's unit (GiB).
pub const GPUSHARE_POD: &str = "ALIYUN_COM_GPU_MEM_POD";
/// gpushare device plugin: when the scheduler decided, nanoseconds since the Unix epoch.
pub const GPUSHARE_ASSUME_TIME: &str = "ALIYUN_COM_GPU_MEM_ASSUME_TIME";
/// gpushare device plugin: `false` until the device plugin has served the pod.
pub const GPUSHARE_ASSIGNED: &str = "ALIYUN_COM_GPU_MEM_ASSIGNED";
/// gpushare device plugin: the chosen GPU's total memory, in GiB.
pub const GPUSHARE_DEV: &str = "ALIYUN_COM_GPU_MEM_DEV";

/// Why a pod's record cannot be used. The watch then counts the pod as using what its requests
/// say and reports it.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum RecordError {
    #[error("annotation {key} is not a valid allocation record: {problem}")]
    Corrupt { key: String, problem: String },
    #[error(
        "annotation {key} was written for another pod (uid {record_uid}, this pod is {pod_uid}); copied from another pod?"
    )]
    OtherPod {
        key: String,
        record_uid: String,
        pod_uid: String,
    },
    #[error("annotation {key} names node {record_node} but the pod is {}", match .pod_node { Some(n) => format!("bound to {n}"), None => "not bound".to_owned() })]
    NodeMismatch {
        key: String,
        record_node: String,
        pod_node: Option<String>,
    },
    #[error("pod resources: {0}")]
    Pod(#[from] TranslateError),
}

/// The one field every version of the record has.
#[derive(Deserialize)]
struct VersionOnly {
    version: u32,
}

/// The JSON in the record annotation.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RecordDoc {
    version: u32,
    node: String,
    pod_uid: String,
    containers: Vec<ContainerDoc>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    init_containers: Vec<ContainerDoc>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ContainerDoc {
    name: String,
    gpus: Vec<GpuDoc>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GpuDoc {
    index: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    uuid: Option<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    whole: bool,
    #[serde(default, rename = "memoryMiB", skip_serializing_if = "is_zero_u64")]
    memory_mib: u64,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    compute_milli: u32,
}

fn is_false(value: &bool) -> bool {
    !*value
}

fn is_zero_u64(value: &u64) -> bool {
    *value == 0
}

fn is_zero_u32(value: &u32) -> bool {
    *value == 0
}

/// The Binding annotations for `allocation`: the record under `annotations.allocation`, and the
/// gpushare device plugin's annotations when `gpushare.enabled` and the pod holds shares.
/// `node` supplies the GPU UUIDs and memory; `assume_time_ns` is the decision time in
/// nanoseconds since the Unix epoch.
pub fn encode(
    allocation: &PodAllocation,
    node: &NodeSpec,
    pod_uid: &str,
    assume_time_ns: u128,
    cfg: &Config,
) -> BTreeMap<String, String> {
    let uuid = |index: GpuIndex| {
        node.gpus
            .iter()
            .find(|gpu| gpu.index == index)
            .and_then(|gpu| gpu.uuid.clone())
    };
    let containers = |list: &[ContainerAllocation]| -> Vec<ContainerDoc> {
        list.iter()
            .map(|container| ContainerDoc {
                name: container.name.clone(),
                gpus: container
                    .gpus
                    .iter()
                    .map(|grant| {
                        let (whole, memory_mib, compute_milli) = match grant.grant {
                            Grant::Whole => (true, 0, 0),
                            Grant::Share { mem, compute } => (false, mem.0, compute.0),
                        };
                        GpuDoc {
                            index: grant.gpu.0,
                            uuid: uuid(grant.gpu),
                            whole,
                            memory_mib,
                            compute_milli,
                        }
                    })
                    .collect(),
            })
            .collect()
    };
    let doc = RecordDoc {
        version: RECORD_VERSION,
        node: allocation.node.as_str().to_owned(),
        pod_uid: pod_uid.to_owned(),
        containers: containers(&allocation.containers),
        init_containers: containers(&allocation.init_containers),
    };
    let mut annotations = BTreeMap::new();
    // Serialising plain strings and numbers cannot fail; an empty record would be refused on
    // read and so could never be mistaken for a real one.
    annotations.insert(
        cfg.annotations.allocation.clone(),
        serde_json::to_string(&doc).unwrap_or_default(),
    );
    if cfg.gpushare.enabled {
        annotations.extend(gpushare_annotations(allocation, node, assume_time_ns));
    }
    annotations
}

/// What the gpushare device plugin reads. It only serves memory shares, so pods holding whole
/// GPUs get none of these. It knows one index per pod; a pod sharing several GPUs gets them all,
/// comma-separated, which only multi-GPU-aware versions of the plugin understand.
fn gpushare_annotations(
    allocation: &PodAllocation,
    node: &NodeSpec,
    assume_time_ns: u128,
) -> Vec<(String, String)> {
    let mut indices = BTreeSet::new();
    let mut pod_mem = MemMiB(0);
    for grant in allocation.containers.iter().flat_map(|c| &c.gpus) {
        if let Grant::Share { mem, .. } = grant.grant {
            indices.insert(grant.gpu);
            pod_mem = MemMiB(pod_mem.0.saturating_add(mem.0));
        }
    }
    if indices.is_empty() {
        return Vec::new();
    }
    let device_mem = indices
        .first()
        .and_then(|first| node.gpus.iter().find(|gpu| gpu.index == *first))
        .map_or(0, |gpu| gpu.memory.0 / 1024);
    let idx = indices
        .iter()
        .map(|i| i.0.to_string())
        .collect::<Vec<_>>()
        .join(",");
    vec![
        (GPUSHARE_IDX.to_owned(), idx),
        (GPUSHARE_POD.to_owned(), (pod_mem.0 / 1024).to_string()),
        (GPUSHARE_ASSUME_TIME.to_owned(), assume_time_ns.to_string()),
        (GPUSHARE_ASSIGNED.to_owned(), "false".to_owned()),
        (GPUSHARE_DEV.to_owned(), device_mem.to_string()),
    ]
}

/// Reads a pod's allocation back: `Ok(None)` when it has no record, an error when the record is
/// corrupt, was copied from another pod, or names a node the pod is not bound to. CPU, memory
/// and MIG slices come from the pod's own requests: the record names no slice, since kubelet
/// chooses the MIG instance, and a pod bound to a node holds the slices it asks for there.
pub fn decode(pod: &Pod, cfg: &Config) -> Result<Option<PodAllocation>, RecordError> {
    let key = &cfg.annotations.allocation;
    let Some(text) = pod.metadata.annotations.as_ref().and_then(|a| a.get(key)) else {
        return Ok(None);
    };
    let corrupt = |problem: String| RecordError::Corrupt {
        key: key.clone(),
        problem,
    };
    // The version first, on its own: a record of another version may have other fields, and
    // must be refused for its version (docs/install.md, upgrades), not misread as a broken v1.
    let version = serde_json::from_str::<VersionOnly>(text)
        .map_err(|e| corrupt(e.to_string()))?
        .version;
    if version != RECORD_VERSION {
        return Err(corrupt(format!(
            "version {version} is not supported (expected {RECORD_VERSION}; written by a newer build?)"
        )));
    }
    let doc: RecordDoc = serde_json::from_str(text).map_err(|e| corrupt(e.to_string()))?;
    let pod_uid = pod.metadata.uid.as_deref().unwrap_or_default();
    if doc.pod_uid != pod_uid {
        return Err(RecordError::OtherPod {
            key: key.clone(),
            record_uid: doc.pod_uid,
            pod_uid: pod_uid.to_owned(),
        });
    }
    let pod_node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    if pod_node.as_deref() != Some(doc.node.as_str()) {
        return Err(RecordError::NodeMismatch {
            key: key.clone(),
            record_node: doc.node,
            pod_node,
        });
    }
    let names: BTreeSet<&str> = pod
        .spec
        .iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .map(|c| c.name.as_str())
        .collect();
    let containers = |list: Vec<ContainerDoc>| -> Result<Vec<ContainerAllocation>, RecordError> {
        list.into_iter()
            .map(|container| {
                if !names.contains(container.name.as_str()) {
                    return Err(corrupt(format!(
                        "container {:?} is not in the pod",
                        container.name
                    )));
                }
                let mut seen = BTreeSet::new();
                let gpus = container
                    .gpus
                    .into_iter()
                    .map(|gpu| {
                        if !seen.insert(gpu.index) {
                            return Err(corrupt(format!(
                                "container {:?} lists GPU {} twice",
                                container.name, gpu.index
                            )));
                        }
                        let grant = match (gpu.whole, gpu.memory_mib, gpu.compute_milli) {
                            (true, 0, 0) => Grant::Whole,
                            (true, _, _) => {
                                return Err(corrupt(format!(
                                    "GPU {} is whole and also has a share amount",
                                    gpu.index
                                )));
                            }
                            // A share holds memory, compute or both; compute alone is a
                            // compute-only share (`resources.gpuCoreWithoutMemory`).
                            (false, 0, 0) => {
                                return Err(corrupt(format!(
                                    "GPU {} has neither whole nor a share amount",
                                    gpu.index
                                )));
                            }
                            (false, _, compute) if compute > 1000 => {
                                return Err(corrupt(format!(
                                    "GPU {} has computeMilli {compute} > 1000",
                                    gpu.index
                                )));
                            }
                            (false, mem, compute) => Grant::Share {
                                mem: MemMiB(mem),
                                compute: ComputeMilli(compute),
                            },
                        };
                        Ok(GpuGrant {
                            gpu: GpuIndex(gpu.index),
                            grant,
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(ContainerAllocation {
                    name: container.name,
                    gpus,
                })
            })
            .collect()
    };
    let containers_allocation = containers(doc.containers)?;
    let init_allocation = containers(doc.init_containers)?;
    let (cpu, memory) = pod_host_request(pod)?;
    Ok(Some(PodAllocation {
        node: NodeName::new(&doc.node),
        cpu,
        memory,
        containers: containers_allocation,
        init_containers: init_allocation,
        mig: pod_mig_request(pod)?,
    }))
}

/// Whether a decoded record is what the pod asks for (`request`, its own translated request;
/// `None` for a pod that asks for no GPU): every container holds exactly the GPUs its demand
/// names (that many whole GPUs; a share of that many GPUs with its memory and compute on each;
/// none), and only GPUs the node has (`node`, when it is known). A record is written by the binder from the pod's request,
/// so any difference means it was written by someone else; `Err` says what differs.
pub fn matches_request(
    allocation: &PodAllocation,
    request: Option<&PodRequest>,
    node: Option<&NodeSpec>,
) -> Result<(), String> {
    for grant in allocation
        .containers
        .iter()
        .chain(&allocation.init_containers)
        .flat_map(|c| &c.gpus)
    {
        if let Some(node) = node
            && !node.gpus.iter().any(|gpu| gpu.index == grant.gpu)
        {
            return Err(format!("GPU {} is not on node {}", grant.gpu.0, node.name));
        }
    }
    let empty = Vec::new();
    let (containers, init) =
        request.map_or((&empty, &empty), |r| (&r.containers, &r.init_containers));
    for (held, asked) in [
        (&allocation.containers, containers),
        (&allocation.init_containers, init),
    ] {
        for container in held {
            let demand = asked
                .iter()
                .find(|c| c.name == container.name)
                .map_or(GpuDemand::None, |c| c.gpu);
            let grants = &container.gpus;
            let fits = match demand {
                GpuDemand::None => grants.is_empty(),
                GpuDemand::Whole { count } | GpuDemand::Topology { count } => {
                    grants.len() == usize::from(count)
                        && grants.iter().all(|g| g.grant == Grant::Whole)
                }
                GpuDemand::Share {
                    gpus,
                    mem_per_gpu,
                    compute_per_gpu,
                } => {
                    grants.len() == usize::from(gpus)
                        && grants.iter().all(|g| {
                            g.grant
                                == Grant::Share {
                                    mem: mem_per_gpu,
                                    compute: compute_per_gpu,
                                }
                        })
                }
            };
            if !fits {
                return Err(format!(
                    "container {:?} holds {} GPU grant(s) where it asks for {demand:?}",
                    container.name,
                    grants.len()
                ));
            }
        }
        for container in asked {
            let recorded = held.iter().any(|c| c.name == container.name);
            if !recorded && container.gpu != GpuDemand::None {
                return Err(format!(
                    "container {:?} asks for {:?} and the record gives it nothing",
                    container.name, container.gpu
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::translate::pod_request;
    use gpu_engine::{
        CpuMilli, Gpu, GpuDemand, GpuMode, LinkMatrix, NodeState, PodRequest, Policy, fit,
    };
    use serde_json::json;

    fn node_spec() -> NodeSpec {
        let gpus = (0..4)
            .map(|i| Gpu {
                uuid: Some(format!("GPU-{i}")),
                ..Gpu::new(i, "T4", MemMiB(15 * 1024))
            })
            .collect();
        NodeSpec::with_gpus("gpu-a", GpuMode::CoreMem, gpus, LinkMatrix::uniform(4))
    }

    fn pod_on(node: &str, annotations: BTreeMap<String, String>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1", "annotations": annotations},
            "spec": {"nodeName": node,
                "initContainers": [{"name": "init", "resources": {"requests": {"aliyun.com/gpu-mem": "2"}}}],
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "2", "memory": "1Gi",
                        "aliyun.com/gpu-mem": "4", "aliyun.com/gpu-core.percentage": "30"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}}},
                    {"name": "c"}]}
        }))
        .unwrap()
    }

    fn allocation() -> PodAllocation {
        let pod = pod_on("gpu-a", BTreeMap::new());
        let request: PodRequest = pod_request(&pod, &Config::default()).unwrap().unwrap();
        Policy::default()
            .evaluate(&NodeState::new(node_spec()), &request)
            .unwrap()
            .allocation
    }

    #[test]
    fn encode_then_decode_is_identity() {
        let cfg = Config::default();
        let allocation = allocation();
        assert_eq!(allocation.cpu, CpuMilli(3000));
        let annotations = encode(&allocation, &node_spec(), "uid-1", 1, &cfg);
        assert_eq!(
            annotations.len(),
            1,
            "no gpushare annotations unless enabled"
        );
        let pod = pod_on("gpu-a", annotations.clone());
        assert_eq!(decode(&pod, &cfg), Ok(Some(allocation.clone())));

        let record: serde_json::Value =
            serde_json::from_str(&annotations["gpu-extender.io/allocation"]).unwrap();
        assert_eq!(record["version"], 1);
        assert_eq!(record["podUid"], "uid-1");
        let share = &record["containers"][0]["gpus"][0];
        assert_eq!(share["memoryMiB"], 4096);
        assert_eq!(share["computeMilli"], 300);
        assert!(share["uuid"].as_str().unwrap().starts_with("GPU-"));
        assert_eq!(record["containers"][1]["gpus"][0]["whole"], true);
        assert_eq!(record["containers"][2]["gpus"], json!([]));
        assert_eq!(record["initContainers"][0]["name"], "init");
    }

    /// A pod of MIG slices gets a record that names no GPU; its slices come back from its own
    /// request, as the binder placed them.
    #[test]
    fn a_mig_pods_slices_come_back_from_its_request() {
        let cfg = Config::default();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1"},
            "spec": {"nodeName": "mig-a", "containers": [{"name": "main", "resources": {
                "limits": {"nvidia.com/mig-1g.10gb": "2"}}}]}
        }))
        .unwrap();
        let request = pod_request(&pod, &cfg).unwrap().unwrap();
        let spec =
            NodeSpec::uniform("mig-a", GpuMode::Exclusive, 0, "A100", MemMiB(0)).with_mig(vec![
                gpu_engine::MigSlices::new(gpu_engine::MigProfile::parse("1g.10gb").unwrap(), 7),
            ]);
        let allocation = fit(&NodeState::new(spec.clone()), &request, &Policy::default()).unwrap();
        assert_eq!(allocation.mig, request.mig);
        let annotations = encode(&allocation, &spec, "uid-1", 1, &cfg);
        let record: serde_json::Value =
            serde_json::from_str(&annotations["gpu-extender.io/allocation"]).unwrap();
        assert_eq!(record["containers"], json!([{"name": "main", "gpus": []}]));
        let mut bound = pod.clone();
        bound.metadata.annotations = Some(annotations);
        assert_eq!(decode(&bound, &cfg), Ok(Some(allocation.clone())));
        assert_eq!(
            matches_request(&allocation, Some(&request), Some(&spec)),
            Ok(())
        );
    }

    #[test]
    fn every_grant_shape_round_trips() {
        let cfg = Config::default();
        let mut allocation = allocation();
        allocation.containers[0].gpus = vec![
            GpuGrant {
                gpu: GpuIndex(2),
                grant: Grant::Share {
                    mem: MemMiB(1),
                    compute: ComputeMilli(0),
                },
            },
            GpuGrant {
                gpu: GpuIndex(3),
                grant: Grant::Share {
                    mem: MemMiB(15 * 1024),
                    compute: ComputeMilli(1000),
                },
            },
        ];
        allocation.init_containers.clear();
        let annotations = encode(&allocation, &node_spec(), "uid-1", 0, &cfg);
        let pod = pod_on("gpu-a", annotations);
        assert_eq!(decode(&pod, &cfg), Ok(Some(allocation)));
    }

    #[test]
    fn gpushare_annotations_when_enabled() {
        let mut cfg = Config::default();
        cfg.gpushare.enabled = true;
        let allocation = allocation();
        let annotations = encode(
            &allocation,
            &node_spec(),
            "uid-1",
            1_700_000_000_123_456_789,
            &cfg,
        );
        let share_gpu = allocation.containers[0].gpus[0].gpu.0.to_string();
        assert_eq!(annotations[GPUSHARE_IDX], share_gpu);
        assert_eq!(annotations[GPUSHARE_POD], "4");
        assert_eq!(annotations[GPUSHARE_ASSUME_TIME], "1700000000123456789");
        assert_eq!(annotations[GPUSHARE_ASSIGNED], "false");
        assert_eq!(annotations[GPUSHARE_DEV], "15");
        // The device plugin's annotations never confuse the record.
        assert_eq!(
            decode(&pod_on("gpu-a", annotations), &cfg),
            Ok(Some(allocation.clone()))
        );

        // Whole-GPU pods get no gpushare annotations.
        let mut whole = allocation;
        whole.containers.retain(|c| c.name == "b");
        whole.init_containers.clear();
        let annotations = encode(&whole, &node_spec(), "uid-1", 5, &cfg);
        assert_eq!(annotations.len(), 1);
    }

    #[test]
    fn missing_record_is_none() {
        let cfg = Config::default();
        assert_eq!(decode(&pod_on("gpu-a", BTreeMap::new()), &cfg), Ok(None));
    }

    fn with_record(record: &str) -> Pod {
        pod_on(
            "gpu-a",
            [("gpu-extender.io/allocation".to_owned(), record.to_owned())].into(),
        )
    }

    #[test]
    fn garbage_records_are_errors_never_panics() {
        let cfg = Config::default();
        let base = |containers: &str| {
            format!(r#"{{"version":1,"node":"gpu-a","podUid":"uid-1","containers":{containers}}}"#)
        };
        for (record, expected) in [
            ("".to_owned(), "EOF"),
            ("{".to_owned(), "EOF"),
            ("[]".to_owned(), "invalid length"),
            ("null".to_owned(), "invalid type"),
            (
                r#"{"version":2,"node":"gpu-a","podUid":"uid-1","containers":[]}"#.to_owned(),
                "version 2",
            ),
            (base(r#"[{"name":"zzz","gpus":[]}]"#), "not in the pod"),
            (
                base(r#"[{"name":"a","gpus":[{"index":0,"whole":true,"memoryMiB":5}]}]"#),
                "also has a share",
            ),
            (
                base(r#"[{"name":"a","gpus":[{"index":0}]}]"#),
                "neither whole",
            ),
            (
                base(r#"[{"name":"a","gpus":[{"index":0,"memoryMiB":5,"computeMilli":1001}]}]"#),
                "> 1000",
            ),
            (
                base(
                    r#"[{"name":"a","gpus":[{"index":0,"whole":true},{"index":0,"whole":true}]}]"#,
                ),
                "twice",
            ),
            (
                base(r#"[{"name":"a","gpus":[{"index":70000,"whole":true}]}]"#),
                "invalid value",
            ),
            (
                base(r#"[{"name":"a","gpus":[{"index":0,"whole":true,"extra":1}]}]"#),
                "unknown field",
            ),
            (
                base(r#"[{"name":"a","gpus":[{"index":0,"memoryMiB":-5}]}]"#),
                "invalid value",
            ),
        ] {
            let err = decode(&with_record(&record), &cfg).unwrap_err();
            let message = err.to_string();
            assert!(
                matches!(err, RecordError::Corrupt { .. }),
                "{record}: {message}"
            );
            assert!(
                message.starts_with(
                    "annotation gpu-extender.io/allocation is not a valid allocation record"
                ),
                "{message}"
            );
            assert!(message.contains(expected), "{record}: {message}");
        }
    }

    #[test]
    fn a_copied_or_misplaced_record_is_refused() {
        let cfg = Config::default();
        let other = r#"{"version":1,"node":"gpu-a","podUid":"uid-0","containers":[]}"#;
        assert!(matches!(
            decode(&with_record(other), &cfg),
            Err(RecordError::OtherPod { .. })
        ));
        let elsewhere = r#"{"version":1,"node":"gpu-b","podUid":"uid-1","containers":[]}"#;
        let err = decode(&with_record(elsewhere), &cfg).unwrap_err();
        assert_eq!(
            err.to_string(),
            "annotation gpu-extender.io/allocation names node gpu-b but the pod is bound to gpu-a"
        );
        let mut unbound =
            with_record(r#"{"version":1,"node":"gpu-a","podUid":"uid-1","containers":[]}"#);
        if let Some(spec) = unbound.spec.as_mut() {
            spec.node_name = None;
        }
        assert!(
            decode(&unbound, &cfg)
                .unwrap_err()
                .to_string()
                .ends_with("not bound")
        );
    }

    #[test]
    fn the_demand_shapes_fit_the_record() {
        // A memory share split over two GPUs records one grant per GPU.
        let demand = GpuDemand::share(8, 2, None).unwrap();
        let request = PodRequest::single(CpuMilli(0), MemMiB(0), demand);
        let allocation = Policy::default()
            .evaluate(&NodeState::new(node_spec()), &request)
            .unwrap()
            .allocation;
        let mut cfg = Config::default();
        cfg.gpushare.enabled = true;
        let annotations = encode(&allocation, &node_spec(), "u", 0, &cfg);
        assert_eq!(annotations[GPUSHARE_POD], "8");
        assert_eq!(annotations[GPUSHARE_IDX].split(',').count(), 2);
    }
}
