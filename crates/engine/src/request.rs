//! What a pod asks for: host resources, per-container GPU demands and model constraints, and the
//! validation that turns raw numbers into a demand or a user-readable error.

use thiserror::Error;

use super::mig::{BadMigProfile, MigSlices, normalized};
use super::model::{ComputeMilli, CpuMilli, GpuMode, GpuPlacement, MemMiB};

/// The GPU demand of one container.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GpuDemand {
    /// No GPU.
    #[default]
    None,
    /// `count` whole GPUs, each held by this pod alone (`nvidia.com/gpu`).
    Whole { count: u16 },
    /// `count` whole GPUs with the best interconnect on the node (`aliyun.com/gpu`, topology nodes).
    Topology { count: u16 },
    /// A share of `gpus` distinct GPUs, the same amount on each: memory, and compute when the node
    /// shares compute too (`core_mem`). Compute 0 means a memory-only share.
    Share {
        gpus: u16,
        mem_per_gpu: MemMiB,
        compute_per_gpu: ComputeMilli,
    },
}

/// Why raw request numbers do not make a valid demand. Messages are shown to users in the pod's
/// FailedScheduling event, so they name the resource and say what would be valid.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum RequestError {
    #[error("GPU memory {total_gib} GiB cannot be split evenly over {gpus} GPUs")]
    UnevenSplit { total_gib: u64, gpus: u16 },
    #[error("GPU core percentage {percent} must be a multiple of {step} between {step} and 100")]
    BadCorePercent { percent: u32, step: u32 },
    #[error("GPU core percentage needs a GPU memory request as well")]
    CoreWithoutMemory,
    #[error("a GPU count of 0 was requested together with GPU memory")]
    ZeroGpuCount,
    #[error("too many GPUs requested ({0}); the most one node can have is 64")]
    TooManyGpus(u64),
    #[error(
        "model pattern {0:?} is not valid: use letters, digits, '-', '_', '.', and an optional trailing '*'"
    )]
    BadModelPattern(String),
    #[error("conflicting GPU requests in one container: {0}")]
    Conflicting(&'static str),
    #[error(transparent)]
    BadMigProfile(#[from] BadMigProfile),
}

/// How compute percentages are read: cGPU's rules by default (multiples of 5, always with GPU
/// memory); HAMi's `gpucores` take any whole percent and may come without memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShareRules {
    /// Percentages must be a multiple of this (1..=100).
    pub core_percent_step: u32,
    /// A percentage without a memory request asks for that much compute on one GPU and no memory.
    pub core_without_memory: bool,
}

impl Default for ShareRules {
    fn default() -> Self {
        Self {
            core_percent_step: 5,
            core_without_memory: false,
        }
    }
}

impl ShareRules {
    /// A compute percentage per GPU in milli-GPU, if these rules accept it.
    fn compute(self, percent: u32) -> Result<ComputeMilli, RequestError> {
        let step = self.core_percent_step.max(1);
        if percent.is_multiple_of(step) && (step..=100).contains(&percent) {
            Ok(ComputeMilli(percent * 10))
        } else {
            Err(RequestError::BadCorePercent { percent, step })
        }
    }
}

impl GpuDemand {
    /// `count` whole GPUs; 0 means no GPU.
    pub fn whole(count: u64) -> Result<Self, RequestError> {
        match count {
            0 => Ok(Self::None),
            n => Ok(Self::Whole {
                count: gpu_count(n)?,
            }),
        }
    }

    /// `count` whole GPUs chosen by interconnect; 0 means no GPU.
    pub fn topology(count: u64) -> Result<Self, RequestError> {
        match count {
            0 => Ok(Self::None),
            n => Ok(Self::Topology {
                count: gpu_count(n)?,
            }),
        }
    }

    /// A memory share: `total_gib` GiB split evenly over `gpus` GPUs, with an optional compute
    /// percentage per GPU (5..=100, a multiple of 5), under cGPU's rules ([`ShareRules::default`]).
    pub fn share(
        total_gib: u64,
        gpus: u64,
        core_percent: Option<u32>,
    ) -> Result<Self, RequestError> {
        Self::share_under(total_gib, gpus, core_percent, ShareRules::default())
    }

    /// [`GpuDemand::share`] under the given rules: the compute percentage's step, and whether a
    /// percentage alone (no memory) is a compute-only share of one GPU.
    pub fn share_under(
        total_gib: u64,
        gpus: u64,
        core_percent: Option<u32>,
        rules: ShareRules,
    ) -> Result<Self, RequestError> {
        if total_gib == 0 {
            return match core_percent {
                None => Ok(Self::None),
                Some(_) if !rules.core_without_memory => Err(RequestError::CoreWithoutMemory),
                Some(percent) => Ok(Self::Share {
                    gpus: 1,
                    mem_per_gpu: MemMiB(0),
                    compute_per_gpu: rules.compute(percent)?,
                }),
            };
        }
        if gpus == 0 {
            return Err(RequestError::ZeroGpuCount);
        }
        let count = gpu_count(gpus)?;
        if !total_gib.is_multiple_of(u64::from(count)) {
            return Err(RequestError::UnevenSplit {
                total_gib,
                gpus: count,
            });
        }
        // Saturating: an absurd quantity must not wrap into a small one (or panic); it becomes a
        // demand no GPU has room for, which `fit` rejects as too large for the node.
        let mem_per_gpu = MemMiB((total_gib / u64::from(count)).saturating_mul(1024));
        Self::share_per_gpu(mem_per_gpu, gpus, core_percent, rules)
    }

    /// A share of `gpus` GPUs with `mem_per_gpu` memory on each (HAMi's `gpumem`, MiB per GPU)
    /// and an optional compute percentage per GPU under `rules`. No memory and no percentage is
    /// no GPU; a percentage alone follows [`ShareRules::core_without_memory`] on `gpus` GPUs.
    pub fn share_per_gpu(
        mem_per_gpu: MemMiB,
        gpus: u64,
        core_percent: Option<u32>,
        rules: ShareRules,
    ) -> Result<Self, RequestError> {
        if mem_per_gpu.0 == 0 {
            match core_percent {
                None => return Ok(Self::None),
                Some(_) if !rules.core_without_memory => {
                    return Err(RequestError::CoreWithoutMemory);
                }
                Some(_) => {}
            }
        }
        if gpus == 0 {
            return Err(RequestError::ZeroGpuCount);
        }
        let gpus = gpu_count(gpus)?;
        let compute_per_gpu = match core_percent {
            None => ComputeMilli(0),
            Some(percent) => rules.compute(percent)?,
        };
        Ok(Self::Share {
            gpus,
            mem_per_gpu,
            compute_per_gpu,
        })
    }

    /// How many distinct GPUs the demand touches.
    pub fn gpu_count(&self) -> u16 {
        match *self {
            Self::None => 0,
            Self::Whole { count } | Self::Topology { count } => count,
            Self::Share { gpus, .. } => gpus,
        }
    }

    /// Whether the container needs any GPU.
    pub fn is_none(&self) -> bool {
        self.gpu_count() == 0
    }

    /// Whether a node in `mode` can serve this demand at all.
    pub fn served_by(&self, mode: GpuMode) -> bool {
        match *self {
            Self::None | Self::Whole { .. } => true,
            Self::Topology { .. } => mode == GpuMode::Topology,
            Self::Share {
                compute_per_gpu, ..
            } => match mode {
                GpuMode::CoreMem => true,
                GpuMode::ShareMemory => compute_per_gpu == ComputeMilli(0),
                GpuMode::Exclusive | GpuMode::Topology => false,
            },
        }
    }
}

fn gpu_count(n: u64) -> Result<u16, RequestError> {
    if n > 64 {
        Err(RequestError::TooManyGpus(n))
    } else {
        Ok(n as u16)
    }
}

/// A GPU card model pattern: an exact name, or a prefix ending in `*`. Names compare
/// case-insensitively with ' ' and '_' read as '-', and never as substrings, so `A10` never
/// matches `A100`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ModelPattern {
    normalized: String,
    prefix: bool,
}

impl ModelPattern {
    /// Parses a pattern; anything but letters, digits, `-`, `_`, `.`, spaces and a trailing `*` is
    /// rejected.
    pub fn parse(raw: &str) -> Result<Self, RequestError> {
        let trimmed = raw.trim();
        let (body, prefix) = match trimmed.strip_suffix('*') {
            Some(body) => (body, true),
            None => (trimmed, false),
        };
        let valid = !body.is_empty()
            && body
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ' '));
        if !valid {
            return Err(RequestError::BadModelPattern(raw.to_owned()));
        }
        Ok(Self {
            normalized: normalize_model(body),
            prefix,
        })
    }

    /// Whether a GPU model name matches.
    pub fn matches(&self, model: &str) -> bool {
        self.matches_normalized(&normalize_model(model))
    }

    /// Whether a model name already in [`normalize_model`] form matches (no allocation).
    pub fn matches_normalized(&self, model: &str) -> bool {
        if self.prefix {
            model.starts_with(&self.normalized)
        } else {
            model == self.normalized
        }
    }
}

/// The pattern as written in its normalised form (`a100*`): parsing it gives the same pattern.
impl std::fmt::Display for ModelPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.normalized)?;
        if self.prefix {
            f.write_str("*")?;
        }
        Ok(())
    }
}

/// The form model names are compared in.
pub fn normalize_model(model: &str) -> String {
    model
        .trim()
        .chars()
        .map(|c| match c {
            ' ' | '_' => '-',
            other => other.to_ascii_lowercase(),
        })
        .collect()
}

/// Whether interconnect quality is a must or a wish for a multi-GPU pod.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TopologyPreference {
    /// No particular wish beyond the node's defaults.
    #[default]
    Any,
    /// Prefer nodes that offer a group as well connected as their best: such a node outranks
    /// every node that does not, whatever the scoring policy says; a worse group is still taken
    /// when no node offers a best one (see `policy::topology::preferred_score`).
    Preferred,
    /// Reject nodes whose free GPUs hold no group connected as well as the node's best group.
    Required,
}

/// What a pod says about which GPUs it can use, beyond resource amounts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuConstraints {
    /// If non-empty, only these models.
    pub include_models: Vec<ModelPattern>,
    /// Never these models.
    pub exclude_models: Vec<ModelPattern>,
    /// Only GPUs with at least this much memory.
    pub min_memory_per_gpu: Option<MemMiB>,
    /// Overrides the node's binpack/spread for this pod's shares.
    pub placement: Option<GpuPlacement>,
    pub topology: TopologyPreference,
}

impl GpuConstraints {
    /// Whether a GPU whose model is already in [`normalize_model`] form passes the model lists.
    pub fn accepts_model(&self, normalized_model: &str) -> bool {
        let included = self.include_models.is_empty()
            || self
                .include_models
                .iter()
                .any(|p| p.matches_normalized(normalized_model));
        included
            && !self
                .exclude_models
                .iter()
                .any(|p| p.matches_normalized(normalized_model))
    }

    /// Whether a GPU is big enough for the pod's minimum.
    pub fn accepts_memory(&self, memory: MemMiB) -> bool {
        self.min_memory_per_gpu.is_none_or(|min| memory >= min)
    }
}

/// One container's request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerRequest {
    pub name: String,
    pub gpu: GpuDemand,
}

/// A pod's whole request, as the watchers translate it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodRequest {
    /// Effective CPU request (Kubernetes' init-container rule already applied).
    pub cpu: CpuMilli,
    /// Effective memory request.
    pub memory: MemMiB,
    pub containers: Vec<ContainerRequest>,
    pub init_containers: Vec<ContainerRequest>,
    /// MIG slices the pod asks for, all its containers together (Kubernetes' rule for
    /// extended resources), by profile: normalized ([`crate::mig::normalized`]).
    pub mig: Vec<MigSlices>,
    pub constraints: GpuConstraints,
}

impl PodRequest {
    /// A one-container pod: the common case and the tests' shorthand.
    pub fn single(cpu: CpuMilli, memory: MemMiB, gpu: GpuDemand) -> Self {
        Self {
            cpu,
            memory,
            containers: vec![ContainerRequest {
                name: "main".to_owned(),
                gpu,
            }],
            init_containers: Vec::new(),
            mig: Vec::new(),
            constraints: GpuConstraints::default(),
        }
    }

    /// Sets the MIG slices the pod asks for (normalized here).
    pub fn with_mig(mut self, mig: Vec<MigSlices>) -> Self {
        self.mig = normalized(mig);
        self
    }

    /// Replaces the constraints.
    pub fn with_constraints(mut self, constraints: GpuConstraints) -> Self {
        self.constraints = constraints;
        self
    }

    /// Whether the pod needs a GPU: a container (init or app) asks for GPUs, or the pod asks
    /// for MIG slices.
    pub fn wants_gpu(&self) -> bool {
        self.wants_gpu_grants() || !self.mig.is_empty()
    }

    /// Whether any container (init or app) asks for GPUs the extender places (whole cards or
    /// shares), MIG slices aside.
    pub fn wants_gpu_grants(&self) -> bool {
        self.all_containers().any(|c| !c.gpu.is_none())
    }

    /// App containers first, then init containers.
    pub fn all_containers(&self) -> impl Iterator<Item = &ContainerRequest> {
        self.containers.iter().chain(self.init_containers.iter())
    }

    /// The demand that dominates scoring: the app container with the most GPUs, or else the
    /// largest init container.
    pub fn primary_demand(&self) -> GpuDemand {
        let largest = |list: &[ContainerRequest]| {
            list.iter()
                .map(|c| c.gpu)
                .max_by_key(|d| (d.gpu_count(), demand_size(d)))
        };
        largest(&self.containers)
            .filter(|d| !d.is_none())
            .or_else(|| largest(&self.init_containers))
            .unwrap_or_default()
    }
}

fn demand_size(demand: &GpuDemand) -> (u64, u32) {
    match *demand {
        GpuDemand::Share {
            mem_per_gpu,
            compute_per_gpu,
            ..
        } => (mem_per_gpu.0, compute_per_gpu.0),
        _ => (u64::MAX, 1000),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_splits_memory_evenly_or_explains_why_not() {
        assert_eq!(
            GpuDemand::share(16, 2, None),
            Ok(GpuDemand::Share {
                gpus: 2,
                mem_per_gpu: MemMiB(8 * 1024),
                compute_per_gpu: ComputeMilli(0)
            })
        );
        let err = GpuDemand::share(15, 2, None).unwrap_err();
        assert_eq!(
            err,
            RequestError::UnevenSplit {
                total_gib: 15,
                gpus: 2
            }
        );
        assert!(
            err.to_string()
                .contains("cannot be split evenly over 2 GPUs")
        );
    }

    #[test]
    fn a_model_pattern_written_out_parses_back_to_itself() {
        for raw in ["Tesla V100_SXM2", "A100*", "t4", "G2"] {
            let pattern = ModelPattern::parse(raw).unwrap();
            assert_eq!(ModelPattern::parse(&pattern.to_string()).unwrap(), pattern);
        }
    }

    #[test]
    fn hami_rules_take_any_whole_percent_and_compute_alone() {
        let hami = ShareRules {
            core_percent_step: 1,
            core_without_memory: true,
        };
        assert_eq!(
            GpuDemand::share_under(0, 1, Some(81), hami),
            Ok(GpuDemand::Share {
                gpus: 1,
                mem_per_gpu: MemMiB(0),
                compute_per_gpu: ComputeMilli(810),
            })
        );
        assert!(matches!(
            GpuDemand::share_under(4, 1, Some(33), hami),
            Ok(GpuDemand::Share {
                compute_per_gpu: ComputeMilli(330),
                ..
            })
        ));
        for bad in [0, 101] {
            assert_eq!(
                GpuDemand::share_under(0, 1, Some(bad), hami),
                Err(RequestError::BadCorePercent {
                    percent: bad,
                    step: 1
                })
            );
        }
        assert_eq!(
            GpuDemand::share_under(0, 1, None, hami),
            Ok(GpuDemand::None)
        );
        let step_ten = ShareRules {
            core_percent_step: 10,
            core_without_memory: false,
        };
        assert!(GpuDemand::share_under(4, 1, Some(30), step_ten).is_ok());
        assert_eq!(
            GpuDemand::share_under(4, 1, Some(35), step_ten),
            Err(RequestError::BadCorePercent {
                percent: 35,
                step: 10
            })
        );
        assert_eq!(
            GpuDemand::share_under(0, 1, Some(30), step_ten),
            Err(RequestError::CoreWithoutMemory)
        );
    }

    #[test]
    fn core_percent_must_be_a_multiple_of_five_in_range() {
        assert!(matches!(
            GpuDemand::share(4, 1, Some(35)),
            Ok(GpuDemand::Share {
                compute_per_gpu: ComputeMilli(350),
                ..
            })
        ));
        for bad in [0, 3, 33, 101, 105] {
            assert_eq!(
                GpuDemand::share(4, 1, Some(bad)),
                Err(RequestError::BadCorePercent {
                    percent: bad,
                    step: 5
                })
            );
        }
        assert_eq!(
            GpuDemand::share(0, 1, Some(50)),
            Err(RequestError::CoreWithoutMemory)
        );
        assert_eq!(
            GpuDemand::share(4, 0, None),
            Err(RequestError::ZeroGpuCount)
        );
        assert_eq!(GpuDemand::whole(65), Err(RequestError::TooManyGpus(65)));
    }

    #[test]
    fn model_patterns_match_whole_names_not_substrings() {
        let a10 = ModelPattern::parse("A10").unwrap();
        assert!(a10.matches("a10"));
        assert!(
            !a10.matches("A100"),
            "regression: substring matching sent A10 pods to A100 nodes"
        );
        let v100 = ModelPattern::parse("Tesla V100*").unwrap();
        assert!(v100.matches("Tesla-V100-SXM2-32GB"));
        assert!(!v100.matches("Tesla-P100"));
        assert!(matches!(
            ModelPattern::parse("A100|H100"),
            Err(RequestError::BadModelPattern(_))
        ));
        assert!(ModelPattern::parse("*").is_err());
    }

    /// Regression: converting GiB to MiB multiplied without a bound, so a huge `gpu-mem`
    /// quantity panicked in debug builds and wrapped to a small demand in release builds.
    #[test]
    fn regression_huge_gpu_memory_request_does_not_overflow() {
        assert_eq!(
            GpuDemand::share(u64::MAX / 2, 1, None),
            Ok(GpuDemand::Share {
                gpus: 1,
                mem_per_gpu: MemMiB(u64::MAX),
                compute_per_gpu: ComputeMilli(0)
            })
        );
    }

    #[test]
    fn modes_serve_only_their_requests() {
        let mem_only = GpuDemand::share(4, 1, None).unwrap();
        let mem_core = GpuDemand::share(4, 1, Some(30)).unwrap();
        assert!(mem_only.served_by(GpuMode::ShareMemory) && mem_only.served_by(GpuMode::CoreMem));
        assert!(!mem_core.served_by(GpuMode::ShareMemory) && mem_core.served_by(GpuMode::CoreMem));
        assert!(!mem_only.served_by(GpuMode::Exclusive));
        assert!(GpuDemand::Topology { count: 2 }.served_by(GpuMode::Topology));
        assert!(!GpuDemand::Topology { count: 2 }.served_by(GpuMode::Exclusive));
        assert!(GpuDemand::Whole { count: 2 }.served_by(GpuMode::CoreMem));
    }
}
