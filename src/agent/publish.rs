//! Publishing a reading on the agent's own Node: a server-side apply of the one annotation, under
//! the agent's field manager, only when the value on the Node differs; and the agent's metrics.

use std::future::Future;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use prometheus::core::Collector;
use prometheus::{Encoder, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};

use super::source::Reading;

/// The field manager of the agent's applies (`metadata.managedFields` names it).
pub const FIELD_MANAGER: &str = "gpu-extender-node-agent";

/// The two calls publishing needs. Implemented over a kube client by [`KubeNodes`]; tests script it.
pub trait NodeAnnotations: Send + Sync {
    /// The annotation's value on the node; `None` when it has none.
    fn read(
        &self,
        node: &str,
        key: &str,
    ) -> impl Future<Output = anyhow::Result<Option<String>>> + Send;
    /// Server-side applies the annotation with [`FIELD_MANAGER`].
    fn apply(
        &self,
        node: &str,
        key: &str,
        value: &str,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// [`NodeAnnotations`] over a kube client.
#[derive(Clone)]
pub struct KubeNodes {
    nodes: Api<Node>,
}

impl std::fmt::Debug for KubeNodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeNodes")
    }
}

impl KubeNodes {
    /// Wraps a client.
    pub fn new(client: kube::Client) -> Self {
        Self {
            nodes: Api::all(client),
        }
    }
}

impl NodeAnnotations for KubeNodes {
    async fn read(&self, node: &str, key: &str) -> anyhow::Result<Option<String>> {
        let found = self
            .nodes
            .get(node)
            .await
            .map_err(|error| api_error(&format!("reading node {node}"), error))?;
        Ok(found
            .metadata
            .annotations
            .and_then(|mut annotations| annotations.remove(key)))
    }

    async fn apply(&self, node: &str, key: &str, value: &str) -> anyhow::Result<()> {
        let patch = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": { "name": node, "annotations": { key: value } },
        });
        // Forced: the agent owns this annotation, even where someone wrote it by hand before.
        self.nodes
            .patch(
                node,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(|error| {
                api_error(&format!("applying annotation {key} on node {node}"), error)
            })?;
        Ok(())
    }
}

/// A kube error as one line: the API server's message for an API error (a refusal names the
/// policy and its reason), kube's own text otherwise.
fn api_error(what: &str, error: kube::Error) -> anyhow::Error {
    match error {
        kube::Error::Api(status) => {
            anyhow::anyhow!(
                "{what}: the API server answered {}: {}",
                status.code,
                status.message
            )
        }
        other => anyhow::anyhow!("{what}: {other}"),
    }
}

/// What one publish did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Published {
    /// The node already carried this report; nothing was written.
    Unchanged,
    /// The annotation was applied.
    Applied,
    /// No GPU was read: an empty report never replaces what the node carries.
    SkippedEmpty,
}

impl Published {
    /// The `result` label of `gpu_extender_agent_publishes_total`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Unchanged => "unchanged",
            Self::Applied => "applied",
            Self::SkippedEmpty => "skipped_empty",
        }
    }
}

/// Publishes `reading` on `node` under `key` when it differs from what the node carries.
pub async fn publish(
    api: &impl NodeAnnotations,
    node: &str,
    key: &str,
    reading: &Reading,
) -> anyhow::Result<Published> {
    if reading.gpus.is_empty() {
        return Ok(Published::SkippedEmpty);
    }
    let value = reading
        .to_annotation()
        .map_err(|error| anyhow::anyhow!("rendering the annotation: {error}"))?;
    if api.read(node, key).await?.as_deref() == Some(value.as_str()) {
        return Ok(Published::Unchanged);
    }
    api.apply(node, key, &value).await?;
    Ok(Published::Applied)
}

/// The agent's metric families, in their own registry.
#[derive(Clone, Debug)]
pub struct AgentMetrics {
    registry: Registry,
    /// Publish passes by result: `applied`, `unchanged`, `skipped_empty`, `error`.
    pub publishes: IntCounterVec,
    /// Unix time of the last pass that left the node carrying the agent's current reading
    /// (applied or unchanged); its age is the age of the node's report.
    pub last_report: IntGaugeVec,
    /// GPUs in the last reading, by `health` (`healthy`, `unhealthy`).
    pub gpus: IntGaugeVec,
    /// Passes in which the driver could not be used at all.
    pub driver_errors: IntCounter,
    /// Every family's name, for the check that docs/metrics.md lists them.
    names: Vec<String>,
}

impl AgentMetrics {
    /// Registers every family.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let publishes = IntCounterVec::new(
            Opts::new(
                "gpu_extender_agent_publishes_total",
                "Node agent publish passes by result.",
            ),
            &["result"],
        )?;
        for result in ["applied", "unchanged", "skipped_empty", "error"] {
            publishes.with_label_values(&[result]);
        }
        let last_report = IntGaugeVec::new(
            Opts::new(
                "gpu_extender_agent_last_report_timestamp_seconds",
                "Unix time at which the node last carried the agent's current reading.",
            ),
            &["node"],
        )?;
        let gpus = IntGaugeVec::new(
            Opts::new(
                "gpu_extender_agent_gpus",
                "GPUs in the node agent's last reading, by health.",
            ),
            &["health"],
        )?;
        let driver_errors = IntCounter::with_opts(Opts::new(
            "gpu_extender_agent_driver_errors_total",
            "Node agent passes in which the GPU driver could not be used.",
        ))?;
        let mut names = Vec::new();
        let collectors: [Box<dyn Collector>; 4] = [
            Box::new(publishes.clone()),
            Box::new(last_report.clone()),
            Box::new(gpus.clone()),
            Box::new(driver_errors.clone()),
        ];
        for collector in collectors {
            names.extend(collector.desc().iter().map(|desc| desc.fq_name.clone()));
            registry.register(collector)?;
        }
        Ok(Self {
            registry,
            publishes,
            last_report,
            gpus,
            driver_errors,
            names,
        })
    }

    /// The name of every metric family registered.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Everything in Prometheus text format.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let mut buffer = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buffer)?;
        String::from_utf8(buffer).map_err(|error| prometheus::Error::Msg(error.to_string()))
    }
}
