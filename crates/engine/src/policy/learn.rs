//! Learning FGD's typical-pod distribution from the pods a table holds: what the cluster
//! actually runs, as the reference learns it from the trace it replays.
//!
//! Each pod becomes a class (host CPU, milli-GPU on each of its GPUs, GPU count), counted once;
//! classes are ordered most frequent first (ties by the class, descending) and the shortest
//! prefix covering [`TYPICAL_COVERAGE`] of the pods is kept, as `GetTypicalPods` does. A pod's
//! milli-GPU is read off its allocation: 1000 for a whole GPU, else the larger of its memory
//! share of the card and its compute share. Model constraints are not recorded in allocations,
//! so learned classes accept any model.

use std::collections::HashMap;

use super::typical::{TypicalPod, TypicalPods};
use crate::model::{CpuMilli, MemMiB};
use crate::table::Table;

/// The share of pods the kept classes must cover (FGD's `GetTypicalPods`, its
/// `PodPopularityThreshold` of 95%).
pub const TYPICAL_COVERAGE: f64 = 0.95;

/// The distribution of the pods `table` holds (bound and reserved), and how many pods it was
/// learned from.
pub fn learn_typical(table: &Table) -> (TypicalPods, u64) {
    // (cpu, milli, gpus) -> (count, memory total)
    let mut counts: HashMap<(u64, u32, u16), (u64, u64)> = HashMap::new();
    for (_, entry) in table.pods() {
        let allocation = &entry.allocation;
        let holds = allocation.footprint();
        let spec = table.node(&allocation.node).map(|state| &state.spec);
        let milli = holds
            .iter()
            .map(|hold| {
                if hold.whole {
                    return 1000;
                }
                let card = spec
                    .and_then(|spec| spec.position_of(hold.gpu))
                    .and_then(|position| spec.and_then(|spec| spec.gpus.get(position)))
                    .map_or(0, |gpu| gpu.memory.0);
                let by_memory = if card == 0 {
                    0
                } else {
                    hold.mem.0.saturating_mul(1000).div_ceil(card).min(1000) as u32
                };
                by_memory.max(hold.compute.0.min(1000))
            })
            .max()
            .unwrap_or(0);
        let gpus = u16::try_from(holds.len()).unwrap_or(u16::MAX);
        let entry = counts
            .entry((allocation.cpu.0, milli, gpus))
            .or_insert((0, 0));
        entry.0 += 1;
        entry.1 += allocation.memory.0;
    }
    let total = counts.values().map(|(count, _)| count).sum();
    let classes = counts
        .into_iter()
        .map(|((cpu, milli, gpus), (count, memory))| {
            let pod = TypicalPod {
                cpu: CpuMilli(cpu),
                memory: MemMiB(0),
                gpus,
                milli,
                models: Vec::new(),
                weight: 0.0,
            };
            ((cpu, milli, gpus), pod, count, memory)
        });
    (typical_from_classes(classes), total)
}

/// `GetTypicalPods` from counted classes, each `(key, pod, count, memory total)`: most frequent
/// first, ties by key descending, each class's memory the mean of its pods', cut at
/// [`TYPICAL_COVERAGE`]. The simulator (classes from the trace) and the extender (classes from
/// the table) both build their distribution here.
pub fn typical_from_classes<K: Ord>(
    classes: impl IntoIterator<Item = (K, TypicalPod, u64, u64)>,
) -> TypicalPods {
    let mut classes: Vec<_> = classes.into_iter().collect();
    classes.sort_by(|a, b| (b.2, &b.0).cmp(&(a.2, &a.0)));
    let classes = classes
        .into_iter()
        .map(|(_, mut pod, count, memory)| {
            pod.memory = MemMiB(memory / count.max(1));
            (pod, count)
        })
        .collect();
    TypicalPods::from_counts(classes, TYPICAL_COVERAGE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::GpuMode;
    use crate::{Change, GpuDemand, NodeSpec, PodKey, PodRequest, Policy, fit};

    fn share(gib: u64) -> PodRequest {
        PodRequest::single(
            CpuMilli(1000),
            MemMiB(1024),
            GpuDemand::Share {
                gpus: 1,
                mem_per_gpu: MemMiB(gib * 1024),
                compute_per_gpu: crate::ComputeMilli(0),
            },
        )
    }

    fn table_with(pods: &[(&str, PodRequest)]) -> Table {
        let mut table = Table::new(20);
        let node = NodeSpec::uniform("n", GpuMode::ShareMemory, 4, "Tesla-T4", MemMiB(16_384));
        table.apply(Change::UpsertNode(node.clone()));
        for (name, request) in pods {
            let Some(state) = table.node(&node.name).cloned() else {
                panic!("node n is missing");
            };
            let allocation = fit(&state, request, &Policy::default())
                .unwrap_or_else(|reason| panic!("{name} does not fit: {reason:?}"));
            table.apply(Change::PodBound {
                pod: PodKey::new("ns", name),
                allocation,
            });
        }
        table
    }

    #[test]
    fn classes_come_from_allocations_most_frequent_first() {
        let table = table_with(&[("a", share(4)), ("b", share(4)), ("c", share(8))]);
        let (typical, counted) = learn_typical(&table);
        assert_eq!(counted, 3);
        let pods = typical.pods();
        assert_eq!(pods.len(), 2);
        // 4 GiB of a 16 GiB card: 250 milli-GPU, two pods of three.
        assert_eq!(
            (pods[0].milli, pods[0].gpus, pods[0].cpu),
            (250, 1, CpuMilli(1000))
        );
        assert!((pods[0].weight - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(pods[1].milli, 500);
        assert!(pods.iter().all(|pod| pod.models.is_empty()));
    }

    #[test]
    fn an_empty_table_learns_nothing() {
        let (typical, counted) = learn_typical(&Table::new(20));
        assert_eq!(counted, 0);
        assert!(typical.is_empty());
    }
}
