//! Tests of the protobuf Pod watch: frames, envelopes, conversion, and the list-watch state
//! machine against a scripted API server (a tower service standing in for the HTTP client).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use http_body_util::StreamBody;
use hyper::body::Frame;

use super::*;
use crate::k8s::proto::MAGIC;
use crate::k8s::proto::failure_status;

fn meta(name: &str, version: &str) -> pb::ObjectMeta {
    pb::ObjectMeta {
        name: Some(name.into()),
        namespace: Some("ml".into()),
        uid: Some(format!("uid-{name}")),
        resource_version: Some(version.into()),
        creation_timestamp: Some(pb::Time {
            seconds: Some(1_700_000_000),
            nanos: Some(0),
        }),
        ..pb::ObjectMeta::default()
    }
}

fn pod(name: &str, version: &str, node: Option<&str>) -> pb::Pod {
    pb::Pod {
        metadata: Some(meta(name, version)),
        spec: Some(pb::PodSpec {
            containers: vec![pb::Container {
                name: Some("main".into()),
                resources: Some(pb::ResourceRequirements {
                    limits: HashMap::from([(
                        "nvidia.com/gpu".to_owned(),
                        pb::Quantity {
                            string: Some("1".into()),
                        },
                    )]),
                    requests: HashMap::new(),
                }),
                restart_policy: None,
            }],
            node_name: node.map(str::to_owned),
            ..pb::PodSpec::default()
        }),
        status: Some(pb::PodStatus {
            phase: Some("Pending".into()),
            conditions: Vec::new(),
        }),
    }
}

/// A bookmark's object: a Pod with only a resourceVersion.
fn bookmark(version: &str) -> pb::Pod {
    pb::Pod {
        metadata: Some(pb::ObjectMeta {
            resource_version: Some(version.into()),
            ..pb::ObjectMeta::default()
        }),
        ..pb::Pod::default()
    }
}

/// What kube-apiserver sends for an object: the magic, then the `Unknown` envelope.
fn enveloped(kind: &str, message: &impl Message) -> Vec<u8> {
    crate::k8s::proto::encode_object(kind, message)
}

fn list(version: &str, items: Vec<pb::Pod>) -> Vec<u8> {
    page(version, None, items)
}

/// A list page; `next` is the continue token of the page after it.
fn page(version: &str, next: Option<&str>, items: Vec<pb::Pod>) -> Vec<u8> {
    let list = pb::PodList {
        metadata: Some(pb::ListMeta {
            resource_version: Some(version.into()),
            r#continue: next.map(str::to_owned),
        }),
        items,
    };
    enveloped("PodList", &list)
}

/// One watch frame: the length, then the event.
fn frame(kind: &str, object: Vec<u8>) -> Vec<u8> {
    let event = pb::WatchEvent {
        r#type: Some(kind.into()),
        object: Some(pb::RawExtension { raw: Some(object) }),
    };
    let bytes = event.encode_to_vec();
    let length = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    [&length.to_be_bytes()[..], &bytes].concat()
}

fn status(code: i32, reason: &str) -> pb::Status {
    pb::Status {
        status: Some("Failure".into()),
        message: Some(format!("{reason} for the test")),
        reason: Some(reason.into()),
        code: Some(code),
    }
}

#[test]
fn frames_come_out_whole_however_the_stream_is_chunked() {
    let stream: Vec<u8> = [
        frame("ADDED", enveloped("Pod", &pod("a", "1", None))),
        frame("MODIFIED", enveloped("Pod", &pod("a", "2", Some("n1")))),
        frame("DELETED", enveloped("Pod", &pod("a", "3", Some("n1")))),
    ]
    .concat();
    for chunk in [1, 3, 4, 5, 17, stream.len()] {
        let mut frames = Frames::default();
        let mut out = Vec::new();
        for piece in stream.chunks(chunk) {
            frames.push(piece);
            while let Some(frame) = frames.next_frame().ok().flatten() {
                out.push(frame);
            }
        }
        assert_eq!(out.len(), 3, "chunks of {chunk}");
        let mut version = String::new();
        let kinds: Vec<_> = out
            .iter()
            .map(|frame| match watch_step(frame, &mut version) {
                Ok(Some(Event::Apply(pod))) => {
                    format!("apply {:?}", pod.spec.and_then(|s| s.node_name))
                }
                Ok(Some(Event::Delete(_))) => "delete".to_owned(),
                _ => "other".to_owned(),
            })
            .collect();
        assert_eq!(kinds, ["apply None", "apply Some(\"n1\")", "delete"]);
        assert_eq!(version, "3");
    }
}

#[test]
fn an_impossible_frame_length_is_an_error_not_an_allocation() {
    let mut frames = Frames::default();
    frames.push(&u32::MAX.to_be_bytes());
    assert!(frames.next_frame().is_err());
}

#[test]
fn a_bookmark_moves_the_version_and_yields_nothing() {
    let mut version = "5".to_owned();
    let bookmark_pod = bookmark("9");
    let step = watch_step(
        &frame("BOOKMARK", enveloped("Pod", &bookmark_pod))[4..],
        &mut version,
    );
    assert!(matches!(step, Ok(None)));
    assert_eq!(version, "9");
}

#[test]
fn an_error_event_is_its_status_and_an_event_without_a_version_is_refused() {
    let mut version = "5".to_owned();
    let gone = frame("ERROR", enveloped("Status", &status(410, "Expired")));
    match watch_step(&gone[4..], &mut version) {
        Err(WatchFrameError::Status(status)) => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
        }
        _ => panic!("an ERROR event must give its Status"),
    }
    let mut unversioned = pod("a", "", None);
    if let Some(meta) = unversioned.metadata.as_mut() {
        meta.resource_version = None;
    }
    let added = frame("ADDED", enveloped("Pod", &unversioned));
    assert!(matches!(
        watch_step(&added[4..], &mut version),
        Err(WatchFrameError::NoVersion)
    ));
    assert_eq!(version, "5", "a refused event moves nothing");
    assert!(matches!(
        watch_step(b"\xff\xff garbage", &mut version),
        Err(WatchFrameError::Decode(_))
    ));
    let unknown = frame("RENAMED", enveloped("Pod", &pod("a", "6", None)));
    assert!(matches!(
        watch_step(&unknown[4..], &mut version),
        Err(WatchFrameError::Decode(_))
    ));
}

#[test]
fn decoding_refuses_an_encoded_envelope_and_takes_a_bare_message() {
    let bare = pod("a", "1", None).encode_to_vec();
    let decoded = decode_object::<pb::Pod>(&bare).ok();
    assert_eq!(decoded, Some(pod("a", "1", None)));
    let gzipped = pb::Unknown {
        raw: Some(bare),
        content_encoding: Some("gzip".into()),
        ..pb::Unknown::default()
    };
    let bytes = [MAGIC, &gzipped.encode_to_vec()].concat();
    assert!(decode_object::<pb::Pod>(&bytes).is_err());
}

#[test]
fn conversion_gives_what_json_would_give() {
    let mut full = pod("a", "7", Some("n1"));
    if let Some(meta) = full.metadata.as_mut() {
        meta.labels.insert("team".into(), "ml".into());
        meta.owner_references.push(pb::OwnerReference {
            kind: Some("ReplicaSet".into()),
            name: Some("rs".into()),
            uid: Some("u".into()),
            api_version: Some("apps/v1".into()),
            controller: Some(true),
            block_owner_deletion: None,
        });
    }
    if let Some(spec) = full.spec.as_mut() {
        spec.priority = Some(100);
        spec.scheduler_name = Some("gpu-scheduler".into());
    }
    if let Some(status) = full.status.as_mut() {
        status.conditions.push(pb::PodCondition {
            r#type: Some("PodScheduled".into()),
            status: Some("False".into()),
            // The zero time: an empty message on the wire, `null` in JSON.
            last_transition_time: Some(pb::Time::default()),
            reason: Some("Unschedulable".into()),
        });
    }
    let converted = pod_of(full);
    assert_eq!(converted.metadata.resource_version.as_deref(), Some("7"));
    assert_eq!(
        converted
            .metadata
            .creation_timestamp
            .map(|t| t.0.as_second()),
        Some(1_700_000_000)
    );
    assert_eq!(
        converted.metadata.annotations, None,
        "no annotations: None, as in JSON"
    );
    assert_eq!(
        converted.metadata.owner_references.map(|o| o[0].controller),
        Some(Some(true))
    );
    let spec = converted.spec.unwrap_or_default();
    assert_eq!(spec.priority, Some(100));
    assert_eq!(spec.scheduler_name.as_deref(), Some("gpu-scheduler"));
    assert_eq!(spec.init_containers, None);
    assert_eq!(spec.overhead, None);
    let resources = spec.containers[0].resources.clone().unwrap_or_default();
    assert_eq!(
        resources.limits.map(|l| l["nvidia.com/gpu"].0.clone()),
        Some("1".to_owned())
    );
    assert_eq!(resources.requests, None);
    let conditions = converted
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default();
    assert_eq!(conditions[0].last_transition_time, None);
    assert_eq!(conditions[0].reason.as_deref(), Some("Unschedulable"));

    // Go writes an unset string as an empty one: a pending pod's nodeName is "" on the wire.
    let pending = pod_of(pod("p", "8", Some("")));
    assert_eq!(pending.spec.and_then(|s| s.node_name), None);
}

/// One scripted answer: the status and the body's chunks.
type Answer = (u16, Vec<Vec<u8>>);

/// A kube client whose API server answers `script` in order (by request), recording the URIs
/// and Accept headers it was asked with.
fn scripted(script: Vec<Answer>) -> (kube::Client, Arc<Mutex<Vec<String>>>) {
    scripted_with_type(script, None)
}

/// [`scripted`] with every answer's Content-Type set to `content_type`.
fn scripted_with_type(
    script: Vec<Answer>,
    content_type: Option<&'static str>,
) -> (kube::Client, Arc<Mutex<Vec<String>>>) {
    let asked = Arc::new(Mutex::new(Vec::new()));
    let script = Arc::new(Mutex::new(VecDeque::from(script)));
    let log = Arc::clone(&asked);
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let accept = request
            .headers()
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        log.lock()
            .map(|mut log| log.push(format!("{} [{accept}]", request.uri())))
            .ok();
        let answer = script.lock().ok().and_then(|mut s| s.pop_front());
        async move {
            let (code, chunks) = answer.unwrap_or((500, vec![b"script exhausted".to_vec()]));
            let frames = futures::stream::iter(
                chunks
                    .into_iter()
                    .map(|chunk| Ok::<_, Infallible>(Frame::data(Bytes::from(chunk)))),
            );
            let mut response = http::Response::new(StreamBody::new(frames));
            *response.status_mut() = http::StatusCode::from_u16(code).unwrap_or_default();
            if let Some(kind) = content_type {
                response.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static(kind),
                );
            }
            Ok::<_, Infallible>(response)
        }
    });
    (kube::Client::new(service, "default"), asked)
}

fn describe(item: &Result<Event<core::Pod>, Error>) -> String {
    let name = |pod: &core::Pod| pod.metadata.name.clone().unwrap_or_default();
    match item {
        Ok(Event::Init) => "init".into(),
        Ok(Event::InitApply(pod)) => format!("list {}", name(pod)),
        Ok(Event::InitDone) => "listed".into(),
        Ok(Event::Apply(pod)) => format!(
            "apply {} on {}",
            name(pod),
            pod.spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default()
        ),
        Ok(Event::Delete(pod)) => format!("delete {}", name(pod)),
        Err(Error::WatchError(status)) => format!("error {}", status.code),
        Err(Error::InitialListFailed(kube::Error::Api(status))) => {
            format!("list failed {} {}", status.code, status.reason)
        }
        Err(Error::WatchStartFailed(kube::Error::Api(status))) => {
            format!("watch failed {}", status.code)
        }
        Err(other) => format!("other error {other}"),
    }
}

#[tokio::test]
async fn lists_watches_resumes_and_relists_as_kube_runtime_does() {
    let added = frame("ADDED", enveloped("Pod", &pod("b", "11", None)));
    let bookmark_pod = bookmark("12");
    let bookmark = frame("BOOKMARK", enveloped("Pod", &bookmark_pod));
    let bound = frame("MODIFIED", enveloped("Pod", &pod("b", "13", Some("n1"))));
    // The first watch's bytes cut across frames, as TCP may deliver them.
    let first_watch: Vec<u8> = [added, bookmark, bound].concat();
    let (head, tail) = first_watch.split_at(7);
    let (middle, tail) = tail.split_at(tail.len() / 2);
    let script = vec![
        (200, vec![list("10", vec![pod("a", "5", None)])]),
        (200, vec![head.to_vec(), middle.to_vec(), tail.to_vec()]),
        (
            200,
            vec![frame("ERROR", enveloped("Status", &status(410, "Expired")))],
        ),
        (200, vec![list("20", vec![pod("b", "13", Some("n1"))])]),
        (
            200,
            vec![frame(
                "DELETED",
                enveloped("Pod", &pod("b", "21", Some("n1"))),
            )],
        ),
    ];
    let (client, asked) = scripted(script);
    let events: Vec<String> = pod_watch(client, "status.phase!=Failed")
        .take(11)
        .map(|item| describe(&item))
        .collect()
        .await;
    assert_eq!(
        events,
        [
            "init",
            "list a",
            "listed",
            "apply b on ",
            "apply b on n1",
            "error 410",
            "init",
            "list b",
            "listed",
            "delete b",
            // The script is exhausted: the next watch start fails, and says so.
            "watch failed 500",
        ]
    );
    let asked = asked.lock().map(|a| a.clone()).unwrap_or_default();
    assert_eq!(asked.len(), 6, "{asked:?}");
    assert!(
        asked.iter().all(|a| a.ends_with(&format!("[{PROTOBUF}]"))),
        "{asked:?}"
    );
    assert!(asked[0].contains("limit=500"), "lists in pages: {asked:?}");
    assert!(asked[1].contains("watch=true") && asked[1].contains("resourceVersion=10"));
    assert!(asked[1].contains("allowWatchBookmarks=true"), "{asked:?}");
    // Resumed from the last event (13), after the bookmark (12).
    assert!(asked[2].contains("resourceVersion=13"), "{asked:?}");
    assert!(
        !asked[3].contains("watch=true"),
        "relisted after 410: {asked:?}"
    );
    assert!(asked[4].contains("resourceVersion=20"), "{asked:?}");
    assert!(
        asked[0].contains("fieldSelector=status.phase%21%3DFailed"),
        "{asked:?}"
    );
}

#[tokio::test]
async fn an_api_server_that_does_not_serve_protobuf_is_named_with_the_way_out() {
    let script = vec![
        (406, vec![b"only JSON here".to_vec()]),
        (200, vec![b"{\"kind\":\"PodList\"}".to_vec()]),
    ];
    let (client, _) = scripted_with_type(script, Some("application/json"));
    let errors: Vec<String> = pod_watch(client, "")
        .take(2)
        .map(|item| match item {
            Err(Error::InitialListFailed(kube::Error::Api(status))) => {
                format!("{} {} {}", status.code, status.reason, status.message)
            }
            other => format!("unexpected {other:?}"),
        })
        .collect()
        .await;
    for (error, code) in errors.iter().zip(["406", "200"]) {
        assert!(error.starts_with(&format!("{code} NotProtobuf")), "{error}");
        assert!(error.contains("set watch.protobuf: false"), "{error}");
    }
    assert!(
        errors[1].contains("answered application/json"),
        "{errors:?}"
    );
}

#[tokio::test]
async fn a_refused_list_gives_the_api_server_s_status_and_is_retried_from_the_start() {
    let forbidden = enveloped("Status", &status(403, "Forbidden"));
    let script = vec![
        (403, vec![forbidden]),
        (
            500,
            vec![b"{\"kind\":\"Status\",\"code\":500,\"reason\":\"InternalError\"}".to_vec()],
        ),
        (
            200,
            vec![page("3", Some("next"), vec![pod("a", "2", None)])],
        ),
        (200, vec![page("3", None, vec![pod("b", "3", None)])]),
        (410, vec![b"gone".to_vec()]),
        (200, vec![list("4", Vec::new())]),
    ];
    let (client, asked) = scripted(script);
    let events: Vec<String> = pod_watch(client, "")
        .take(10)
        .map(|item| describe(&item))
        .collect()
        .await;
    assert_eq!(
        events,
        [
            "list failed 403 Forbidden",
            "list failed 500 InternalError",
            "init",
            "list a",
            "list b",
            "listed",
            // The version is gone before the watch starts: relist.
            "watch failed 410",
            "init",
            "listed",
            "watch failed 500",
        ]
    );
    let asked = asked.lock().map(|a| a.clone()).unwrap_or_default();
    assert!(asked[3].contains("continue=next"), "{asked:?}");
    assert!(asked[4].contains("resourceVersion=3"), "{asked:?}");
    assert!(!asked[5].contains("watch=true"), "{asked:?}");
}

proptest::proptest! {
    /// Whatever bytes the API server (or something in between) sends, the decoder answers with
    /// frames, events or errors, never a panic; a valid stream with bytes flipped included.
    #[test]
    fn arbitrary_watch_bytes_never_panic(
        noise in proptest::collection::vec(proptest::num::u8::ANY, 0..512),
        flips in proptest::collection::vec((0usize..4096, proptest::num::u8::ANY), 0..8),
        chunk in 1usize..64,
    ) {
        let mut stream: Vec<u8> = [
            frame("ADDED", enveloped("Pod", &pod("a", "1", None))),
            frame("ERROR", enveloped("Status", &status(410, "Expired"))),
        ]
        .concat();
        for (at, byte) in flips {
            let len = stream.len();
            if let Some(b) = stream.get_mut(at % len) {
                *b ^= byte;
            }
        }
        stream.extend_from_slice(&noise);
        let mut frames = Frames::default();
        let mut version = String::new();
        for piece in stream.chunks(chunk) {
            frames.push(piece);
            while let Ok(Some(frame)) = frames.next_frame() {
                let _ = watch_step(&frame, &mut version);
            }
        }
        let _ = decode_object::<pb::PodList>(&noise);
        let _ = failure_status(500, &noise);
    }
}
