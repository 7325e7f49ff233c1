//! The `Estimator` gRPC service on its own listener (`estimator.listen`): each estimate reads
//! one consistent snapshot of the allocation table, keeps the nodes whose labels, taints and
//! cordon admit the template ([`NodeClaims`](crate::objects::admission::NodeClaims)), and counts with
//! [`max_replicas`]. Pods already bound and capacity reserved at bind are in the table, so they
//! are honoured as they are.
//! Requests are counted and timed by method and gRPC code (docs/metrics.md); at most
//! `estimator.maxConcurrentRequests` are served at once over all connections, the rest answered
//! `RESOURCE_EXHAUSTED` at once (karmada-scheduler then schedules that workload with its
//! general estimator's answers alone).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt as _};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, SemaphorePermit};
use tonic::transport::server::Connected;
use tonic::{Code, Request, Response, Status};

use super::proto::pb;
use super::proto::service::estimator_server::{Estimator, EstimatorServer};
use super::template::{Template, template};
use super::workload::{WorkloadError, Workloads, pod_controlled_by};
use crate::config::Config;
use crate::objects::admission::PodClaims;
use crate::objects::scheduling::unschedulable_since;
use crate::state::{ClusterState, PolicyCell};
use crate::telemetry::Metrics;
use crate::telemetry::metrics::ESTIMATOR_METHODS as METHODS;
use gpu_engine::{NodeState, max_replicas};

/// The answer's ceiling: Karmada's `maxReplicas` is an int32.
const MAX_ANSWER: u64 = i32::MAX as u64;

/// The estimator over the extender's shared state.
#[derive(Clone)]
pub struct EstimatorService {
    cluster: Arc<ClusterState>,
    policy: PolicyCell,
    config: Arc<Config>,
    metrics: Metrics,
    /// Where a workload's current ReplicaSet is found (`GetUnschedulableReplicas`); without
    /// it that method answers `Unimplemented`.
    workloads: Option<Arc<dyn Workloads>>,
    /// One permit per call served at once (`estimator.maxConcurrentRequests`), shared by every
    /// connection.
    permits: Arc<Semaphore>,
}

impl std::fmt::Debug for EstimatorService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EstimatorService")
            .field("cluster", &self.cluster)
            .field("config", &self.config)
            .field("workloads", &self.workloads.is_some())
            .finish_non_exhaustive()
    }
}

impl EstimatorService {
    pub fn new(
        cluster: Arc<ClusterState>,
        policy: PolicyCell,
        config: Arc<Config>,
        metrics: Metrics,
    ) -> Self {
        let limit = usize::try_from(config.estimator.max_concurrent_requests)
            .unwrap_or(1)
            .clamp(1, Semaphore::MAX_PERMITS);
        Self {
            cluster,
            policy,
            config,
            metrics,
            workloads: None,
            permits: Arc::new(Semaphore::new(limit)),
        }
    }

    /// The estimator finding workloads' ReplicaSets with `workloads`.
    #[must_use]
    pub fn with_workloads(mut self, workloads: Arc<dyn Workloads>) -> Self {
        self.workloads = Some(workloads);
        self
    }

    /// How many pods of the request's workload kube-scheduler has found no node for, for
    /// longer than the request's threshold: what `GetUnschedulableReplicas` answers. As
    /// Karmada's estimator: Deployments only, the pods of the current ReplicaSet
    /// ([`super::workload`]), each unschedulable since before now less the threshold. Only the
    /// pods the watch keeps are seen: pending pods that ask for a GPU resource.
    pub async fn unschedulable_replicas(
        &self,
        request: &pb::UnschedulableReplicasRequest,
        now: Timestamp,
    ) -> Result<u64, Status> {
        self.check_cluster(&request.cluster)?;
        let resource = request
            .resource
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("resource is required"))?;
        if resource.kind != "Deployment" {
            return Err(Status::unimplemented(format!(
                "kind {:?} of workload {}/{} is not supported (Deployments only, as Karmada's \
                 own estimator)",
                resource.kind, resource.namespace, resource.name
            )));
        }
        if resource.api_version != "apps/v1" {
            return Err(Status::invalid_argument(format!(
                "a Deployment is apps/v1, the request names {:?}",
                resource.api_version
            )));
        }
        if resource.namespace.is_empty() || resource.name.is_empty() {
            return Err(Status::invalid_argument(
                "resource.namespace and resource.name are required",
            ));
        }
        let workloads = self.workloads.as_ref().ok_or_else(|| {
            Status::unimplemented(
                "GetUnschedulableReplicas needs the API server, which this estimator was not \
                 given",
            )
        })?;
        if !self.cluster.is_ready() {
            return Err(Status::unavailable(
                "the GPU extender has not yet synced its view of the cluster",
            ));
        }
        let current = workloads
            .current_replica_set(&resource.namespace, &resource.name)
            .await
            .map_err(|e| match e {
                WorkloadError::NotFound { .. } => Status::not_found(e.to_string()),
                WorkloadError::Api { .. } => Status::unavailable(e.to_string()),
            })?;
        let Some(replica_set) = current else {
            return Ok(0);
        };
        // Karmada counts a pod when its condition's time plus the threshold is before now.
        let threshold = SignedDuration::from_nanos(request.unschedulable_threshold.max(0));
        let since_before = now.checked_sub(threshold).unwrap_or(Timestamp::MIN);
        let waiting = self.cluster.pending_pods(|pod| {
            pod.metadata.namespace.as_deref() == Some(resource.namespace.as_str())
                && pod_controlled_by(pod, &replica_set)
                && unschedulable_since(pod).is_some_and(|since| since < since_before)
        });
        Ok(waiting.len() as u64)
    }

    /// How many replicas of the request's template the cluster can still run: what
    /// `MaxAvailableReplicas` answers.
    pub fn max_available_replicas(
        &self,
        request: &pb::MaxAvailableReplicasRequest,
    ) -> Result<u64, Status> {
        self.check_cluster(&request.cluster)?;
        if !request.assumed_workloads.is_empty() {
            // Karmada sends these only when its scheduler runs ahead of the member's pods; the
            // extender cannot tell where they would land, and guessing would mis-count.
            return Err(Status::unimplemented(
                "assumedWorkloads are not supported by the GPU extender's estimator; its table \
                 already holds every pod bound or reserved at bind",
            ));
        }
        let template = template(request.replica_requirements.as_ref(), &self.config)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        if !self.cluster.is_ready() {
            return Err(Status::unavailable(
                "the GPU extender has not yet synced its view of the cluster",
            ));
        }
        let policy = self.policy.load();
        let table = self.cluster.read();
        let admitted = self.admitted(table.nodes(), &template)?;
        Ok(max_replicas(
            admitted,
            &template.request,
            &policy,
            MAX_ANSWER,
        ))
    }

    /// The nodes whose labels, taints and cordon admit the template, as kube-scheduler's
    /// node-level filters decide before the extender is asked.
    fn admitted<'t>(
        &self,
        nodes: impl Iterator<Item = &'t NodeState>,
        template: &Template,
    ) -> Result<Vec<&'t NodeState>, Status> {
        // The template's resources are read once, not once per node.
        let pod = PodClaims::of(&template.pod, &self.config)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let claims_by_node = self.cluster.node_claims();
        // By the table's name, which the feed keys the claims with: found by pointer.
        Ok(nodes
            .filter(|node| {
                pod.admitted_by(node.spec.name.as_str(), claims_by_node.get(&node.spec.name))
            })
            .collect())
    }

    /// A turn to serve one call, if one is free now: a call that waited would only pile up
    /// behind those running while karmada-scheduler's own timeout (3 s by default) runs out.
    fn admit(&self) -> Result<SemaphorePermit<'_>, Status> {
        self.permits.try_acquire().map_err(|_| {
            self.metrics.estimator_requests_shed.inc();
            Status::resource_exhausted(format!(
                "the GPU extender's estimator is serving its limit of {} calls \
                 (estimator.maxConcurrentRequests); retry",
                self.config.estimator.max_concurrent_requests
            ))
        })
    }

    fn check_cluster(&self, asked: &str) -> Result<(), Status> {
        let served = &self.config.estimator.cluster;
        if !served.is_empty() && asked != served {
            return Err(Status::invalid_argument(format!(
                "this estimator serves cluster {served:?}, the request names {asked:?}"
            )));
        }
        Ok(())
    }

    /// Counts and times one call of `method`.
    fn observe<T>(&self, method: &str, started: Instant, answer: &Result<T, Status>) {
        let code = match answer {
            Ok(_) => Code::Ok,
            Err(status) => status.code(),
        };
        self.metrics
            .estimator_requests
            .with_label_values(&[method, code_label(code)])
            .inc();
        self.metrics
            .estimator_duration
            .with_label_values(&[method])
            .observe(started.elapsed().as_secs_f64());
    }
}

/// The `code` label: gRPC's own names for the codes this service answers.
pub fn code_label(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::InvalidArgument => "InvalidArgument",
        Code::Unavailable => "Unavailable",
        Code::Unimplemented => "Unimplemented",
        Code::NotFound => "NotFound",
        Code::ResourceExhausted => "ResourceExhausted",
        _ => "Other",
    }
}

#[tonic::async_trait]
impl Estimator for EstimatorService {
    async fn max_available_replicas(
        &self,
        request: Request<pb::MaxAvailableReplicasRequest>,
    ) -> Result<Response<pb::MaxAvailableReplicasResponse>, Status> {
        let started = Instant::now();
        let answer = self
            .admit()
            .and_then(|_turn| self.max_available_replicas(request.get_ref()));
        self.observe(METHODS[0], started, &answer);
        let max_replicas = i32::try_from(answer?).unwrap_or(i32::MAX);
        Ok(Response::new(pb::MaxAvailableReplicasResponse {
            max_replicas,
        }))
    }

    async fn max_available_component_sets(
        &self,
        request: Request<pb::MaxAvailableComponentSetsRequest>,
    ) -> Result<Response<pb::MaxAvailableComponentSetsResponse>, Status> {
        let started = Instant::now();
        let answer = self
            .admit()
            .and_then(|_turn| self.check_cluster(&request.get_ref().cluster))
            .and_then(|()| {
                Err::<pb::MaxAvailableComponentSetsResponse, _>(Status::unimplemented(
                    "MaxAvailableComponentSets (multi-component workloads) is not supported by \
                     the GPU extender's estimator",
                ))
            });
        self.observe(METHODS[1], started, &answer);
        answer.map(Response::new)
    }

    async fn get_unschedulable_replicas(
        &self,
        request: Request<pb::UnschedulableReplicasRequest>,
    ) -> Result<Response<pb::UnschedulableReplicasResponse>, Status> {
        let started = Instant::now();
        let answer = match self.admit() {
            Ok(_turn) => {
                self.unschedulable_replicas(request.get_ref(), Timestamp::now())
                    .await
            }
            Err(status) => Err(status),
        };
        self.observe(METHODS[2], started, &answer);
        let unschedulable_replicas = i32::try_from(answer?).unwrap_or(i32::MAX);
        Ok(Response::new(pb::UnschedulableReplicasResponse {
            unschedulable_replicas,
        }))
    }
}

/// HTTP/2 streams served at once on one estimator connection (karmada-scheduler sends a few).
const MAX_STREAMS_PER_CONNECTION: u32 = 64;

/// How often an idle estimator connection is pinged; a peer that does not answer within as long
/// is dropped.
const PING_INTERVAL: Duration = Duration::from_secs(20);

/// The longest one estimator call may take before it is answered `CANCELLED`.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// tonic's server with the estimator's limits: streams per connection, pings that drop dead
/// peers, and a deadline per call.
fn limited_server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .http2_keepalive_interval(Some(PING_INTERVAL))
        .http2_keepalive_timeout(Some(PING_INTERVAL))
        .timeout(CALL_TIMEOUT)
}

/// The connections of `incoming`, at most `max_connections` open at once: the next is taken
/// only when a permit is free, so past the cap clients wait in the kernel's accept queue, and
/// each connection gives its permit back when it closes.
fn capped<IO>(
    incoming: impl Stream<Item = std::io::Result<IO>> + Send + 'static,
    max_connections: usize,
) -> impl Stream<Item = std::io::Result<Handshaken<IO>>> + Send + 'static
where
    IO: Send + 'static,
{
    let permits = Arc::new(Semaphore::new(
        max_connections.clamp(1, Semaphore::MAX_PERMITS),
    ));
    futures::stream::unfold(
        (Box::pin(incoming), permits),
        |(mut incoming, permits)| async move {
            let permit = Arc::clone(&permits).acquire_owned().await.ok()?;
            let next = incoming.next().await?;
            Some((
                next.map(|io| Handshaken {
                    io,
                    _permit: permit,
                }),
                (incoming, permits),
            ))
        },
    )
}

/// Serves `service` on `listener` (plain HTTP/2, as Karmada dials without TLS settings), at
/// most `max_connections` connections at once, until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    service: EstimatorService,
    max_connections: usize,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    limited_server()
        .add_service(EstimatorServer::new(service))
        .serve_with_incoming_shutdown(capped(incoming, max_connections), shutdown)
        .await
}

/// Serves `service` on connections whose TLS handshake (ALPN `h2`) is already done, as Karmada
/// dials with `--scheduler-estimator-ca-file`, at most `max_connections` at once, until
/// `shutdown` completes.
pub async fn serve_tls<IO>(
    handshaken: impl Stream<Item = std::io::Result<IO>> + Send + 'static,
    service: EstimatorService,
    max_connections: usize,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    limited_server()
        .add_service(EstimatorServer::new(service))
        .serve_with_incoming_shutdown(capped(handshaken, max_connections), shutdown)
        .await
}

/// A connection as tonic serves it, holding its place under the connection cap until it
/// closes; the peer's address is not passed on (the estimator reads none).
struct Handshaken<IO> {
    io: IO,
    _permit: OwnedSemaphorePermit,
}

impl<IO> Connected for Handshaken<IO> {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl<IO: AsyncRead + Unpin> AsyncRead for Handshaken<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Handshaken<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
