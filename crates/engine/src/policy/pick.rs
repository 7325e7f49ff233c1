//! What every GPU chooser of the policy shares: the share to place ([`ShareAsk`]), the
//! positions picked ([`Picked`]) and the free-capacity arithmetic the choosers and the scores
//! read. The choosers (binpack, spread, fgd, fgd-plus, the reference's draw) import this module
//! and never the policy that dispatches to them.

use crate::allocation::PodAllocation;
use crate::model::{ComputeMilli, CpuMilli, MAX_GPUS_PER_NODE, MemMiB};
use crate::state::{GpuUsage, NodeState, PerGpu};
use crate::topology::{bit, positions};

use super::fgd::FreeChange;

/// A share to place: amounts per GPU, how many GPUs, and the CPU the node keeps afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShareAsk {
    pub mem: MemMiB,
    pub compute: ComputeMilli,
    pub count: usize,
    pub cpu_after: CpuMilli,
    pub mem_after: MemMiB,
}

/// GPU positions picked for a share, in the order they were picked; on the stack, since masks
/// address at most 64 positions.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Picked {
    positions: [u8; MAX_GPUS_PER_NODE],
    len: usize,
}

impl Picked {
    pub(crate) fn new() -> Self {
        Self {
            positions: [0; MAX_GPUS_PER_NODE],
            len: 0,
        }
    }

    /// Appends a position (below 64, as every mask position is).
    pub(crate) fn push(&mut self, position: usize) {
        if let (Some(slot), Ok(position)) =
            (self.positions.get_mut(self.len), u8::try_from(position))
        {
            *slot = position;
            self.len += 1;
        }
    }

    /// The picked positions, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.positions[..self.len].iter().map(|&p| usize::from(p))
    }

    /// The picked positions as a mask.
    pub(crate) fn mask(&self) -> u64 {
        self.iter()
            .fold(0u64, |mask, position| mask | bit(position))
    }

    pub(crate) fn to_vec(self) -> Vec<usize> {
        self.iter().collect()
    }
}

/// Per-GPU free milli-GPU of `node` under `usage`.
pub fn free_milli(node: &NodeState, usage: &[GpuUsage]) -> Vec<u32> {
    free_milli_of(node, usage).to_vec()
}

/// [`free_milli`] on the stack.
pub(crate) fn free_milli_of(node: &NodeState, usage: &[GpuUsage]) -> PerGpu<u32> {
    let mut free = PerGpu::defaults(usage.len().min(node.spec.gpus.len()));
    for (position, slot) in free.iter_mut().enumerate() {
        *slot = node.free_milli_under(position, &usage[position]);
    }
    free
}

/// The positions whose free capacity differs between `before` and `after`.
pub(crate) fn changes_between(before: &[u32], after: &[u32]) -> PerGpu<FreeChange> {
    let differing = before.iter().zip(after).filter(|(b, a)| b != a).count();
    let mut changes = PerGpu::defaults(differing);
    let found = before
        .iter()
        .zip(after)
        .enumerate()
        .filter(|(_, (b, a))| b != a)
        .map(|(position, (&old, &new))| FreeChange { position, old, new });
    for (slot, change) in changes.iter_mut().zip(found) {
        *slot = change;
    }
    changes
}

/// The node's GPU usage once `allocation` is added.
pub fn usage_after(node: &NodeState, allocation: &PodAllocation) -> Vec<GpuUsage> {
    let mut usage = node.gpus.to_vec();
    add_allocation(node, &mut usage, allocation);
    usage
}

/// Adds `allocation`'s per-GPU holds to scratch `usage` (holds on GPUs the node lacks are
/// skipped).
pub(crate) fn add_allocation(node: &NodeState, usage: &mut [GpuUsage], allocation: &PodAllocation) {
    allocation.for_each_hold(|hold| {
        let Some(slot) = node.position_of(hold.gpu).and_then(|p| usage.get_mut(p)) else {
            return;
        };
        if hold.whole {
            slot.whole_pods = slot.whole_pods.saturating_add(1);
        } else {
            slot.mem = MemMiB(slot.mem.0.saturating_add(hold.mem.0));
            slot.compute = ComputeMilli(slot.compute.0.saturating_add(hold.compute.0));
            slot.shares = slot.shares.saturating_add(1);
        }
    });
}

/// Maps a uniform 32-bit draw to an index below `len` (multiply-shift: no modulo bias worth
/// the name for small `len`). `len` must be positive.
fn drawn_index(len: usize, draw: u32) -> usize {
    ((u64::from(draw) * len as u64) >> 32) as usize
}

/// The reference's random GPU choice: `count` GPUs of `pool`, starting from the drawn one and
/// going up by position (the reference only ever draws one GPU, for sharing pods).
pub(crate) fn drawn_pick(pool: u64, count: usize, draw: u32) -> Picked {
    let mut picked = Picked::new();
    let candidates = pool.count_ones() as usize;
    if candidates == 0 {
        return picked;
    }
    let start = drawn_index(candidates, draw);
    for position in positions(pool)
        .skip(start)
        .chain(positions(pool))
        .take(count.min(candidates))
    {
        picked.push(position);
    }
    picked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_map_uniformly_onto_candidates() {
        assert_eq!(drawn_index(4, 0), 0);
        assert_eq!(drawn_index(4, u32::MAX), 3);
        assert_eq!(drawn_index(4, 1 << 31), 2);
        let drawn = |pool, count, draw| drawn_pick(pool, count, draw).iter().collect::<Vec<_>>();
        assert_eq!(drawn(0b1011, 1, u32::MAX), vec![3]);
        assert_eq!(drawn(0b1011, 2, 1 << 31), vec![1, 3]);
        assert!(drawn(0, 1, 7).is_empty());
    }
}
