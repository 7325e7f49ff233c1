//! The allocation records the watch refused to apply, per pod, for `inspect` and for the Events
//! that tell the pod's owner: at most one entry a pod (the latest refusal), at most
//! [`REJECTED_LIMIT`] pods (the oldest forgotten first), and forgotten with the pod.
//!
//! Why keep them: the metric says how many were refused, the log says it once; a platform team
//! looking at a pod, or at `inspect`, needs to see which pod carries a record the scheduler does
//! not believe, and why, while the pod lives.

use std::collections::{HashMap, VecDeque};

use gpu_engine::PodKey;

use crate::inspect::RejectedRecord;

/// Pods with a refused record kept at most.
pub const REJECTED_LIMIT: usize = 1024;

/// The refused records ([`super::ClusterState::note_rejected_record`]).
#[derive(Debug, Default)]
pub struct RejectedRecords {
    /// Per pod: the latest refusal, and whether an Event has told it.
    entries: HashMap<PodKey, (RejectedRecord, bool)>,
    /// Pods in the order they were first refused, to forget the oldest past the limit.
    order: VecDeque<PodKey>,
}

impl RejectedRecords {
    /// Notes that `key`'s record was refused for `reason`; `true` when this is news (the pod's
    /// first refusal, or another reason or detail than the last), which is worth a log line
    /// and an Event; a repeat only counts.
    pub fn note(&mut self, key: &PodKey, uid: &str, reason: &str, detail: &str) -> bool {
        if let Some((record, published)) = self.entries.get_mut(key) {
            record.times = record.times.saturating_add(1);
            if record.reason == reason && record.detail == detail && record.uid == uid {
                return false;
            }
            record.reason = reason.to_owned();
            record.detail = detail.to_owned();
            record.uid = uid.to_owned();
            *published = false;
            return true;
        }
        while self.order.len() >= REJECTED_LIMIT {
            if let Some(oldest) = self.order.pop_front() {
                self.entries.remove(&oldest);
            }
        }
        self.order.push_back(key.clone());
        self.entries.insert(
            key.clone(),
            (
                RejectedRecord {
                    pod: key.as_str().to_owned(),
                    uid: uid.to_owned(),
                    reason: reason.to_owned(),
                    detail: detail.to_owned(),
                    times: 1,
                },
                false,
            ),
        );
        true
    }

    /// Forgets `key` (the pod is gone).
    pub fn forget(&mut self, key: &PodKey) {
        if self.entries.remove(key).is_some() {
            self.order.retain(|kept| kept != key);
        }
    }

    /// Every entry, by pod.
    pub fn list(&self) -> Vec<RejectedRecord> {
        let mut list: Vec<RejectedRecord> = self
            .entries
            .values()
            .map(|(record, _)| record.clone())
            .collect();
        list.sort_by(|a, b| a.pod.cmp(&b.pod));
        list
    }

    /// The entries no Event has told yet, now marked told.
    pub fn take_untold(&mut self) -> Vec<RejectedRecord> {
        let mut untold: Vec<RejectedRecord> = self
            .entries
            .values_mut()
            .filter(|(_, told)| !*told)
            .map(|(record, told)| {
                *told = true;
                record.clone()
            })
            .collect();
        untold.sort_by(|a, b| a.pod.cmp(&b.pod));
        untold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_is_news_once_per_reason_and_told_once() {
        let mut store = RejectedRecords::default();
        let key = PodKey::new("team", "p");
        assert!(store.note(&key, "u1", "changed", "changed after bind"));
        assert!(!store.note(&key, "u1", "changed", "changed after bind"));
        assert_eq!(store.list()[0].times, 2);
        assert_eq!(store.take_untold().len(), 1);
        assert!(store.take_untold().is_empty(), "told once");
        assert!(store.note(&key, "u1", "removed", "removed after bind"));
        let told = store.take_untold();
        assert_eq!(
            (told.len(), told[0].reason.as_str(), told[0].times),
            (1, "removed", 3)
        );
        store.forget(&key);
        assert!(store.list().is_empty());
    }

    #[test]
    fn past_the_limit_the_oldest_pods_are_forgotten() {
        let mut store = RejectedRecords::default();
        for i in 0..=REJECTED_LIMIT {
            store.note(&PodKey::new("team", &format!("p{i}")), "u", "mismatch", "x");
        }
        let list = store.list();
        assert_eq!(list.len(), REJECTED_LIMIT);
        assert!(list.iter().all(|r| r.pod != "team/p0"), "the first is gone");
    }
}
