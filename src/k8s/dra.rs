//! The Dynamic Resource Allocation watches: every ResourceSlice and ResourceClaim
//! (`resource.k8s.io/v1`), as one stream of [`DraEvent`]s for the watch feed
//! ([`crate::k8s::watch`], which reads them through [`crate::objects::dra`]). Where the API
//! server does not serve `resource.k8s.io/v1` (clusters before 1.34, or the group switched
//! off), or refuses the extender's account, the stream says so once ([`DraEvent::Unavailable`])
//! and ends: nothing waits for DRA that will never come.

use futures::stream::{self, BoxStream};
use futures::{FutureExt as _, StreamExt};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::ListParams;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_stream};
use kube::{Api, ResourceExt};

use crate::config::Config;

/// One item of the DRA watches.
#[derive(Debug)]
pub enum DraEvent {
    Slice(Result<Event<ResourceSlice>, watcher::Error>),
    Claim(Result<Event<ResourceClaim>, watcher::Error>),
    /// DRA cannot be read: the API does not serve it, or refuses the extender's account.
    Unavailable(Unavailable),
}

/// Why DRA cannot be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// The API server does not serve `resource.k8s.io/v1`.
    NotServed,
    /// The extender's account may not list ResourceSlices (its ClusterRole predates DRA).
    Forbidden,
}

impl Unavailable {
    /// What the log says, once.
    pub fn explain(self) -> &'static str {
        match self {
            Self::NotServed => {
                "the API server does not serve resource.k8s.io/v1: GPUs handed out by Dynamic Resource Allocation are not read (set dra.enabled=false to skip the check)"
            }
            Self::Forbidden => {
                "the extender's account may not list resource.k8s.io/v1 ResourceSlices: GPUs handed out by Dynamic Resource Allocation are not read and may be counted free; grant list and watch on resourceslices and resourceclaims (deploy/rbac-extender.yaml) or set dra.enabled=false"
            }
        }
    }
}

/// What a failed probe list means: not served (404, kube-apiserver's plain "404 page not
/// found" for a group it does not serve included), forbidden (403), or a passing failure for
/// the watchers to retry (`None`).
pub(crate) fn unavailable(error: &kube::Error) -> Option<Unavailable> {
    match error {
        kube::Error::Api(status) if status.is_not_found() || status.code == 404 => {
            Some(Unavailable::NotServed)
        }
        kube::Error::Api(status) if status.is_forbidden() || status.code == 403 => {
            Some(Unavailable::Forbidden)
        }
        _ => None,
    }
}

/// The ResourceSlice and ResourceClaim watches as one stream; empty when `dra.enabled` is off.
/// One list of a single slice first tells whether DRA is served; then both watchers run with
/// kube-runtime's default backoff (errors are items, retried), managed fields dropped.
pub fn events(client: kube::Client, cfg: &Config) -> BoxStream<'static, DraEvent> {
    if !cfg.dra.enabled {
        return stream::empty().boxed();
    }
    let probe = async move {
        let slices: Api<ResourceSlice> = Api::all(client.clone());
        if let Err(error) = slices.list(&ListParams::default().limit(1)).await
            && let Some(why) = unavailable(&error)
        {
            return stream::once(async move { DraEvent::Unavailable(why) }).boxed();
        }
        let slices = watch_stream(slices, watcher::Config::default())
            .default_backoff()
            .modify(|slice| slice.managed_fields_mut().clear())
            .map(DraEvent::Slice);
        let claims: Api<ResourceClaim> = Api::all(client);
        let claims = watch_stream(claims, watcher::Config::default())
            .default_backoff()
            .modify(|claim| claim.managed_fields_mut().clear())
            .map(DraEvent::Claim);
        stream::select(slices, claims).boxed()
    };
    probe.into_stream().flatten().boxed()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test fixtures")]
    use super::*;
    use serde_json::json;

    fn status(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(
            serde_json::from_value(json!({
                "status": "Failure", "code": code, "message": "m", "reason": reason
            }))
            .unwrap(),
        ))
    }

    /// kube-apiserver answers a group it does not serve with plain text "404 page not found",
    /// which kube-rs reads as a Status of code 404 without the NotFound reason.
    #[test]
    fn a_group_not_served_or_forbidden_is_unavailable_and_other_errors_are_retried() {
        assert_eq!(
            unavailable(&status(404, "Failed to parse error data")),
            Some(Unavailable::NotServed)
        );
        assert_eq!(
            unavailable(&status(404, "NotFound")),
            Some(Unavailable::NotServed)
        );
        assert_eq!(
            unavailable(&status(403, "Forbidden")),
            Some(Unavailable::Forbidden)
        );
        assert_eq!(unavailable(&status(500, "InternalError")), None);
        assert_eq!(unavailable(&status(429, "TooManyRequests")), None);
    }
}
