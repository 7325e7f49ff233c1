//! Authentication and authorization on the admin listener, the way Kubernetes components (and
//! kube-rbac-proxy) do it: the request's bearer token goes to the API server's TokenReview; the
//! user it names must be allowed `get` on the request's path as a non-resource URL by a
//! SubjectAccessReview (RBAC: a ClusterRole with `nonResourceURLs: ["/inspect"]`, verb `get`).
//! Only the paths in `server.adminAuth.paths` are guarded (`/inspect` by default); no token is
//! 401, a token the API server does not accept is 401, a user not allowed is 403.
//!
//! Outcomes (allowed, 401, 403) are kept for `server.adminAuth.cacheTtlSeconds` per token and
//! path, so a scraper polling every few seconds costs the API server two reviews per interval,
//! not two per request. A review that fails (the API server unreachable) is answered 503 and
//! not kept.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;
use parking_lot::Mutex;
use tracing::{debug, warn};

/// What a review decided for one token and path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The user may read the path.
    Allowed,
    /// The token names no user (expired, revoked, unknown): 401, with the reason.
    Unauthenticated(String),
    /// The user (named) may not read the path: 403, with the reason.
    Forbidden(String),
}

/// Asks whether `token` may `get` `path`; `Err` when it could not be asked (503).
pub trait Review: Send + Sync {
    fn review<'a>(
        &'a self,
        token: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Verdict, String>>;
}

/// [`Review`] by the API server: TokenReview, then SubjectAccessReview.
#[derive(Clone)]
pub struct KubeReview {
    client: kube::Client,
}

impl std::fmt::Debug for KubeReview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeReview").finish_non_exhaustive()
    }
}

impl KubeReview {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    async fn ask(&self, token: &str, path: &str) -> Result<Verdict, String> {
        let tokens: Api<TokenReview> = Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let answer = tokens
            .create(&PostParams::default(), &review)
            .await
            .map_err(|error| format!("TokenReview failed: {error}"))?;
        let status = answer.status.unwrap_or_default();
        let user = match status.user {
            Some(user) if status.authenticated == Some(true) => user,
            _ => {
                return Ok(Verdict::Unauthenticated(
                    status
                        .error
                        .unwrap_or_else(|| "the token was not accepted".to_owned()),
                ));
            }
        };
        let name = user.username.clone().unwrap_or_default();
        let access: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_owned()),
                    verb: Some("get".to_owned()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answer = access
            .create(&PostParams::default(), &review)
            .await
            .map_err(|error| format!("SubjectAccessReview failed: {error}"))?;
        let status = answer.status.unwrap_or_default();
        Ok(if status.allowed {
            Verdict::Allowed
        } else {
            Verdict::Forbidden(format!(
                "user {name:?} may not get {path}{}",
                status
                    .reason
                    .filter(|r| !r.is_empty())
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            ))
        })
    }
}

impl Review for KubeReview {
    fn review<'a>(
        &'a self,
        token: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Verdict, String>> {
        Box::pin(self.ask(token, path))
    }
}

/// Outcomes kept at most; beyond it the oldest half is dropped (tokens are few in practice).
const CACHE_LIMIT: usize = 4096;

/// The guard of the admin listener: which paths, who reviews, and the outcomes kept.
pub struct AdminAuth {
    paths: Vec<String>,
    review: Arc<dyn Review>,
    ttl: Duration,
    cache: Mutex<HashMap<(String, String), (Instant, Verdict)>>,
}

impl std::fmt::Debug for AdminAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminAuth")
            .field("paths", &self.paths)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl AdminAuth {
    /// Guards `paths`, asking `review`, keeping outcomes for `ttl`.
    pub fn new(paths: Vec<String>, ttl: Duration, review: Arc<dyn Review>) -> Self {
        Self {
            paths,
            review,
            ttl,
            cache: Mutex::new(HashMap::new()),
        }
    }

    async fn verdict(&self, token: &str, path: &str) -> Result<Verdict, String> {
        let key = (token.to_owned(), path.to_owned());
        let now = Instant::now();
        if let Some((at, verdict)) = self.cache.lock().get(&key)
            && now.duration_since(*at) < self.ttl
        {
            return Ok(verdict.clone());
        }
        let verdict = self.review.review(token, path).await?;
        if !self.ttl.is_zero() {
            let mut cache = self.cache.lock();
            if cache.len() >= CACHE_LIMIT {
                let ttl = self.ttl;
                cache.retain(|_, (at, _)| now.duration_since(*at) < ttl);
                if cache.len() >= CACHE_LIMIT {
                    cache.clear();
                }
            }
            cache.insert(key, (now, verdict.clone()));
        }
        Ok(verdict)
    }
}

fn refuse(status: StatusCode, message: String) -> Response {
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message,
    )
        .into_response();
    if status == StatusCode::UNAUTHORIZED
        && let Ok(value) = header::HeaderValue::from_str("Bearer realm=\"gpu-extender\"")
    {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

/// The middleware: passes requests for open paths; for guarded ones, answers 401, 403 or 503
/// unless the bearer token's user may `get` the path.
pub async fn guard(State(auth): State<Arc<AdminAuth>>, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    if !auth.paths.contains(&path) {
        return next.run(request).await;
    }
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            // The scheme is case-insensitive (RFC 9110).
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(token)
        })
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let Some(token) = token else {
        return refuse(
            StatusCode::UNAUTHORIZED,
            format!(
                "{path} needs a bearer token (Authorization: Bearer ...; `inspect --from` sends \
                 --token or GPU_EXTENDER_ADMIN_TOKEN) of a user allowed `get` on it \
                 (server.adminAuth.paths)\n"
            ),
        );
    };
    match auth.verdict(token, &path).await {
        Ok(Verdict::Allowed) => next.run(request).await,
        Ok(Verdict::Unauthenticated(reason)) => {
            debug!(%path, %reason, "admin request refused: token not accepted");
            refuse(
                StatusCode::UNAUTHORIZED,
                format!("{path}: the bearer token was not accepted: {reason}\n"),
            )
        }
        Ok(Verdict::Forbidden(reason)) => {
            debug!(%path, %reason, "admin request refused: not allowed");
            refuse(StatusCode::FORBIDDEN, format!("{reason}\n"))
        }
        Err(error) => {
            warn!(%path, %error, "admin request refused: cannot review its token");
            refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{path}: cannot review the bearer token with the API server: {error}\n"),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;
    use axum::body::Body;
    use axum::routing::get;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::ServiceExt as _;

    /// A scripted API server: `reader` may read everything, `stranger` nothing, `broken` cannot
    /// be reviewed; any other token is unknown. Counts the reviews.
    #[derive(Default)]
    struct Scripted {
        calls: AtomicUsize,
    }

    impl Review for Scripted {
        fn review<'a>(
            &'a self,
            token: &'a str,
            path: &'a str,
        ) -> BoxFuture<'a, Result<Verdict, String>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                match token {
                    "reader" => Ok(Verdict::Allowed),
                    "stranger" => Ok(Verdict::Forbidden(format!(
                        "user \"stranger\" may not get {path}"
                    ))),
                    "broken" => Err("connection refused".to_owned()),
                    _ => Ok(Verdict::Unauthenticated("invalid bearer token".to_owned())),
                }
            })
        }
    }

    fn app(review: Arc<Scripted>, ttl: Duration) -> axum::Router {
        let auth = Arc::new(AdminAuth::new(vec!["/inspect".into()], ttl, review));
        axum::Router::new()
            .route("/inspect", get(|| async { "report" }))
            .route("/metrics", get(|| async { "metrics" }))
            .layer(axum::middleware::from_fn_with_state(auth, guard))
    }

    async fn call(app: &axum::Router, path: &str, token: Option<&str>) -> (StatusCode, String) {
        let mut request = Request::get(path);
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let response = app
            .clone()
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn guarded_paths_answer_401_403_or_the_page_and_open_paths_need_nothing() {
        let review = Arc::new(Scripted::default());
        let app = app(review.clone(), Duration::ZERO);
        let (status, body) = call(&app, "/inspect", None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(body.contains("needs a bearer token"), "{body}");
        assert_eq!(
            review.calls.load(Ordering::SeqCst),
            0,
            "no token, no review"
        );
        let (status, body) = call(&app, "/inspect", Some("forged")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(body.contains("invalid bearer token"), "{body}");
        let (status, body) = call(&app, "/inspect", Some("stranger")).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(body.contains("may not get /inspect"), "{body}");
        assert_eq!(
            call(&app, "/inspect", Some("reader")).await,
            (StatusCode::OK, "report".to_owned())
        );
        let (status, body) = call(&app, "/inspect", Some("broken")).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("connection refused"), "{body}");
        let before = review.calls.load(Ordering::SeqCst);
        assert_eq!(
            call(&app, "/metrics", None).await,
            (StatusCode::OK, "metrics".to_owned())
        );
        assert_eq!(review.calls.load(Ordering::SeqCst), before);
    }

    #[tokio::test]
    async fn outcomes_are_reused_within_the_ttl_but_failures_are_not() {
        let review = Arc::new(Scripted::default());
        let app = app(review.clone(), Duration::from_secs(3600));
        for _ in 0..3 {
            assert_eq!(
                call(&app, "/inspect", Some("reader")).await.0,
                StatusCode::OK
            );
            assert_eq!(
                call(&app, "/inspect", Some("stranger")).await.0,
                StatusCode::FORBIDDEN
            );
        }
        assert_eq!(
            review.calls.load(Ordering::SeqCst),
            2,
            "one review per token"
        );
        for _ in 0..2 {
            assert_eq!(
                call(&app, "/inspect", Some("broken")).await.0,
                StatusCode::SERVICE_UNAVAILABLE
            );
        }
        assert_eq!(
            review.calls.load(Ordering::SeqCst),
            4,
            "failures are asked again"
        );
    }
}
