//! One replay through a real cluster: the replay's own nodes created, then the seed's arrival
//! sequence (the one `simulate` replays) offered one pod at a time, each waited for until
//! kube-scheduler has bound it or marked it unschedulable; an unschedulable pod is deleted, as
//! in the reference, unless some node had room for it: then it is given kube-scheduler's retry
//! first, as a cluster gives it (after departures, or a window that hid the nodes with room).
//! After each pod the same measurements as `simulate` are taken from the allocation records of
//! the bound pods, so the outputs are `simulate`'s. With departures, before each pod the bound
//! pods whose deletion time has come are deleted, and the next pod waits until the watch has
//! reported them gone. Also the checks that keep the replay to objects of its own, and the
//! clean-up.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use tokio::sync::mpsc;

use super::objects::{
    self, GpuApi, NAMESPACE, NODE_PREFIX, OWNER_LABEL, claim_allocation, claim_object,
    device_class, node_names, node_object, node_status, pod_object, resource_slice,
};
use gpu_engine::{NodeName, NodeState, PodAllocation, ScoringPolicy};
use gpu_extender::config::Config;
use gpu_extender::objects::{record, translate};
use gpu_sim::ceiling::RunCeiling;
use gpu_sim::metrics::{Curves, Rejections};
use gpu_sim::progress::Progress;
use gpu_sim::replay::{ChoiceRank, Leaving, Live, Referee};
use gpu_sim::{Cluster, Prepared, RunResult, SimPolicy};

/// What one replay is asked to do.
#[derive(Debug)]
pub struct ReplayPlan<'a> {
    pub prepared: &'a Prepared,
    pub cluster: &'a Cluster,
    /// The policy the extender runs (for the outputs; the extender's configuration sets it);
    /// `None` in DRA mode for kube-scheduler alone, without the extender.
    pub scoring: Option<ScoringPolicy>,
    pub seed: u64,
    pub tune: f64,
    /// The scheduler profile the pods name.
    pub scheduler_name: &'a str,
    /// The value of the owner label on everything this run creates.
    pub run_id: &'a str,
    /// The extender's configuration: resource names and the record's annotation key.
    pub config: &'a Config,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// How long one pod may stay undecided before the replay gives up.
    pub decision_timeout: Duration,
}

impl ReplayPlan<'_> {
    /// The policy as `simulate` runs it: the extender's scoring with the FGD+ knobs its
    /// configuration sets (`policy.fgdPlus`, `--extender-set` included), so that the referee and
    /// `--compare` measure the loop against the policy the extender runs.
    pub fn policy(&self) -> SimPolicy {
        match self.scoring {
            Some(scoring) => SimPolicy::Engine {
                scoring,
                tuning: self.config.engine_policy().fgd_plus,
            },
            None => SimPolicy::KubeDefault,
        }
    }

    /// How the run's objects present GPUs.
    pub fn gpu_api(&self) -> GpuApi {
        gpu_api(self.prepared)
    }
}

/// How a run of `prepared` presents GPUs: as claims in DRA mode, else as device-plugin resources.
pub fn gpu_api(prepared: &Prepared) -> GpuApi {
    if prepared.dra() {
        GpuApi::Dra
    } else {
        GpuApi::DevicePlugin
    }
}

/// What kube-scheduler decided for one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Bound to the node of this name, which ranks so among the cluster's nodes as the policy
    /// scores them ([`ChoiceTally`]).
    Bound { node: String, choice: ChoiceRank },
    /// Marked unschedulable (then deleted).
    Unschedulable,
}

/// One submitted pod and what became of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodDecision {
    /// The pod's name in the cluster.
    pub pod: String,
    pub decision: Decision,
}

/// How the nodes kube-scheduler bound rank among every node of the cluster, as the policy
/// scores them in `simulate`'s view of the same state: what the candidates kube-scheduler sends
/// (its `percentageOfNodesToScore` window) cost the policy's choice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChoiceTally {
    /// Pods bound.
    pub bound: usize,
    /// Bound to a node that scores below the best fitting node of the whole cluster.
    pub below_best: usize,
    /// Bound to a node the policy does not fit the pod on (a disagreement between the loop and
    /// `simulate`'s model of it; expected 0).
    pub not_fit: usize,
    /// The arrival index (from 0) of the first pod bound below the best.
    pub first_below: Option<usize>,
    /// Pods marked unschedulable.
    pub unschedulable: usize,
    /// Of those, the ones some node of the whole cluster fits in `simulate`'s view of the same
    /// state: turned away by kube-scheduler's window, or by a view of the cluster (the
    /// extender's table, kube-scheduler's cache) behind the API server.
    pub unschedulable_fit: usize,
    /// Pods marked unschedulable while some node fitted them that kube-scheduler's retry then
    /// bound (counted in `bound`, not above): right after pods left, or after its window hid
    /// every node with room and the extender's requeue nudge asked for the retry.
    pub retried: usize,
}

impl ChoiceTally {
    fn count(&mut self, index: usize, rank: ChoiceRank) {
        self.bound += 1;
        match rank {
            ChoiceRank::Best => {}
            ChoiceRank::BelowBest => {
                self.below_best += 1;
                self.first_below.get_or_insert(index);
            }
            ChoiceRank::NotFit => self.not_fit += 1,
        }
    }
}

/// A replay's outputs: the same result `simulate` gives, plus what only the real loop has.
#[derive(Debug)]
pub struct Replayed {
    pub result: RunResult,
    /// Each submission's decision, in arrival order.
    pub decisions: Vec<PodDecision>,
    /// How the bound nodes rank among the whole cluster's.
    pub choices: ChoiceTally,
    /// From the first pod created to the last one decided.
    pub elapsed: Duration,
}

/// Refuses to run where objects of a replay already exist: nodes or a namespace carrying the
/// owner label, or nodes of the replay's name prefix that are not the replay's (someone else's).
pub async fn refuse_foreign_objects(client: &kube::Client) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let listed = nodes
        .list_metadata(&ListParams::default())
        .await
        .context("listing nodes (is the API server reachable?)")?;
    let owned = listed
        .items
        .iter()
        .filter(|n| {
            n.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(OWNER_LABEL))
        })
        .count();
    if owned > 0 {
        bail!(
            "{owned} node(s) labelled {OWNER_LABEL} are left from an earlier replay; remove them \
             first (kubectl delete nodes -l {OWNER_LABEL})"
        );
    }
    if let Some(foreign) = listed.items.iter().find_map(|n| {
        n.metadata
            .name
            .as_deref()
            .filter(|name| name.starts_with(NODE_PREFIX))
    }) {
        bail!(
            "node {foreign} has the replay's name prefix {NODE_PREFIX:?} but is not the replay's; \
             the replay will not run beside it"
        );
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    match namespaces
        .get_metadata_opt(NAMESPACE)
        .await
        .context("looking for the replay's namespace")?
    {
        Some(namespace) if namespace.metadata.deletion_timestamp.is_some() => bail!(
            "namespace {NAMESPACE} is still being deleted (an earlier replay's); run again once \
             it is gone"
        ),
        Some(_) => bail!(
            "namespace {NAMESPACE} exists (an earlier replay, or someone else's); remove it first \
             (kubectl delete namespace {NAMESPACE})"
        ),
        None => Ok(()),
    }
}

/// Creates the replay's namespace and its nodes, Ready, with their capacity; in DRA mode also
/// NVIDIA's DeviceClass (where the cluster has none of that name) and each GPU node's
/// ResourceSlice.
pub async fn create_cluster(
    client: &kube::Client,
    cluster: &Cluster,
    run_id: &str,
    config: &Config,
    api: GpuApi,
) -> Result<Vec<String>> {
    let names = node_names(cluster.nodes())?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace = serde_json::from_value(json!({
        "metadata": {"name": NAMESPACE, "labels": {OWNER_LABEL: run_id}},
    }))?;
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .with_context(|| format!("creating namespace {NAMESPACE}"))?;
    let gpu_api = api;
    let api: Api<Node> = Api::all(client.clone());
    futures::stream::iter(cluster.nodes().iter().zip(&names))
        .map(|(node, name)| {
            let api = api.clone();
            async move {
                api.create(
                    &PostParams::default(),
                    &node_object(node, name, run_id, config, gpu_api),
                )
                .await
                .with_context(|| format!("creating node {name}"))?;
                api.patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(&node_status(node, config, gpu_api)),
                )
                .await
                .with_context(|| format!("setting the status of node {name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    if gpu_api == GpuApi::Dra {
        create_dra_devices(client, cluster, &names, run_id).await?;
    }
    Ok(names)
}

/// NVIDIA's DeviceClass, unless the cluster has one of that name already (then it is the
/// driver's own and is used as it is), and one ResourceSlice per GPU node.
async fn create_dra_devices(
    client: &kube::Client,
    cluster: &Cluster,
    names: &[String],
    run_id: &str,
) -> Result<()> {
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let class = device_class(run_id);
    let class_name = class.metadata.name.clone().unwrap_or_default();
    if classes
        .get_metadata_opt(&class_name)
        .await
        .with_context(|| format!("looking for DeviceClass {class_name} (does the API server serve resource.k8s.io/v1?)"))?
        .is_none()
    {
        classes
            .create(&PostParams::default(), &class)
            .await
            .with_context(|| format!("creating DeviceClass {class_name}"))?;
    }
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    futures::stream::iter(
        cluster
            .nodes()
            .iter()
            .zip(names)
            .filter_map(|(node, name)| resource_slice(node, name, run_id)),
    )
    .map(|slice| {
        let slices = slices.clone();
        async move {
            let name = slice.metadata.name.clone().unwrap_or_default();
            slices
                .create(&PostParams::default(), &slice)
                .await
                .with_context(|| format!("creating ResourceSlice {name}"))?;
            anyhow::Ok(())
        }
    })
    .buffer_unordered(16)
    .try_collect::<Vec<()>>()
    .await?;
    Ok(())
}

/// In DRA mode, the ResourceClaim of every pod the plan will offer, created before kube-scheduler
/// and the extender start (both then list them at once, and no pod is ranked before the
/// extender has read its claim). An unschedulable pod's claim is deleted with it.
pub async fn create_claims(client: &kube::Client, plan: &ReplayPlan<'_>) -> Result<usize> {
    if plan.gpu_api() != GpuApi::Dra {
        return Ok(0);
    }
    let prepared = plan.prepared;
    let (arrivals, _, _) = prepared.plan(plan.seed, plan.tune);
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let claims: Vec<ResourceClaim> = arrivals
        .order
        .iter()
        .enumerate()
        .filter_map(|(index, &pod)| {
            claim_object(&prepared.workload().pods()[pod], index, plan.run_id)
        })
        .collect();
    let count = claims.len();
    futures::stream::iter(claims)
        .map(|claim| {
            let api = api.clone();
            async move {
                let name = claim.metadata.name.clone().unwrap_or_default();
                api.create(&PostParams::default(), &claim)
                    .await
                    .with_context(|| format!("creating ResourceClaim {name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(count)
}

/// Deletes everything the run created: its pods (at once), in DRA mode its claims, slices and
/// DeviceClass (the cluster's resource-claim controller releases an allocated claim once its pod
/// is gone), its nodes and its namespace. Waits until the pods are gone; the namespace itself
/// goes when the cluster's namespace controller finalises it (a loopback plane has none: it is
/// discarded whole).
pub async fn clean_up(client: &kube::Client, run_id: &str, api: GpuApi) -> Result<()> {
    let selector = format!("{OWNER_LABEL}={run_id}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let immediate = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    // Pods first, at once: a namespace deletion would give each its grace period.
    let _ = pods
        .delete_collection(&immediate, &ListParams::default().labels(&selector))
        .await;
    if api == GpuApi::Dra {
        let owned = ListParams::default().labels(&selector);
        Api::<ResourceClaim>::namespaced(client.clone(), NAMESPACE)
            .delete_collection(&DeleteParams::default(), &owned)
            .await
            .context("deleting the replay's ResourceClaims")?;
        Api::<ResourceSlice>::all(client.clone())
            .delete_collection(&DeleteParams::default(), &owned)
            .await
            .context("deleting the replay's ResourceSlices")?;
        Api::<DeviceClass>::all(client.clone())
            .delete_collection(&DeleteParams::default(), &owned)
            .await
            .context("deleting the replay's DeviceClass")?;
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    match namespaces.delete(NAMESPACE, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(error) => return Err(error).context("deleting the replay's namespace"),
    }
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&selector),
        )
        .await
        .context("deleting the replay's nodes")?;
    let started = Instant::now();
    let owned = ListParams::default().labels(&selector);
    while !pods.list_metadata(&owned).await?.items.is_empty() {
        if started.elapsed() > Duration::from_secs(120) {
            bail!("the replay's pods were not gone 120 s after their deletion");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// A pod's state as far as the replay cares.
enum Seen {
    Bound(Box<Pod>),
    Unschedulable,
    /// Deleted: gone from the API server.
    Gone,
}

/// `simulate`'s view of the real loop's state, kept from the bound pods' records: the nodes,
/// their live measurements, and the policy that ranks the loop's choices on them.
struct Mirror<'p> {
    prepared: &'p Prepared,
    nodes: Vec<NodeState>,
    live: Live,
    referee: Referee,
}

impl<'p> Mirror<'p> {
    /// The prepared cluster, empty, under `policy`.
    fn new(prepared: &'p Prepared, policy: SimPolicy) -> Self {
        let nodes = prepared.nodes().to_vec();
        Self {
            prepared,
            live: Live::of(prepared, &nodes),
            referee: Referee::new(prepared, policy),
            nodes,
        }
    }

    /// Workload pod `pod` placed on node `n` with `allocation` (`added`), or gone from it.
    fn change(&mut self, n: usize, pod: usize, allocation: &PodAllocation, added: bool) {
        self.referee.node_changing(&self.nodes[n]);
        if added {
            self.nodes[n].add(allocation);
        } else {
            self.nodes[n].remove(allocation);
        }
        self.referee
            .node_changed(self.prepared, &self.nodes, n, pod, added);
        self.live.measure(self.prepared, &self.nodes, n);
    }

    /// How node `n` ranks for workload pod `pod` among all nodes.
    fn rank(&mut self, pod: usize, n: usize) -> ChoiceRank {
        self.referee
            .rank(self.prepared, &self.nodes, &self.live, pod, n)
    }

    /// Whether some node fits workload pod `pod`.
    fn fits_somewhere(&mut self, pod: usize) -> bool {
        self.referee
            .fits_somewhere(self.prepared, &self.nodes, &self.live, pod)
    }
}

/// A bound pod that leaves at its deletion time (with departures).
struct Running {
    name: String,
    /// Its workload pod and node (indices), and what it holds there.
    pod: usize,
    node: usize,
    allocation: PodAllocation,
}

/// The receiving end of [`watch_decisions`]; the watch stops when it is dropped (the run is
/// over, or failed), so it never outlives the plane it watches.
struct Decisions {
    receiver: mpsc::UnboundedReceiver<(String, Seen)>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Decisions {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Forwards every decided pod of the run from a watch.
fn watch_decisions(client: &kube::Client, run_id: &str) -> Decisions {
    let (sender, receiver) = mpsc::unbounded_channel();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let config = watcher::Config::default().labels(&format!("{OWNER_LABEL}={run_id}"));
    let stream = watcher::watcher(pods, config);
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let (pod, deleted) = match event {
                Ok(Event::Apply(pod) | Event::InitApply(pod)) => (pod, false),
                Ok(Event::Delete(pod)) => (pod, true),
                Ok(_) => continue,
                // The watcher re-lists by itself; a pod decided meanwhile shows in the re-list,
                // and one deleted meanwhile as a delete.
                Err(_) => continue,
            };
            let Some(name) = pod.metadata.name.clone() else {
                continue;
            };
            let seen = if deleted {
                Seen::Gone
            } else if pod.spec.as_ref().is_some_and(|s| s.node_name.is_some()) {
                Seen::Bound(Box::new(pod))
            } else if is_unschedulable(&pod) {
                Seen::Unschedulable
            } else {
                continue;
            };
            if sender.send((name, seen)).is_err() {
                return;
            }
        }
    });
    Decisions { receiver, task }
}

/// kube-scheduler's verdict: `PodScheduled=False` with reason `Unschedulable` (no node fits)
/// or `SchedulerError` (a call failed; the reference counts that as a failure too).
fn is_unschedulable(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && matches!(
                        c.reason.as_deref(),
                        Some("Unschedulable" | "SchedulerError")
                    )
            })
        })
}

/// Replays the plan's arrival sequence on nodes already created (`node_names`, in the cluster's
/// order) and measures it as `simulate` does.
pub async fn replay_pods(
    client: &kube::Client,
    plan: &ReplayPlan<'_>,
    node_names: &[String],
) -> Result<Replayed> {
    let prepared = plan.prepared;
    let (arrivals, _, _) = prepared.plan(plan.seed, plan.tune);
    let node_index: HashMap<&str, usize> = node_names
        .iter()
        .enumerate()
        .map(|(i, name)| (name.as_str(), i))
        .collect();
    let mut mirror = Mirror::new(prepared, plan.policy());
    let mut choices = ChoiceTally::default();
    let capacity = prepared.capacity_milli();
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let claims_api: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let mut decided = watch_decisions(client, plan.run_id);
    let mut early: HashMap<String, Seen> = HashMap::new();
    let progress = Progress::new(arrivals.order.len() as u64, plan.progress);
    let mut steps = Vec::with_capacity(arrivals.order.len());
    let mut decisions = Vec::with_capacity(arrivals.order.len());
    let (mut arrived, mut failed, mut failed_milli) = (0u64, 0u32, 0u64);
    let mut rejected = Rejections::default();
    let immediate = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    // With departures: the bound pods by deletion time, as `simulate` keeps them.
    let mut leaving: Leaving<Running> = Leaving::default();
    let started = Instant::now();
    for (index, &pod_id) in arrivals.order.iter().enumerate() {
        let pod = &prepared.workload().pods()[pod_id];
        // Whether pods left just before this one.
        let mut departed_now = false;
        if prepared.departures() {
            let created = prepared.lifetime(pod_id).0;
            let mut departed = Vec::new();
            for leaver in leaving.due(created) {
                pods_api
                    .delete(&leaver.name, &immediate)
                    .await
                    .with_context(|| format!("deleting departing pod {}", leaver.name))?;
                mirror.change(leaver.node, leaver.pod, &leaver.allocation, false);
                departed.push(leaver.name);
            }
            // What a departure frees reaches kube-scheduler's cache and the extender's table on
            // their own watches, about as promptly as this one but not in step with the next
            // pod: a pod turned away meanwhile is given kube-scheduler's retry (below).
            departed_now = !departed.is_empty();
            for name in departed {
                if !matches!(early.remove(&name), Some(Seen::Gone)) {
                    wait_for_gone(&mut decided, &mut early, &name, plan.decision_timeout).await?;
                }
            }
        }
        let object = pod_object(
            pod,
            index,
            plan.scheduler_name,
            plan.run_id,
            plan.config,
            plan.gpu_api(),
        )?;
        let name = objects::pod_name(pod, index);
        arrived += pod.gpu_total();
        pods_api
            .create(&PostParams::default(), &object)
            .await
            .with_context(|| format!("creating pod {name}"))?;
        let mut seen = match early.remove(&name) {
            Some(seen) => seen,
            None => wait_for(&mut decided, &mut early, &name, plan.decision_timeout).await?,
        };
        let fits = matches!(seen, Seen::Unschedulable) && mirror.fits_somewhere(pod_id);
        // A pod turned away while some node had room is retried by kube-scheduler, and a
        // cluster would bind it then: after departures, on the deletion's event (it was turned
        // away by a view that had not yet seen them: kube-scheduler's cache of bound pods is
        // kept apart from its queue); otherwise kube-scheduler's window hid every node with
        // room, and the extender's requeue nudge has kube-scheduler retry it with its next
        // window (`requeue.enabled`).
        let retry_wait = if departed_now {
            Some(RETRY_WAIT)
        } else {
            // In DRA mode the extender filters nothing: no window miss of its to nudge.
            (plan.config.requeue.enabled && plan.gpu_api() == GpuApi::DevicePlugin)
                .then_some(MISSED_RETRY_WAIT)
        };
        if let Some(retry_wait) = retry_wait.filter(|_| fits) {
            match next_of(&mut decided, &mut early, &name, retry_wait, |seen| {
                matches!(seen, Seen::Bound(_))
            })
            .await
            {
                Ok(bound) => {
                    choices.retried += 1;
                    seen = bound;
                }
                Err(WaitError::Timeout) => {}
                Err(WaitError::Ended) => bail!("the pod watch ended"),
            }
        }
        match seen {
            Seen::Bound(bound) => {
                let (n, allocation) = match plan.gpu_api() {
                    GpuApi::DevicePlugin => placement(&bound, &node_index, plan.config)?,
                    GpuApi::Dra => dra_placement(&claims_api, &bound, pod, &node_index).await?,
                };
                let choice = mirror.rank(pod_id, n);
                choices.count(index, choice);
                mirror.change(n, pod_id, &allocation, true);
                if prepared.departures() {
                    let running = Running {
                        name: name.clone(),
                        pod: pod_id,
                        node: n,
                        allocation,
                    };
                    leaving.add(prepared.lifetime(pod_id).1, running);
                }
                decisions.push(PodDecision {
                    pod: name,
                    decision: Decision::Bound {
                        node: node_names[n].clone(),
                        choice,
                    },
                });
            }
            Seen::Gone => bail!("pod {name} was deleted before kube-scheduler decided"),
            Seen::Unschedulable => {
                choices.unschedulable += 1;
                if fits {
                    choices.unschedulable_fit += 1;
                }
                failed += 1;
                failed_milli += pod.gpu_total();
                rejected.reject(pod.kind());
                pods_api
                    .delete(&name, &immediate)
                    .await
                    .with_context(|| format!("deleting unschedulable pod {name}"))?;
                if plan.gpu_api() == GpuApi::Dra && gpu_sim::dra::claimed_devices(pod) > 0 {
                    // Never allocated: no finalizer holds it.
                    claims_api
                        .delete(&name, &DeleteParams::default())
                        .await
                        .with_context(|| {
                            format!("deleting the claim of unschedulable pod {name}")
                        })?;
                }
                decisions.push(PodDecision {
                    pod: name,
                    decision: Decision::Unschedulable,
                });
            }
        }
        let step = mirror.live.step(arrived, capacity, failed);
        rejected.step(step.arrive_percent(capacity));
        steps.push(step);
        progress.inc(1);
    }
    let elapsed = started.elapsed();
    progress.finish();
    let curves = Curves::of_steps(&steps, capacity);
    // As `simulate`: no bound holds once pods leave.
    let ceiling = (!prepared.departures()).then(|| {
        RunCeiling::of_run(
            prepared.workload().pods(),
            &arrivals.order,
            &steps,
            capacity,
        )
    });
    let last = steps
        .last()
        .copied()
        .unwrap_or_else(|| mirror.live.step(0, capacity, 0));
    Ok(Replayed {
        result: RunResult {
            trace: prepared.trace.clone(),
            policy: plan.policy(),
            seed: plan.seed,
            pods: arrivals.order.len(),
            added: arrivals.added,
            failed: failed as usize,
            failed_milli,
            capacity_milli: capacity,
            steps: Some(steps),
            curves,
            rejected,
            last,
            evaluations: 0,
            end_nodes: Some(mirror.nodes),
            ceiling,
            // The real loop's are the extender's `gpu_extender_filter_window_misses_total`,
            // which the command prints for a loopback plane.
            window_misses: None,
        },
        decisions,
        choices,
        elapsed,
    })
}

/// Waits for `name`'s decision, keeping the decisions of other pods that arrive meanwhile.
async fn wait_for(
    decided: &mut Decisions,
    early: &mut HashMap<String, Seen>,
    name: &str,
    timeout: Duration,
) -> Result<Seen> {
    next_of(decided, early, name, timeout, |_| true)
        .await
        .map_err(|error| match error {
            WaitError::Timeout => anyhow!(
                "pod {name} was neither bound nor marked unschedulable within {} s (is \
                 kube-scheduler running and serving the pods' schedulerName?)",
                timeout.as_secs()
            ),
            WaitError::Ended => anyhow!("the pod watch ended"),
        })
}

/// Waits until the watch reports `name` deleted, keeping what it reports of other pods.
async fn wait_for_gone(
    decided: &mut Decisions,
    early: &mut HashMap<String, Seen>,
    name: &str,
    timeout: Duration,
) -> Result<()> {
    next_of(decided, early, name, timeout, |seen| {
        matches!(seen, Seen::Gone)
    })
    .await
    .map(drop)
    .map_err(|error| match error {
        WaitError::Timeout => anyhow!(
            "departing pod {name} was not reported deleted within {} s",
            timeout.as_secs()
        ),
        WaitError::Ended => anyhow!("the pod watch ended"),
    })
}

/// How long a pod turned away right after departures is given for kube-scheduler's retry (its
/// first backoff is 1 s).
const RETRY_WAIT: Duration = Duration::from_secs(5);

/// How long a pod kube-scheduler's window turned away is given for the retries the extender's
/// requeue nudge asks for: a nudge within 0.2 s of the verdict, kube-scheduler's backoff (1 s,
/// doubling), and a nudge at most every `requeue.minIntervalSeconds` (10 s) when the next
/// window misses too (2.4-10.3 s in `lifecycle::a_pod_kube_schedulers_window_hid_...`).
const MISSED_RETRY_WAIT: Duration = Duration::from_secs(30);

enum WaitError {
    Timeout,
    Ended,
}

/// The next report of `name` that `wanted` accepts; other reports are kept in `early` (the
/// latest per pod: a later update of a pod already handled, its deletion included, lands there
/// and is never read).
async fn next_of(
    decided: &mut Decisions,
    early: &mut HashMap<String, Seen>,
    name: &str,
    timeout: Duration,
    wanted: impl Fn(&Seen) -> bool,
) -> Result<Seen, WaitError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let next = tokio::time::timeout_at(deadline, decided.receiver.recv())
            .await
            .map_err(|_| WaitError::Timeout)?
            .ok_or(WaitError::Ended)?;
        if next.0 == name && wanted(&next.1) {
            return Ok(next.1);
        }
        early.insert(next.0, next.1);
    }
}

/// In DRA mode, where a bound pod went and what it holds there: the devices kube-scheduler
/// allocated to its claim (written before the binding), or its CPU and memory alone.
async fn dra_placement(
    claims: &Api<ResourceClaim>,
    bound: &Pod,
    pod: &gpu_sim::SimPod,
    node_index: &HashMap<&str, usize>,
) -> Result<(usize, PodAllocation)> {
    let node = bound
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default();
    let name = bound.metadata.name.as_deref().unwrap_or_default();
    let &n = node_index
        .get(node)
        .ok_or_else(|| anyhow!("pod {name} was bound to {node}, which is not a replay node"))?;
    if gpu_sim::dra::claimed_devices(pod) == 0 {
        return Ok((
            n,
            PodAllocation::host_only(NodeName::new(node), pod.cpu, pod.memory),
        ));
    }
    let claim = claims
        .get(name)
        .await
        .with_context(|| format!("reading the claim of pod {name}"))?;
    Ok((n, claim_allocation(&claim, node, pod)?))
}

/// Where a bound pod went and what it holds there: its allocation record, or (a pod that asks
/// for no GPU, bound by kube-scheduler itself) its CPU and memory alone.
fn placement(
    pod: &Pod,
    node_index: &HashMap<&str, usize>,
    config: &Config,
) -> Result<(usize, PodAllocation)> {
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let &n = node_index
        .get(node)
        .ok_or_else(|| anyhow!("pod {name} was bound to {node}, which is not a replay node"))?;
    let allocation = match record::decode(pod, config)
        .with_context(|| format!("pod {name}: its allocation record"))?
    {
        Some(allocation) => allocation,
        None => {
            if translate::pod_request(pod, config)?.is_some() {
                bail!("GPU pod {name} was bound to {node} without an allocation record");
            }
            let (cpu, memory) = translate::pod_host_request(pod)?;
            PodAllocation::host_only(NodeName::new(node), cpu, memory)
        }
    };
    Ok((n, allocation))
}
