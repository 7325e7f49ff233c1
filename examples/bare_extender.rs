//! The least a binding extender can do in kube-scheduler's loop, to measure what the extender
//! protocol itself costs: filter answers the first candidate without reading the pod, bind
//! writes the Binding (in protobuf, with an allocation-record-sized annotation, through the same
//! client gpu-extender uses), and nothing is kept. With `BARE_EXTENDER_WATCH=1` it also watches
//! Pods (in protobuf, as gpu-extender does) and Nodes and drops every event: the part of any
//! stateful extender's cost that its watch alone brings.
//!
//! Not a scheduler: it ignores GPUs, so it is only for `gpu-lab replay --throughput
//! --throughput-extender <this binary>`, where every pod asks for one GPU and kube-scheduler's own
//! filter already keeps full nodes out (docs/benchmarks.md, "Thirteenth pass").
//!
//! It takes the arguments the replay gives `gpu-extender serve` and reads three of them:
//! `--listen`, `--admin-listen` (`/readyz`, and an empty `/metrics`) and `--kubeconfig`.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::{get, post};
use axum::serve::ListenerExt as _;
use futures::StreamExt as _;
use gpu_extender::http::wire::{ExtenderBindingArgs, ExtenderBindingResult};
use gpu_extender::k8s::api::{BindingWrite, KubeApi, PodApi, kube_client};
use gpu_extender::k8s::watch::LIVE_PODS;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;
use serde::Deserialize;

/// The one field of `ExtenderArgs` it reads (`nodeCacheCapable: true` sends names). Not the
/// extender's `CandidateArgs`: that decodes the pod, which this extender means not to read.
#[derive(Deserialize)]
struct FilterArgs<'a> {
    #[serde(rename = "NodeNames", borrow, default)]
    node_names: Option<Vec<&'a str>>,
}

fn json<T: serde::Serialize>(answer: &T) -> String {
    serde_json::to_string(answer).unwrap_or_default()
}

/// The smallest answer kube-scheduler accepts: the names and the error, no empty maps.
async fn filter(body: Bytes) -> String {
    let answer = match serde_json::from_slice::<FilterArgs<'_>>(&body) {
        Ok(args) => {
            let first = args.node_names.as_deref().and_then(<[&str]>::first);
            serde_json::json!({ "NodeNames": first.into_iter().collect::<Vec<_>>(), "Error": "" })
        }
        Err(error) => {
            serde_json::json!({ "Error": format!("cannot decode the filter body: {error}") })
        }
    };
    answer.to_string()
}

async fn bind(State(api): State<Arc<KubeApi>>, body: Bytes) -> String {
    let args = match serde_json::from_slice::<ExtenderBindingArgs>(&body) {
        Ok(args) => args,
        Err(error) => {
            return json(&ExtenderBindingResult {
                error: format!("cannot decode the bind body: {error}"),
            });
        }
    };
    // About the size of gpu-extender's record for a one-GPU pod, so that the pod the API server
    // stores and sends to every watcher weighs what it would.
    let record = serde_json::json!({
        "version": 1,
        "node": args.node,
        "podUid": args.pod_uid,
        "containers": [{ "name": "main", "gpus": [{ "index": 0, "whole": true }] }],
    });
    let write = BindingWrite {
        namespace: args.pod_namespace,
        name: args.pod_name,
        uid: args.pod_uid,
        node: args.node,
        annotations: BTreeMap::from([(
            "gpu-extender.io/allocation".to_owned(),
            record.to_string(),
        )]),
    };
    let error = match api.create_binding(&write).await {
        Ok(()) => String::new(),
        Err(error) => error.to_string(),
    };
    json(&ExtenderBindingResult { error })
}

/// Watches Pods and Nodes as gpu-extender does and drops what arrives.
fn watch_and_drop(client: &kube::Client) {
    let pods = gpu_extender::k8s::watch::pod_watch(client.clone(), LIVE_PODS);
    tokio::spawn(pods.for_each(|_| async {}));
    let nodes = watcher::watcher(kube::Api::<Node>::all(client.clone()), Default::default());
    tokio::spawn(nodes.for_each(|_| async {}));
}

fn flag(args: &[String], name: &str) -> Option<String> {
    let at = args.iter().position(|arg| arg == name)?;
    args.get(at + 1).cloned()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let listen = flag(&args, "--listen").context("--listen ADDRESS is required")?;
    let admin = flag(&args, "--admin-listen").context("--admin-listen ADDRESS is required")?;
    let kubeconfig = flag(&args, "--kubeconfig").map(std::path::PathBuf::from);
    let client = kube_client(kubeconfig.as_deref()).await?;
    if std::env::var_os("BARE_EXTENDER_WATCH").is_some_and(|value| value == "1") {
        watch_and_drop(&client);
    }
    let api = Arc::new(KubeApi::new(client));
    let calls = Router::new()
        .route("/scheduler/filter", post(filter))
        .route("/scheduler/bind", post(bind))
        .with_state(api);
    let admin_routes = Router::new()
        .route("/readyz", get(|| async { "ok" }))
        .route("/metrics", get(|| async { "" }));
    let calls_listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| format!("listening on {listen}"))?
        // As gpu-extender's listener: small answers go out at once.
        .tap_io(|stream| {
            let _ = stream.set_nodelay(true);
        });
    let admin_listener = tokio::net::TcpListener::bind(&admin)
        .await
        .with_context(|| format!("listening on {admin}"))?;
    tokio::spawn(async move { axum::serve(admin_listener, admin_routes).await });
    axum::serve(calls_listener, calls).await?;
    Ok(())
}
