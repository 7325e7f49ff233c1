//! The operator commands `inspect` and `explain`: they read the cluster the way the extender does
//! (Nodes and Pods listed with the user's kubeconfig, fed through the same watch feed, so the
//! same translation and allocation-record code builds the table) and print what the report and
//! explanation modules make of it. `inspect` can instead read a running extender's `/inspect`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::ListParams;
use kube::runtime::watcher::Event;

use crate::config::{Config, ConfigFlags};
use crate::engine::PodKey;
use crate::explain;
use crate::http::client::fetch_report_as;
use crate::inspect::Filter;
use crate::k8s::api::kube_client;
use crate::k8s::quota;
use crate::k8s::watch::Feed;
use crate::objects::quota::quota_names;
use crate::objects::translate;
use crate::state::ClusterState;

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
    /// user allowed `get` on it (server.adminAuth.paths), e.g. "$(kubectl create token NAME)".
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
    let (config, state, client) = load(&args.cluster).await?;
    let pod = Api::<Pod>::namespaced(client, namespace)
        .get_opt(name)
        .await
        .with_context(|| format!("reading pod {namespace}/{name}"))?
        .ok_or_else(|| anyhow!("pod {namespace}/{name} not found"))?;
    let key = format!("{namespace}/{name}");
    let request = translate::pod_request(&pod, &config)
        .map_err(|error| anyhow!("pod {key}: its GPU request cannot be read: {error}"))?
        .ok_or_else(|| anyhow!("pod {key} requests no GPU: the GPU extender does not judge it"))?;
    let table = state.read();
    if let Some(entry) = table.pod(&PodKey::new(namespace, name)) {
        let text = format!(
            "Pod {key} is bound to node {} with {}.\n",
            entry.allocation.node,
            explain::describe_allocation(&entry.allocation)
        );
        return match args.output {
            Output::Text => Ok(text),
            Output::Json => serde_json::to_string_pretty(&serde_json::json!({
                "pod": key,
                "boundTo": entry.allocation.node.as_str(),
                "gpus": explain::describe_allocation(&entry.allocation),
            }))
            .context("encoding the explanation"),
        };
    }
    let policy = config.engine_policy();
    let verdicts = explain::explain(&table, &request, &policy);
    drop(table);
    let over_quota = state
        .quota_admit(namespace, &request, &quota_names(&config))
        .err();
    match args.output {
        Output::Text => {
            let mut text = explain::to_text(&key, &request, &verdicts);
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
    let client = kube_client(args.kubeconfig.as_deref()).await?;
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing nodes")?;
    // The same selection as the extender's pod watch: finished pods hold nothing.
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed"))
        .await
        .context("listing pods")?;
    let state = Arc::new(ClusterState::for_config(&config));
    let mut feed = Feed::new(
        state.clone(),
        config.clone(),
        Arc::new(config.engine_policy()),
    );
    feed.apply_node_event(&Event::Init);
    for node in nodes.items {
        feed.apply_node_event(&Event::InitApply(node));
    }
    feed.apply_node_event(&Event::InitDone);
    feed.apply_pod_event(&Event::Init);
    for pod in pods.items {
        feed.apply_pod_event(&Event::InitApply(pod));
    }
    feed.apply_pod_event(&Event::InitDone);
    if let Some(quotas) = quota::list(client.clone(), &config).await? {
        state.set_quotas(quotas);
    }
    Ok((config, state, client))
}
