//! The Pod list-and-watch in kube-apiserver's protobuf encoding: the same [`Event`]s kube-runtime's
//! watcher gives, decoded from the binary form kube-scheduler's informers already receive.
//!
//! Why: every Pod event is sent to kube-scheduler in protobuf; a JSON watcher makes the API
//! server encode each event a second time, and JSON costs the extender more to read than
//! protobuf. kube-rs has no protobuf client, so this is one: the messages are a view of the Pod
//! with only the fields the watch reads (`proto/gpu_extender/pod_watch.proto`), so the fields it
//! skips are never allocated. The events are converted to k8s-openapi Pods, so the [`super::Feed`]
//! reads one type whichever encoding is in use (`watch.protobuf`).
//!
//! The protocol: a list (`Accept: application/vnd.kubernetes.protobuf`) answers the "k8s\0" magic
//! and a `runtime.Unknown` envelope around a `PodList`; a watch answers frames of a 4-byte
//! big-endian length and a `WatchEvent` whose object is enveloped the same way. The state machine
//! follows kube-runtime's: list in pages (`Init`, `InitApply`.., `InitDone`), watch from the list's
//! resourceVersion with bookmarks, resume from the last version seen when a watch ends, relist
//! when the API server says the version is gone (410). Errors are yielded, not retried here: the
//! caller's backoff (`default_backoff`) paces the next attempt.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::time::Duration;

use futures::Stream;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use kube::api::{ListParams, WatchParams};
use kube::core::{Request, Status};
use kube::runtime::watcher::{Error, Event};
use prost::Message;
use prost::bytes::{Buf, Bytes, BytesMut};

use crate::k8s::proto::{self, PROTOBUF, decode_object, pb, status_of};
/// Pods per list page (kube-runtime's default).
const PAGE_SIZE: u32 = 500;
/// How long the API server keeps one watch open (kube-runtime's default); a silent connection
/// is given up a little after it.
const WATCH_TIMEOUT_S: u32 = 290;
const IDLE_GRACE: Duration = Duration::from_secs(30);
/// A frame longer than this is a corrupt stream, not a Pod (etcd stores at most 1.5 MiB).
const MAX_FRAME: usize = 64 << 20;

/// Lists and watches the Pods that `field_selector` selects, in protobuf. See the module docs.
pub fn pod_watch(
    client: kube::Client,
    field_selector: &str,
) -> impl Stream<Item = Result<Event<core::Pod>, Error>> + Send + 'static {
    let watch = PodWatch {
        source: Source {
            client,
            field_selector: field_selector.to_owned(),
        },
        phase: Phase::List { next_page: None },
        queue: VecDeque::new(),
    };
    futures::stream::unfold(watch, |mut watch| async move {
        let item = watch.step().await;
        Some((item, watch))
    })
}

struct PodWatch {
    source: Source,
    phase: Phase,
    /// Events decoded and not yet yielded (a list page's Pods).
    queue: VecDeque<Event<core::Pod>>,
}

enum Phase {
    /// Listing; `next_page` is the continue token of the page to read (`None`: the first).
    List { next_page: Option<String> },
    /// A watch is to be started from `version`.
    Resume { version: String },
    Watch {
        version: String,
        body: BoxStream<'static, io::Result<Bytes>>,
        frames: Frames,
    },
}

impl PodWatch {
    async fn step(&mut self) -> Result<Event<core::Pod>, Error> {
        loop {
            if let Some(event) = self.queue.pop_front() {
                return Ok(event);
            }
            match &mut self.phase {
                Phase::List { next_page } => {
                    let next_page = next_page.take();
                    let first = next_page.is_none();
                    let page = match self.source.list_page(next_page).await {
                        Ok(page) => page,
                        Err(error) => {
                            // A failed page restarts the list (the token was taken: the phase
                            // is the first page again), as a continue token can expire.
                            return Err(Error::InitialListFailed(error));
                        }
                    };
                    let metadata = page.metadata.unwrap_or_default();
                    let version = metadata.resource_version.filter(|v| !v.is_empty());
                    let next = metadata.r#continue.filter(|c| !c.is_empty());
                    if first {
                        self.queue.push_back(Event::Init);
                    }
                    self.queue.extend(
                        page.items
                            .into_iter()
                            .map(|pod| Event::InitApply(pod_of(pod))),
                    );
                    self.phase = match (next, version) {
                        (Some(token), _) => Phase::List {
                            next_page: Some(token),
                        },
                        (None, Some(version)) => {
                            self.queue.push_back(Event::InitDone);
                            Phase::Resume { version }
                        }
                        (None, None) => {
                            // Listed again from the first page.
                            self.queue.clear();
                            return Err(Error::NoResourceVersion);
                        }
                    };
                }
                Phase::Resume { version } => {
                    let version = std::mem::take(version);
                    match self.source.start_watch(&version).await {
                        Ok(body) => {
                            self.phase = Phase::Watch {
                                version,
                                body,
                                frames: Frames::default(),
                            }
                        }
                        Err(error) => {
                            self.phase = if is_gone(&error) {
                                Phase::List { next_page: None }
                            } else {
                                Phase::Resume { version }
                            };
                            return Err(Error::WatchStartFailed(error));
                        }
                    }
                }
                Phase::Watch {
                    version,
                    body,
                    frames,
                } => {
                    let frame = match frames.next_frame() {
                        Ok(Some(frame)) => frame,
                        Ok(None) => {
                            let idle = Duration::from_secs(u64::from(WATCH_TIMEOUT_S)) + IDLE_GRACE;
                            match tokio::time::timeout(idle, body.next()).await {
                                Ok(Some(Ok(chunk))) => {
                                    frames.push(&chunk);
                                    continue;
                                }
                                Ok(Some(Err(error))) => {
                                    self.resume();
                                    return Err(Error::WatchFailed(kube::Error::ReadEvents(error)));
                                }
                                // The API server ended the watch (its timeout), or it went
                                // silent: resume from the last version seen.
                                Ok(None) | Err(_) => {
                                    self.resume();
                                    continue;
                                }
                            }
                        }
                        Err(error) => {
                            self.resume();
                            return Err(Error::WatchFailed(kube::Error::ReadEvents(error)));
                        }
                    };
                    match watch_step(&frame, version) {
                        Ok(Some(event)) => return Ok(event),
                        // A bookmark: only the version moved.
                        Ok(None) => {}
                        Err(WatchFrameError::Status(status)) => {
                            if status.code == 410 {
                                self.phase = Phase::List { next_page: None };
                            }
                            return Err(Error::WatchError(status));
                        }
                        Err(WatchFrameError::NoVersion) => {
                            self.phase = Phase::List { next_page: None };
                            return Err(Error::NoResourceVersion);
                        }
                        Err(WatchFrameError::Decode(error)) => {
                            // Resume from the last good event: the next watch starts on a
                            // frame boundary.
                            self.resume();
                            return Err(Error::WatchFailed(kube::Error::ReadEvents(error)));
                        }
                    }
                }
            }
        }
    }

    /// Ends a watch: the next step starts another from the last version it saw.
    fn resume(&mut self) {
        if let Phase::Watch { version, .. } =
            std::mem::replace(&mut self.phase, Phase::List { next_page: None })
        {
            self.phase = Phase::Resume { version };
        }
    }
}

/// Where the Pods come from: the API server and the selection (kept apart from the stream state,
/// which is not `Sync`, so that requests can borrow it across awaits).
struct Source {
    client: kube::Client,
    field_selector: String,
}

impl Source {
    async fn list_page(&self, next_page: Option<String>) -> Result<pb::PodList, kube::Error> {
        // Paged and consistent, as kube-runtime's watcher lists by default.
        let mut params = ListParams::default()
            .fields(&self.field_selector)
            .limit(PAGE_SIZE);
        if let Some(token) = &next_page {
            params = params.continue_token(token);
        }
        let request = Request::new("/api/v1/pods")
            .list(&params)
            .map_err(kube::Error::BuildRequest)?;
        let body = self
            .send(request)
            .await?
            .into_body()
            .collect_bytes()
            .await?;
        decode_object::<pb::PodList>(&body)
            .map_err(|error| kube::Error::ReadEvents(invalid("the pod list", error)))
    }

    async fn start_watch(
        &self,
        version: &str,
    ) -> Result<BoxStream<'static, io::Result<Bytes>>, kube::Error> {
        let params = WatchParams::default()
            .fields(&self.field_selector)
            .timeout(WATCH_TIMEOUT_S);
        let request = Request::new("/api/v1/pods")
            .watch(&params, version)
            .map_err(kube::Error::BuildRequest)?;
        let response = self.send(request).await?;
        Ok(response
            .into_body()
            .into_data_stream()
            .map_err(io::Error::other)
            .boxed())
    }

    /// Sends `request` asking for protobuf; a failed request's Status becomes the error.
    async fn send(
        &self,
        request: http::Request<Vec<u8>>,
    ) -> Result<http::Response<kube::client::Body>, kube::Error> {
        let response = match proto::send(&self.client, request).await {
            Err(kube::Error::Api(status)) if status.code == 406 => {
                return Err(not_protobuf(406, "refused it (406 Not Acceptable)"));
            }
            other => other?,
        };
        // A proxy in front of the API server may answer JSON whatever was asked: say so,
        // rather than fail to decode it as protobuf.
        match response.headers().get(http::header::CONTENT_TYPE) {
            Some(kind) if !kind.as_bytes().starts_with(PROTOBUF.as_bytes()) => {
                let kind = String::from_utf8_lossy(kind.as_bytes()).into_owned();
                Err(not_protobuf(
                    response.status().as_u16(),
                    &format!("answered {kind}"),
                ))
            }
            _ => Ok(response),
        }
    }
}

/// The error for an API server (or proxy) that does not serve Pods in protobuf: `answered`
/// says what it did instead.
fn not_protobuf(code: u16, answered: &str) -> kube::Error {
    let message = format!(
        "asked for Pods in protobuf, the API server {answered}; \
         set watch.protobuf: false to watch them in JSON"
    );
    kube::Error::Api(Box::new(
        Status::failure(&message, "NotProtobuf").with_code(code),
    ))
}

/// Whether `error` says the resourceVersion asked for is gone (410): only a relist helps.
fn is_gone(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 410)
}

enum WatchFrameError {
    Status(Box<Status>),
    NoVersion,
    Decode(io::Error),
}

/// Decodes one watch frame and moves `version` to the version it carries: the event to yield,
/// or `None` for a bookmark.
fn watch_step(
    frame: &[u8],
    version: &mut String,
) -> Result<Option<Event<core::Pod>>, WatchFrameError> {
    let event = pb::WatchEvent::decode(frame)
        .map_err(|error| WatchFrameError::Decode(invalid("a watch event", error)))?;
    let raw = event
        .object
        .and_then(|object| object.raw)
        .unwrap_or_default();
    let kind = event.r#type.as_deref().unwrap_or_default();
    if kind == "ERROR" {
        let status = decode_object::<pb::Status>(&raw)
            .map_err(|error| WatchFrameError::Decode(invalid("a watch error", error)))?;
        return Err(WatchFrameError::Status(Box::new(status_of(status, 500))));
    }
    let pod = decode_object::<pb::Pod>(&raw)
        .map_err(|error| WatchFrameError::Decode(invalid("a watched pod", error)))?;
    let seen = pod
        .metadata
        .as_ref()
        .and_then(|m| m.resource_version.as_deref())
        .unwrap_or_default();
    if seen.is_empty() {
        return Err(WatchFrameError::NoVersion);
    }
    seen.clone_into(version);
    match kind {
        "ADDED" | "MODIFIED" => Ok(Some(Event::Apply(pod_of(pod)))),
        "DELETED" => Ok(Some(Event::Delete(pod_of(pod)))),
        "BOOKMARK" => Ok(None),
        other => Err(WatchFrameError::Decode(invalid(
            "a watch event",
            format!("unknown event type {other:?}"),
        ))),
    }
}

fn invalid(what: &str, error: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("cannot decode {what} from protobuf: {error}"),
    )
}

/// Splits a watch stream into its length-prefixed frames, whatever the chunking.
#[derive(Default)]
struct Frames {
    buffer: BytesMut,
}

impl Frames {
    fn push(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
    }

    /// The next complete frame, if the buffer holds one.
    fn next_frame(&mut self) -> io::Result<Option<Bytes>> {
        let Some(prefix) = self.buffer.first_chunk::<4>() else {
            return Ok(None);
        };
        let length = usize::try_from(u32::from_be_bytes(*prefix)).unwrap_or(usize::MAX);
        if length > MAX_FRAME {
            return Err(invalid(
                "a watch stream",
                format!("a frame of {length} bytes (at most {MAX_FRAME})"),
            ));
        }
        if self.buffer.len() < 4 + length {
            self.buffer.reserve(4 + length - self.buffer.len());
            return Ok(None);
        }
        self.buffer.advance(4);
        Ok(Some(self.buffer.split_to(length).freeze()))
    }
}

// Conversions to k8s-openapi types. Go's protobuf encoding writes every string field that is
// not a pointer, empty or not, where JSON omits the empty ones (`omitempty`): an empty string, map
// or list is `None` here, as the same object read from JSON gives. (An empty `nodeName` read as
// `Some("")` would be a pod bound to no node.)

fn present(text: Option<String>) -> Option<String> {
    text.filter(|text| !text.is_empty())
}

fn pod_of(pod: pb::Pod) -> core::Pod {
    core::Pod {
        metadata: object_meta(pod.metadata.unwrap_or_default()),
        spec: pod.spec.map(pod_spec),
        status: pod.status.map(|status| core::PodStatus {
            phase: present(status.phase),
            conditions: non_empty(status.conditions.into_iter().map(condition).collect()),
            ..core::PodStatus::default()
        }),
    }
}

fn object_meta(meta: pb::ObjectMeta) -> meta::ObjectMeta {
    meta::ObjectMeta {
        name: present(meta.name),
        namespace: present(meta.namespace),
        uid: present(meta.uid),
        resource_version: present(meta.resource_version),
        creation_timestamp: meta.creation_timestamp.and_then(time),
        labels: non_empty_map(meta.labels.into_iter().collect()),
        annotations: non_empty_map(meta.annotations.into_iter().collect()),
        owner_references: non_empty(
            meta.owner_references
                .into_iter()
                .map(|owner| meta::OwnerReference {
                    api_version: owner.api_version.unwrap_or_default(),
                    kind: owner.kind.unwrap_or_default(),
                    name: owner.name.unwrap_or_default(),
                    uid: owner.uid.unwrap_or_default(),
                    controller: owner.controller,
                    block_owner_deletion: owner.block_owner_deletion,
                })
                .collect(),
        ),
        ..meta::ObjectMeta::default()
    }
}

fn pod_spec(spec: pb::PodSpec) -> core::PodSpec {
    core::PodSpec {
        containers: spec.containers.into_iter().map(container).collect(),
        init_containers: non_empty(spec.init_containers.into_iter().map(container).collect()),
        node_name: present(spec.node_name),
        scheduler_name: present(spec.scheduler_name),
        priority: spec.priority,
        overhead: non_empty_map(quantities(spec.overhead)),
        resources: spec.resources.map(resources),
        ..core::PodSpec::default()
    }
}

fn container(container: pb::Container) -> core::Container {
    core::Container {
        name: container.name.unwrap_or_default(),
        resources: container.resources.map(resources),
        restart_policy: present(container.restart_policy),
        ..core::Container::default()
    }
}

fn resources(resources: pb::ResourceRequirements) -> core::ResourceRequirements {
    core::ResourceRequirements {
        limits: non_empty_map(quantities(resources.limits)),
        requests: non_empty_map(quantities(resources.requests)),
        claims: None,
    }
}

fn quantities(map: impl IntoIterator<Item = (String, pb::Quantity)>) -> BTreeMap<String, Quantity> {
    map.into_iter()
        .map(|(name, quantity)| (name, Quantity(quantity.string.unwrap_or_default())))
        .collect()
}

fn condition(condition: pb::PodCondition) -> core::PodCondition {
    core::PodCondition {
        type_: condition.r#type.unwrap_or_default(),
        status: condition.status.unwrap_or_default(),
        reason: present(condition.reason),
        last_transition_time: condition.last_transition_time.and_then(time),
        ..core::PodCondition::default()
    }
}

/// A `metav1.Time`; the zero time (encoded as an empty message, JSON's `null`) is `None`.
fn time(time: pb::Time) -> Option<meta::Time> {
    let seconds = time.seconds?;
    k8s_openapi::jiff::Timestamp::new(seconds, time.nanos.unwrap_or(0))
        .ok()
        .map(meta::Time)
}

fn non_empty<T>(list: Vec<T>) -> Option<Vec<T>> {
    (!list.is_empty()).then_some(list)
}

fn non_empty_map<V>(map: BTreeMap<String, V>) -> Option<BTreeMap<String, V>> {
    (!map.is_empty()).then_some(map)
}

#[cfg(test)]
mod tests;
