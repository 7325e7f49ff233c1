//! The one mapping from trace rows to Kubernetes objects: a trace node becomes a Ready Node with
//! the labels and capacity a real node of its kind carries, a trace pod a Pod asking for the
//! resources a pod of its kind asks for, and both carry the replay's owner label. The extender's
//! own translation of these objects gives exactly the engine values `simulate` uses (checked in
//! the tests below on every pod of the shared traces), so the two replays differ only in who
//! decides. Documented in docs/simulate.md ("In a real cluster").

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value, json};
use thiserror::Error;

use gpu_engine::{
    ContainerAllocation, GpuGrant, GpuIndex, Grant, NodeName, PodAllocation, ScoringPolicy,
    TypicalPod, TypicalPods, WHOLE_GPU_COMPUTE,
};
use gpu_extender::config::Config;
use gpu_sim::dra::DEVICE_CLASS;
use gpu_sim::trace::MAX_PODS_PER_NODE;
use gpu_sim::{SimNode, SimPod, Workload};

/// Label on every object the replay creates; its value names the run.
pub const OWNER_LABEL: &str = "gpu-extender.io/replay";
/// Prefix of every node name the replay creates.
pub const NODE_PREFIX: &str = "replay-";
/// The namespace the replay's pods live in.
pub const NAMESPACE: &str = "gpu-extender-replay";
/// The sharing mode every replayed node is labelled with: it serves whole GPUs and compute
/// shares, the two kinds of GPU pod in the traces.
pub const NODE_MODE: &str = "core_mem";
/// The image of every replayed pod's one container (never pulled: no kubelet runs them).
const POD_IMAGE: &str = "registry.k8s.io/pause:3.10";

/// Why a trace row has no faithful Kubernetes form.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum MappingError {
    #[error(
        "pod {pod}: a share of {milli} milli-GPU is not a whole percent of a GPU; the real loop \
         asks for compute in percent (gpu_milli must be a multiple of 10)"
    )]
    ShareNotWholePercent { pod: String, milli: u32 },
    #[error(
        "pod {pod}: {gpus} GPUs of {milli} milli-GPU each; a pod shares one GPU or takes whole \
         GPUs"
    )]
    MultiGpuShare { pod: String, gpus: u16, milli: u32 },
    #[error("nodes {first:?} and {second:?} both become the Kubernetes name {name:?}")]
    NodeNameClash {
        first: String,
        second: String,
        name: String,
    },
}

/// The extender configuration of a replay: the recommended setup (`policy.filterBestOnly`), plus
/// what the traces need. Compute is
/// asked for in whole percents alone (trace shares carry no GPU memory), the reference puts no
/// limit on pods per GPU, and FGD's typical pods are the trace's own, as `simulate` uses them.
/// Their weights are written as the number of the workload's pods in each class: the extender
/// then divides by the same total as `simulate` did, and gets the same weights to the last bit.
pub fn extender_config(
    scoring: ScoringPolicy,
    typical: &TypicalPods,
    workload: &Workload,
) -> Config {
    let mut config = Config::default();
    config.resources.gpu_core_percent_step = 1;
    config.resources.gpu_core_without_memory = true;
    config.policy.scoring = scoring;
    config.policy.max_pods_per_shared_gpu = 1000;
    // The recommended setup (deploy/): filter passes the policy's one choice.
    config.policy.filter_best_only = true;
    // The classes past the coverage cut go too, marked: fgd-plus weighs their scarcity.
    let classes = typical
        .pods()
        .iter()
        .map(|pod| (pod, false))
        .chain(typical.rare().iter().map(|pod| (pod, true)));
    config.policy.typical_pods.pods = classes
        .map(|(pod, rare)| gpu_extender::config::TypicalPodConfig {
            cpu_milli: pod.cpu.0,
            gpus: pod.gpus,
            gpu_milli: pod.milli,
            memory_mib: pod.memory.0,
            models: pod.models.iter().map(ToString::to_string).collect(),
            weight: class_size(pod, workload) as f64,
            rare,
        })
        .collect();
    config
}

/// `config` with the `--extender-set` overrides applied (`KEY=VALUE`, as `serve --set`): what
/// the extender of the loopback plane runs with, so that the replay reads the same settings
/// (the resource names its objects ask for, whether the requeue nudge retries a pod the window
/// missed).
pub fn with_extender_set(config: Config, extender_set: &[String]) -> anyhow::Result<Config> {
    let overrides = gpu_extender::config::set_overrides(extender_set, "--extender-set")?;
    Ok(config.with_overrides(&overrides)?)
}

/// How many pods of the workload are of a typical pod's class (FGD's class: CPU, milli-GPU,
/// GPU count and model list; memory is not part of it).
fn class_size(typical: &TypicalPod, workload: &Workload) -> usize {
    workload
        .pods()
        .iter()
        .filter(|pod| {
            let shape = pod.shape();
            shape.cpu == typical.cpu
                && shape.gpus == typical.gpus
                && shape.milli == typical.milli
                && pod.models == typical.models
        })
        .count()
}

/// A Kubernetes object name (and label value) for a trace name: lower case, anything but
/// letters, digits, `-` and `.` replaced by `-`.
pub fn dns_name(raw: &str) -> String {
    let name: String = raw
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
            _ => '-',
        })
        .collect();
    name.trim_matches(|c| c == '-' || c == '.').to_owned()
}

/// The Kubernetes names of the cluster's nodes, in the cluster's order.
pub fn node_names(nodes: &[SimNode]) -> Result<Vec<String>, MappingError> {
    let names: Vec<String> = nodes
        .iter()
        .map(|node| format!("{NODE_PREFIX}{}", dns_name(&node.name)))
        .collect();
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for (node, name) in nodes.iter().zip(&names) {
        if let Some(first) = seen.insert(name, &node.name) {
            return Err(MappingError::NodeNameClash {
                first: first.to_owned(),
                second: node.name.clone(),
                name: name.clone(),
            });
        }
    }
    Ok(names)
}

/// How the replay presents GPUs: through the device plugins' resources (the extender places the
/// pods), or in DRA mode through ResourceSlices and ResourceClaims (kube-scheduler places them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuApi {
    DevicePlugin,
    Dra,
}

/// The Node object (metadata only: the API server ignores a status sent with a create). In DRA
/// mode a node carries no GPU label: its GPUs are its ResourceSlice's.
pub fn node_object(node: &SimNode, name: &str, run: &str, config: &Config, api: GpuApi) -> Node {
    let labels = &config.node_labels;
    let mut node_labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_owned(), name.to_owned()),
        (OWNER_LABEL.to_owned(), run.to_owned()),
    ]);
    if node.gpus > 0 && api == GpuApi::DevicePlugin {
        node_labels.insert(labels.mode.clone(), NODE_MODE.to_owned());
        node_labels.insert(labels.model.clone(), node.model.clone());
        node_labels.insert(labels.count.clone(), node.gpus.to_string());
    }
    Node {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(node_labels),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The node's status, to be set through the status subresource: capacity and allocatable as
/// its device plugins would advertise them (whole GPUs and compute percent; no GPU memory, which
/// the traces do not have; none in DRA mode), and Ready.
pub fn node_status(node: &SimNode, config: &Config, api: GpuApi) -> Value {
    let resources = &config.resources;
    let mut capacity = BTreeMap::from([
        ("cpu".to_owned(), format!("{}m", node.cpu.0)),
        ("memory".to_owned(), format!("{}Mi", node.memory.0)),
        ("pods".to_owned(), MAX_PODS_PER_NODE.to_string()),
    ]);
    if node.gpus > 0 && api == GpuApi::DevicePlugin {
        capacity.insert(resources.whole_gpu.clone(), node.gpus.to_string());
        capacity.insert(
            resources.gpu_core.clone(),
            (u32::from(node.gpus) * 100).to_string(),
        );
    }
    json!({"status": {
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "gpu-lab replay node (no kubelet)",
        }],
    }})
}

/// The Pod for the `index`-th submission of `pod`, for the scheduler profile `scheduler`. In DRA
/// mode a GPU pod asks for no GPU resource: it names its claim ([`claim_object`], of its own
/// name) in `spec.resourceClaims` and its container uses it.
pub fn pod_object(
    pod: &SimPod,
    index: usize,
    scheduler: &str,
    run: &str,
    config: &Config,
    api: GpuApi,
) -> Result<Pod, MappingError> {
    let name = pod_name(pod, index);
    let mut requests = BTreeMap::from([
        ("cpu".to_owned(), format!("{}m", pod.cpu.0)),
        ("memory".to_owned(), format!("{}Mi", pod.memory.0)),
    ]);
    let mut limits = BTreeMap::new();
    let mut annotations = BTreeMap::new();
    let mut affinity = Value::Null;
    let mut pod_claims = Value::Null;
    let mut container_claims = Value::Null;
    if api == GpuApi::Dra {
        if gpu_sim::dra::claimed_devices(pod) > 0 {
            pod_claims = json!([{"name": CLAIM_REQUEST, "resourceClaimName": name}]);
            container_claims = json!([{"name": CLAIM_REQUEST}]);
        }
    } else if let Some((resource, amount)) = gpu_resource(pod, config)? {
        requests.insert(resource.clone(), amount.clone());
        limits.insert(resource, amount);
        let models: Vec<&str> = pod.gpu_spec.split('|').filter(|m| !m.is_empty()).collect();
        if !models.is_empty() {
            annotations.insert(config.annotations.model_include.clone(), models.join(","));
            affinity = model_affinity(&config.node_labels.model, &models);
        }
    }
    let object = json!({
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {OWNER_LABEL: run},
            "annotations": annotations,
        },
        "spec": {
            "schedulerName": scheduler,
            "affinity": affinity,
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": pod_claims,
            "containers": [{
                "name": "main",
                "image": POD_IMAGE,
                "resources": {"requests": requests, "limits": limits, "claims": container_claims},
            }],
        },
    });
    // Every field above is one the Pod type has; a failure here is a bug, not bad input.
    Ok(serde_json::from_value(object).unwrap_or_default())
}

/// Required node affinity on the model label for a pod that names its models: what a
/// Kubernetes user writes for an exact list of models, and what kube-scheduler's own filter sees.
/// Without it kube-scheduler counts nodes of every model feasible, and a window of
/// `percentageOfNodesToScore` may hold none of the pod's models (the window misses of
/// docs/operations.md). The `model-include` annotation stays beside it: it is how the extender
/// reads the same constraint, so its request equals `simulate`'s (checked below).
fn model_affinity(model_label: &str, models: &[&str]) -> Value {
    json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{
            "key": model_label, "operator": "In", "values": models,
        }]}],
    }}})
}

/// The name of the `index`-th submission (resampled pods repeat a trace row).
pub fn pod_name(pod: &SimPod, index: usize) -> String {
    format!("p{index:05}-{}", dns_name(&pod.name))
}

/// The name of a claim's one request, and of the pod's entry that uses the claim.
const CLAIM_REQUEST: &str = "gpus";

/// The DeviceClass of NVIDIA's DRA driver, as its Helm chart installs it: every device of the
/// driver whose `type` is `gpu`.
pub fn device_class(run: &str) -> DeviceClass {
    let selector = format!(
        "device.driver == '{DEVICE_CLASS}' && device.attributes['{DEVICE_CLASS}'].type == 'gpu'"
    );
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS, "labels": {OWNER_LABEL: run}},
        "spec": {"selectors": [{"cel": {"expression": selector}}]},
    }))
    .unwrap_or_default()
}

/// The ResourceSlice NVIDIA's driver would publish for `node` (Kubernetes name `name`): one pool
/// of one slice, named after the node, with a device `gpu-<i>` per GPU (attributes `type` gpu,
/// `index`, `uuid`, `productName` the trace's model; capacity `memory` 0, as the trace has no
/// GPU memory and `simulate` models none). `None` for a node without GPUs.
pub fn resource_slice(node: &SimNode, name: &str, run: &str) -> Option<ResourceSlice> {
    if node.gpus == 0 {
        return None;
    }
    let devices: Vec<Value> = (0..node.gpus)
        .map(|i| {
            json!({
                "name": format!("gpu-{i}"),
                "attributes": {
                    "type": {"string": "gpu"},
                    "index": {"int": i},
                    "uuid": {"string": format!("GPU-{name}-{i}")},
                    "productName": {"string": node.model},
                },
                "capacity": {"memory": {"value": "0"}},
            })
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": {OWNER_LABEL: run}},
        "spec": {
            "driver": DEVICE_CLASS,
            "nodeName": name,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }))
    .ok()
}

/// The ResourceClaim of the `index`-th submission of `pod` (named as the pod): one request for
/// its devices ([`gpu_sim::dra::claimed_devices`]) of [`DEVICE_CLASS`], and for a pod that names
/// GPU models a CEL selector on the devices' `productName` (a trailing `*` a prefix). `None` for
/// a pod that asks for no GPU.
pub fn claim_object(pod: &SimPod, index: usize, run: &str) -> Option<ResourceClaim> {
    let devices = gpu_sim::dra::claimed_devices(pod);
    if devices == 0 {
        return None;
    }
    let product = format!("device.attributes['{DEVICE_CLASS}'].productName");
    let models: Vec<String> = pod
        .gpu_spec
        .split('|')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(|model| match model.strip_suffix('*') {
            Some(prefix) => format!("{product}.startsWith({prefix:?})"),
            None => format!("{product} == {model:?}"),
        })
        .collect();
    let mut exactly = json!({
        "deviceClassName": DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": devices,
    });
    if !models.is_empty() {
        exactly["selectors"] = json!([{"cel": {"expression": models.join(" || ")}}]);
    }
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": pod_name(pod, index), "namespace": NAMESPACE, "labels": {OWNER_LABEL: run}},
        "spec": {"devices": {"requests": [{"name": CLAIM_REQUEST, "exactly": exactly}]}},
    }))
    .ok()
}

/// What a bound pod with `claim` holds on `node`: the GPUs of the devices kube-scheduler
/// allocated (`gpu-<i>` of [`DEVICE_CLASS`] is GPU `i`), with its CPU and memory.
pub fn claim_allocation(
    claim: &ResourceClaim,
    node: &str,
    pod: &SimPod,
) -> anyhow::Result<PodAllocation> {
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .ok_or_else(|| anyhow::anyhow!("claim {name} of a bound pod is not allocated"))?;
    let gpus = results
        .iter()
        .map(|result| {
            let index = result
                .device
                .strip_prefix("gpu-")
                .and_then(|i| i.parse::<u16>().ok())
                .filter(|_| result.driver == DEVICE_CLASS && result.pool == node)
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "claim {name}: device {}/{}/{} is not a GPU of node {node}",
                        result.driver,
                        result.pool,
                        result.device
                    )
                })?;
            Ok(GpuGrant {
                gpu: GpuIndex(index),
                grant: Grant::Whole,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut allocation = PodAllocation::host_only(NodeName::new(node), pod.cpu, pod.memory);
    allocation.containers.push(ContainerAllocation {
        name: "main".to_owned(),
        gpus,
    });
    Ok(allocation)
}

/// The GPU resource and amount a trace pod asks for: whole GPUs by count, a share as a compute
/// percentage (one GPU), nothing for a CPU-only pod.
fn gpu_resource(pod: &SimPod, config: &Config) -> Result<Option<(String, String)>, MappingError> {
    let shape = pod.shape();
    if shape.gpus == 0 {
        return Ok(None);
    }
    if shape.milli >= WHOLE_GPU_COMPUTE.0 {
        return Ok(Some((
            config.resources.whole_gpu.clone(),
            shape.gpus.to_string(),
        )));
    }
    if shape.gpus > 1 {
        return Err(MappingError::MultiGpuShare {
            pod: pod.name.clone(),
            gpus: shape.gpus,
            milli: shape.milli,
        });
    }
    if !shape.milli.is_multiple_of(10) {
        return Err(MappingError::ShareNotWholePercent {
            pod: pod.name.clone(),
            milli: shape.milli,
        });
    }
    Ok(Some((
        config.resources.gpu_core.clone(),
        (shape.milli / 10).to_string(),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_engine::{CpuMilli, MemMiB};
    use gpu_extender::objects::admission::{Layer, claim_refusal};
    use gpu_extender::objects::translate;
    use gpu_sim::{Cluster, Prepared, load};
    use std::path::Path;

    fn with_status(node: Node, status: Value) -> Node {
        let mut value = serde_json::to_value(node).unwrap();
        value["status"] = status["status"].clone();
        serde_json::from_value(value).unwrap()
    }

    fn sim_pod(name: &str, gpus: u16, milli: u32, spec: &str) -> SimPod {
        SimPod {
            name: name.into(),
            cpu: CpuMilli(4000),
            memory: MemMiB(8192),
            gpus,
            milli,
            gpu_spec: spec.into(),
            models: gpu_sim::load::model_list(spec).unwrap(),
            lifetime: None,
        }
    }

    /// The extender's reading of the mapped objects equals the simulator's engine values.
    fn assert_same_as_simulate(cluster: &Cluster, workload: &Workload) {
        let typical = Prepared::new(cluster, workload).typical().clone();
        let config = extender_config(ScoringPolicy::FgdPlus, &typical, workload);
        config.validate().unwrap();
        let names = node_names(cluster.nodes()).unwrap();
        for (node, name) in cluster.nodes().iter().zip(&names) {
            let object = with_status(
                node_object(node, name, "t", &config, GpuApi::DevicePlugin),
                node_status(node, &config, GpuApi::DevicePlugin),
            );
            let mut expected = node.spec();
            expected.name = gpu_engine::NodeName::new(name);
            // NodeSpec has no PartialEq (its topology index is derived); its Debug form
            // shows every field.
            assert_eq!(
                format!("{:?}", translate::node_spec(&object, &config).unwrap()),
                format!("{expected:?}"),
                "node {}",
                node.name
            );
        }
        for (index, pod) in workload.pods().iter().enumerate() {
            let object = pod_object(
                pod,
                index,
                "gpu-scheduler",
                "t",
                &config,
                GpuApi::DevicePlugin,
            )
            .unwrap();
            let request = translate::pod_request(&object, &config).unwrap();
            if pod.gpu_total() == 0 {
                assert_eq!(request, None, "pod {}", pod.name);
                assert_eq!(
                    translate::pod_host_request(&object).unwrap(),
                    (pod.cpu, pod.memory),
                    "pod {}",
                    pod.name
                );
            } else {
                assert_eq!(request, Some(pod.request()), "pod {}", pod.name);
            }
        }
        let policy = config.engine_policy();
        // The classes survive the config; their scarcity the extender measures on its own nodes.
        assert_eq!(
            policy.typical.pods(),
            typical.pods(),
            "typical pods survive the config"
        );
        assert_eq!(
            policy.typical.rare(),
            typical.rare(),
            "so do the classes past the cut"
        );
    }

    #[test]
    fn the_built_in_example_maps_to_what_simulate_uses() {
        let scenario =
            load::parse_scenario(Path::new("example"), gpu_sim::cli::EXAMPLE_SCENARIO).unwrap();
        assert_same_as_simulate(&scenario.cluster.unwrap(), &scenario.workload.unwrap());
    }

    #[test]
    #[ignore = "needs the openb traces in ../shared/traces/openb; make test runs it when they are there"]
    fn every_pod_of_the_shared_traces_maps_to_what_simulate_uses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces/openb");
        assert!(
            dir.join(gpu_sim::cli::OPENB_NODES).is_file(),
            "no openb traces at {}: {}",
            dir.display(),
            gpu_sim::cli::OPENB_SOURCE
        );
        let cluster = load::load_cluster(&dir.join(gpu_sim::cli::OPENB_NODES)).unwrap();
        for trace in ["default", "gpushare40", "multigpu20", "gpuspec10", "cpu050"] {
            let workload =
                load::load_workload(&dir.join(format!("openb_pod_list_{trace}.csv"))).unwrap();
            assert_same_as_simulate(&cluster, &workload);
        }
    }

    #[test]
    fn the_replay_reads_the_extender_s_configuration_with_its_overrides() {
        let base = Config::default();
        assert!(base.requeue.enabled);
        let set = |args: &[&str]| {
            let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
            with_extender_set(Config::default(), &args)
        };
        let off = set(&["requeue.enabled=false", "policy.filterBestOnly=false"]).unwrap();
        assert!(!off.requeue.enabled);
        assert!(!off.policy.filter_best_only);
        let unknown = set(&["requeue.nope=1"]).unwrap_err().to_string();
        assert!(unknown.contains("requeue.nope"), "{unknown}");
        let malformed = set(&["requeue.enabled"]).unwrap_err().to_string();
        assert!(malformed.contains("KEY=VALUE"), "{malformed}");
        // FGD+'s knobs reach the extender by the keys `simulate` takes, and the policy the
        // replay measures against (`ReplayPlan::policy`) reads them from the same config.
        let tuned = set(&["policy.fgdPlus.host.weight=0", "policy.fgdPlus.lookahead=0"]).unwrap();
        let mut expected = gpu_engine::policy::fgd_plus::Tuning::default();
        expected.set("host.weight", "0").unwrap();
        expected.set("lookahead", "0").unwrap();
        assert_eq!(tuned.engine_policy().fgd_plus, expected);
    }

    #[test]
    fn pods_ask_for_the_resources_of_their_kind() {
        let config = extender_config(
            ScoringPolicy::Binpack,
            &TypicalPods::default(),
            &Workload::new("none", Vec::new()),
        );
        let requests = |pod: &SimPod| {
            let object = pod_object(
                pod,
                7,
                "gpu-scheduler",
                "run-1",
                &config,
                GpuApi::DevicePlugin,
            )
            .unwrap();
            let spec = object.spec.unwrap();
            assert_eq!(spec.scheduler_name.as_deref(), Some("gpu-scheduler"));
            let requests = spec.containers[0]
                .resources
                .clone()
                .unwrap()
                .requests
                .unwrap();
            requests
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect::<BTreeMap<_, _>>()
        };
        let whole = requests(&sim_pod("w", 2, 1000, ""));
        assert_eq!(whole["nvidia.com/gpu"], "2");
        let share = requests(&sim_pod("s", 1, 470, ""));
        assert_eq!(share["aliyun.com/gpu-core.percentage"], "47");
        assert!(!share.contains_key("aliyun.com/gpu-mem"));
        let cpu = requests(&sim_pod("c", 0, 0, "T4"));
        assert_eq!(cpu.len(), 2, "{cpu:?}");
        assert_eq!(cpu["cpu"], "4000m");
        assert_eq!(cpu["memory"], "8192Mi");
        let constrained = pod_object(
            &sim_pod("m", 1, 1000, "T4|P100"),
            0,
            "x",
            "run-1",
            &config,
            GpuApi::DevicePlugin,
        )
        .unwrap();
        assert_eq!(
            constrained.metadata.annotations.clone().unwrap()["gpu-extender.io/model-include"],
            "T4,P100"
        );
        // kube-scheduler sees the same constraint: a node of another model fails its
        // NodeAffinity filter, a node of one of the models passes it.
        let model_node = |model: &str| -> Node {
            serde_json::from_value(json!({"metadata": {"name": "n", "labels": {
                "aliyun.accelerator/nvidia_name": model,
            }}}))
            .unwrap()
        };
        assert_eq!(
            claim_refusal(&model_node("V100M32"), &constrained).map(|r| r.layer),
            Some(Layer::NodeAffinity)
        );
        assert_eq!(claim_refusal(&model_node("P100"), &constrained), None);
        let free = pod_object(
            &sim_pod("f", 1, 1000, ""),
            0,
            "x",
            "run-1",
            &config,
            GpuApi::DevicePlugin,
        )
        .unwrap();
        assert!(
            free.spec.unwrap().affinity.is_none(),
            "no models, no affinity"
        );
        assert_eq!(
            pod_name(&sim_pod("openb-pod-0001", 1, 1000, ""), 42),
            "p00042-openb-pod-0001"
        );
    }

    #[test]
    fn in_dra_mode_the_extender_reads_the_objects_as_simulate_models_them() {
        let config = Config::default();
        let node = SimNode {
            name: "n1".into(),
            cpu: CpuMilli(64_000),
            memory: MemMiB(262_144),
            gpus: 4,
            model: "V100M16".into(),
        };
        // The node: no GPU of its own (no label, no capacity); its slice's devices are the
        // GPUs `simulate --dra` gives it: whole, of the trace's model, no memory.
        let object = with_status(
            node_object(&node, "replay-n1", "t", &config, GpuApi::Dra),
            node_status(&node, &config, GpuApi::Dra),
        );
        let own = translate::node_spec(&object, &config).unwrap();
        assert!(own.gpus.is_empty(), "{own:?}");
        assert_eq!((own.cpu, own.memory), (node.cpu, node.memory));
        let slice = resource_slice(&node, "replay-n1", "t").unwrap();
        let mut book = gpu_extender::objects::dra::DraBook::new();
        book.apply_slice(&slice, &config.dra);
        let (gpus, problems) =
            gpu_extender::objects::dra::node_gpus(&book.node_devices("replay-n1"));
        assert!(problems.is_empty(), "{problems:?}");
        let expected = gpu_sim::dra::node_spec(&node);
        assert_eq!(gpus.len(), expected.gpus.len());
        for (read, modelled) in gpus.iter().zip(&expected.gpus) {
            assert_eq!(
                (read.index, &read.model, read.memory, read.healthy),
                (
                    modelled.index,
                    &modelled.model,
                    modelled.memory,
                    modelled.healthy
                )
            );
        }
        let no_gpus = SimNode { gpus: 0, ..node };
        assert!(resource_slice(&no_gpus, "replay-c", "t").is_none());

        // Pods: a share claims one device, whole GPUs their count; the pod names its claim and
        // asks for no GPU resource; the extender reads the claim's count.
        for (pod, devices) in [
            (sim_pod("s", 1, 470, "T4|P100"), 1),
            (sim_pod("w", 8, 1000, ""), 8),
        ] {
            let claim = claim_object(&pod, 3, "t").unwrap();
            assert_eq!(
                gpu_extender::objects::dra::requested_gpus(&claim, &config.dra),
                Some(devices)
            );
            let object = pod_object(&pod, 3, "gpu-scheduler", "t", &config, GpuApi::Dra).unwrap();
            assert_eq!(translate::pod_request(&object, &config).unwrap(), None);
            assert_eq!(
                translate::pod_host_request(&object).unwrap(),
                (pod.cpu, pod.memory)
            );
            assert_eq!(
                gpu_extender::objects::dra::pod_claims(&object),
                [format!("{NAMESPACE}/{}", claim.metadata.name.unwrap())]
            );
        }
        let selectors = serde_json::to_value(claim_object(
            &sim_pod("s", 1, 470, "T4|P100"),
            0,
            "t",
        ))
        .unwrap()["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
            .clone();
        assert_eq!(
            selectors[0]["cel"]["expression"],
            "device.attributes['gpu.nvidia.com'].productName == \"T4\" || \
             device.attributes['gpu.nvidia.com'].productName == \"P100\""
        );
        let cpu_only = sim_pod("c", 0, 0, "");
        assert!(claim_object(&cpu_only, 0, "t").is_none());
        let object = pod_object(&cpu_only, 0, "gpu-scheduler", "t", &config, GpuApi::Dra).unwrap();
        assert!(gpu_extender::objects::dra::pod_claims(&object).is_empty());
    }

    #[test]
    fn a_claim_s_devices_are_the_gpus_the_pod_holds() {
        let pod = sim_pod("w", 2, 1000, "");
        let mut claim = claim_object(&pod, 0, "t").unwrap();
        claim.status = serde_json::from_value(json!({"allocation": {"devices": {"results": [
            {"request": "gpus", "driver": "gpu.nvidia.com", "pool": "replay-n1", "device": "gpu-2"},
            {"request": "gpus", "driver": "gpu.nvidia.com", "pool": "replay-n1", "device": "gpu-3"},
        ]}}}))
        .unwrap();
        let allocation = claim_allocation(&claim, "replay-n1", &pod).unwrap();
        let held: Vec<u16> = allocation.footprint().iter().map(|h| h.gpu.0).collect();
        assert_eq!(held, [2, 3]);
        assert!(allocation.footprint().iter().all(|h| h.whole));
        assert_eq!((allocation.cpu, allocation.memory), (pod.cpu, pod.memory));
        let error = claim_allocation(&claim, "replay-n2", &pod).unwrap_err();
        assert!(
            error.to_string().contains("not a GPU of node replay-n2"),
            "{error}"
        );
        claim.status = None;
        let error = claim_allocation(&claim, "replay-n1", &pod).unwrap_err();
        assert!(error.to_string().contains("not allocated"), "{error}");
    }

    #[test]
    fn rows_without_a_faithful_kubernetes_form_are_refused_by_name() {
        let config = Config::default();
        assert_eq!(
            pod_object(
                &sim_pod("odd", 1, 455, ""),
                0,
                "x",
                "r",
                &config,
                GpuApi::DevicePlugin
            )
            .unwrap_err(),
            MappingError::ShareNotWholePercent {
                pod: "odd".into(),
                milli: 455
            }
        );
        assert!(matches!(
            pod_object(
                &sim_pod("multi", 2, 500, ""),
                0,
                "x",
                "r",
                &config,
                GpuApi::DevicePlugin
            ),
            Err(MappingError::MultiGpuShare { gpus: 2, .. })
        ));
        let node = |name: &str| SimNode {
            name: name.into(),
            cpu: CpuMilli(1000),
            memory: MemMiB(1024),
            gpus: 1,
            model: "T4".into(),
        };
        assert!(matches!(
            node_names(&[node("Node_A"), node("node-a")]),
            Err(MappingError::NodeNameClash { .. })
        ));
        assert_eq!(
            node_names(&[node("Node_A")]).unwrap(),
            ["replay-node-a".to_owned()]
        );
    }
}
