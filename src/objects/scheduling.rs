//! kube-scheduler's verdict on a pod as its `PodScheduled` condition records it: whether it
//! found no node for the pod, and since when. Read by the requeue task and quota reclaim
//! (which pods wait) and the estimator (which have waited longer than Karmada's threshold).

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use k8s_openapi::jiff::Timestamp;

/// The condition type kube-scheduler writes.
pub const POD_SCHEDULED: &str = "PodScheduled";

/// Whether kube-scheduler has tried `pod` and found no node for it: not bound, and its
/// `PodScheduled` condition is `False` with reason `Unschedulable` (a `SchedulerError` is not
/// a capacity problem, and is retried by kube-scheduler itself).
pub fn is_unschedulable(pod: &Pod) -> bool {
    unschedulable_condition(pod).is_some()
}

/// When kube-scheduler last found no node for `pod` (the condition's `lastTransitionTime`), if
/// it is [unschedulable](is_unschedulable) and the time is recorded.
pub fn unschedulable_since(pod: &Pod) -> Option<Timestamp> {
    unschedulable_condition(pod)
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|time| time.0)
}

fn unschedulable_condition(pod: &Pod) -> Option<&PodCondition> {
    let bound = pod
        .spec
        .as_ref()
        .is_some_and(|spec| spec.node_name.as_deref().is_some_and(|n| !n.is_empty()));
    if bound {
        return None;
    }
    pod.status
        .as_ref()
        .and_then(|status| status.conditions.as_deref())
        .into_iter()
        .flatten()
        .find(|c| {
            c.type_ == POD_SCHEDULED
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        })
}
