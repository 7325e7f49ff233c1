//! Serving a router on a listener with the limits every door of the process needs: at most
//! `limits.maxConnections` open connections, HTTP/1 headers within `limits.headerReadTimeoutMs`,
//! HTTP/2 streams per connection capped and dead peers found by pings, the client's address
//! handed to the handlers, and a graceful drain on shutdown.
//!
//! Why not `axum::serve`: it sets none of these (hyper has no header deadline without a timer,
//! and axum gives it none), so one client that opens a connection and sends a byte a minute
//! holds a task and a socket for ever, and a few thousand of them exhaust the process's file
//! descriptors. Here the connection cap is taken before `accept`, so past it new clients wait
//! in the kernel's accept queue rather than in memory, and each of the slow ones is cut off
//! at the header deadline. Bodies have their own deadline ([`super::body`]).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::sync::{Semaphore, watch};
use tower::ServiceExt as _;
use tracing::{debug, warn};

use crate::config::Config;

/// Streams served at once on one HTTP/2 connection: kube-scheduler's filter, prioritize and a
/// few binds in flight need a handful; more only lets one connection claim the whole process.
const MAX_STREAMS_PER_CONNECTION: u32 = 64;

/// How often an idle HTTP/2 connection is pinged, and how long the answer may take before the
/// connection is dropped as dead.
const PING_INTERVAL: Duration = Duration::from_secs(20);

/// How long shutdown waits for open connections to finish their requests.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The limits of one listener (`limits.*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DoorLimits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Time for an HTTP/1 client to send a request's headers.
    pub header_read_timeout: Duration,
}

impl DoorLimits {
    /// The limits `config` sets (the same for every listener).
    pub fn of(config: &Config) -> Self {
        Self {
            max_connections: usize::try_from(config.limits.max_connections)
                .unwrap_or(1)
                .clamp(1, Semaphore::MAX_PERMITS),
            header_read_timeout: Duration::from_millis(config.limits.header_read_timeout_ms),
        }
    }
}

/// Serves `router` on `listener` within `limits` until `shutdown` completes, then stops
/// accepting, asks open connections to finish (HTTP/2 GOAWAY, HTTP/1 close after the request
/// in flight) and waits up to [`DRAIN_TIMEOUT`] for them. `name` is the configuration key of
/// the listener, for the logs. Handlers can read the client's address as
/// `ConnectInfo<SocketAddr>`.
pub async fn serve<L>(
    mut listener: L,
    router: Router,
    limits: DoorLimits,
    name: &'static str,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: axum::serve::Listener<Addr = SocketAddr>,
{
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .keep_alive_interval(PING_INTERVAL)
        .keep_alive_timeout(PING_INTERVAL);
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        // The permit first: past the cap, clients wait in the kernel's queue, not here.
        let permit = tokio::select! {
            permit = Arc::clone(&connections).acquire_owned() => match permit {
                Ok(permit) => permit,
                // Never: the semaphore is not closed.
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        if connections.available_permits() == 0 {
            debug!(
                listener = name,
                limit = limits.max_connections,
                "at the connection limit (limits.maxConnections): new clients wait"
            );
        }
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let router = router.clone();
        let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            router.clone().oneshot(request)
        });
        let builder = builder.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let stopping = async move {
                // An error is the sender gone: stopping too.
                let _ = stop.wait_for(|stopping| *stopping).await;
            };
            let connection = builder.serve_connection(TokioIo::new(io), service);
            tokio::pin!(connection);
            let outcome = tokio::select! {
                outcome = connection.as_mut() => outcome,
                () = stopping => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = outcome {
                debug!(listener = name, %peer, %error, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    // Fails only when every receiver is gone: no connection is open.
    let _ = stop_tx.send(true);
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(DRAIN_TIMEOUT, connections.acquire_many(all))
        .await
        .is_err()
    {
        warn!(
            listener = name,
            open = limits.max_connections - connections.available_permits(),
            "connections still open after the drain timeout; closing them"
        );
    }
    Ok(())
}
