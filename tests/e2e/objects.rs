//! Fake GPU nodes and GPU pods, and waiting for what kube-scheduler does with them. Nodes have no
//! kubelet: each is created, then given capacity, allocatable and a Ready condition through the
//! status subresource, as a device plugin and kubelet would.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::harness::GPU_SCHEDULER;

/// The well-known label of a node's instance type (a node group of the kwok provider is the set
/// of nodes of one instance type).
pub const INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// Whole GPUs (exclusive nodes).
pub const NVIDIA_GPU: &str = "nvidia.com/gpu";
/// GPU memory in GiB (sharing nodes).
pub const GPU_MEM: &str = "aliyun.com/gpu-mem";
/// GPU compute percentage per GPU (core_mem nodes).
pub const GPU_CORE: &str = "aliyun.com/gpu-core.percentage";
/// Whole GPUs chosen by interconnect (topology nodes).
pub const TOPOLOGY_GPU: &str = "aliyun.com/gpu";
/// Pod label: split the GPU memory request over this many GPUs; node capacity: GPU count.
pub const GPU_COUNT: &str = "aliyun.com/gpu-count";
/// The namespace every scenario uses.
pub const NS: &str = "default";

/// A node's GPU sharing mode, as its `ack.node.gpu.schedule` label says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No label: whole GPUs (`nvidia.com/gpu`).
    Exclusive,
    /// `cgpu`: memory shares (`aliyun.com/gpu-mem`).
    Share,
    /// `core_mem`: memory and compute shares.
    CoreMem,
    /// `topology`: whole GPUs chosen by interconnect (`aliyun.com/gpu`).
    Topology,
}

/// A fake GPU node.
#[derive(Clone, Debug)]
pub struct GpuNode {
    pub name: String,
    pub mode: Mode,
    pub gpus: u16,
    pub model: String,
    /// Memory per GPU, GiB.
    pub mem_gib: u64,
    /// `binpack` / `spread` (the placement label), if set.
    pub placement: Option<String>,
    /// Extra labels and annotations.
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Host CPU cores.
    pub cpu: u32,
    /// Extended resources advertised besides (or instead of) the mode's, as
    /// [`GpuNode::advertise`] sets them.
    pub advertised: BTreeMap<String, u64>,
}

impl GpuNode {
    pub fn new(name: &str, mode: Mode, gpus: u16, model: &str, mem_gib: u64) -> Self {
        Self {
            name: name.to_owned(),
            mode,
            gpus,
            model: model.to_owned(),
            mem_gib,
            placement: None,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            cpu: 64,
            advertised: BTreeMap::new(),
        }
    }

    /// Advertises `count` of the extended resource `resource` in the node's capacity and
    /// allocatable, replacing what the mode advertises under that name (MIG slices:
    /// `nvidia.com/mig-1g.10gb`, with `nvidia.com/gpu` 0 for cards all in MIG mode).
    pub fn advertise(mut self, resource: &str, count: u64) -> Self {
        self.advertised.insert(resource.to_owned(), count);
        self
    }

    pub fn placement(mut self, placement: &str) -> Self {
        self.placement = Some(placement.to_owned());
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), value.to_owned());
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Memory per GPU in MiB.
    pub fn mem_mib(&self) -> u64 {
        self.mem_gib * 1024
    }

    fn node_labels(&self) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([
            ("kubernetes.io/hostname".to_owned(), self.name.clone()),
            ("kubernetes.io/os".to_owned(), "linux".to_owned()),
            (
                "aliyun.accelerator/nvidia_name".to_owned(),
                self.model.clone(),
            ),
            (
                "aliyun.accelerator/nvidia_mem".to_owned(),
                format!("{}MiB", self.mem_mib()),
            ),
            (
                "aliyun.accelerator/nvidia_count".to_owned(),
                self.gpus.to_string(),
            ),
        ]);
        let mode = match self.mode {
            Mode::Exclusive => None,
            Mode::Share => Some("cgpu"),
            Mode::CoreMem => Some("core_mem"),
            Mode::Topology => Some("topology"),
        };
        if let Some(mode) = mode {
            labels.insert("ack.node.gpu.schedule".to_owned(), mode.to_owned());
        }
        if let Some(placement) = &self.placement {
            labels.insert("ack.node.gpu.placement".to_owned(), placement.clone());
        }
        labels.extend(self.labels.clone());
        labels
    }

    /// This node as a node-group template of an autoscaler's kwok provider: labels (the instance
    /// type among them, no hostname), `taints`, and capacity and allocatable in the status, as a
    /// new node of the group will report them; `max` nodes at most in the group.
    pub fn template(&self, instance_type: &str, max: u32, taints: &[(&str, &str)]) -> Value {
        let mut labels = self.node_labels();
        labels.remove("kubernetes.io/hostname");
        labels.insert(INSTANCE_TYPE.to_owned(), instance_type.to_owned());
        let capacity = self.capacity();
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                // The kwok provider names its template node after this; the nodes it adds are
                // named after the group (`<instance type>-<5 random characters>`).
                "name": format!("template-{instance_type}"),
                "labels": labels,
                "annotations": { "cluster-autoscaler.kwok.nodegroup/max-count": max.to_string() },
            },
            "spec": {
                "taints": taints.iter().map(|(key, value)| json!({
                    "key": key, "value": value, "effect": "NoSchedule",
                })).collect::<Vec<_>>(),
            },
            "status": { "capacity": capacity, "allocatable": capacity },
        })
    }

    /// What the device plugins would advertise, plus host resources.
    pub fn capacity(&self) -> BTreeMap<String, String> {
        let gpus = u64::from(self.gpus);
        let mut capacity = BTreeMap::from([
            ("cpu".to_owned(), self.cpu.to_string()),
            ("memory".to_owned(), "256Gi".to_owned()),
            ("pods".to_owned(), "250".to_owned()),
        ]);
        let mut put = |key: &str, value: u64| {
            capacity.insert(key.to_owned(), value.to_string());
        };
        match self.mode {
            Mode::Exclusive => put(NVIDIA_GPU, gpus),
            Mode::Share => {
                put(GPU_MEM, gpus * self.mem_gib);
                put(GPU_COUNT, gpus);
            }
            Mode::CoreMem => {
                put(GPU_MEM, gpus * self.mem_gib);
                put(GPU_CORE, gpus * 100);
                put(GPU_COUNT, gpus);
            }
            Mode::Topology => put(TOPOLOGY_GPU, gpus),
        }
        for (resource, count) in &self.advertised {
            put(resource, *count);
        }
        capacity
    }
}

/// Creates the node, then sets capacity, allocatable and Ready through the status subresource.
pub async fn create_node(client: &kube::Client, node: &GpuNode) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let object: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": node.node_labels(),
            "annotations": node.annotations,
        },
    }))?;
    api.create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating node {}", node.name))?;
    set_node_status(&api, node).await
}

/// Relabels and resizes an existing node to `node`'s description: what a GPU operator's label
/// change or a device plugin's new capacity looks like to the watchers.
pub async fn update_node(client: &kube::Client, node: &GpuNode) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let labels = json!({ "metadata": { "labels": node.node_labels() } });
    api.patch(&node.name, &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .with_context(|| format!("relabelling node {}", node.name))?;
    set_node_status(&api, node).await
}

/// The status a device plugin and a kubelet would report: capacity, allocatable, Ready.
async fn set_node_status(api: &Api<Node>, node: &GpuNode) -> Result<()> {
    let capacity = node.capacity();
    let status = json!({
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "fake node (no kubelet)",
            }],
        }
    });
    api.patch_status(&node.name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("setting the status of node {}", node.name))?;
    Ok(())
}

/// Creates every node.
pub async fn create_nodes(client: &kube::Client, nodes: &[GpuNode]) -> Result<()> {
    for node in nodes {
        create_node(client, node).await?;
    }
    Ok(())
}

/// One container of a pod under construction.
#[derive(Clone, Debug, Default)]
pub struct Ctr {
    pub name: String,
    pub resources: Vec<(String, String)>,
}

/// A GPU pod under construction.
#[derive(Clone, Debug)]
pub struct PodSpec {
    pub name: String,
    pub scheduler: String,
    pub containers: Vec<Ctr>,
    pub init_containers: Vec<Ctr>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub node_selector: BTreeMap<String, String>,
    pub affinity: Option<Value>,
    pub tolerations: Vec<Value>,
    pub priority_class: Option<String>,
}

impl PodSpec {
    /// A pod for the `gpu-scheduler` profile with one container, `main`, asking `resource: qty`.
    pub fn new(name: &str, resource: &str, qty: u64) -> Self {
        Self::empty(name).container("main", &[(resource, qty)])
    }

    /// A pod with no container yet.
    pub fn empty(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            scheduler: GPU_SCHEDULER.to_owned(),
            containers: Vec::new(),
            init_containers: Vec::new(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            node_selector: BTreeMap::new(),
            affinity: None,
            tolerations: Vec::new(),
            priority_class: None,
        }
    }

    /// Adds `resource: qty` to the last container.
    pub fn with(mut self, resource: &str, qty: u64) -> Self {
        if let Some(last) = self.containers.last_mut() {
            last.resources.push((resource.to_owned(), qty.to_string()));
        }
        self
    }

    pub fn container(mut self, name: &str, resources: &[(&str, u64)]) -> Self {
        self.containers.push(ctr(name, resources));
        self
    }

    pub fn init_container(mut self, name: &str, resources: &[(&str, u64)]) -> Self {
        self.init_containers.push(ctr(name, resources));
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), value.to_owned());
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Pins the pod to a node by its hostname label (kube-scheduler still decides, the extender
    /// still places the GPUs).
    pub fn on(mut self, node: &str) -> Self {
        self.node_selector
            .insert("kubernetes.io/hostname".to_owned(), node.to_owned());
        self
    }

    pub fn affinity(mut self, affinity: Value) -> Self {
        self.affinity = Some(affinity);
        self
    }

    /// Tolerates the `NoSchedule` taint `key=value` (a GPU node pool's taint).
    pub fn tolerate(mut self, key: &str, value: &str) -> Self {
        self.tolerations.push(json!({
            "key": key, "operator": "Equal", "value": value, "effect": "NoSchedule",
        }));
        self
    }

    /// Sets `priorityClassName`.
    pub fn priority(mut self, class: &str) -> Self {
        self.priority_class = Some(class.to_owned());
        self
    }

    pub fn scheduler(mut self, name: &str) -> Self {
        self.scheduler = name.to_owned();
        self
    }

    pub fn to_pod(&self) -> Result<Pod> {
        let container = |c: &Ctr| {
            let mut amounts = serde_json::Map::new();
            amounts.insert("cpu".into(), json!("10m"));
            amounts.insert("memory".into(), json!("16Mi"));
            for (resource, qty) in &c.resources {
                amounts.insert(resource.clone(), json!(qty));
            }
            json!({
                "name": c.name,
                "image": "registry.k8s.io/pause:3.10",
                "resources": { "requests": amounts, "limits": amounts },
            })
        };
        let mut spec = json!({
            "schedulerName": self.scheduler,
            "terminationGracePeriodSeconds": 0,
            "containers": self.containers.iter().map(container).collect::<Vec<_>>(),
        });
        if !self.init_containers.is_empty() {
            spec["initContainers"] = self.init_containers.iter().map(container).collect();
        }
        if !self.node_selector.is_empty() {
            spec["nodeSelector"] = json!(self.node_selector);
        }
        if let Some(affinity) = &self.affinity {
            spec["affinity"] = affinity.clone();
        }
        if !self.tolerations.is_empty() {
            spec["tolerations"] = json!(self.tolerations);
        }
        if let Some(class) = &self.priority_class {
            spec["priorityClassName"] = json!(class);
        }
        let pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "namespace": NS,
                "labels": self.labels,
                "annotations": self.annotations,
            },
            "spec": spec,
        });
        serde_json::from_value(pod).with_context(|| format!("building pod {}", self.name))
    }
}

fn ctr(name: &str, resources: &[(&str, u64)]) -> Ctr {
    Ctr {
        name: name.to_owned(),
        resources: resources
            .iter()
            .map(|(r, q)| ((*r).to_owned(), q.to_string()))
            .collect(),
    }
}

/// The pods API of the scenarios' namespace.
pub fn pods(client: &kube::Client) -> Api<Pod> {
    Api::namespaced(client.clone(), NS)
}

/// Creates a pod.
pub async fn create_pod(client: &kube::Client, spec: &PodSpec) -> Result<Pod> {
    pods(client)
        .create(&PostParams::default(), &spec.to_pod()?)
        .await
        .with_context(|| format!("creating pod {}", spec.name))
}

/// Creates a pod and waits until it is bound; returns the bound pod.
pub async fn create_bound(client: &kube::Client, spec: &PodSpec, limit: Duration) -> Result<Pod> {
    create_pod(client, spec).await?;
    wait_bound(client, &spec.name, limit).await
}

/// Deletes a pod at once (there is no kubelet to wait for).
pub async fn delete_pod(client: &kube::Client, name: &str) -> Result<()> {
    pods(client)
        .delete(name, &DeleteParams::default().grace_period(0))
        .await
        .with_context(|| format!("deleting pod {name}"))?;
    Ok(())
}

/// Marks a pod finished (what its kubelet would report when the containers exit).
pub async fn set_phase(client: &kube::Client, name: &str, phase: &str) -> Result<()> {
    let patch = json!({ "status": { "phase": phase } });
    pods(client)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("setting pod {name} {phase}"))?;
    Ok(())
}

/// The node a pod is bound to, if any.
pub fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// A pod's `PodScheduled` condition: (status, reason, message).
pub fn scheduled_condition(pod: &Pod) -> Option<(String, String, String)> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled")
        .map(|c| {
            (
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

/// Whether kube-scheduler gave up on the pod for now, as unschedulable.
pub fn is_unschedulable(pod: &Pod) -> bool {
    matches!(scheduled_condition(pod), Some((s, r, _)) if s == "False" && r == "Unschedulable")
}

/// Polls `name` every 100 ms until `done` holds, for at most `limit`; the error says what the
/// pod looked like last.
pub async fn wait_pod(
    client: &kube::Client,
    name: &str,
    what: &str,
    limit: Duration,
    done: impl Fn(&Pod) -> bool,
) -> Result<Pod> {
    let api = pods(client);
    let deadline = Instant::now() + limit;
    loop {
        let pod = api.get_opt(name).await?;
        if let Some(pod) = &pod
            && done(pod)
        {
            return Ok(pod.clone());
        }
        if Instant::now() > deadline {
            let state = match &pod {
                None => "gone".to_owned(),
                Some(pod) => describe(client, pod).await,
            };
            bail!(
                "pod {name} not {what} within {:.0}s; {state}",
                limit.as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the pod is bound to a node.
pub async fn wait_bound(client: &kube::Client, name: &str, limit: Duration) -> Result<Pod> {
    wait_pod(client, name, "bound", limit, |p| node_of(p).is_some()).await
}

/// Waits until kube-scheduler marks the pod Unschedulable; returns the pod.
pub async fn wait_unschedulable(client: &kube::Client, name: &str, limit: Duration) -> Result<Pod> {
    wait_pod(client, name, "unschedulable", limit, is_unschedulable).await
}

/// Waits until every pod in `names` is bound or unschedulable; returns them all.
pub async fn wait_settled(
    client: &kube::Client,
    names: &[String],
    limit: Duration,
) -> Result<Vec<Pod>> {
    let api = pods(client);
    let deadline = Instant::now() + limit;
    loop {
        let all = api.list(&ListParams::default()).await?.items;
        let by_name: BTreeMap<&str, &Pod> = all
            .iter()
            .filter_map(|p| Some((p.metadata.name.as_deref()?, p)))
            .collect();
        let pending: Vec<&String> = names
            .iter()
            .filter(|n| {
                by_name
                    .get(n.as_str())
                    .is_none_or(|p| node_of(p).is_none() && !is_unschedulable(p))
            })
            .collect();
        if pending.is_empty() {
            return Ok(names
                .iter()
                .filter_map(|n| by_name.get(n.as_str()).map(|p| (*p).clone()))
                .collect());
        }
        if Instant::now() > deadline {
            bail!(
                "{} of {} pods neither bound nor unschedulable within {:.0}s, e.g. {:?}",
                pending.len(),
                names.len(),
                limit.as_secs_f64(),
                pending.iter().take(5).collect::<Vec<_>>()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Every pod of the namespace.
pub async fn list_pods(client: &kube::Client) -> Result<Vec<Pod>> {
    Ok(pods(client).list(&ListParams::default()).await?.items)
}

/// How many pods of the namespace are bound.
pub async fn bound_count(client: &kube::Client) -> Result<usize> {
    Ok(list_pods(client)
        .await?
        .iter()
        .filter(|p| node_of(p).is_some())
        .count())
}

/// The pod's events (reason, message), oldest first.
pub async fn events_of(client: &kube::Client, pod: &str) -> Result<Vec<(String, String)>> {
    let api: Api<Event> = Api::namespaced(client.clone(), NS);
    let params = ListParams::default().fields(&format!("involvedObject.name={pod}"));
    let mut events = api.list(&params).await?.items;
    events.sort_by(|a, b| {
        let key = |e: &Event| {
            e.last_timestamp
                .as_ref()
                .map(|t| t.0)
                .or(e.event_time.as_ref().map(|t| t.0))
        };
        key(a).cmp(&key(b))
    });
    Ok(events
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect())
}

/// Waits for a FailedScheduling event on the pod whose message contains `needle`; returns the
/// message.
pub async fn wait_failed_scheduling(
    client: &kube::Client,
    pod: &str,
    needle: &str,
    limit: Duration,
) -> Result<String> {
    let deadline = Instant::now() + limit;
    loop {
        let events = events_of(client, pod).await?;
        if let Some((_, message)) = events
            .iter()
            .find(|(reason, message)| reason == "FailedScheduling" && message.contains(needle))
        {
            return Ok(message.clone());
        }
        if Instant::now() > deadline {
            return Err(anyhow!(
                "no FailedScheduling event containing {needle:?} for pod {pod} within {:.0}s; \
                 events: {events:?}",
                limit.as_secs_f64()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A short account of a pod for error messages: node, PodScheduled condition, last events.
pub async fn describe(client: &kube::Client, pod: &Pod) -> String {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let events = events_of(client, name).await.unwrap_or_default();
    let last: Vec<String> = events
        .iter()
        .rev()
        .take(3)
        .map(|(r, m)| format!("{r}: {m}"))
        .collect();
    format!(
        "node {:?}, PodScheduled {:?}, last events {:?}",
        node_of(pod),
        scheduled_condition(pod),
        last
    )
}
