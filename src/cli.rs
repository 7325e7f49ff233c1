//! The operator commands `inspect` and `explain`: they read the cluster the way the extender does
//! (Nodes and Pods listed with the user's kubeconfig, fed through the same watch feed, so the
//! same translation and allocation-record code builds the table) and print what the report and
//! explanation modules make of it. `inspect` can instead read a running extender's `/inspect`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::ListParams;
use kube::runtime::watcher::Event;

use crate::config::{Config, ConfigFlags};
use crate::explain;
use crate::http::client::fetch_report_as;
use crate::inspect::Filter;
use crate::k8s::api::kube_client;
use crate::k8s::dra::DraEvent;
use crate::k8s::quota;
use crate::k8s::watch::Feed;
use crate::objects::quota::quota_names;
use crate::objects::{admission, translate};
use crate::state::{ClusterState, Snapshot, TableWriter};
use gpu_engine::quota::QuotaSet;

/// Output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned text in the style of `kubectl inspect cgpu`.
    #[default]
    Text,
    /// The report as JSON (the `/inspect` endpoint's shape).
    Json,
}

/// Where the commands read the cluster from.
#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    /// Kubeconfig to reach the API server; default: KUBECONFIG, ~/.kube/config, or in-cluster.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The extender's configuration (label, resource and annotation keys; policy), as for `serve`.
    #[command(flatten)]
    pub config: ConfigFlags,
}

/// Command-line arguments of `inspect`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Read a running extender's report instead of the API server, e.g.
    /// http://127.0.0.1:9090 (its admin listener, server.adminListen; `/inspect` is added when
    /// no path is given).
    #[arg(long, value_name = "URL")]
    pub from: Option<String>,
    /// With --from: a bearer token for the admin listener, which answers `/inspect` only to a
    /// user allowed `get` on it (server.adminAuth.paths) and a token issued for one of
    /// server.adminAuth.audiences, e.g. "$(kubectl create token NAME --audience gpu-extender)".
    #[arg(
        long,
        value_name = "TOKEN",
        env = "GPU_EXTENDER_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// Only this node.
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,
    /// Only GPUs whose model contains this text (case-insensitive), and the nodes that have one.
    #[arg(long, value_name = "TEXT")]
    pub model: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: Output,
    /// Leave out the list of pods on each GPU.
    #[arg(long)]
    pub no_pods: bool,
}

/// Command-line arguments of `explain`.
#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// The pod, as NAMESPACE/NAME (or NAME in the `default` namespace).
    #[arg(value_name = "NAMESPACE/NAME")]
    pub pod: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: Output,
}

/// Runs `inspect`; returns what to print.
pub async fn inspect(args: InspectArgs) -> anyhow::Result<String> {
    let report = match &args.from {
        Some(url) => fetch_report_as(url, args.token.as_deref()).await?,
        None => {
            let (_, state, _) = load(&args.cluster).await?;
            state.report()
        }
    };
    if let Some(node) = &args.node
        && !report.nodes.iter().any(|n| n.name == *node)
    {
        bail!("node {node} is not in the report (not a node of this cluster, or not yet seen)");
    }
    let report = report.filtered(&Filter {
        node: args.node.clone(),
        model: args.model.clone(),
    });
    match args.output {
        Output::Json => serde_json::to_string_pretty(&report).context("encoding the report"),
        Output::Text => Ok(report.to_text(!args.no_pods)),
    }
}

/// Runs `explain`; returns what to print.
pub async fn explain(args: ExplainArgs) -> anyhow::Result<String> {
    let (namespace, name) = match args.pod.split_once('/') {
        Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => (namespace, name),
        Some(_) => bail!("{}: expected NAMESPACE/NAME", args.pod),
        None => ("default", args.pod.as_str()),
    };
    let config = Arc::new(args.cluster.config.load()?);
    let (nodes, pods, client) = list(&args.cluster).await?;
    let dra = list_dra(&client, &config).await?;
    let quotas = quota::list(client.clone(), &config).await?;
    let pod = Api::<Pod>::namespaced(client, namespace)
        .get_opt(name)
        .await
        .with_context(|| format!("reading pod {namespace}/{name}"))?
        .ok_or_else(|| anyhow!("pod {namespace}/{name} not found"))?;
    explain_objects(&config, (nodes, pods, dra), quotas, &pod, args.output)
}

/// ResourceSlices and ResourceClaims as listed for the table ([`list_dra`]).
type DraObjects = (Vec<ResourceSlice>, Vec<ResourceClaim>);

/// Every ResourceSlice and ResourceClaim, read as the extender reads them; `None` with
/// `dra.enabled` off, or where the API does not serve them to this user.
async fn list_dra(client: &kube::Client, config: &Config) -> anyhow::Result<Option<DraObjects>> {
    if !config.dra.enabled {
        return Ok(None);
    }
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let slices = match slices.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(error) if crate::k8s::dra::unavailable(&error).is_some() => return Ok(None),
        Err(error) => return Err(anyhow::Error::new(error).context("listing ResourceSlices")),
    };
    let claims: Api<ResourceClaim> = Api::all(client.clone());
    let claims = claims
        .list(&ListParams::default())
        .await
        .context("listing ResourceClaims")?;
    Ok(Some((slices, claims.items)))
}

/// `explain` on listed objects: builds the table from the nodes, pods and DRA objects as the
/// extender does, applies kube-scheduler's node-level filters to `pod` on each node, then the
/// engine and the team's quota (`quotas`: none where the cluster has no ElasticQuota CRD), and
/// renders the verdicts in `output`. A pod that asks for GPUs through DRA claims is judged for
/// the whole GPUs its claims ask for, as the DRA prioritize ranks it (docs/dra.md). No I/O.
fn explain_objects(
    config: &Arc<Config>,
    (nodes, pods, dra): (Vec<Node>, Vec<Pod>, Option<DraObjects>),
    quotas: Option<QuotaSet>,
    pod: &Pod,
    output: Output,
) -> anyhow::Result<String> {
    let key = format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("")
    );
    let extended = translate::pod_request(pod, config)
        .map_err(|error| anyhow!("pod {key}: its GPU request cannot be read: {error}"))?;
    let pod_key = translate::pod_key(pod);
    let used = admission::requested_by_node(
        pods.iter()
            .filter(|other| translate::pod_key(other) != pod_key),
        config,
    );
    let mut refused = BTreeMap::new();
    for node in &nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let refusal = admission::node_refusal(node, pod, used.get(&name), config)
            .map_err(|error| anyhow!("pod {key}: its GPU request cannot be read: {error}"))?;
        if let Some(refusal) = refusal {
            refused.insert(
                name,
                explain::SchedulerRefusal {
                    layer: refusal.layer.as_str(),
                    resolvable: refusal.is_resolvable(),
                    detail: refusal.detail,
                },
            );
        }
    }
    let state = build_state(config, nodes, pods, dra);
    if let Some(quotas) = quotas {
        state.set_quotas(quotas);
    }
    let (request, claimed) = match extended {
        Some(request) => (request, None),
        None => {
            let no_gpu =
                || anyhow!("pod {key} requests no GPU: the GPU extender does not judge it");
            let ask = state.claim_ask(pod).ok_or_else(no_gpu)?;
            let (cpu, memory) = translate::pod_host_request(pod).unwrap_or_default();
            let request = crate::state::verbs::claim_pod_request(&ask, cpu, memory)
                .map_err(|error| anyhow!("pod {key}: its claims' GPUs cannot be read: {error}"))?;
            (request, Some(ask))
        }
    };
    let claims = crate::objects::dra::pod_claims(pod);
    let policy = std::sync::Arc::new(config.engine_policy());
    let snapshot = Snapshot::of(&state, policy);
    let table = snapshot.table();
    if let Some(entry) = table.pod(&pod_key)
        && claimed.is_some()
    {
        let held: Vec<String> = claims
            .iter()
            .filter_map(|claim| {
                let hold = table.external(&crate::objects::dra::claim_holder(claim))?;
                let gpus: Vec<String> = hold.holds.iter().map(|h| h.gpu.0.to_string()).collect();
                let slices: Vec<String> = hold
                    .mig
                    .iter()
                    .map(|slices| format!("{} x{}", slices.profile, slices.count))
                    .collect();
                let slices = if slices.is_empty() {
                    String::new()
                } else {
                    format!(" (MIG slices {})", slices.join(", "))
                };
                Some(format!(
                    "{claim} holds GPU {}{slices} of {}",
                    gpus.join(", "),
                    hold.node
                ))
            })
            .collect();
        let text = format!(
            "Pod {key} is bound to node {}; its DRA claims: {}.\n",
            entry.allocation.node,
            if held.is_empty() {
                "none holds GPUs".to_owned()
            } else {
                held.join("; ")
            }
        );
        return match output {
            Output::Text => Ok(text),
            Output::Json => serde_json::to_string_pretty(&serde_json::json!({
                "pod": key,
                "boundTo": entry.allocation.node.as_str(),
                "claims": held,
            }))
            .context("encoding the explanation"),
        };
    }
    if let Some(entry) = table.pod(&pod_key) {
        let text = format!(
            "Pod {key} is bound to node {} with {}.\n",
            entry.allocation.node,
            explain::describe_allocation(&entry.allocation)
        );
        return match output {
            Output::Text => Ok(text),
            Output::Json => serde_json::to_string_pretty(&serde_json::json!({
                "pod": key,
                "boundTo": entry.allocation.node.as_str(),
                "gpus": explain::describe_allocation(&entry.allocation),
            }))
            .context("encoding the explanation"),
        };
    }
    let verdicts = explain::explain(table, &request, snapshot.policy(), &refused);
    let over_quota = snapshot
        .quota_admit(
            pod.metadata.namespace.as_deref().unwrap_or("default"),
            &request,
            &quota_names(config),
        )
        .err();
    match output {
        Output::Text => {
            let mut text = explain::to_text(&key, &request, &verdicts);
            if let Some(ask) = &claimed {
                text.push_str(&format!(
                    "DRA: the pod's claims ({}) ask for {} of a known DeviceClass. kube-scheduler's DRA plugin filters the nodes and allocates the devices; the extender ranks the nodes with the {} policy on the GPUs and MIG slices their ResourceSlices publish, less those claims hold (the verdicts above).\n",
                    claims.join(", "),
                    ask.describe(),
                    snapshot.policy().scoring.as_str()
                ));
            }
            if let Some(reason) = &over_quota {
                text.push_str(&format!(
                    "Refused on every node: {reason}; the pod waits until its team's GPUs are freed.\n"
                ));
            }
            Ok(text)
        }
        Output::Json => serde_json::to_string_pretty(&serde_json::json!({
            "pod": key,
            "request": explain::describe_request(&request),
            "claims": claims,
            "quota": over_quota,
            "nodes": verdicts,
        }))
        .context("encoding the explanation"),
    }
}

/// Lists Nodes and Pods and builds the table from them through the extender's own watch feed.
async fn load(
    args: &ClusterArgs,
) -> anyhow::Result<(Arc<Config>, Arc<ClusterState>, kube::Client)> {
    let config = Arc::new(args.config.load()?);
    let (nodes, pods, client) = list(args).await?;
    let dra = list_dra(&client, &config).await?;
    let state = build_state(&config, nodes, pods, dra);
    if let Some(quotas) = quota::list(client.clone(), &config).await? {
        state.set_quotas(quotas);
    }
    Ok((config, state, client))
}

/// Lists the Nodes and the Pods that hold anything (not finished), with the user's kubeconfig.
async fn list(args: &ClusterArgs) -> anyhow::Result<(Vec<Node>, Vec<Pod>, kube::Client)> {
    let client = kube_client(args.kubeconfig.as_deref()).await?;
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing nodes")?;
    // The same selection as the extender's pod watch: finished pods hold nothing.
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(crate::k8s::watch::LIVE_PODS))
        .await
        .context("listing pods")?;
    Ok((nodes.items, pods.items, client))
}

/// The table built from listed Nodes, Pods and (where listed) DRA objects through the extender's
/// own watch feed.
fn build_state(
    config: &Arc<Config>,
    nodes: Vec<Node>,
    pods: Vec<Pod>,
    dra: Option<DraObjects>,
) -> Arc<ClusterState> {
    let writer = TableWriter::new(ClusterState::for_config(config));
    let state = Arc::clone(writer.reader());
    let mut feed = Feed::new(writer, config.clone(), Arc::new(config.engine_policy()));
    if let Some((slices, claims)) = dra {
        feed.watch_dra();
        feed.apply_dra_event(DraEvent::Slice(Ok(Event::Init)));
        for slice in slices {
            feed.apply_dra_event(DraEvent::Slice(Ok(Event::InitApply(slice))));
        }
        feed.apply_dra_event(DraEvent::Slice(Ok(Event::InitDone)));
        feed.apply_dra_event(DraEvent::Claim(Ok(Event::Init)));
        for claim in claims {
            feed.apply_dra_event(DraEvent::Claim(Ok(Event::InitApply(claim))));
        }
        feed.apply_dra_event(DraEvent::Claim(Ok(Event::InitDone)));
    }
    feed.apply_node_event(&Event::Init);
    for node in nodes {
        feed.apply_node_event(&Event::InitApply(node));
    }
    feed.apply_node_event(&Event::InitDone);
    feed.apply_pod_event(&Event::Init);
    for pod in pods {
        feed.apply_pod_event(&Event::InitApply(pod));
    }
    feed.apply_pod_event(&Event::InitDone);
    state
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on a broken fixture")]

    use serde_json::{Value, json};

    use super::*;

    /// A fake GPU node as `scripts/demo.sh` makes them: labels for the mode and the cards, and
    /// the allocatable a device plugin would advertise for the mode.
    fn node(name: &str, mode: &str, count: u32, mem_gib: u32, extra: Value) -> Node {
        let mut labels = json!({
            "aliyun.accelerator/nvidia_name": "GPU",
            "aliyun.accelerator/nvidia_mem": format!("{}MiB", mem_gib * 1024),
            "aliyun.accelerator/nvidia_count": count.to_string(),
        });
        let mut allocatable = json!({"cpu": "64", "memory": "256Gi", "pods": "110"});
        match mode {
            "default" => allocatable["nvidia.com/gpu"] = json!(count.to_string()),
            "topology" => allocatable["aliyun.com/gpu"] = json!(count.to_string()),
            _ => {
                allocatable["aliyun.com/gpu-mem"] = json!((count * mem_gib).to_string());
                allocatable["aliyun.com/gpu-count"] = json!(count.to_string());
            }
        }
        if mode != "default" {
            labels["ack.node.gpu.schedule"] = json!(mode);
        }
        let mut node = json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {},
            "status": {"allocatable": allocatable, "capacity": allocatable},
        });
        if let Some(extra) = extra.as_object() {
            for (path, value) in extra {
                match path.as_str() {
                    "labels" => {
                        for (k, v) in value.as_object().unwrap() {
                            node["metadata"]["labels"][k] = v.clone();
                        }
                    }
                    "annotations" => node["metadata"]["annotations"] = value.clone(),
                    "taints" => node["spec"]["taints"] = value.clone(),
                    _ => panic!("unknown extra {path}"),
                }
            }
        }
        serde_json::from_value(node).unwrap()
    }

    fn pod(name: &str, limits: Value, spec: Value) -> Pod {
        let mut pod = json!({
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"schedulerName": "gpu-scheduler", "containers": [
                {"name": "main", "resources": {"limits": limits}}
            ]},
            "status": {"phase": "Pending"},
        });
        for (k, v) in spec.as_object().unwrap() {
            pod["spec"][k] = v.clone();
        }
        serde_json::from_value(pod).unwrap()
    }

    /// Per node, its verdict from `explain -o json`.
    fn verdicts(nodes: Vec<Node>, pods: Vec<Pod>, pod: &Pod) -> BTreeMap<String, Value> {
        let config = Arc::new(Config::default());
        let out = explain_objects(&config, (nodes, pods, None), None, pod, Output::Json).unwrap();
        let json: Value = serde_json::from_str(&out).unwrap();
        json["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| (v["node"].as_str().unwrap().to_owned(), v.clone()))
            .collect()
    }

    /// Issue 15: in the demo, kube-scheduler said "5 Insufficient nvidia.com/gpu" for `batch-2`
    /// while `explain` said it fit 3 of 5 nodes ("a100-nvlink yes fits: would get GPU6"). Only
    /// `a100-whole` advertises `nvidia.com/gpu`, and `batch-1` holds its one GPU.
    #[test]
    fn batch_2_fits_no_node_of_the_demo_as_kube_scheduler_says() {
        let nodes = vec![
            node("a100-nvlink", "topology", 8, 80, json!({})),
            node("t4-binpack", "cgpu", 4, 16, json!({})),
            node("a10-spread", "cgpu", 4, 24, json!({})),
            node("v100-coremem", "core_mem", 2, 32, json!({})),
            node("a100-whole", "default", 1, 40, json!({})),
        ];
        let whole = json!({"cpu": "100m", "memory": "64Mi", "nvidia.com/gpu": "1"});
        let batch_1 = pod("batch-1", whole.clone(), json!({"nodeName": "a100-whole"}));
        let batch_2 = pod("batch-2", whole, json!({}));
        let verdicts = verdicts(nodes, vec![batch_1, batch_2.clone()], &batch_2);
        assert_eq!(verdicts.len(), 5);
        for (name, verdict) in &verdicts {
            assert_eq!(verdict["fits"], json!(false), "{name}: {verdict}");
            assert_eq!(
                verdict["layer"],
                json!("NodeResourcesFit"),
                "{name}: {verdict}"
            );
            let detail = verdict["detail"].as_str().unwrap();
            assert!(
                detail.starts_with("kube-scheduler NodeResourcesFit: Insufficient nvidia.com/gpu"),
                "{name}: {detail}"
            );
        }
        assert!(
            verdicts["a100-whole"]["detail"]
                .as_str()
                .unwrap()
                .contains("the node has 1 allocatable, its pods request 1, the pod asks 1"),
            "{}",
            verdicts["a100-whole"]
        );
        assert!(
            verdicts["a100-nvlink"]["detail"]
                .as_str()
                .unwrap()
                .contains("the node has 0 allocatable"),
            "{}",
            verdicts["a100-nvlink"]
        );
    }

    /// Each layer names itself: a taint, required node affinity, the allocatable count, the
    /// resource name, the extender's own GPU check, and a node that passes them all.
    #[test]
    fn each_refusing_layer_is_named_before_the_engine_is_asked() {
        let nodes = vec![
            node(
                "tainted",
                "default",
                1,
                40,
                json!({"taints": [{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]}),
            ),
            node("pool-b", "default", 1, 40, json!({"labels": {"pool": "b"}})),
            node("full", "default", 1, 40, json!({})),
            node("sharing", "cgpu", 2, 16, json!({})),
            node(
                "unhealthy",
                "default",
                1,
                40,
                json!({"annotations": {"gpu-extender.io/gpus":
                    r#"{"version": 1, "gpus": [{"index": 0, "healthy": false}]}"#}}),
            ),
            node("free", "default", 1, 40, json!({})),
        ];
        let limits = json!({"nvidia.com/gpu": "1"});
        let holder = pod("holder", limits.clone(), json!({"nodeName": "full"}));
        let wanted = pod(
            "wanted",
            limits,
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions":
                    [{"key": "pool", "operator": "NotIn", "values": ["b"]}]}]}}}}),
        );
        let verdicts = verdicts(nodes, vec![holder, wanted.clone()], &wanted);
        let layer = |name: &str| verdicts[name]["layer"].as_str().map(str::to_owned);
        assert_eq!(layer("tainted").as_deref(), Some("TaintToleration"));
        assert_eq!(verdicts["tainted"]["resolvable"], json!(false));
        assert_eq!(layer("pool-b").as_deref(), Some("NodeAffinity"));
        assert_eq!(layer("full").as_deref(), Some("NodeResourcesFit"));
        assert_eq!(verdicts["full"]["resolvable"], json!(true));
        assert_eq!(layer("sharing").as_deref(), Some("NodeResourcesFit"));
        assert_eq!(layer("unhealthy").as_deref(), Some("gpu-extender"));
        assert_eq!(verdicts["unhealthy"]["reason"], json!("unhealthy_gpus"));
        assert_eq!(
            verdicts["free"]["fits"],
            json!(true),
            "{}",
            verdicts["free"]
        );
        assert_eq!(verdicts["free"]["layer"], Value::Null);

        // The text names the layer on every line.
        let config = Arc::new(Config::default());
        let text = explain_objects(
            &config,
            (
                vec![node(
                    "pool-b",
                    "default",
                    1,
                    40,
                    json!({"labels": {"pool": "b"}}),
                )],
                Vec::new(),
                None,
            ),
            None,
            &wanted,
            Output::Text,
        )
        .unwrap();
        assert!(
            text.contains("pool-b  no    kube-scheduler NodeAffinity: node(s) didn't match"),
            "{text}"
        );
    }

    /// A pod asking for GPUs through DRA claims is judged for the whole GPUs they ask for, on
    /// the GPUs the nodes' slices publish less those other claims hold; once bound, its claims'
    /// GPUs are named.
    #[test]
    fn explain_judges_a_pod_by_its_dra_claims() {
        use crate::objects::dra::fixtures::{claim, claim_pod, gpu, pending_claim, slice};
        let config = Arc::new(Config::default());
        let dra_node = |name: &str| -> Node {
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"}}
            }))
            .unwrap()
        };
        let dra = || {
            Some((
                vec![
                    slice(
                        "a",
                        "gpu.nvidia.com",
                        "d1",
                        1,
                        1,
                        vec![gpu(0, "A0"), gpu(1, "A1")],
                    ),
                    slice(
                        "b",
                        "gpu.nvidia.com",
                        "d2",
                        1,
                        1,
                        vec![gpu(0, "B0"), gpu(1, "B1")],
                    ),
                ],
                vec![
                    claim("held", &[("d2", "gpu-0")], &["other"]),
                    pending_claim("wants", "gpu.nvidia.com", 2),
                ],
            ))
        };
        let pod = claim_pod("p", "wants");
        let text = explain_objects(
            &config,
            (vec![dra_node("d1"), dra_node("d2")], Vec::new(), dra()),
            None,
            &pod,
            Output::Json,
        )
        .unwrap();
        let out: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(out["claims"], json!(["team/wants"]));
        let verdicts: BTreeMap<String, Value> = out["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| (v["node"].as_str().unwrap().to_owned(), v.clone()))
            .collect();
        assert_eq!(verdicts["d1"]["fits"], json!(true), "{out:#}");
        assert_eq!(
            verdicts["d2"]["fits"],
            json!(false),
            "a claim holds one of d2's GPUs"
        );
        let text = explain_objects(
            &config,
            (vec![dra_node("d1"), dra_node("d2")], Vec::new(), dra()),
            None,
            &pod,
            Output::Text,
        )
        .unwrap();
        assert!(
            text.contains("DRA: the pod's claims (team/wants) ask for 2 whole GPU(s)"),
            "{text}"
        );
        // Bound: its claims' GPUs are named.
        let mut bound = claim_pod("q", "held");
        bound.spec.as_mut().unwrap().node_name = Some("d2".into());
        let text = explain_objects(
            &config,
            (
                vec![dra_node("d1"), dra_node("d2")],
                vec![bound.clone()],
                dra(),
            ),
            None,
            &bound,
            Output::Text,
        )
        .unwrap();
        assert!(text.contains("team/held holds GPU 0 of d2"), "{text}");
        // No GPU through either way: not judged.
        let error = explain_objects(
            &config,
            (vec![dra_node("d1")], Vec::new(), None),
            None,
            &pod,
            Output::Text,
        )
        .unwrap_err();
        assert!(error.to_string().contains("requests no GPU"), "{error}");
    }

    /// A pod whose DRA claim asks a MIG slice of one profile is judged for it, on the slices the
    /// nodes' ResourceSlices publish less those other claims hold; once bound, its claim's slice
    /// is named.
    #[test]
    fn explain_judges_a_pod_by_its_mig_claims() {
        use crate::objects::dra::fixtures::{
            claim, claim_pod, mig_slice, pending_mig_claim, slice,
        };
        let config = Arc::new(Config::default());
        let dra_node = |name: &str| -> Node {
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"}}
            }))
            .unwrap()
        };
        let one = "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'";
        let dra = || {
            Some((
                vec![
                    slice(
                        "a",
                        "gpu.nvidia.com",
                        "d1",
                        1,
                        1,
                        vec![mig_slice("m0", 0, "A0", "1g.10gb", 10)],
                    ),
                    slice(
                        "b",
                        "gpu.nvidia.com",
                        "d2",
                        1,
                        1,
                        vec![mig_slice("m0", 0, "B0", "1g.10gb", 10)],
                    ),
                ],
                vec![
                    claim("held", &[("d2", "m0")], &["other"]),
                    pending_mig_claim("wants", "mig.nvidia.com", 1, &[one]),
                ],
            ))
        };
        let nodes = || vec![dra_node("d1"), dra_node("d2")];
        let pod = claim_pod("p", "wants");
        let text = explain_objects(
            &config,
            (nodes(), Vec::new(), dra()),
            None,
            &pod,
            Output::Json,
        )
        .unwrap();
        let out: Value = serde_json::from_str(&text).unwrap();
        let fits: BTreeMap<String, Value> = out["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| (v["node"].as_str().unwrap().to_owned(), v["fits"].clone()))
            .collect();
        assert_eq!(fits["d1"], json!(true), "{out:#}");
        assert_eq!(
            fits["d2"],
            json!(false),
            "a claim holds d2's only slice: {out:#}"
        );
        let text = explain_objects(
            &config,
            (nodes(), Vec::new(), dra()),
            None,
            &pod,
            Output::Text,
        )
        .unwrap();
        assert!(
            text.contains("DRA: the pod's claims (team/wants) ask for 1 MIG slice(s) of 1g.10gb"),
            "{text}"
        );
        let mut bound = claim_pod("q", "held");
        bound.spec.as_mut().unwrap().node_name = Some("d2".into());
        let text = explain_objects(
            &config,
            (nodes(), vec![bound.clone()], dra()),
            None,
            &bound,
            Output::Text,
        )
        .unwrap();
        assert!(
            text.contains("team/held holds GPU 0 (MIG slices 1g.10gb x1) of d2"),
            "{text}"
        );
    }
}
