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
//!
//! Tokens are reviewed for an audience (`server.adminAuth.audiences`, `gpu-extender` by
//! default), so a token issued to some other service, which that service could replay, is not
//! accepted here. A client address whose tokens the API server refused
//! `server.adminAuth.failedTokensPerMinute` times in a minute is answered 429 without a review
//! until the minute is over: guessing tokens costs the guesser, not the API server.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
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

use crate::telemetry::Metrics;

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
    /// The audiences a token must be for; empty: the API server's own.
    audiences: Vec<String>,
}

impl std::fmt::Debug for KubeReview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeReview").finish_non_exhaustive()
    }
}

impl KubeReview {
    /// Reviews through `client`, accepting tokens issued for one of `audiences` (empty: the
    /// API server's own audiences).
    pub fn new(client: kube::Client, audiences: Vec<String>) -> Self {
        Self { client, audiences }
    }

    async fn ask(&self, token: &str, path: &str) -> Result<Verdict, String> {
        let tokens: Api<TokenReview> = Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: (!self.audiences.is_empty()).then(|| self.audiences.clone()),
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
        // An authenticator that does not know audiences answers without them: such a token
        // was not checked to be ours, so it is refused (as kube-rbac-proxy does).
        if let Some(refusal) = audience_refusal(&self.audiences, status.audiences.as_deref()) {
            return Ok(Verdict::Unauthenticated(refusal));
        }
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

/// Why a token the API server accepted is not for us: `wanted` audiences were asked and the
/// review's `granted` ones share none of them.
fn audience_refusal(wanted: &[String], granted: Option<&[String]>) -> Option<String> {
    if wanted.is_empty() {
        return None;
    }
    let granted = granted.unwrap_or_default();
    (!granted.iter().any(|audience| wanted.contains(audience))).then(|| {
        format!(
            "the token is not issued for {} (server.adminAuth.audiences)",
            wanted.join(", ")
        )
    })
}

/// Outcomes kept at most; beyond it the oldest half is dropped (tokens are few in practice).
const CACHE_LIMIT: usize = 4096;

/// Client addresses whose failures are counted at most; beyond it the counts of finished
/// minutes are dropped, then all (a flood from many addresses then starts afresh, which costs
/// it as much as it costs us).
const FAILURE_LIMIT: usize = 4096;

/// The window of `failedTokensPerMinute`.
const FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// Refused tokens per client address ([`AdminAuth::with_failure_limit`]).
#[derive(Debug, Default)]
struct Failures {
    /// Refusals allowed per address per window; 0: no limit.
    per_minute: u32,
    /// Per address: when its window started and the refusals in it.
    counts: Mutex<HashMap<IpAddr, (Instant, u32)>>,
    metrics: Option<Metrics>,
}

impl Failures {
    /// Whether `address` has used up its refusals for the current window at `now`.
    fn exhausted(&self, address: IpAddr, now: Instant) -> bool {
        self.per_minute > 0
            && self
                .counts
                .lock()
                .get(&address)
                .is_some_and(|(start, count)| {
                    now.duration_since(*start) < FAILURE_WINDOW && *count >= self.per_minute
                })
    }

    fn note(&self, address: IpAddr, now: Instant) {
        if self.per_minute == 0 {
            return;
        }
        let mut counts = self.counts.lock();
        if counts.len() >= FAILURE_LIMIT && !counts.contains_key(&address) {
            counts.retain(|_, (start, _)| now.duration_since(*start) < FAILURE_WINDOW);
            if counts.len() >= FAILURE_LIMIT {
                counts.clear();
            }
        }
        let entry = counts.entry(address).or_insert((now, 0));
        if now.duration_since(entry.0) >= FAILURE_WINDOW {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(1);
    }
}

/// The guard of the admin listener: which paths, who reviews, and the outcomes kept.
pub struct AdminAuth {
    paths: Vec<String>,
    review: Arc<dyn Review>,
    ttl: Duration,
    cache: Mutex<HashMap<(String, String), (Instant, Verdict)>>,
    failures: Failures,
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
            failures: Failures::default(),
        }
    }

    /// The same guard answering 429 to a client address once `per_minute` of its tokens were
    /// refused within a minute (0: no limit), counted in `metrics`.
    pub fn with_failure_limit(self, per_minute: u32, metrics: Metrics) -> Self {
        Self {
            failures: Failures {
                per_minute,
                counts: Mutex::default(),
                metrics: Some(metrics),
            },
            ..self
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
    // Requests served without a socket (tests) share one address.
    let address = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |info| info.0.ip());
    if auth.failures.exhausted(address, Instant::now()) {
        if let Some(metrics) = &auth.failures.metrics {
            metrics.admin_tokens_throttled.inc();
        }
        let mut response = refuse(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "{path}: too many refused tokens from {address} \
                 (server.adminAuth.failedTokensPerMinute); retry in a minute\n"
            ),
        );
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("60"));
        return response;
    }
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
            auth.failures.note(address, Instant::now());
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

    #[tokio::test]
    async fn an_address_whose_tokens_keep_failing_is_answered_429_without_a_review() {
        let review = Arc::new(Scripted::default());
        let metrics = Metrics::new().unwrap();
        let auth = Arc::new(
            AdminAuth::new(vec!["/inspect".into()], Duration::ZERO, review.clone())
                .with_failure_limit(3, metrics.clone()),
        );
        let app = axum::Router::new()
            .route("/inspect", get(|| async { "report" }))
            .layer(axum::middleware::from_fn_with_state(auth, guard));
        for guess in ["a", "b", "c"] {
            assert_eq!(
                call(&app, "/inspect", Some(guess)).await.0,
                StatusCode::UNAUTHORIZED
            );
        }
        let (status, body) = call(&app, "/inspect", Some("reader")).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
        assert!(body.contains("failedTokensPerMinute"), "{body}");
        assert_eq!(review.calls.load(Ordering::SeqCst), 3, "no fourth review");
        assert_eq!(metrics.admin_tokens_throttled.get(), 1);
    }

    #[test]
    fn refused_tokens_are_counted_per_address_and_per_minute() {
        let failures = Failures {
            per_minute: 2,
            ..Failures::default()
        };
        let start = Instant::now();
        let guesser = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let other = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        failures.note(guesser, start);
        assert!(!failures.exhausted(guesser, start));
        failures.note(guesser, start);
        assert!(failures.exhausted(guesser, start));
        assert!(
            !failures.exhausted(other, start),
            "another address is not held"
        );
        let later = start + FAILURE_WINDOW;
        assert!(
            !failures.exhausted(guesser, later),
            "a new minute starts afresh"
        );
        let unlimited = Failures::default();
        for _ in 0..100 {
            unlimited.note(guesser, start);
        }
        assert!(!unlimited.exhausted(guesser, start));
    }

    #[test]
    fn a_token_must_be_issued_for_one_of_the_audiences_asked() {
        let ours = vec!["gpu-extender".to_owned()];
        assert_eq!(audience_refusal(&ours, Some(&ours)), None);
        let theirs = vec!["https://kubernetes.default.svc".to_owned()];
        assert!(audience_refusal(&ours, Some(&theirs)).is_some());
        // An authenticator that ignores audiences answers none: refused.
        assert!(audience_refusal(&ours, None).is_some());
        assert_eq!(audience_refusal(&[], None), None, "no audience asked");
    }
}
