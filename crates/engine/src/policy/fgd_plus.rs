//! FGD+: fragmentation gradient descent with two more things measured, host stranding and the
//! look-ahead value of slivers, compared without truncation, plus a small charge for opening a
//! fully idle node (a large one once idle nodes run short of what the big pods need) and "used
//! nodes first" among equals.
//!
//! Why, in short (docs/policies.md has the measurements): at the end of a replay FGD's leftover
//! GPU capacity is mostly slivers no pod fits and GPUs whose node ran out of CPU or memory. FGD
//! only sees CPU through "does one typical pod still fit", a test that flips at a threshold, and
//! never sees memory; the host term charges, smoothly, every free milli-GPU that the node's free
//! CPU or memory could no longer feed at the typical pods' CPU and memory per GPU. FGD values a
//! sliver by whether one typical pod fits it; the look-ahead values it by what it will finally
//! leave behind as pods keep arriving ([`TypicalPods::sliver_value`]), which also steers the
//! choice of GPU inside a node.

use crate::allocation::PodAllocation;
use crate::model::{ComputeMilli, CpuMilli, MemMiB};
use crate::request::PodRequest;
use crate::state::{GpuUsage, NodeState};
use crate::topology::{bit, positions};

use super::binpack;
use super::fgd::{self, FgdCache, NodeMeasure};
use super::pick::{Picked, ShareAsk, free_milli, free_milli_of};
use super::typical::{BIG_CLASS_GPUS, Scarcity, TypicalPods};

/// FGD+'s knobs, one group per term that FGD+ adds to FGD's measure (docs/policies.md, "FGD+ on
/// one page"). [`Tuning::default`] is the measured best on the openb traces, frozen: why each
/// value, and which modes lost and were removed, is in
/// docs/decisions/0014-fgd-plus-frozen-into-named-terms.md. The extender reads every knob from
/// `policy.fgdPlus` and `gpu-lab simulate` from `fgd-plus:KEY=VALUE+...`, by the same keys
/// ([`Tuning::KEYS`]), so a tuning found in the lab runs unchanged in a cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tuning {
    /// The sliver look-ahead's weight (hundredths): each GPU's free sliver valued by what it
    /// will finally leave behind as pods keep arriving ([`TypicalPods::sliver_value`]); it
    /// steers the choice of GPU inside a node too. 0 turns it off.
    pub lookahead: u32,
    /// Scarcity: the fragmentation of the classes few nodes can run, weighed more.
    pub scarcity: ScarcityTerm,
    /// Host stranding: free GPU that the node's free CPU or memory could not feed.
    pub host: HostTerm,
    /// The idle-node guard: what opening a node whose GPUs are all idle costs.
    pub idle_nodes: IdleNodeGuard,
    /// The host hold: a pod that asks no GPU is refused an idle node of [`BIG_CLASS_GPUS`] GPUs
    /// or more, and any GPU node where it would leave the free GPUs without the CPU or memory
    /// they need ([`holds_host`]).
    pub hold_host: bool,
}

/// The scarcity term: the scarce classes' fragmentation ([`TypicalPods::scarce_fragmentation`])
/// added to FGD's measure with these weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScarcityTerm {
    /// Weight (hundredths) of the scarce classes that name GPU models; 0 turns it off.
    pub models: u32,
    /// Weight (hundredths) of the scarce classes that accept any model, scarce by their shape
    /// (GPU count, CPU, memory); 0 turns it off.
    pub shapes: u32,
    /// Whether a class's scarcity is measured on the nodes as if empty or as they are now
    /// ([`Scarcity`]).
    pub measured: Scarcity,
}

/// The host-stranding term ([`host_stranded`]), added to FGD's measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostTerm {
    /// Weight (hundredths); 0 turns it off.
    pub weight: u32,
    /// Host slack ([`TypicalPods::host_slack`], hundredths) from which the term has its whole
    /// weight; below it the weight shrinks in proportion, to none without slack. 0 gives the
    /// term its whole weight on every cluster.
    pub slack: u32,
}

/// The idle-node guard: charges for opening a node whose GPUs are all idle, and how much of the
/// host term's credit such a placement earns, by how well the idle nodes cover the big pods
/// ([`TypicalPods::idle_cover`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IdleNodeGuard {
    /// Extra fragmentation (milli-GPU) charged for placing a GPU pod on an idle node: keeps
    /// whole nodes for the pods that need them.
    pub penalty: u32,
    /// Share (hundredths) of the host term's reduction of stranding credited to a GPU pod that
    /// opens an idle node; a rise in stranding is always charged whole. 100 credits it whole.
    /// Below the idle cover [`IdleNodeGuard::credit_cover`] only part of it is credited
    /// ([`Tuning::idle_credit_at`]).
    pub credit: u32,
    /// Idle cover (hundredths) from which a GPU pod opening an idle node earns the whole
    /// [`IdleNodeGuard::credit`]; below it the credit shrinks in proportion, to none at
    /// [`IdleNodeGuard::floor`]. 0 credits it whole at every cover.
    pub credit_cover: u32,
    /// Idle cover (hundredths) below which opening an idle node is guarded: charged
    /// [`IdleNodeGuard::guard_penalty`] more, and a rise of host stranding there
    /// [`IdleNodeGuard::guard_rise`] times. 0 turns the guard off.
    pub floor: u32,
    /// Extra fragmentation (milli-GPU) charged for opening an idle node while guarded, scaled
    /// by the host slack as the host term is ([`Tuning::slack_share`]).
    pub guard_penalty: u32,
    /// Multiplier (hundredths) on a rise of host stranding on an idle node opened while
    /// guarded; 100 charges it as anywhere else.
    pub guard_rise: u32,
}

/// Why a knob could not be set ([`Tuning::set`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KnobError {
    #[error("unknown fgd-plus knob {key:?}; the knobs are {}", Tuning::KEYS.join(", "))]
    Unknown { key: String },
    #[error("fgd-plus knob {key}: {value:?} is not {expected}")]
    Value {
        key: &'static str,
        value: String,
        expected: &'static str,
    },
}

impl Tuning {
    /// Every knob's key, as `policy.fgdPlus` names it (below that section) and `simulate` takes
    /// it, in the order the terms are described.
    pub const KEYS: [&'static str; 13] = [
        "lookahead",
        "scarcity.models",
        "scarcity.shapes",
        "scarcity.measured",
        "host.weight",
        "host.slack",
        "idleNodes.penalty",
        "idleNodes.credit",
        "idleNodes.creditCover",
        "idleNodes.floor",
        "idleNodes.guardPenalty",
        "idleNodes.guardRise",
        "holdHostForGpus",
    ];

    /// Sets the knob `key` ([`Tuning::KEYS`]) from its text: a whole number, `true`/`false` for
    /// the hold, and `now`/`shape`/`empty` for how scarcity is measured.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), KnobError> {
        let Some(&key) = Self::KEYS.iter().find(|known| **known == key) else {
            return Err(KnobError::Unknown {
                key: key.to_owned(),
            });
        };
        let wrong = |expected| KnobError::Value {
            key,
            value: value.to_owned(),
            expected,
        };
        let number = || value.parse::<u32>().map_err(|_| wrong("a whole number"));
        match key {
            "scarcity.measured" => {
                self.scarcity.measured =
                    Scarcity::from_word(value).ok_or_else(|| wrong("now, shape or empty"))?;
            }
            "holdHostForGpus" => {
                self.hold_host = value.parse().map_err(|_| wrong("true or false"))?;
            }
            _ => *self.number_mut(key).ok_or_else(|| wrong("a knob"))? = number()?,
        }
        Ok(())
    }

    /// Every knob as `(key, value)`, in [`Tuning::KEYS`] order, in the text [`Tuning::set`]
    /// reads.
    pub fn knobs(&self) -> Vec<(&'static str, String)> {
        // Read through the one key-to-field table (`number_mut`), on a copy, rather than a
        // second table that could drift from the one `set` writes through.
        let mut copy = *self;
        Self::KEYS
            .iter()
            .map(|&key| {
                let value = match key {
                    "scarcity.measured" => self.scarcity.measured.word().to_owned(),
                    "holdHostForGpus" => self.hold_host.to_string(),
                    _ => copy
                        .number_mut(key)
                        .map_or_else(String::new, |n| n.to_string()),
                };
                (key, value)
            })
            .collect()
    }

    /// The knobs that differ from [`Tuning::default`], as `(key, value)`.
    pub fn changed_knobs(&self) -> Vec<(&'static str, String)> {
        let default = Self::default().knobs();
        self.knobs()
            .into_iter()
            .zip(default)
            .filter(|(mine, theirs)| mine != theirs)
            .map(|(mine, _)| mine)
            .collect()
    }

    /// The numeric knob `key`, if it is one.
    fn number_mut(&mut self, key: &str) -> Option<&mut u32> {
        Some(match key {
            "lookahead" => &mut self.lookahead,
            "scarcity.models" => &mut self.scarcity.models,
            "scarcity.shapes" => &mut self.scarcity.shapes,
            "host.weight" => &mut self.host.weight,
            "host.slack" => &mut self.host.slack,
            "idleNodes.penalty" => &mut self.idle_nodes.penalty,
            "idleNodes.credit" => &mut self.idle_nodes.credit,
            "idleNodes.creditCover" => &mut self.idle_nodes.credit_cover,
            "idleNodes.floor" => &mut self.idle_nodes.floor,
            "idleNodes.guardPenalty" => &mut self.idle_nodes.guard_penalty,
            "idleNodes.guardRise" => &mut self.idle_nodes.guard_rise,
            _ => return None,
        })
    }

    /// The host term's weight (hundredths) on a cluster with host slack `slack`
    /// ([`TypicalPods::host_slack`]; `None`, not measured: the whole weight).
    pub fn host_weight_at(&self, slack: Option<f64>) -> f64 {
        f64::from(self.host.weight) * self.slack_share(slack)
    }

    /// The share (0..=1) of their whole weight that the host term and the idle-node guard's
    /// charge have on a cluster with host slack `slack`: 1 from `host.slack` up, in proportion
    /// below it; 1 when the slack is not measured or `host.slack` is 0.
    pub fn slack_share(&self, slack: Option<f64>) -> f64 {
        match slack {
            Some(slack) if self.host.slack > 0 => {
                (100.0 * slack / f64::from(self.host.slack)).clamp(0.0, 1.0)
            }
            _ => 1.0,
        }
    }

    /// The share (0..=1) of the host term's reduction of stranding credited to a GPU pod that
    /// opens an idle node, at idle cover `cover` ([`TypicalPods::idle_cover`]; `None`, no big
    /// class to keep idle nodes for: the whole [`IdleNodeGuard::credit`]).
    pub fn idle_credit_at(&self, cover: Option<u32>) -> f64 {
        let idle = &self.idle_nodes;
        let whole = f64::from(idle.credit) / 100.0;
        match cover {
            Some(cover) if idle.credit_cover > 0 && cover < idle.credit_cover => {
                if cover <= idle.floor {
                    0.0
                } else {
                    whole * f64::from(cover - idle.floor)
                        / f64::from(idle.credit_cover - idle.floor)
                }
            }
            _ => whole,
        }
    }

    /// Whether either kind of scarce class is weighed.
    pub fn weighs_scarcity(&self) -> bool {
        self.scarcity.models > 0 || self.scarcity.shapes > 0
    }
}

impl Default for Tuning {
    /// The frozen values; docs/decisions/0014-fgd-plus-frozen-into-named-terms.md gives the
    /// measurement behind each.
    fn default() -> Self {
        Self {
            lookahead: 1600,
            scarcity: ScarcityTerm {
                models: 1000,
                shapes: 6000,
                measured: Scarcity::Now,
            },
            host: HostTerm {
                weight: 900,
                slack: 10,
            },
            idle_nodes: IdleNodeGuard {
                penalty: 100,
                credit: 80,
                credit_cover: 100,
                floor: 25,
                guard_penalty: 4000,
                guard_rise: 1600,
            },
            hold_host: true,
        }
    }
}

/// The part of the measure that depends on individual GPUs (FGD's expectation with memory, the
/// weighted sliver look-ahead and the scarce classes' term): what the choice of GPU minimises.
pub fn fragmentation(
    typical: &TypicalPods,
    tuning: &Tuning,
    cpu_free: CpuMilli,
    mem_free: MemMiB,
    free_milli: &[u32],
    access: &[u64],
) -> f64 {
    let expected = typical.fragmentation_with_memory(cpu_free, mem_free, free_milli, access);
    let look = if tuning.lookahead > 0 {
        let values: f64 = free_milli.iter().map(|&f| typical.sliver_value(f)).sum();
        f64::from(tuning.lookahead) / 100.0 * values
    } else {
        0.0
    };
    let scarce = if tuning.weighs_scarcity() {
        typical.scarce_fragmentation(
            cpu_free,
            mem_free,
            free_milli,
            access,
            f64::from(tuning.scarcity.models) / 100.0,
            f64::from(tuning.scarcity.shapes) / 100.0,
        )
    } else {
        0.0
    };
    expected + look + scarce
}

/// FGD+'s GPU choice for a share: one GPU at a time, the one whose use leaves the least
/// [`fragmentation`] (lowest position on ties). `cache` holds the node's access masks across
/// calls.
pub(crate) fn pick(
    node: &NodeState,
    usage: &[GpuUsage],
    pool: u64,
    ask: ShareAsk,
    typical: &TypicalPods,
    tuning: &Tuning,
    cache: &mut FgdCache,
) -> Picked {
    if typical.is_empty() {
        return binpack::pick(node, usage, pool, ask.count);
    }
    let access = cache.access(typical, node);
    let with_ask = |slot: GpuUsage| GpuUsage {
        mem: MemMiB(slot.mem.0 + ask.mem.0),
        compute: ComputeMilli(slot.compute.0 + ask.compute.0),
        ..slot
    };
    let mut scratch = usage.to_vec();
    let mut free = free_milli(node, &scratch);
    let before = fragmentation(
        typical,
        tuning,
        node.cpu_free(),
        node.mem_free(),
        &free,
        access,
    );
    let mut remaining = pool;
    let mut chosen = Picked::new();
    let mut trial = free.clone();
    for _ in 0..ask.count {
        let mut best: Option<(usize, f64)> = None;
        for position in positions(remaining) {
            trial.copy_from_slice(&free);
            trial[position] = node.free_milli_under(position, &with_ask(scratch[position]));
            let reduction = before
                - fragmentation(
                    typical,
                    tuning,
                    ask.cpu_after,
                    ask.mem_after,
                    &trial,
                    access,
                );
            if best.is_none_or(|(_, best_value)| reduction > best_value) {
                best = Some((position, reduction));
            }
        }
        let Some((position, _)) = best else {
            break;
        };
        chosen.push(position);
        remaining &= !bit(position);
        scratch[position] = with_ask(scratch[position]);
        free[position] = node.free_milli_under(position, &scratch[position]);
    }
    chosen
}

/// Free GPU capacity (milli-GPU) that the node's free CPU or memory could not feed if every GPU
/// pod needed the typical pods' CPU and memory per GPU: a fluid estimate of stranding that grows
/// smoothly as host resources run short, where FGD's per-class test flips at thresholds.
pub fn host_stranded(
    typical: &TypicalPods,
    cpu_free: CpuMilli,
    mem_free: MemMiB,
    free_milli: &[u32],
) -> f64 {
    let gpu_free: f64 = free_milli.iter().map(|&f| f64::from(f)).sum();
    let (cpu_per_gpu, mem_per_gpu) = typical.host_per_gpu();
    let fed = |free: f64, per_gpu: f64| {
        if per_gpu > 0.0 {
            1000.0 * free / per_gpu
        } else {
            f64::INFINITY
        }
    };
    let fed = fed(cpu_free.0 as f64, cpu_per_gpu).min(fed(mem_free.0 as f64, mem_per_gpu));
    (gpu_free - fed).max(0.0)
}

/// Whether FGD+ refuses `node` to a pod that takes `taking` and no GPU, under
/// [`Tuning::hold_host`]: a GPU node's CPU and memory go to a pod without GPUs only where the
/// node's free GPUs would not need them at the typical pods' CPU and memory per GPU
/// ([`host_stranded`] does not rise), and an idle node of [`BIG_CLASS_GPUS`] GPUs or more not at
/// all. A node without GPUs takes any such pod. Where CPU or memory runs out before the GPUs,
/// what a CPU-only pod holds there is GPU that no later pod can use (docs/policies.md, "Host
/// held for the GPUs").
pub fn holds_host(
    typical: &TypicalPods,
    tuning: &Tuning,
    node: &NodeState,
    taking: Taking,
) -> bool {
    if !tuning.hold_host || taking.gpus || node.spec.gpus.is_empty() {
        return false;
    }
    if node.gpus_idle() && node.spec.gpus.len() >= usize::from(BIG_CLASS_GPUS) {
        // An idle big node is what the pods of many GPUs need. Without this, on the trace's
        // nodes without the T4 ones, CPU-only pods filled the few idle 8-GPU nodes whose CPU
        // exceeds what their GPUs need (they strand nothing there), and the 8-GPU pods of 120
        // cores that only those nodes can run were turned away from 17% arrival on.
        return true;
    }
    let free = free_milli_of(node, &node.gpus);
    let (cpu, memory) = (node.cpu_free(), node.mem_free());
    let before = host_stranded(typical, cpu, memory, &free);
    let after = host_stranded(
        typical,
        CpuMilli(cpu.0.saturating_sub(taking.cpu.0)),
        MemMiB(memory.0.saturating_sub(taking.memory.0)),
        &free,
    );
    after > before
}

/// Scale of the tie-break: far below any difference of measure that matters (scores move by
/// 0.05 per milli-GPU near the centre, and by more than this per milli-GPU up to reductions of
/// 100,000: `fgd::wide_score_from_reduction`).
const TIE_BREAK: f64 = 1e-6;

/// The score of `allocation` on `node` (0..=100, 50 = no change), given the node's per-GPU
/// free milli-GPU before and after it.
pub fn score(
    typical: &TypicalPods,
    tuning: &Tuning,
    node: &NodeState,
    allocation: &PodAllocation,
    before: &[u32],
    after: &[u32],
) -> f64 {
    score_taking(typical, tuning, node, Taking::of(allocation), before, after)
}

/// What a placement takes from a node besides its GPU usage: what [`score_taking`] reads.
#[derive(Clone, Copy, Debug)]
pub struct Taking {
    pub cpu: CpuMilli,
    pub memory: MemMiB,
    /// Whether the pod holds any GPU, MIG slices included (an idle node it lands on stops being
    /// idle; a MIG pod is a GPU pod, never held off a node's host).
    pub gpus: bool,
}

impl Taking {
    /// What `allocation` takes.
    pub fn of(allocation: &PodAllocation) -> Self {
        Self {
            cpu: allocation.cpu,
            memory: allocation.memory,
            gpus: allocation.has_gpus() || allocation.holds_mig(),
        }
    }

    /// What `request` takes once placed: it holds GPUs exactly when it asks for any.
    pub fn asked(request: &PodRequest) -> Self {
        Self {
            cpu: request.cpu,
            memory: request.memory,
            gpus: request.wants_gpu(),
        }
    }
}

/// [`score`] from what the placement takes, without the allocation: the score-only path of
/// filter and prioritize knows the node's usage afterwards but builds no allocation.
pub fn score_taking(
    typical: &TypicalPods,
    tuning: &Tuning,
    node: &NodeState,
    taking: Taking,
    before: &[u32],
    after: &[u32],
) -> f64 {
    let access = typical.access_masks(node);
    let measure = measure_node(typical, tuning, node, before, &access);
    score_measured(typical, tuning, node, taking, &access, measure, after)
}

/// FGD+'s measure ([`NodeMeasure`]) of `node` with free capacity `free` (milli-GPU per GPU);
/// `access` is [`TypicalPods::access_masks`]'s.
pub(crate) fn measure_node(
    typical: &TypicalPods,
    tuning: &Tuning,
    node: &NodeState,
    free: &[u32],
    access: &[u64],
) -> NodeMeasure {
    let (cpu, memory) = (node.cpu_free(), node.mem_free());
    let host_stranded = if tuning.host_weight_at(typical.host_slack()) > 0.0 {
        host_stranded(typical, cpu, memory, free)
    } else {
        0.0
    };
    NodeMeasure {
        fragmentation: fragmentation(typical, tuning, cpu, memory, free, access),
        host_stranded,
    }
}

/// [`score_taking`] against the node's measure taken beforehand (`measure`, with `access`).
pub(crate) fn score_measured(
    typical: &TypicalPods,
    tuning: &Tuning,
    node: &NodeState,
    taking: Taking,
    access: &[u64],
    measure: NodeMeasure,
    after: &[u32],
) -> f64 {
    let cpu_after = CpuMilli(node.cpu_free().0.saturating_sub(taking.cpu.0));
    let mem_after = MemMiB(node.mem_free().0.saturating_sub(taking.memory.0));
    let mut reduction =
        measure.fragmentation - fragmentation(typical, tuning, cpu_after, mem_after, after, access);
    let host_weight = tuning.host_weight_at(typical.host_slack());
    let node_idle = node.gpus_idle();
    let opens_idle_node = taking.gpus && node_idle;
    let guarded = opens_idle_node
        && typical
            .idle_cover()
            .is_some_and(|cover| cover < tuning.idle_nodes.floor);
    if guarded {
        // In proportion to the host slack, as the host term it counters: on the trace's
        // nodes without the T4 ones (slack 0.02) the whole charge put `default` and
        // `gpushare40` with departures 0.14 and 0.07 further below FGD, against 0.11 and 0.04
        // scaled (docs/policies.md, "Idle nodes guarded").
        reduction -=
            f64::from(tuning.idle_nodes.guard_penalty) * tuning.slack_share(typical.host_slack());
    }
    if host_weight > 0.0 {
        let stranded_after = host_stranded(typical, cpu_after, mem_after, after);
        let mut host = measure.host_stranded - stranded_after;
        if opens_idle_node && host > 0.0 {
            // An idle node's stranding is a possibility, not yet a loss: a whole-node pod may
            // still bring its own CPU and memory. Crediting all of it sent low-memory pods to
            // open every memory-poor node and left none idle for the 8-GPU pods.
            host *= tuning.idle_credit_at(typical.idle_cover());
        }
        if guarded && host < 0.0 {
            host *= f64::from(tuning.idle_nodes.guard_rise) / 100.0;
        }
        reduction += host_weight / 100.0 * host;
    }
    if opens_idle_node {
        reduction -= f64::from(tuning.idle_nodes.penalty);
    }
    let score = fgd::wide_score_from_reduction(reduction);
    // Among equal scores, nodes already running GPU pods before idle ones.
    let order = if node_idle { 0.0 } else { 1.0 };
    score + TIE_BREAK * order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fit::RejectReason;
    use crate::policy::typical::TypicalPod;
    use crate::{GpuDemand, GpuMode, NodeSpec, Policy, ScoringPolicy};

    fn class(cpu: u64, memory: u64, gpus: u16, milli: u32, weight: f64) -> TypicalPod {
        TypicalPod {
            cpu: CpuMilli(cpu),
            memory: MemMiB(memory),
            gpus,
            milli,
            models: Vec::new(),
            weight,
        }
    }

    /// FGD+'s score for `pod` on `node` with `tuning`, against `typical`.
    fn score_with(
        typical: &TypicalPods,
        tuning: Tuning,
        node: &NodeState,
        pod: &PodRequest,
    ) -> f64 {
        Policy {
            fgd_plus: tuning,
            ..Policy::scoring(ScoringPolicy::FgdPlus).with_typical(typical.clone())
        }
        .evaluate(node, pod)
        .unwrap()
        .score
    }

    /// An idle node of `gpus` GPUs of `model` with `cpu` milli-cores and memory to spare.
    fn idle_node(gpus: u16, model: &str, cpu: u64) -> NodeState {
        NodeState::new(
            NodeSpec::uniform("n", GpuMode::CoreMem, gpus, model, MemMiB(0)).with_host(
                CpuMilli(cpu),
                MemMiB(1 << 30),
                1001,
            ),
        )
    }

    /// An idle 8-GPU node with `cpu` milli-cores and memory to spare.
    fn eight_gpu_node(cpu: u64) -> NodeState {
        idle_node(8, "G2", cpu)
    }

    /// An idle 2-GPU T4 node with `cpu` milli-cores and memory to spare.
    fn two_gpu_node(cpu: u64) -> NodeState {
        idle_node(2, "T4", cpu)
    }

    /// One-GPU pods of 12 cores and CPU-only pods of 8, alike in number: 20 cores asked per
    /// GPU asked.
    fn gpu_and_cpu_only_pods() -> TypicalPods {
        TypicalPods::new(vec![
            class(12_000, 0, 1, 1000, 1.0),
            class(8_000, 0, 0, 0, 1.0),
        ])
    }

    #[test]
    fn host_stranding_counts_gpus_the_cpu_cannot_feed() {
        // Typical GPU pod: one whole GPU with 12 cores and 64 GiB.
        let typical = TypicalPods::new(vec![class(12_000, 65_536, 1, 1000, 1.0)]);
        let free = [1000, 1000, 1000, 1000];
        // 24 cores feed 2 of the 4 free GPUs: 2000 milli stranded.
        let stranded = host_stranded(&typical, CpuMilli(24_000), MemMiB(1 << 30), &free);
        assert!((stranded - 2000.0).abs() < 1e-9);
        // Memory for 3: the scarcer resource decides.
        let stranded = host_stranded(&typical, CpuMilli(24_000), MemMiB(3 * 65_536), &free);
        assert!((stranded - 2000.0).abs() < 1e-9);
        let stranded = host_stranded(&typical, CpuMilli(96_000), MemMiB(65_536), &free);
        assert!((stranded - 3000.0).abs() < 1e-9);
        assert_eq!(
            host_stranded(&typical, CpuMilli(96_000), MemMiB(1 << 30), &free),
            0.0
        );
    }

    #[test]
    fn the_host_weight_grows_with_the_host_slack() {
        let tuning = Tuning::default();
        let whole = f64::from(tuning.host.weight);
        assert_eq!(
            tuning.host_weight_at(None),
            whole,
            "not measured: whole weight"
        );
        assert_eq!(tuning.host_weight_at(Some(0.0)), 0.0);
        assert!((tuning.host_weight_at(Some(0.05)) - whole / 2.0).abs() < 1e-9);
        assert!((tuning.host_weight_at(Some(0.1)) - whole).abs() < 1e-9);
        assert_eq!(tuning.host_weight_at(Some(0.36)), whole);
        let unscaled = Tuning {
            host: HostTerm {
                slack: 0,
                ..tuning.host
            },
            ..tuning
        };
        assert_eq!(unscaled.host_weight_at(Some(0.0)), whole);
    }

    #[test]
    fn where_no_node_has_cpu_to_spare_beside_its_gpus_the_host_term_is_off() {
        let typical = gpu_and_cpu_only_pods();
        let pod = PodRequest::single(CpuMilli(8_000), MemMiB(1024), GpuDemand::None);
        let score = |typical: &TypicalPods, host_weight: u32| {
            let policy = Policy {
                fgd_plus: Tuning {
                    host: HostTerm {
                        weight: host_weight,
                        ..Tuning::default().host
                    },
                    // Measured as scored: the hold would refuse the tight node.
                    hold_host: false,
                    ..Tuning::default()
                },
                ..Policy::scoring(ScoringPolicy::FgdPlus)
            }
            .with_typical(typical.clone());
            policy.evaluate(&two_gpu_node(24_000), &pod).unwrap().score
        };
        // A 128-core node has 88 cores beyond its GPUs' 40: slack 88 / 80 = 1.1 of the
        // cluster's ask. The host term charges the CPU taken from GPUs that need it.
        let spare = typical
            .clone()
            .with_cluster(&[two_gpu_node(128_000), two_gpu_node(24_000)]);
        assert_eq!(spare.host_slack(), Some(1.1));
        assert!(score(&spare, 900) < score(&spare, 0));
        // No node has more than its GPUs ask: nowhere to steer CPU-heavy pods to.
        let tight = typical.with_cluster(&[two_gpu_node(40_000), two_gpu_node(24_000)]);
        assert_eq!(tight.host_slack(), Some(0.0));
        assert_eq!(score(&tight, 900), score(&tight, 0));
    }

    #[test]
    fn cpu_only_pods_go_where_cpu_is_plentiful() {
        let typical = gpu_and_cpu_only_pods();
        let held = Policy::scoring(ScoringPolicy::FgdPlus).with_typical(typical);
        let pod = PodRequest::single(CpuMilli(8_000), MemMiB(1024), GpuDemand::None);
        // 104 cores for 2 GPUs have CPU to spare; 24 cores are exactly what the GPUs need: the
        // hold refuses the pod there, and with the hold off it scores lower there.
        assert!(held.evaluate(&two_gpu_node(104_000), &pod).is_ok());
        assert_eq!(
            held.evaluate(&two_gpu_node(24_000), &pod).map(|e| e.score),
            Err(RejectReason::HostHeldForGpus)
        );
        let policy = Policy {
            fgd_plus: Tuning {
                hold_host: false,
                ..held.fgd_plus
            },
            ..held
        };
        let rich = policy.evaluate(&two_gpu_node(104_000), &pod).unwrap().score;
        let tight = policy.evaluate(&two_gpu_node(24_000), &pod).unwrap().score;
        assert!(rich > tight, "{rich} vs {tight}");
    }

    #[test]
    fn a_cpu_only_pod_is_charged_for_the_cpu_the_gpus_beside_it_need() {
        let typical =
            gpu_and_cpu_only_pods().with_cluster(&[two_gpu_node(128_000), two_gpu_node(24_000)]);
        // 16 of the node's 24 cores: the 8 left feed no 12-core GPU pod.
        let pod = PodRequest::single(CpuMilli(16_000), MemMiB(1024), GpuDemand::None);
        let node = two_gpu_node(24_000);
        let score = |tuning: Tuning| score_with(&typical, tuning, &node, &pod);
        // Scored as a GPU pod, the host term charges the CPU taken from the GPUs beside it.
        // (The hold would refuse this node outright: how the pod is scored where the hold is
        // off is what is measured here.)
        let unheld = Tuning {
            hold_host: false,
            ..Tuning::default()
        };
        let no_host_term = Tuning {
            host: HostTerm {
                weight: 0,
                ..unheld.host
            },
            ..unheld
        };
        assert!(score(unheld) < score(no_host_term));
    }

    #[test]
    fn among_equal_scores_a_node_already_running_gpu_pods_comes_first() {
        let typical = TypicalPods::new(vec![class(0, 0, 1, 1000, 1.0)]);
        let policy = Policy::scoring(ScoringPolicy::FgdPlus).with_typical(typical);
        let pod = PodRequest::single(CpuMilli(0), MemMiB(0), GpuDemand::None);
        let idle = two_gpu_node(128_000);
        let mut used = two_gpu_node(128_000);
        let first = PodRequest::single(CpuMilli(0), MemMiB(0), GpuDemand::Whole { count: 1 });
        used.add(&crate::fit(&used, &first, &policy).unwrap());
        let idle_score = policy.evaluate(&idle, &pod).unwrap().score;
        let used_score = policy.evaluate(&used, &pod).unwrap().score;
        // A pod that takes nothing changes neither node's measure: only the order differs.
        assert!(
            (used_score - idle_score - TIE_BREAK).abs() < 1e-12,
            "{used_score} {idle_score}"
        );
    }
    #[test]
    fn a_class_scarce_by_model_is_scaled_by_the_model_weight_only() {
        // One V100 node among four 8-GPU nodes: a V100-only pod runs on a quarter of the GPUs.
        let node = |model: &str| idle_node(8, model, 96_000);
        let v100 = node("V100");
        let t4 = node("T4");
        let mut v100_only = class(4_000, 0, 1, 1000, 1.0);
        v100_only.models = vec![crate::ModelPattern::parse("V100").unwrap()];
        let typical = TypicalPods::new(vec![class(4_000, 0, 1, 1000, 9.0), v100_only])
            .with_cluster(&[v100.clone(), t4.clone(), t4.clone(), t4]);
        let access = typical.access_masks(&v100);
        // Every GPU has 300 milli free: a whole-GPU class loses all 2400. Weight 0.1, excess 3.
        let free = [300; 8];
        let expected = 0.1 * 3.0 * 2400.0;
        let by_model = typical.scarce_fragmentation(
            CpuMilli(96_000),
            MemMiB(1 << 20),
            &free,
            &access,
            2.0,
            0.0,
        );
        assert!((by_model - 2.0 * expected).abs() < 1e-6, "{by_model}");
        assert_eq!(
            typical.scarce_fragmentation(
                CpuMilli(96_000),
                MemMiB(1 << 20),
                &free,
                &access,
                0.0,
                7.0
            ),
            0.0,
            "a class that names a model is not scaled by the shape weight"
        );
    }

    #[test]
    fn a_class_few_nodes_can_run_is_weighed_by_how_scarce_they_are() {
        // One 8-GPU node with 128 cores, three 8-GPU nodes with 64: an 8-GPU pod that needs 120
        // cores runs on a quarter of the GPUs; a one-GPU pod runs anywhere.
        let big = eight_gpu_node(128_000);
        let small = eight_gpu_node(64_000);
        let typical = TypicalPods::new(vec![
            class(8_000, 0, 1, 1000, 9.0),
            class(120_000, 0, 8, 1000, 1.0),
        ]);
        let cluster = [big.clone(), small.clone(), small.clone(), small.clone()];
        let scarce = typical.clone().with_cluster(&cluster);
        let access = scarce.access_masks(&big);
        assert_eq!(
            access,
            [0xFF, 0xFF, 0xFF],
            "two typical classes, one scarce"
        );
        let free = [0, 1000, 1000, 1000, 1000, 1000, 1000, 1000];
        // Excess scarcity 32/8 - 1 = 3 for the big class, none for the small one: the big
        // class's lost 7000 milli counts 0.1 × 3 × 7000.
        let measured = scarce.scarce_fragmentation(
            CpuMilli(128_000),
            MemMiB(1 << 20),
            &free,
            &access,
            1.0,
            1.0,
        );
        assert!((measured - 0.1 * 3.0 * 7000.0).abs() < 1e-6, "{measured}");
        // The big class accepts any model: it is scarce by shape, so only `by_shape` scales it.
        let by_shape_only = scarce.scarce_fragmentation(
            CpuMilli(128_000),
            MemMiB(1 << 20),
            &free,
            &access,
            0.0,
            2.0,
        );
        assert!(
            (by_shape_only - 2.0 * measured).abs() < 1e-6,
            "{by_shape_only}"
        );
        assert_eq!(
            scarce.scarce_fragmentation(
                CpuMilli(128_000),
                MemMiB(1 << 20),
                &free,
                &access,
                5.0,
                0.0
            ),
            0.0,
            "a class that names no model is not scaled by the model weight"
        );
        assert_eq!(
            typical.scarce_fragmentation(
                CpuMilli(128_000),
                MemMiB(1 << 20),
                &free,
                &access,
                1.0,
                1.0
            ),
            0.0,
            "no cluster, no scarcity"
        );

        // Both nodes idle (the idle-node charge is the same on either): a one-GPU pod on the
        // CPU-rich node would take the only node the big class can run on, which the term
        // charges; without it, the CPU-rich node looks as good or better.
        let pod = PodRequest::single(CpuMilli(8_000), MemMiB(0), GpuDemand::Whole { count: 1 });
        let margin = |scarce_weight: u32| {
            let policy = Policy {
                fgd_plus: Tuning {
                    scarcity: ScarcityTerm {
                        models: scarce_weight,
                        shapes: scarce_weight,
                        ..Tuning::default().scarcity
                    },
                    ..Tuning::default()
                },
                ..Policy::scoring(ScoringPolicy::FgdPlus).with_typical(scarce.clone())
            };
            policy.evaluate(&small, &pod).unwrap().score
                - policy.evaluate(&big, &pod).unwrap().score
        };
        assert!(
            margin(1000) > margin(0),
            "{} vs {}",
            margin(1000),
            margin(0)
        );
        assert!(margin(1000) > 0.0, "{}", margin(1000));

        // A class too rare for FGD's 95% coverage is still weighed: FGD's measure leaves it
        // out, the scarce measure does not.
        let cut = TypicalPods::from_counts(
            vec![
                (class(8_000, 0, 1, 1000, 0.0), 99),
                (class(120_000, 0, 8, 1000, 0.0), 1),
            ],
            0.95,
        );
        assert_eq!(cut.pods().len(), 1);
        let cut = cut.with_cluster(&cluster);
        let access = cut.access_masks(&big);
        assert_eq!(access.len(), 2, "the typical class, then the scarce one");
        let measured =
            cut.scarce_fragmentation(CpuMilli(128_000), MemMiB(1 << 20), &free, &access, 1.0, 1.0);
        // Weight 1/99 on the kept classes' scale, excess 3, 7000 lost.
        assert!((measured - 3.0 * 7000.0 / 99.0).abs() < 1e-6, "{measured}");
    }

    #[test]
    fn a_class_scarce_by_memory_is_protected_only_where_the_memory_is() {
        // One 8-GPU node with 384 GiB, three with 192 GiB (the trace's G2 nodes with memory
        // halved): an 8-GPU pod of 257 GiB runs on a quarter of the GPUs. Its measure must see
        // memory as the census does: before, it counted the class as fitting the 192 GiB nodes
        // too, charged opening any node alike, and one-GPU pods filled the only nodes the
        // class can run on (`fgd-plus` 2.1 points below FGD at 72% arrival on that cluster).
        let node = |memory_gib: u64| {
            NodeState::new(
                NodeSpec::uniform("n", GpuMode::CoreMem, 8, "G2", MemMiB(0)).with_host(
                    CpuMilli(96_000),
                    MemMiB(memory_gib << 10),
                    1001,
                ),
            )
        };
        let (big, small) = (node(384), node(192));
        let typical = TypicalPods::new(vec![
            class(12_000, 16 << 10, 1, 1000, 9.0),
            class(64_000, 257 << 10, 8, 1000, 1.0),
        ])
        .with_cluster(&[big.clone(), small.clone(), small.clone(), small.clone()]);
        assert_eq!(typical.scarce().len(), 1, "the big class is scarce");
        let access = typical.access_masks(&small);
        let free = [1000; 8];
        // Excess scarcity 3, weight 0.1: on the small node the class strands all 8000 whatever
        // is placed; on the big one nothing until its memory runs short.
        let lost_on = |memory_gib: u64| {
            typical.scarce_fragmentation(
                CpuMilli(96_000),
                MemMiB(memory_gib << 10),
                &free,
                &access,
                0.0,
                1.0,
            )
        };
        assert!((lost_on(192) - 0.1 * 3.0 * 8000.0).abs() < 1e-6);
        assert_eq!(lost_on(384), 0.0);
        assert!(
            (lost_on(256) - lost_on(192)).abs() < 1e-6,
            "257 GiB no longer fits"
        );
        // FGD's own measure of the typical classes leaves memory out; FGD+'s counts it: with 8
        // GiB free neither class can run, and all 8000 is lost to both.
        let short = MemMiB(8 << 10);
        assert_eq!(typical.fragmentation(CpuMilli(96_000), &free, &access), 0.0);
        let with_memory =
            typical.fragmentation_with_memory(CpuMilli(96_000), short, &free, &access);
        assert!((with_memory - 8000.0).abs() < 1e-6, "{with_memory}");

        // A one-GPU pod of 48 GiB goes to a small node: there it strands nothing the big class
        // could use, on the big node it strands all of it.
        let pod = PodRequest::single(
            CpuMilli(12_000),
            MemMiB(48 << 10),
            GpuDemand::Whole { count: 1 },
        );
        let policy = Policy::scoring(ScoringPolicy::FgdPlus).with_typical(typical);
        let on_small = policy.evaluate(&small, &pod).unwrap().score;
        let on_big = policy.evaluate(&big, &pod).unwrap().score;
        assert!(on_small > on_big, "{on_small} vs {on_big}");
    }

    #[test]
    fn a_whole_node_pod_leaves_the_node_only_a_scarce_class_can_run_even_when_both_score_high() {
        // The CPU-rich node is the only one the 120-core class can run on. An 8-GPU pod that
        // fits either should take a CPU-poor node. With a large look-ahead (here raised, on
        // openb an 8-GPU pod's is about 40,000 milli-GPU), filling either empty node reduces the
        // measure by so much that the logistic score of both was exactly 100 in f64, and the
        // node order chose; the wide score keeps the scarce class's charge.
        let big = eight_gpu_node(128_000);
        let small = eight_gpu_node(64_000);
        let typical = TypicalPods::new(vec![
            class(8_000, 0, 1, 1000, 6.0),
            class(4_000, 0, 1, 600, 3.0),
            class(120_000, 0, 8, 1000, 1.0),
        ])
        .with_cluster(&[big.clone(), small.clone(), small.clone(), small.clone()]);
        let policy = Policy {
            fgd_plus: Tuning {
                lookahead: 16_000,
                ..Tuning::default()
            },
            ..Policy::scoring(ScoringPolicy::FgdPlus).with_typical(typical)
        };
        let pod = PodRequest::single(CpuMilli(64_000), MemMiB(0), GpuDemand::Whole { count: 8 });
        let on_big = policy.evaluate(&big, &pod).unwrap().score;
        let on_small = policy.evaluate(&small, &pod).unwrap().score;
        assert!(on_big > 99.0, "both reductions are large: {on_big}");
        assert!(on_small > on_big, "{on_small} vs {on_big}");
        assert!(on_small < 100.0, "{on_small}");
    }

    #[test]
    fn opening_an_idle_node_earns_a_share_of_the_host_credit_and_pays_a_rise_whole() {
        // Typical pod: one GPU and 64 GiB. An 8-GPU node with 256 GiB feeds only 4 of them.
        let typical = TypicalPods::new(vec![class(0, 65_536, 1, 1000, 1.0)]);
        let memory_poor = |used: bool| {
            let mut node = NodeState::new(
                NodeSpec::uniform("n", GpuMode::CoreMem, 8, "G2", MemMiB(0)).with_host(
                    CpuMilli(96_000),
                    MemMiB(4 * 65_536),
                    1001,
                ),
            );
            if used {
                // One GPU taken by a pod without memory: the node keeps 256 GiB for 7 GPUs.
                let first =
                    PodRequest::single(CpuMilli(0), MemMiB(0), GpuDemand::Whole { count: 1 });
                let policy = Policy::scoring(ScoringPolicy::FgdPlus);
                node.add(&crate::fit(&node, &first, &policy).unwrap());
            }
            node
        };
        let score = |node: &NodeState, memory: u64, credit: u32| {
            let tuning = Tuning {
                idle_nodes: IdleNodeGuard {
                    credit,
                    penalty: 0,
                    ..Tuning::default().idle_nodes
                },
                ..Tuning::default()
            };
            let pod =
                PodRequest::single(CpuMilli(0), MemMiB(memory), GpuDemand::Whole { count: 1 });
            score_with(&typical, tuning, node, &pod)
        };
        // A pod without memory lowers the stranding by a GPU: on the idle node the credit
        // decides how much of that counts, on the used node it always counts whole.
        let idle = memory_poor(false);
        assert!(score(&idle, 0, 100) > score(&idle, 0, 50));
        assert!(score(&idle, 0, 50) > score(&idle, 0, 0));
        let used = memory_poor(true);
        assert_eq!(score(&used, 0, 100), score(&used, 0, 0));
        // A pod of 192 GiB strands two more GPUs: charged whole whatever the credit.
        assert_eq!(score(&idle, 3 * 65_536, 100), score(&idle, 3 * 65_536, 0));
        assert!(score(&idle, 3 * 65_536, 50) < score(&idle, 0, 50));
    }

    #[test]
    fn the_idle_credit_shrinks_with_the_cover_to_none_at_the_floor() {
        let tuning = Tuning::default();
        assert_eq!(
            (tuning.idle_nodes.floor, tuning.idle_nodes.credit_cover),
            (25, 100)
        );
        let whole = f64::from(tuning.idle_nodes.credit) / 100.0;
        assert_eq!(tuning.idle_credit_at(None), whole);
        assert_eq!(tuning.idle_credit_at(Some(100)), whole);
        assert!((tuning.idle_credit_at(Some(70)) - whole * 0.6).abs() < 1e-12);
        assert_eq!(tuning.idle_credit_at(Some(25)), 0.0);
        assert_eq!(tuning.idle_credit_at(Some(10)), 0.0);
        let always_whole = Tuning {
            idle_nodes: IdleNodeGuard {
                credit_cover: 0,
                ..tuning.idle_nodes
            },
            ..tuning
        };
        assert_eq!(always_whole.idle_credit_at(Some(0)), whole);
        // Without the guard's floor the credit shrinks from the cover down to none at 0.
        let unguarded = Tuning {
            idle_nodes: IdleNodeGuard {
                floor: 0,
                ..tuning.idle_nodes
            },
            ..tuning
        };
        assert!((unguarded.idle_credit_at(Some(50)) - whole * 0.5).abs() < 1e-12);
        // A cover at or below the floor: whole from it, none below.
        let step = Tuning {
            idle_nodes: IdleNodeGuard {
                credit_cover: 20,
                ..tuning.idle_nodes
            },
            ..tuning
        };
        assert_eq!(step.idle_credit_at(Some(20)), whole);
        assert_eq!(step.idle_credit_at(Some(15)), 0.0);
    }

    #[test]
    fn a_pod_opening_an_idle_node_earns_less_host_credit_as_the_idle_nodes_dwindle() {
        // One-GPU pods of 64 GiB and 4-GPU pods of 256 GiB, three to one: the big class asks
        // 4 of every 7 GPUs (0.571). The 8-GPU nodes' 256 GiB feed only 4 GPUs.
        let typical = TypicalPods::new(vec![
            class(0, 65_536, 1, 1000, 3.0),
            class(0, 4 * 65_536, 4, 1000, 1.0),
        ]);
        let node = || {
            NodeState::new(
                NodeSpec::uniform("n", GpuMode::CoreMem, 8, "G2", MemMiB(0)).with_host(
                    CpuMilli(96_000),
                    MemMiB(4 * 65_536),
                    1001,
                ),
            )
        };
        let lean = PodRequest::single(CpuMilli(0), MemMiB(0), GpuDemand::Whole { count: 1 });
        let binpack = Policy::scoring(ScoringPolicy::Binpack);
        let used = || {
            let mut used = node();
            used.add(&crate::fit(&used, &lean, &binpack).unwrap());
            used
        };
        // Four idle nodes of ten: 0.4 / 0.571 = 0.7 of the cover; all ten idle: the whole. A
        // node without GPUs holds the cluster's spare memory, so that the host term weighs.
        let cluster =
            |idle: usize| -> Vec<NodeState> {
                let spare = NodeSpec::uniform("spare", GpuMode::CoreMem, 0, "", MemMiB(0))
                    .with_host(CpuMilli(96_000), MemMiB(1 << 30), 1001);
                (0..10)
                    .map(|i| if i < idle { node() } else { used() })
                    .chain([NodeState::new(spare)])
                    .collect()
            };
        let some_idle = typical.clone().with_cluster(&cluster(4));
        assert_eq!(some_idle.idle_cover(), Some(70));
        let all_idle = typical.clone().with_cluster(&cluster(10));
        assert_eq!(all_idle.idle_cover(), Some(100));
        let score = |typical: &TypicalPods, node: &NodeState, tuning| {
            score_with(typical, tuning, node, &lean)
        };
        let ramped = Tuning::default();
        let always_whole = Tuning {
            idle_nodes: IdleNodeGuard {
                credit_cover: 0,
                ..ramped.idle_nodes
            },
            ..ramped
        };
        // The memory-less pod lowers the idle node's stranding: credited less at 0.7.
        assert!(score(&some_idle, &node(), ramped) < score(&some_idle, &node(), always_whole));
        assert_eq!(
            score(&all_idle, &node(), ramped),
            score(&all_idle, &node(), always_whole)
        );
        // A used node is credited whole at any cover.
        assert_eq!(
            score(&some_idle, &used(), ramped),
            score(&some_idle, &used(), always_whole)
        );
    }

    #[test]
    fn opening_an_idle_node_is_guarded_once_the_idle_nodes_cover_few_big_pods() {
        // One-GPU pods of 12 cores and 4-GPU pods of 48, three to one: the big class holds 4
        // of every 7 GPUs asked (0.571), 12 cores asked per GPU; 128-core nodes leave slack.
        let typical = TypicalPods::new(vec![
            class(12_000, 0, 1, 1000, 3.0),
            class(48_000, 0, 4, 1000, 1.0),
        ]);
        let node = || eight_gpu_node(128_000);
        let one = PodRequest::single(CpuMilli(1000), MemMiB(0), GpuDemand::Whole { count: 1 });
        let binpack = Policy::scoring(ScoringPolicy::Binpack);
        let used = |mut node: NodeState| {
            node.add(&crate::fit(&node, &one, &binpack).unwrap());
            node
        };
        // Nine used nodes and one idle: 8 of 80 GPUs idle, a cover of 0.1 / 0.571 = 0.175.
        let one_idle_of_ten = |node: &dyn Fn() -> NodeState| -> Vec<NodeState> {
            let mut cluster: Vec<NodeState> = (0..9).map(|_| used(node())).collect();
            cluster.push(node());
            cluster
        };
        let cluster = one_idle_of_ten(&node);
        let few_idle = typical.clone().with_cluster(&cluster);
        assert_eq!(few_idle.idle_cover(), Some(15));
        let idle_cluster: Vec<NodeState> = (0..10).map(|_| node()).collect();
        let all_idle = typical.clone().with_cluster(&idle_cluster);
        assert_eq!(all_idle.idle_cover(), Some(100));
        // A CPU-heavy one-GPU pod: 64 cores leave the idle node's other GPUs short of CPU.
        let heavy = PodRequest::single(CpuMilli(64_000), MemMiB(0), GpuDemand::Whole { count: 1 });
        let score_of = |pod: &PodRequest, typical: &TypicalPods, node: &NodeState, tuning| {
            score_with(typical, tuning, node, pod)
        };
        let score = |typical: &TypicalPods, node: &NodeState, tuning| {
            score_of(&heavy, typical, node, tuning)
        };
        let guarded = Tuning::default();
        let penalty_only = Tuning {
            idle_nodes: IdleNodeGuard {
                guard_rise: 100,
                ..guarded.idle_nodes
            },
            ..guarded
        };
        let off = Tuning {
            idle_nodes: IdleNodeGuard {
                floor: 0,
                ..guarded.idle_nodes
            },
            ..guarded
        };
        let idle = node();
        assert!(score(&few_idle, &idle, guarded) < score(&few_idle, &idle, penalty_only));
        assert!(score(&few_idle, &idle, penalty_only) < score(&few_idle, &idle, off));
        // Enough idle nodes, or a used node: no guard.
        assert_eq!(
            score(&all_idle, &idle, guarded),
            score(&all_idle, &idle, off)
        );
        let used = used(node());
        assert_eq!(
            score(&few_idle, &used, guarded),
            score(&few_idle, &used, off)
        );
        // Where no node has CPU to spare beside its GPUs (96 cores for 8 GPUs at 12 per GPU)
        // the host term is off, and so is the guard's charge.
        let tight_node = || eight_gpu_node(96_000);
        let tight = typical.clone().with_cluster(&one_idle_of_ten(&tight_node));
        assert_eq!(tight.host_slack(), Some(0.0));
        assert_eq!(tight.idle_cover(), Some(15));
        let light = |tuning| score_of(&one, &tight, &tight_node(), tuning);
        assert_eq!(light(guarded), light(off));
        // Without big classes there is nothing to guard the idle nodes for.
        let small = TypicalPods::new(vec![class(12_000, 0, 1, 1000, 1.0)]).with_cluster(&cluster);
        assert_eq!(small.idle_cover(), None);
        assert_eq!(score(&small, &idle, guarded), score(&small, &idle, off));
    }

    #[test]
    fn opening_an_idle_node_costs_the_penalty() {
        let node = NodeState::new(NodeSpec::uniform("n", GpuMode::CoreMem, 2, "T4", MemMiB(0)));
        let typical = TypicalPods::new(vec![class(0, 0, 1, 1000, 1.0)]);
        let policy = Policy::scoring(ScoringPolicy::FgdPlus).with_typical(typical);
        let pod = PodRequest::single(CpuMilli(0), MemMiB(0), GpuDemand::Whole { count: 1 });
        let charged = policy.evaluate(&node, &pod).unwrap().score;
        let free = Policy {
            fgd_plus: Tuning {
                idle_nodes: IdleNodeGuard {
                    penalty: 0,
                    ..Tuning::default().idle_nodes
                },
                ..Tuning::default()
            },
            ..policy.clone()
        }
        .evaluate(&node, &pod)
        .unwrap()
        .score;
        assert!(free > charged);
        assert!((0.0..=100.0).contains(&charged));
    }

    #[test]
    fn the_hold_gives_a_cpu_only_pod_only_what_the_free_gpus_do_not_need() {
        // The typical pod asks 8 cores per GPU; the node has 4 GPUs and 40 cores.
        let (held, unheld) = super::super::fgd_plus_held_and_unheld(CpuMilli(8000));
        assert!(held.fgd_plus.hold_host, "on by default");
        let cpu_only =
            |cores: u64| PodRequest::single(CpuMilli(cores * 1000), MemMiB(0), GpuDemand::None);
        let mut node = idle_node(4, "T4", 40_000);
        // An idle node of four GPUs or more is kept for GPU pods, however much CPU it has to spare.
        assert_eq!(
            held.evaluate(&node, &cpu_only(1)).map(|e| e.score),
            Err(RejectReason::HostHeldForGpus)
        );
        assert!(unheld.evaluate(&node, &cpu_only(1)).is_ok(), "turned off");
        // GPU pods are never held.
        let gpu_pod = PodRequest::single(CpuMilli(8000), MemMiB(0), GpuDemand::Whole { count: 1 });
        let placed = held.evaluate(&node, &gpu_pod).unwrap();
        node.add(&placed.allocation);
        // 32 cores left beside 3 free GPUs, which need 24: 8 to spare, and not one more.
        assert!(held.evaluate(&node, &cpu_only(8)).is_ok());
        assert_eq!(
            held.evaluate(&node, &cpu_only(9)).map(|e| e.score),
            Err(RejectReason::HostHeldForGpus)
        );
        assert_eq!(
            held.evaluate_score(&node, &cpu_only(9)),
            Err(RejectReason::HostHeldForGpus),
            "filter's path refuses as bind's does"
        );
        // A smaller idle node gives what its free GPUs do not need: 2 GPUs need 16 of 40 cores.
        let small = idle_node(2, "T4", 40_000);
        assert!(held.evaluate(&small, &cpu_only(24)).is_ok());
        assert_eq!(
            held.evaluate(&small, &cpu_only(25)).map(|e| e.score),
            Err(RejectReason::HostHeldForGpus)
        );
        // A node without GPUs takes any pod that fits.
        let cpu_node = idle_node(0, "", 40_000);
        assert!(held.evaluate(&cpu_node, &cpu_only(30)).is_ok());
    }
}
