//! Every request, on either router, runs in a `request` span naming its method and path, and its
//! status and latency are logged when it is answered; the verb's own span (naming the pod) nests
//! inside. One test in its own binary: it installs the process-wide subscriber, which a
//! thread-local one in a shared test binary cannot be relied on to replace (other tests' threads
//! cache the callsites' interest meanwhile).

#![allow(
    clippy::unwrap_used,
    reason = "test code: a panic is a test failure with its location"
)]

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::json;
use tower::ServiceExt;

use gpu_engine::Table;
use gpu_extender::config::Config;
use gpu_extender::http::server::{AppState, admin_router, router};
use gpu_extender::state::ClusterState;
use gpu_extender::telemetry::Metrics;

/// Log lines written by the test's subscriber.
#[derive(Clone, Default)]
struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLogs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for CapturedLogs {
    type Writer = Self;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl CapturedLogs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

async fn send(router: axum::Router, request: Request<Body>) -> StatusCode {
    router.oneshot(request).await.unwrap().status()
}

fn post(verb: &str, body: serde_json::Value) -> Request<Body> {
    Request::post(format!("/scheduler/{verb}"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

#[tokio::test]
async fn every_request_is_traced_with_its_path_status_and_latency() {
    let logs = CapturedLogs::default();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(logs.clone())
        .init();
    let state = AppState::new(
        Arc::new(ClusterState::with_table(Table::new(20))),
        Arc::new(Config::default()),
        Metrics::new().unwrap(),
    )
    .with_body_limit(1024 * 1024);
    let extender = router(state.clone(), "/scheduler");
    let filter = json!({"Pod": null, "Nodes": null, "NodeNames": ["gpu-a"]});
    assert_eq!(
        send(extender.clone(), post("filter", filter)).await,
        StatusCode::OK
    );
    let healthz = Request::get("/healthz").body(Body::empty()).unwrap();
    assert_eq!(send(admin_router(state), healthz).await, StatusCode::OK);
    let text = logs.text();
    let answered: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("finished processing request"))
        .collect();
    assert_eq!(answered.len(), 2, "{text}");
    assert!(
        answered[0].contains("request{method=POST uri=/scheduler/filter")
            && answered[0].contains("status=200")
            && answered[0].contains("latency="),
        "{text}"
    );
    assert!(answered[1].contains("uri=/healthz"), "{text}");

    // A bind with no binder warns inside its verb's span, which names the pod.
    let bind = json!({"PodName": "p", "PodNamespace": "ml", "PodUID": "u", "Node": "gpu-a"});
    assert_eq!(send(extender, post("bind", bind)).await, StatusCode::OK);
    let text = logs.text();
    assert!(
        text.lines().any(|line| line
            .contains("request{method=POST uri=/scheduler/bind version=HTTP/1.1}:bind{pod=ml/p")
            && line.contains("bind failed")),
        "the verb's span nests in the request's: {text}"
    );
}
