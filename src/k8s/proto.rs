//! kube-apiserver's protobuf encoding, as the extender speaks it: the messages generated from
//! `proto/gpu_extender/pod_watch.proto` (a view of Pod, the watch frames, Status, Binding), the
//! "k8s\0" envelope around an object both ways, the Status of a failed request, and the one
//! protobuf write, the Binding ([`create_binding`]).
//!
//! Why the Binding too: kube-scheduler writes its Bindings in protobuf; the binder wrote them in
//! JSON, which kube-apiserver decodes with strict field validation and more garbage, and a
//! profile of the throughput loop put that decoding at about 0.1 ms of kube-apiserver CPU per
//! pod (docs/benchmarks.md, "Tenth pass").

use kube::api::PostParams;
use kube::core::Status;
use prost::Message;

use super::api::BindingWrite;

pub(crate) mod wire {
    include!(concat!(env!("OUT_DIR"), "/pod_watch_protos.rs"));
}
pub(crate) use wire::gpu_extender::pod_watch as pb;

/// What kube-apiserver prefixes to a protobuf-encoded object, before its `Unknown` envelope.
pub(crate) const MAGIC: &[u8] = b"k8s\x00";
/// The media type of kube-apiserver's protobuf encoding.
pub(crate) const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// Encodes an object as kube-apiserver does: the magic, then the `Unknown` envelope naming its
/// `v1` kind, around the message.
pub(crate) fn encode_object(kind: &str, message: &impl Message) -> Vec<u8> {
    let envelope = pb::Unknown {
        type_meta: Some(pb::TypeMeta {
            api_version: Some("v1".into()),
            kind: Some(kind.into()),
        }),
        raw: Some(message.encode_to_vec()),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    [MAGIC, &envelope.encode_to_vec()].concat()
}

/// Decodes an object as kube-apiserver encodes it: the magic, the `Unknown` envelope, the
/// message. Without the magic the bytes are taken as the bare message.
pub(crate) fn decode_object<M: Message + Default>(bytes: &[u8]) -> Result<M, String> {
    let Some(enveloped) = bytes.strip_prefix(MAGIC) else {
        return M::decode(bytes).map_err(|error| error.to_string());
    };
    let envelope = pb::Unknown::decode(enveloped).map_err(|error| error.to_string())?;
    if let Some(encoding) = envelope
        .content_encoding
        .as_deref()
        .filter(|e| !e.is_empty())
    {
        return Err(format!("unsupported content encoding {encoding:?}"));
    }
    M::decode(envelope.raw.as_deref().unwrap_or_default()).map_err(|error| error.to_string())
}

/// The Status a failed request answered: protobuf, JSON, or (a proxy's page) its text.
pub(crate) fn failure_status(code: u16, body: &[u8]) -> Status {
    if body.starts_with(MAGIC)
        && let Ok(status) = decode_object::<pb::Status>(body)
    {
        return status_of(status, code);
    }
    if let Ok(status) = serde_json::from_slice::<Status>(body) {
        return status;
    }
    let text = String::from_utf8_lossy(body);
    Status::failure(text.trim(), "").with_code(code)
}

/// A protobuf Status as kube's, its code `code_otherwise` when it carries none.
pub(crate) fn status_of(status: pb::Status, code_otherwise: u16) -> Status {
    let code = status
        .code
        .and_then(|code| u16::try_from(code).ok())
        .filter(|code| *code != 0)
        .unwrap_or(code_otherwise);
    Status::failure(
        status.message.as_deref().unwrap_or_default(),
        status.reason.as_deref().unwrap_or_default(),
    )
    .with_code(code)
}

/// The body of `POST pods/{name}/binding` for `write`: what kube-scheduler sends, plus the
/// allocation record's annotations, which kube-apiserver copies onto the pod.
pub(crate) fn binding_body(write: &BindingWrite) -> Vec<u8> {
    let binding = pb::Binding {
        metadata: Some(pb::ObjectMeta {
            name: Some(write.name.clone()),
            namespace: Some(write.namespace.clone()),
            uid: (!write.uid.is_empty()).then(|| write.uid.clone()),
            annotations: write.annotations.clone().into_iter().collect(),
            ..pb::ObjectMeta::default()
        }),
        target: Some(pb::ObjectReference {
            kind: Some("Node".into()),
            name: Some(write.node.clone()),
            api_version: Some("v1".into()),
        }),
    };
    encode_object("Binding", &binding)
}

/// Sends `request` asking for protobuf answers. A failed request's Status (read in protobuf, JSON
/// or text, [`failure_status`]) becomes kube's `Error::Api`, as kube's own typed calls report it;
/// what a successful answer holds is the caller's to read.
pub(crate) async fn send(
    client: &kube::Client,
    request: http::Request<Vec<u8>>,
) -> Result<http::Response<kube::client::Body>, kube::Error> {
    let (mut parts, body) = request.into_parts();
    parts.headers.insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static(PROTOBUF),
    );
    let request = http::Request::from_parts(parts, kube::client::Body::from(body));
    let response = client.send(request).await?;
    if response.status().is_success() {
        return Ok(response);
    }
    let code = response.status().as_u16();
    let body = response.into_body().collect_bytes().await?;
    Err(kube::Error::Api(Box::new(failure_status(code, &body))))
}

/// Creates the pod's Binding in protobuf. A refusal is kube's `Error::Api` with the Status the
/// API server answered (409 when the pod is bound or its UID differs, 404 when it is gone),
/// as kube's own typed calls report it.
pub(crate) async fn create_binding(
    client: &kube::Client,
    write: &BindingWrite,
) -> Result<(), kube::Error> {
    // kube builds the URL (and checks the name) as `Api::create_subresource` would; only the
    // encoding differs.
    let mut request =
        kube::core::Request::new(format!("/api/v1/namespaces/{}/pods", write.namespace))
            .create_subresource(
                "binding",
                &write.name,
                &PostParams::default(),
                binding_body(write),
            )
            .map_err(kube::Error::BuildRequest)?;
    request.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(PROTOBUF),
    );
    // The API server answers a Binding with a Status, which a success leaves unread.
    send(client, request).await.map(drop)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn write() -> BindingWrite {
        BindingWrite {
            namespace: "team-a".into(),
            name: "train-0".into(),
            uid: "0f3c-uid".into(),
            node: "gpu-00042".into(),
            annotations: BTreeMap::from([(
                "gpu-extender.io/allocation".to_owned(),
                r#"{"version":1}"#.to_owned(),
            )]),
        }
    }

    #[test]
    fn a_binding_is_enveloped_as_kube_apiserver_reads_it_and_carries_the_record() {
        let body = binding_body(&write());
        assert!(body.starts_with(MAGIC));
        let envelope = pb::Unknown::decode(&body[MAGIC.len()..]).expect("an Unknown envelope");
        let type_meta = envelope.type_meta.clone().expect("typeMeta");
        assert_eq!(type_meta.api_version.as_deref(), Some("v1"));
        assert_eq!(type_meta.kind.as_deref(), Some("Binding"));
        let binding = decode_object::<pb::Binding>(&body).expect("a Binding");
        let meta = binding.metadata.clone().expect("metadata");
        assert_eq!(meta.name.as_deref(), Some("train-0"));
        assert_eq!(meta.namespace.as_deref(), Some("team-a"));
        assert_eq!(meta.uid.as_deref(), Some("0f3c-uid"));
        let annotations: BTreeMap<String, String> = meta.annotations.into_iter().collect();
        assert_eq!(annotations, write().annotations);
        let target = binding.target.expect("target");
        assert_eq!(target.kind.as_deref(), Some("Node"));
        assert_eq!(target.name.as_deref(), Some("gpu-00042"));
        assert_eq!(target.api_version.as_deref(), Some("v1"));
    }

    #[test]
    fn a_binding_without_uid_or_record_leaves_both_out() {
        let mut bare = write();
        bare.uid.clear();
        bare.annotations.clear();
        let binding = decode_object::<pb::Binding>(&binding_body(&bare)).expect("a Binding");
        let meta = binding.metadata.expect("metadata");
        assert_eq!(
            meta.uid, None,
            "an empty UID would be a precondition no pod meets"
        );
        assert!(meta.annotations.is_empty());
    }

    #[test]
    fn a_refusal_keeps_its_code_and_message_in_either_encoding() {
        let refusal = pb::Status {
            status: Some("Failure".into()),
            message: Some("pod train-0 is already assigned to node gpu-00007".into()),
            reason: Some("Conflict".into()),
            code: Some(409),
        };
        let from_protobuf = failure_status(500, &encode_object("Status", &refusal));
        assert_eq!(from_protobuf.code, 409);
        assert!(from_protobuf.message.contains("already assigned"));
        let json = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"pods \"train-0\" not found","reason":"NotFound","code":404}"#;
        assert_eq!(failure_status(500, json).code, 404);
        let page = failure_status(502, b"<html>bad gateway</html>");
        assert_eq!(page.code, 502);
        assert!(page.message.contains("bad gateway"));
    }
}
