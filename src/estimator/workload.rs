//! Which pods make up the workload a `GetUnschedulableReplicas` request names, found as
//! Karmada's own estimator finds them (v1.18's `replica.GetUnschedulablePodsOfWorkload`): only
//! Deployments; a Deployment's pods are those of its current ReplicaSet, the one it controls
//! whose pod template is the Deployment's own (the `pod-template-hash` label aside), the oldest
//! if several are ([`current_replica_set`], the decision). The Deployment and its ReplicaSets are
//! read from the API server (read-only, `get` deployments and `list` replicasets): the
//! ReplicaSets a page at a time and only those the Deployment's selector matches, and the answer
//! kept for [`ANSWER_TTL`] per Deployment and generation ([`CachedWorkloads`]), so a burst of
//! calls for one workload makes one LIST. The pods come from the watch.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use kube::Api;
use kube::api::ListParams;
use kube::core::Selector;
use tokio::sync::OnceCell;

/// The label the Deployment controller adds to a ReplicaSet's template (and its pods).
const POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// How long a Deployment's current ReplicaSet, once found, is the answer for that Deployment's
/// generation without another LIST. A new template is a new generation, found at once; only a
/// ReplicaSet the Deployment controller makes for the template it already has waits this long
/// to be seen (karmada-descheduler asks every two minutes by default).
pub const ANSWER_TTL: Duration = Duration::from_secs(10);

/// The Deployments whose answers are kept at most; past it, expired ones are dropped, and when
/// none has expired an answer is found but not kept.
pub const CACHED_DEPLOYMENTS: usize = 1024;

/// ReplicaSets asked of the API server per page.
const PAGE: u32 = 500;

/// Why a workload's current ReplicaSet could not be found.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WorkloadError {
    /// The Deployment does not exist (gRPC `NotFound`).
    #[error("deployment {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    /// The API server could not be asked or refused (gRPC `Unavailable`).
    #[error("reading deployment {namespace}/{name} from the API server: {problem}")]
    Api {
        namespace: String,
        name: String,
        problem: String,
    },
}

/// Finds a Deployment's current ReplicaSet.
pub trait Workloads: Send + Sync {
    /// The UID of the current ReplicaSet of Deployment `namespace/name`; `None` when it has none
    /// yet (the Deployment controller has not caught up with a new template).
    fn current_replica_set<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, WorkloadError>>;
}

/// The reads [`CachedWorkloads`] makes; errors are the API server's words.
pub trait WorkloadSource: Send + Sync {
    /// Deployment `namespace/name`, `None` when it does not exist.
    fn deployment<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Deployment>, String>>;

    /// Every ReplicaSet of `namespace` whose labels match `selector` (a label selector in the
    /// API's syntax; `None`: all of them).
    fn replica_sets<'a>(
        &'a self,
        namespace: &'a str,
        selector: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<ReplicaSet>, String>>;
}

/// [`WorkloadSource`] read from the API server.
#[derive(Clone)]
pub struct KubeWorkloads {
    client: kube::Client,
}

impl std::fmt::Debug for KubeWorkloads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeWorkloads").finish_non_exhaustive()
    }
}

impl KubeWorkloads {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl WorkloadSource for KubeWorkloads {
    fn deployment<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Deployment>, String>> {
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), namespace);
        Box::pin(async move { deployments.get_opt(name).await.map_err(|e| e.to_string()) })
    }

    fn replica_sets<'a>(
        &'a self,
        namespace: &'a str,
        selector: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<ReplicaSet>, String>> {
        let replica_sets: Api<ReplicaSet> = Api::namespaced(self.client.clone(), namespace);
        let mut first = ListParams::default().limit(PAGE);
        if let Some(selector) = selector {
            first = first.labels(selector);
        }
        Box::pin(all_pages(move |token| {
            let params = match &token {
                Some(token) => first.clone().continue_token(token),
                None => first.clone(),
            };
            let replica_sets = replica_sets.clone();
            async move {
                let page = replica_sets
                    .list(&params)
                    .await
                    .map_err(|e| e.to_string())?;
                let next = page.metadata.continue_.filter(|token| !token.is_empty());
                Ok((page.items, next))
            }
        }))
    }
}

/// Every item of a paginated list: `page` is asked with no token, then with each continue
/// token it answers, until it answers none.
pub async fn all_pages<T, E, F, Fut>(mut page: F) -> Result<Vec<T>, E>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Result<(Vec<T>, Option<String>), E>>,
{
    let mut items = Vec::new();
    let mut token = None;
    loop {
        let (mut more, next) = page(token.take()).await?;
        items.append(&mut more);
        match next {
            Some(next) => token = Some(next),
            None => return Ok(items),
        }
    }
}

/// The label selector, in the API's syntax, that a Deployment's ReplicaSets match: its own
/// `spec.selector` (the Deployment controller adopts only ReplicaSets it matches). `None` when
/// it selects everything or cannot be read: then every ReplicaSet is listed, and ownership
/// alone decides.
pub fn replica_set_selector(deployment: &Deployment) -> Option<String> {
    let selector = deployment.spec.as_ref()?.selector.clone();
    let selector = Selector::try_from(selector).ok()?;
    (!selector.selects_all()).then(|| selector.to_string())
}

/// [`Workloads`] over a [`WorkloadSource`], each Deployment's answer kept for a while: every
/// call reads the Deployment (one small GET), and the ReplicaSets are listed only when no
/// answer is kept for its UID and generation, or the kept one is older than the TTL. Calls for
/// one Deployment that arrive while its LIST is under way wait for that LIST. Failures are not
/// kept.
pub struct CachedWorkloads<S> {
    source: S,
    ttl: Duration,
    capacity: usize,
    answers: Mutex<HashMap<(String, String), Kept>>,
}

impl<S> std::fmt::Debug for CachedWorkloads<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedWorkloads")
            .field("ttl", &self.ttl)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

/// One Deployment's answer, for the UID and generation it was found for.
struct Kept {
    uid: String,
    generation: Option<i64>,
    expires: Instant,
    answer: Arc<OnceCell<Option<String>>>,
}

impl<S: WorkloadSource> CachedWorkloads<S> {
    /// Answers kept for [`ANSWER_TTL`], for at most [`CACHED_DEPLOYMENTS`] Deployments.
    pub fn new(source: S) -> Self {
        Self::with_limits(source, ANSWER_TTL, CACHED_DEPLOYMENTS)
    }

    /// Answers kept for `ttl`, for at most `capacity` Deployments.
    pub fn with_limits(source: S, ttl: Duration, capacity: usize) -> Self {
        Self {
            source,
            ttl,
            capacity,
            answers: Mutex::new(HashMap::new()),
        }
    }

    /// The current ReplicaSet of Deployment `namespace/name` as of `now` (the clock is the
    /// caller's, so that the expiry can be tested without waiting).
    pub async fn current_at(
        &self,
        namespace: &str,
        name: &str,
        now: Instant,
    ) -> Result<Option<String>, WorkloadError> {
        let api_error = |problem: String| WorkloadError::Api {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            problem,
        };
        let deployment = self
            .source
            .deployment(namespace, name)
            .await
            .map_err(api_error)?
            .ok_or_else(|| WorkloadError::NotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            })?;
        let Some(uid) = deployment.metadata.uid.clone() else {
            // No ReplicaSet can name a controller without a UID (the API server gives every
            // stored object one).
            return Ok(None);
        };
        let answer = self.slot(namespace, name, uid, deployment.metadata.generation, now);
        let found = answer
            .get_or_try_init(|| async {
                let selector = replica_set_selector(&deployment);
                let replica_sets = self
                    .source
                    .replica_sets(namespace, selector.as_deref())
                    .await
                    .map_err(api_error)?;
                Ok(current_replica_set(&deployment, &replica_sets))
            })
            .await?;
        Ok(found.clone())
    }

    /// Where the answer for this Deployment, UID and generation is kept (or being found): the
    /// kept one while it is fresh, else a new one, kept if there is room.
    fn slot(
        &self,
        namespace: &str,
        name: &str,
        uid: String,
        generation: Option<i64>,
        now: Instant,
    ) -> Arc<OnceCell<Option<String>>> {
        let mut answers = self.answers.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (namespace.to_owned(), name.to_owned());
        if let Some(kept) = answers.get(&key)
            && kept.uid == uid
            && kept.generation == generation
            && now < kept.expires
        {
            return Arc::clone(&kept.answer);
        }
        let answer = Arc::new(OnceCell::new());
        if answers.len() >= self.capacity && !answers.contains_key(&key) {
            answers.retain(|_, kept| now < kept.expires);
        }
        if answers.len() < self.capacity || answers.contains_key(&key) {
            let expires = now.checked_add(self.ttl).unwrap_or(now);
            answers.insert(
                key,
                Kept {
                    uid,
                    generation,
                    expires,
                    answer: Arc::clone(&answer),
                },
            );
        }
        answer
    }

    /// How many Deployments' answers are kept now.
    pub fn kept(&self) -> usize {
        self.answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl<S: WorkloadSource> Workloads for CachedWorkloads<S> {
    fn current_replica_set<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, WorkloadError>> {
        Box::pin(self.current_at(namespace, name, Instant::now()))
    }
}

/// The UID of `deployment`'s current ReplicaSet among `replica_sets`: one it controls whose
/// template equals its own but for the `pod-template-hash` label, the oldest if several
/// (Kubernetes' `deploymentutil.FindNewReplicaSet`, which Karmada lifts).
pub fn current_replica_set(deployment: &Deployment, replica_sets: &[ReplicaSet]) -> Option<String> {
    let uid = deployment.metadata.uid.as_deref()?;
    let template = deployment.spec.as_ref().map(|spec| &spec.template);
    let mut candidates: Vec<&ReplicaSet> = replica_sets
        .iter()
        .filter(|rs| controlled_by(rs.metadata.owner_references.as_deref(), uid))
        .filter(|rs| {
            let theirs = rs.spec.as_ref().and_then(|spec| spec.template.as_ref());
            match (template, theirs) {
                (Some(ours), Some(theirs)) => equal_but_hash(ours, theirs),
                _ => false,
            }
        })
        .collect();
    // Oldest first, then by name, as Kubernetes' `ReplicaSetsByCreationTimestamp`.
    candidates.sort_by(|a, b| {
        let key = |rs: &ReplicaSet| {
            (
                rs.metadata.creation_timestamp.as_ref().map(|t| t.0),
                rs.metadata.name.clone(),
            )
        };
        key(a).cmp(&key(b))
    });
    candidates.first().and_then(|rs| rs.metadata.uid.clone())
}

/// Whether `pod`'s controller is the object with UID `owner`.
pub fn pod_controlled_by(pod: &Pod, owner: &str) -> bool {
    controlled_by(pod.metadata.owner_references.as_deref(), owner)
}

fn controlled_by(
    owners: Option<&[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference]>,
    uid: &str,
) -> bool {
    owners
        .unwrap_or(&[])
        .iter()
        .any(|owner| owner.controller == Some(true) && owner.uid == uid)
}

/// Kubernetes' `EqualIgnoreHash`: the templates are equal once the `pod-template-hash` label is
/// removed from both.
fn equal_but_hash(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    let without_hash = |template: &PodTemplateSpec| {
        let mut template = template.clone();
        if let Some(metadata) = template.metadata.as_mut()
            && let Some(labels) = metadata.labels.as_mut()
        {
            labels.remove(POD_TEMPLATE_HASH);
            if labels.is_empty() {
                metadata.labels = None;
            }
        }
        template
    };
    without_hash(a) == without_hash(b)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on a broken fixture")]

    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use serde_json::json;

    use super::*;

    fn deployment(image: &str) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "d-1"},
            "spec": {
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "main", "image": image}]}
                }
            }
        }))
        .unwrap()
    }

    fn replica_set(name: &str, uid: &str, owner: &str, image: &str, created: &str) -> ReplicaSet {
        serde_json::from_value(json!({
            "metadata": {
                "name": name, "namespace": "default", "uid": uid,
                "creationTimestamp": created,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": "web", "uid": owner, "controller": true}]
            },
            "spec": {
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web", "pod-template-hash": name}},
                    "spec": {"containers": [{"name": "main", "image": image}]}
                }
            }
        }))
        .unwrap()
    }

    #[test]
    fn the_current_replica_set_has_the_deployments_template_and_is_controlled_by_it() {
        let sets = [
            replica_set("old", "rs-old", "d-1", "v1", "2026-01-01T00:00:00Z"),
            replica_set("new", "rs-new", "d-1", "v2", "2026-01-02T00:00:00Z"),
            // Same template, another owner.
            replica_set("other", "rs-other", "d-2", "v2", "2025-01-01T00:00:00Z"),
            // Same template and owner, newer: the oldest wins.
            replica_set("newer", "rs-newer", "d-1", "v2", "2026-01-03T00:00:00Z"),
        ];
        assert_eq!(
            current_replica_set(&deployment("v2"), &sets).as_deref(),
            Some("rs-new")
        );
        assert_eq!(
            current_replica_set(&deployment("v1"), &sets).as_deref(),
            Some("rs-old")
        );
        // A template no ReplicaSet has yet.
        assert_eq!(current_replica_set(&deployment("v3"), &sets), None);
    }

    /// An API server holding Deployment `default/web` (template `image`, `generation`) and
    /// ReplicaSets, counting the reads, its LIST taking a turn of the scheduler first (so that
    /// calls made together overlap) and failing while `broken`.
    struct Fake {
        image: Mutex<(String, i64)>,
        sets: Vec<ReplicaSet>,
        gets: AtomicUsize,
        lists: AtomicUsize,
        selectors: Mutex<Vec<Option<String>>>,
        broken: AtomicBool,
    }

    impl Fake {
        fn new() -> Self {
            Self {
                image: Mutex::new(("v2".to_owned(), 1)),
                sets: vec![
                    replica_set("old", "rs-old", "d-1", "v1", "2026-01-01T00:00:00Z"),
                    replica_set("new", "rs-new", "d-1", "v2", "2026-01-02T00:00:00Z"),
                ],
                gets: AtomicUsize::new(0),
                lists: AtomicUsize::new(0),
                selectors: Mutex::new(Vec::new()),
                broken: AtomicBool::new(false),
            }
        }

        fn roll_out(&self, image: &str) {
            let mut current = self.image.lock().unwrap();
            *current = (image.to_owned(), current.1 + 1);
        }
    }

    impl WorkloadSource for Fake {
        fn deployment<'a>(
            &'a self,
            namespace: &'a str,
            name: &'a str,
        ) -> BoxFuture<'a, Result<Option<Deployment>, String>> {
            self.gets.fetch_add(1, Ordering::SeqCst);
            let (image, generation) = self.image.lock().unwrap().clone();
            let mut web = deployment(&image);
            web.metadata.generation = Some(generation);
            let known = (namespace, name) == ("default", "web");
            Box::pin(async move { Ok(known.then_some(web)) })
        }

        fn replica_sets<'a>(
            &'a self,
            _namespace: &'a str,
            selector: Option<&'a str>,
        ) -> BoxFuture<'a, Result<Vec<ReplicaSet>, String>> {
            Box::pin(async move {
                tokio::task::yield_now().await;
                self.lists.fetch_add(1, Ordering::SeqCst);
                self.selectors
                    .lock()
                    .unwrap()
                    .push(selector.map(str::to_owned));
                if self.broken.load(Ordering::SeqCst) {
                    return Err("connection refused".to_owned());
                }
                Ok(self.sets.clone())
            })
        }
    }

    #[tokio::test]
    async fn a_burst_of_calls_for_one_deployment_makes_one_list() {
        let cached = CachedWorkloads::new(Fake::new());
        let now = Instant::now();
        let burst = (0..8).map(|_| cached.current_at("default", "web", now));
        let answers = futures::future::join_all(burst).await;
        for answer in answers {
            assert_eq!(answer, Ok(Some("rs-new".to_owned())));
        }
        // Each call reads the Deployment; the ReplicaSets are listed once, with its selector.
        assert_eq!(cached.source.gets.load(Ordering::SeqCst), 8);
        assert_eq!(cached.source.lists.load(Ordering::SeqCst), 1);
        assert_eq!(
            *cached.source.selectors.lock().unwrap(),
            [Some("app=web".to_owned())]
        );
        // Later, within the TTL: still the one LIST.
        let later = now + ANSWER_TTL / 2;
        assert_eq!(
            cached.current_at("default", "web", later).await,
            Ok(Some("rs-new".to_owned()))
        );
        assert_eq!(cached.source.lists.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn the_answer_expires_and_a_new_generation_is_listed_at_once() {
        let cached = CachedWorkloads::new(Fake::new());
        let now = Instant::now();
        let current = async |at: Instant| cached.current_at("default", "web", at).await;
        assert_eq!(current(now).await, Ok(Some("rs-new".to_owned())));
        assert_eq!(
            current(now + ANSWER_TTL).await,
            Ok(Some("rs-new".to_owned()))
        );
        assert_eq!(cached.source.lists.load(Ordering::SeqCst), 2, "expired");
        // The template changes back (a rollback, a new generation): listed again at once.
        cached.source.roll_out("v1");
        assert_eq!(
            current(now + ANSWER_TTL).await,
            Ok(Some("rs-old".to_owned()))
        );
        assert_eq!(cached.source.lists.load(Ordering::SeqCst), 3);
        // A template no ReplicaSet has yet: none, and that too is kept for the TTL.
        cached.source.roll_out("v3");
        assert_eq!(current(now + ANSWER_TTL).await, Ok(None));
        assert_eq!(current(now + ANSWER_TTL).await, Ok(None));
        assert_eq!(cached.source.lists.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn failures_are_not_kept_and_a_missing_deployment_is_not_found() {
        let cached = CachedWorkloads::new(Fake::new());
        let now = Instant::now();
        cached.source.broken.store(true, Ordering::SeqCst);
        let failed = cached.current_at("default", "web", now).await;
        assert!(
            matches!(&failed, Err(WorkloadError::Api { problem, .. }) if problem == "connection refused"),
            "{failed:?}"
        );
        cached.source.broken.store(false, Ordering::SeqCst);
        assert_eq!(
            cached.current_at("default", "web", now).await,
            Ok(Some("rs-new".to_owned()))
        );
        assert_eq!(cached.source.lists.load(Ordering::SeqCst), 2);
        assert_eq!(
            cached.current_at("default", "gone", now).await,
            Err(WorkloadError::NotFound {
                namespace: "default".to_owned(),
                name: "gone".to_owned()
            })
        );
        assert_eq!(cached.source.lists.load(Ordering::SeqCst), 2);
    }

    /// A source with one Deployment per name (`default/<any>`), each its own workload.
    struct Many(AtomicUsize);

    impl WorkloadSource for Many {
        fn deployment<'a>(
            &'a self,
            _namespace: &'a str,
            name: &'a str,
        ) -> BoxFuture<'a, Result<Option<Deployment>, String>> {
            let mut found = deployment("v1");
            found.metadata.uid = Some(format!("uid-{name}"));
            Box::pin(async move { Ok(Some(found)) })
        }

        fn replica_sets<'a>(
            &'a self,
            _namespace: &'a str,
            _selector: Option<&'a str>,
        ) -> BoxFuture<'a, Result<Vec<ReplicaSet>, String>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(Vec::new()) })
        }
    }

    #[tokio::test]
    async fn the_kept_answers_are_bounded() {
        let ttl = Duration::from_secs(10);
        let cached = CachedWorkloads::with_limits(Many(AtomicUsize::new(0)), ttl, 2);
        let now = Instant::now();
        for name in ["a", "b", "c"] {
            assert_eq!(cached.current_at("default", name, now).await, Ok(None));
        }
        // Full of fresh answers: `c` was answered but not kept.
        assert_eq!(cached.kept(), 2);
        assert_eq!(cached.current_at("default", "c", now).await, Ok(None));
        assert_eq!(cached.source.0.load(Ordering::SeqCst), 4);
        assert_eq!(cached.current_at("default", "a", now).await, Ok(None));
        assert_eq!(cached.source.0.load(Ordering::SeqCst), 4, "a is kept");
        // Once they expire, they make room.
        let later = now + ttl;
        assert_eq!(cached.current_at("default", "c", later).await, Ok(None));
        assert_eq!(cached.kept(), 1);
    }

    #[tokio::test]
    async fn every_page_is_read() {
        let pages = [
            (vec![1, 2], Some("p2".to_owned())),
            (vec![3], Some("p3".to_owned())),
            (vec![4, 5], None),
        ];
        let mut asked = Vec::new();
        let items = all_pages(|token| {
            asked.push(token.clone());
            let index = asked.len() - 1;
            let page = pages[index].clone();
            async move { Ok::<_, String>(page) }
        })
        .await;
        assert_eq!(items, Ok(vec![1, 2, 3, 4, 5]));
        assert_eq!(asked, [None, Some("p2".to_owned()), Some("p3".to_owned())]);
        let failed = all_pages(|_| async { Err::<(Vec<u8>, Option<String>), _>("gone") }).await;
        assert_eq!(failed, Err("gone"));
    }

    #[test]
    fn the_replica_sets_are_listed_by_the_deployments_selector() {
        assert_eq!(
            replica_set_selector(&deployment("v1")).as_deref(),
            Some("app=web")
        );
        let with_expressions: Deployment = serde_json::from_value(json!({
            "spec": {
                "selector": {
                    "matchLabels": {"app": "web", "tier": "gpu"},
                    "matchExpressions": [{"key": "track", "operator": "In",
                                          "values": ["stable", "canary"]}]
                },
                "template": {}
            }
        }))
        .unwrap();
        assert_eq!(
            replica_set_selector(&with_expressions).as_deref(),
            Some("app=web,tier=gpu,track in (canary,stable)")
        );
        // Everything, or an operator the API does not have: no selector, ownership decides.
        let everything: Deployment =
            serde_json::from_value(json!({"spec": {"selector": {}, "template": {}}})).unwrap();
        assert_eq!(replica_set_selector(&everything), None);
        let unreadable: Deployment = serde_json::from_value(json!({"spec": {
            "selector": {"matchExpressions": [{"key": "a", "operator": "Near"}]},
            "template": {}
        }}))
        .unwrap();
        assert_eq!(replica_set_selector(&unreadable), None);
    }
}
