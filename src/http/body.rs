//! Reading a verb's request body whole, before the request waits for its turn at the
//! concurrency limit: within `server.bodyLimitBytes`, within `limits.bodyReadTimeoutMs` of its
//! headers, and within a process-wide budget of buffered bytes (`limits.maxBufferedBodyBytes`).
//!
//! Why before the turn: a permit held while a body trickles in is a permit kube-scheduler
//! cannot have, so a few hundred slow senders would shed every scheduling call. Read first,
//! a slow sender costs only its own connection, and is cut off at the deadline. Why a
//! budget: with the reading outside the permit, nothing else bounds how many bodies are held
//! at once (connections × HTTP/2 streams × the body limit is far above the pod's memory); the
//! budget is taken chunk by chunk as bytes arrive and given back when the answer is sent.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tracing::debug;

use crate::config::Config;
use crate::telemetry::Metrics;

/// The limits of [`read_whole_body`] and the budget they share.
#[derive(Debug)]
pub struct BodyReader {
    /// Largest body, in bytes.
    limit: usize,
    /// Time for a body to arrive whole, from its headers.
    timeout: Duration,
    /// The buffered-bytes budget, one permit a byte.
    budget: Arc<Semaphore>,
    metrics: Metrics,
}

/// Why a body was not read.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    TooLarge,
    TooSlow,
    OverBudget,
    Unreadable(String),
}

impl Refusal {
    /// The `reason` label of `gpu_extender_request_bodies_refused_total`.
    fn reason(&self) -> &'static str {
        match self {
            Self::TooLarge => "too_large",
            Self::TooSlow => "too_slow",
            Self::OverBudget => "over_budget",
            Self::Unreadable(_) => "unreadable",
        }
    }
}

impl BodyReader {
    /// The reader `config` sets up, counting refusals in `metrics`.
    pub fn new(config: &Config, metrics: Metrics) -> Self {
        Self::with_limits(
            usize::try_from(config.server.body_limit_bytes).unwrap_or(usize::MAX),
            Duration::from_millis(config.limits.body_read_timeout_ms),
            usize::try_from(config.limits.max_buffered_body_bytes).unwrap_or(usize::MAX),
            metrics,
        )
    }

    /// A reader of bodies up to `limit` bytes, each whole within `timeout`, holding at most
    /// `budget` bytes at once across all requests.
    pub fn with_limits(limit: usize, timeout: Duration, budget: usize, metrics: Metrics) -> Self {
        Self {
            limit,
            timeout,
            budget: Arc::new(Semaphore::new(budget.clamp(1, Semaphore::MAX_PERMITS))),
            metrics,
        }
    }

    /// The body whole, and the budget it holds (given back when dropped).
    async fn read(
        &self,
        declared_length: Option<u64>,
        mut body: Body,
    ) -> Result<(Bytes, Option<OwnedSemaphorePermit>), Refusal> {
        if declared_length.is_some_and(|length| length > self.limit as u64) {
            return Err(Refusal::TooLarge);
        }
        let deadline = Instant::now() + self.timeout;
        let mut collected: Vec<u8> = Vec::new();
        let mut held: Option<OwnedSemaphorePermit> = None;
        loop {
            let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
                Err(_) => return Err(Refusal::TooSlow),
                Ok(None) => break,
                Ok(Some(Err(error))) => return Err(Refusal::Unreadable(error.to_string())),
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue; // Trailers carry nothing a verb reads.
            };
            if collected.len() + data.len() > self.limit {
                return Err(Refusal::TooLarge);
            }
            // Frames are at most 16 MiB (HTTP/2's largest), far below u32::MAX.
            let bytes = u32::try_from(data.len()).map_err(|_| Refusal::TooLarge)?;
            if bytes > 0 {
                let permit = tokio::time::timeout_at(
                    deadline,
                    Arc::clone(&self.budget).acquire_many_owned(bytes),
                )
                .await
                .map_err(|_| Refusal::OverBudget)?
                .map_err(|_| Refusal::OverBudget)?;
                match &mut held {
                    Some(all) => all.merge(permit),
                    None => held = Some(permit),
                }
            }
            collected.extend_from_slice(&data);
        }
        Ok((Bytes::from(collected), held))
    }
}

/// The middleware: reads the body with `reader`'s limits and passes the request on with the
/// body in memory, holding its share of the budget until the answer is built; answers 413,
/// 408, 503 or 400 otherwise.
pub async fn read_whole_body(
    State(reader): State<Arc<BodyReader>>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    let declared_length = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    match reader.read(declared_length, body).await {
        Ok((bytes, held)) => {
            let response = next
                .run(Request::from_parts(parts, Body::from(bytes)))
                .await;
            drop(held);
            response
        }
        Err(refusal) => {
            reader
                .metrics
                .request_bodies_refused
                .with_label_values(&[refusal.reason()])
                .inc();
            debug!(path = %parts.uri.path(), reason = refusal.reason(), "request body refused");
            let (status, message) = match refusal {
                Refusal::TooLarge => (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "the request body is larger than {} bytes (server.bodyLimitBytes)",
                        reader.limit
                    ),
                ),
                Refusal::TooSlow => (
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the request body did not arrive within {} ms (limits.bodyReadTimeoutMs)",
                        reader.timeout.as_millis()
                    ),
                ),
                Refusal::OverBudget => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "gpu-extender is holding its limit of request bytes \
                     (limits.maxBufferedBodyBytes); retry"
                        .to_owned(),
                ),
                Refusal::Unreadable(error) => (
                    StatusCode::BAD_REQUEST,
                    format!("the request body could not be read: {error}"),
                ),
            };
            (
                status,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                message,
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;
    use futures::StreamExt as _;

    /// A reader whose deadline (50 ms) the tests of slow bodies reach quickly.
    fn reader(limit: usize, budget: usize) -> BodyReader {
        BodyReader::with_limits(
            limit,
            Duration::from_millis(50),
            budget,
            Metrics::new().unwrap(),
        )
    }

    /// A body of `chunks`, then one that never ends when `hang` is set.
    fn body(chunks: Vec<&'static [u8]>, hang: bool) -> Body {
        let chunks = futures::stream::iter(
            chunks
                .into_iter()
                .map(|chunk| Ok::<_, std::io::Error>(Bytes::from_static(chunk))),
        );
        if hang {
            Body::from_stream(chunks.chain(futures::stream::pending()))
        } else {
            Body::from_stream(chunks)
        }
    }

    #[tokio::test]
    async fn a_body_is_read_whole_and_holds_its_bytes_of_the_budget_until_dropped() {
        let reader = reader(100, 10);
        let (bytes, held) = reader
            .read(None, body(vec![b"abcd", b"efgh"], false))
            .await
            .unwrap();
        assert_eq!(&bytes[..], b"abcdefgh");
        assert_eq!(reader.budget.available_permits(), 2);
        drop(held);
        assert_eq!(reader.budget.available_permits(), 10);
    }

    #[tokio::test]
    async fn a_body_past_the_limit_is_refused_whether_declared_or_sent() {
        let reader = reader(5, 100);
        assert_eq!(
            reader.read(Some(6), body(vec![], false)).await.unwrap_err(),
            Refusal::TooLarge
        );
        assert_eq!(
            reader
                .read(None, body(vec![b"abc", b"def"], false))
                .await
                .unwrap_err(),
            Refusal::TooLarge
        );
        assert_eq!(reader.budget.available_permits(), 100, "nothing kept");
    }

    #[tokio::test]
    async fn a_body_that_stops_arriving_is_refused_at_the_deadline() {
        let reader = reader(100, 100);
        assert_eq!(
            reader
                .read(None, body(vec![b"ab"], true))
                .await
                .unwrap_err(),
            Refusal::TooSlow
        );
        assert_eq!(
            reader.budget.available_permits(),
            100,
            "its bytes given back"
        );
    }

    #[tokio::test]
    async fn bodies_past_the_budget_wait_and_then_are_refused() {
        let reader = reader(100, 6);
        let (_, first) = reader.read(None, body(vec![b"abcd"], false)).await.unwrap();
        // 4 of 6 held: a second body of 4 waits for the first, which is never dropped here.
        assert_eq!(
            reader
                .read(None, body(vec![b"efgh"], false))
                .await
                .unwrap_err(),
            Refusal::OverBudget
        );
        drop(first);
        assert!(reader.read(None, body(vec![b"efgh"], false)).await.is_ok());
    }
}
