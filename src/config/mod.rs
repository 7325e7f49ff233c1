//! Configuration: the only reader of configuration files, `GPU_EXTENDER_*` environment variables
//! and command-line overrides. Everything has a default; the result is validated once, here, with
//! messages that name the offending key, and the rest of the program receives a plain [`Config`]
//! value (no globals). Every key is documented in `docs/configuration.md`.
//!
//! Precedence, lowest first: built-in defaults, the YAML file, environment variables, flags.
//! Environment variables and flags are both "overrides": a dotted key such as
//! `policy.maxPodsPerSharedGpu` and a value written in YAML (so lists can be given in flow style,
//! `[a, b]`).
//!
//! ```
//! use gpu_extender::config::Config;
//! let yaml = "policy:\n  scoring: spread\n";
//! let env = [("GPU_EXTENDER_BIND_RESERVATION_TTL_SECONDS".to_owned(), "60".to_owned())];
//! let flags = [(
//!     "server.listen".to_owned(),
//!     "127.0.0.1:8888".to_owned(),
//!     "flag --listen".to_owned(),
//! )];
//! let cfg = Config::from_sources(Some(("config.yaml", yaml)), &env, &flags).unwrap();
//! assert_eq!(cfg.policy.scoring.as_str(), "spread");
//! assert_eq!(cfg.bind.reservation_ttl_seconds, 60);
//! assert_eq!(cfg.server.listen.port(), 8888);
//! ```

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use gpu_engine::policy::fgd_plus;
use gpu_engine::policy::typical::Scarcity;
use gpu_engine::{ModelPattern, Policy, ScoringPolicy, ShareRules, TypicalPod, TypicalPods};

mod flags;
mod names;
mod sources;
#[cfg(test)]
mod tests;
mod validate;

pub use flags::{ConfigFlags, ServeFlags, set_overrides};
pub use names::{is_dns_label, is_dns_subdomain, is_extended_resource_name, is_qualified_name};
pub use sources::{env_overrides, env_var_name, env_vars, parse_override};

/// The prefix of every environment variable this module reads.
pub const ENV_PREFIX: &str = "GPU_EXTENDER_";

/// Environment variables under [`ENV_PREFIX`] that are not configuration keys: the binary reads
/// them itself (the config file path, the log filter, `inspect`'s token), so they are not
/// typos. The build and test tooling's variables have a prefix of their own, `GPU_TEST_`
/// (docs/testing.md), so the product knows nothing of them.
pub const RESERVED_ENV: &[&str] = &[
    "GPU_EXTENDER_CONFIG",
    "GPU_EXTENDER_LOG",
    "GPU_EXTENDER_LOG_FORMAT",
    // The bearer token `inspect --from` sends (src/cli.rs).
    "GPU_EXTENDER_ADMIN_TOKEN",
];

/// Every configuration key, as a dotted path. Each one can be overridden by a flag
/// (`--set KEY=VALUE`) and by the environment variable [`env_var_name`] gives for it.
pub const KEYS: &[&str] = &[
    "resources.wholeGpu",
    "resources.gpuMem",
    "resources.gpuCore",
    "resources.topologyGpu",
    "resources.gpuCount",
    "resources.gpuCorePercentStep",
    "resources.gpuCoreWithoutMemory",
    "resources.sharing",
    "nodeLabels.mode",
    "nodeLabels.placement",
    "nodeLabels.model",
    "nodeLabels.memory",
    "nodeLabels.count",
    "nodeLabels.gfdProduct",
    "nodeLabels.gfdMemory",
    "nodeLabels.gfdCount",
    "annotations.allocation",
    "annotations.nodeGpus",
    "annotations.modelInclude",
    "annotations.modelExclude",
    "annotations.minGpuMemory",
    "annotations.placement",
    "annotations.topology",
    "annotations.requeue",
    "gpushare.enabled",
    "policy.scoring",
    "policy.maxPodsPerSharedGpu",
    "policy.typicalPods.learn",
    "policy.typicalPods.learnIntervalSeconds",
    "policy.typicalPods.pods",
    "policy.filterBestOnly",
    "policy.fgdPlus.lookahead",
    "policy.fgdPlus.scarcity.models",
    "policy.fgdPlus.scarcity.shapes",
    "policy.fgdPlus.scarcity.measured",
    "policy.fgdPlus.host.weight",
    "policy.fgdPlus.host.slack",
    "policy.fgdPlus.idleNodes.penalty",
    "policy.fgdPlus.idleNodes.credit",
    "policy.fgdPlus.idleNodes.creditCover",
    "policy.fgdPlus.idleNodes.floor",
    "policy.fgdPlus.idleNodes.guardPenalty",
    "policy.fgdPlus.idleNodes.guardRise",
    "policy.fgdPlus.holdHostForGpus",
    "server.listen",
    "server.urlPrefix",
    "server.adminListen",
    "server.bodyLimitBytes",
    "server.tls.certFile",
    "server.tls.keyFile",
    "server.tls.clientCaFile",
    "server.tls.reloadIntervalSeconds",
    "server.tls.allowedClientNames",
    "server.allowUnauthenticatedVerbs",
    "server.schedulerNames",
    "server.adminTls.certFile",
    "server.adminTls.keyFile",
    "server.adminTls.clientCaFile",
    "server.adminTls.reloadIntervalSeconds",
    "server.adminTls.allowedClientNames",
    "server.adminAuth.paths",
    "server.adminAuth.cacheTtlSeconds",
    "server.adminAuth.audiences",
    "server.adminAuth.failedTokensPerMinute",
    "server.requestTimeoutMs",
    "bind.reservationTtlSeconds",
    "bind.events",
    "watch.protobuf",
    "requeue.enabled",
    "requeue.maxPodsPerNode",
    "requeue.minIntervalSeconds",
    "writerLease.name",
    "writerLease.namespace",
    "writerLease.durationSeconds",
    "quota.reclaim.enabled",
    "quota.reclaim.intervalSeconds",
    "quota.reclaim.coolDownSeconds",
    "limits.maxConcurrentRequests",
    "limits.maxConcurrentAdminRequests",
    "limits.maxConnections",
    "limits.headerReadTimeoutMs",
    "limits.bodyReadTimeoutMs",
    "limits.maxBufferedBodyBytes",
    "limits.metricsRenderIntervalMs",
    "estimator.listen",
    "estimator.cluster",
    "estimator.tls.certFile",
    "estimator.tls.keyFile",
    "estimator.tls.clientCaFile",
    "estimator.tls.reloadIntervalSeconds",
    "estimator.tls.allowedClientNames",
    "estimator.allowUnauthenticated",
    "estimator.maxConcurrentRequests",
    "webhook.listen",
    "webhook.labelNodes",
    "webhook.tls.certFile",
    "webhook.tls.keyFile",
    "webhook.tls.clientCaFile",
    "webhook.tls.reloadIntervalSeconds",
    "webhook.tls.allowedClientNames",
    "dra.enabled",
    "dra.drivers",
];

/// Why the configuration could not be loaded. Messages name the file, variable or key at fault.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The YAML is malformed, a field is unknown (a typo) or a value has the wrong type. The
    /// message carries the field path and line, e.g. `policy: unknown field "scorng" ...`.
    #[error("config file {source_name}: {message}")]
    Parse {
        source_name: String,
        message: String,
    },
    #[error("unknown configuration key {key:?} (from {origin}); see docs/configuration.md")]
    UnknownKey { key: String, origin: String },
    #[error("unknown environment variable {0}: not a configuration key; see docs/configuration.md")]
    UnknownEnv(String),
    #[error("{key} (from {origin}): {message}")]
    Override {
        key: String,
        origin: String,
        message: String,
    },
    #[error("override {0:?} must have the form KEY=VALUE")]
    MalformedOverride(String),
    /// Values that parse but make no sense, every one listed as `key: problem`.
    #[error("invalid configuration: {}", .0.join("; "))]
    Invalid(Vec<String>),
}

/// The whole configuration. `Default` is the configuration with no file, env or flags.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Config {
    pub resources: Resources,
    pub node_labels: NodeLabels,
    pub annotations: Annotations,
    pub gpushare: Gpushare,
    pub policy: PolicyConfig,
    pub server: ServerConfig,
    pub bind: BindConfig,
    pub watch: WatchConfig,
    pub requeue: RequeueConfig,
    pub writer_lease: WriterLeaseConfig,
    pub quota: QuotaConfig,
    pub limits: Limits,
    pub estimator: EstimatorConfig,
    pub webhook: WebhookConfig,
    pub dra: DraConfig,
}

/// Extended resource names pods request and nodes advertise, and the pod label for multi-GPU
/// sharing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Resources {
    /// Whole GPUs on exclusive nodes.
    pub whole_gpu: String,
    /// GPU memory in GiB on sharing nodes (MiB per GPU with [`Sharing::Hami`]).
    pub gpu_mem: String,
    /// GPU compute percentage (5..100) on `core_mem` nodes.
    pub gpu_core: String,
    /// Whole GPUs chosen by interconnect on `topology` nodes.
    pub topology_gpu: String,
    /// Pod label: split the GPU memory request over this many GPUs. Also read as a node
    /// capacity (the gpushare device plugin advertises the GPU count under this name).
    pub gpu_count: String,
    /// Compute percentages must be a multiple of this: 5 as cGPU, 1 for HAMi's `gpucores`.
    pub gpu_core_percent_step: u32,
    /// A compute percentage without GPU memory asks for compute alone on one GPU (HAMi's
    /// `gpucores` without `gpumem`, and the trace replay's milli-GPU shares); cGPU refuses it.
    pub gpu_core_without_memory: bool,
    /// How a container's GPU resources combine into a share: cGPU's or HAMi's.
    pub sharing: Sharing,
}

/// Whose resource semantics a container's GPU request follows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Sharing {
    /// Alibaba cGPU / gpushare: `gpuMem` is GiB in total, split evenly over the pod label
    /// `gpuCount` GPUs; `wholeGpu` with `gpuMem` or `gpuCore` in one container is a conflict.
    #[default]
    Cgpu,
    /// HAMi: `wholeGpu` is the number of GPUs, `gpuMem` MiB on each of them, `gpuCore` a
    /// percentage of each; `wholeGpu` alone (or with `gpuCore` alone, unless
    /// `gpuCoreWithoutMemory`) takes whole GPUs, as HAMi then gives the pod all the card's memory.
    Hami,
}

impl Resources {
    /// How compute percentages are read.
    pub fn share_rules(&self) -> ShareRules {
        ShareRules {
            core_percent_step: self.gpu_core_percent_step,
            core_without_memory: self.gpu_core_without_memory,
        }
    }
}

impl Default for Resources {
    fn default() -> Self {
        Self {
            whole_gpu: "nvidia.com/gpu".into(),
            gpu_mem: "aliyun.com/gpu-mem".into(),
            gpu_core: "aliyun.com/gpu-core.percentage".into(),
            topology_gpu: "aliyun.com/gpu".into(),
            gpu_count: "aliyun.com/gpu-count".into(),
            gpu_core_percent_step: 5,
            gpu_core_without_memory: false,
            sharing: Sharing::Cgpu,
        }
    }
}

/// Node label keys: ACK's, then NVIDIA GPU Feature Discovery's as fallbacks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct NodeLabels {
    /// GPU sharing mode: absent/`default`, `cgpu`/`share`/`mps`, `core_mem`, `topology`.
    pub mode: String,
    /// Share placement on multi-GPU nodes: `binpack` (default) or `spread`.
    pub placement: String,
    /// Card model.
    pub model: String,
    /// Memory per card (`16160MiB`, `16GiB`, or a bare number of MiB).
    pub memory: String,
    /// Number of cards.
    pub count: String,
    /// GFD card model, used when `model` is absent.
    pub gfd_product: String,
    /// GFD memory per card in MiB, used when `memory` is absent.
    pub gfd_memory: String,
    /// GFD number of cards, used when `count` is absent.
    pub gfd_count: String,
}

impl Default for NodeLabels {
    fn default() -> Self {
        Self {
            mode: "ack.node.gpu.schedule".into(),
            placement: "ack.node.gpu.placement".into(),
            model: "aliyun.accelerator/nvidia_name".into(),
            memory: "aliyun.accelerator/nvidia_mem".into(),
            count: "aliyun.accelerator/nvidia_count".into(),
            gfd_product: "nvidia.com/gpu.product".into(),
            gfd_memory: "nvidia.com/gpu.memory".into(),
            gfd_count: "nvidia.com/gpu.count".into(),
        }
    }
}

/// Annotation keys this project reads and writes; formats in `docs/annotations.md`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Annotations {
    /// Pod (written through the Binding): the allocation record.
    pub allocation: String,
    /// Node: per-GPU detail and the link matrix.
    pub node_gpus: String,
    /// Pod: comma-separated model patterns the pod accepts.
    pub model_include: String,
    /// Pod: comma-separated model patterns the pod refuses.
    pub model_exclude: String,
    /// Pod: minimum memory per GPU, a quantity with a unit (`40Gi`).
    pub min_gpu_memory: String,
    /// Pod: `binpack` or `spread`, overriding the node's share placement.
    pub placement: String,
    /// Pod: `required` or `preferred` interconnect quality for multi-GPU requests.
    pub topology: String,
    /// Pod (written by the extender): when it last asked kube-scheduler to retry the pod.
    pub requeue: String,
}

impl Default for Annotations {
    fn default() -> Self {
        Self {
            allocation: "gpu-extender.io/allocation".into(),
            node_gpus: "gpu-extender.io/gpus".into(),
            model_include: "gpu-extender.io/model-include".into(),
            model_exclude: "gpu-extender.io/model-exclude".into(),
            min_gpu_memory: "gpu-extender.io/min-gpu-memory".into(),
            placement: "gpu-extender.io/placement".into(),
            topology: "gpu-extender.io/topology".into(),
            requeue: "gpu-extender.io/requeue".into(),
        }
    }
}

/// Compatibility with the Alibaba gpushare device plugin.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Gpushare {
    /// Also write the `ALIYUN_COM_GPU_MEM_*` annotations the device plugin reads.
    pub enabled: bool,
}

/// How nodes are scored and GPUs chosen.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct PolicyConfig {
    #[serde(with = "scoring_name")]
    pub scoring: ScoringPolicy,
    /// At most this many pods on one shared GPU (cGPU's limit is 20).
    pub max_pods_per_shared_gpu: u16,
    pub typical_pods: TypicalPodsConfig,
    /// Filter passes only the fitting nodes the policy scores best.
    pub filter_best_only: bool,
    /// Every knob of `fgd-plus`.
    pub fgd_plus: FgdPlusConfig,
    /// The old name of `policy.fgdPlus.holdHostForGpus`, still read from files (never written);
    /// [`PolicyConfig::fgd_plus_tuning`] says which wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_host_for_gpus: Option<bool>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            scoring: ScoringPolicy::Binpack,
            max_pods_per_shared_gpu: 20,
            typical_pods: TypicalPodsConfig::default(),
            filter_best_only: false,
            fgd_plus: FgdPlusConfig::default(),
            hold_host_for_gpus: None,
        }
    }
}

impl PolicyConfig {
    /// FGD+'s knobs as the engine takes them: `policy.fgdPlus`, with the old names
    /// (`policy.holdHostForGpus`, `policy.typicalPods.scarcity`) taking the place of a new key
    /// still at its default. Both set to different values is refused by [`Config::validate`].
    pub fn fgd_plus_tuning(&self) -> fgd_plus::Tuning {
        let mut tuning = self.fgd_plus.engine();
        if let Some(hold) = self.hold_host_for_gpus {
            tuning.hold_host = hold;
        }
        if let Some(measured) = self.typical_pods.scarcity {
            tuning.scarcity.measured = measured.engine();
        }
        tuning
    }

    /// Where an old key and its new name are both set, differently: `(old, new)`.
    fn renamed_conflicts(&self) -> Vec<(&'static str, &'static str)> {
        let default = FgdPlusConfig::default();
        let mut conflicts = Vec::new();
        if let Some(hold) = self.hold_host_for_gpus
            && self.fgd_plus.hold_host_for_gpus != default.hold_host_for_gpus
            && self.fgd_plus.hold_host_for_gpus != hold
        {
            conflicts.push(("policy.holdHostForGpus", "policy.fgdPlus.holdHostForGpus"));
        }
        if let Some(measured) = self.typical_pods.scarcity
            && self.fgd_plus.scarcity.measured != default.scarcity.measured
            && self.fgd_plus.scarcity.measured != measured
        {
            conflicts.push((
                "policy.typicalPods.scarcity",
                "policy.fgdPlus.scarcity.measured",
            ));
        }
        conflicts
    }
}

/// `policy.fgdPlus`: every knob of FGD+, one group per term it adds to FGD's measure
/// (docs/policies.md, "FGD+ on one page"). The keys below `policy.fgdPlus` are the engine's
/// (`fgd_plus::Tuning::KEYS`), which `gpu-lab simulate` takes as `fgd-plus:KEY=VALUE`: a tuning
/// measured there is set here unchanged. The defaults are the engine's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct FgdPlusConfig {
    /// The sliver look-ahead's weight, hundredths (0: off).
    pub lookahead: u32,
    pub scarcity: FgdPlusScarcity,
    pub host: FgdPlusHost,
    pub idle_nodes: FgdPlusIdleNodes,
    /// A pod that asks for no GPU is refused the CPU and memory that a GPU node's free GPUs
    /// need, and idle nodes of four GPUs or more ([`fgd_plus::holds_host`]). Only acts on pods
    /// the policy places: under `fgd-plus`, and for pods without GPUs only with
    /// `filterBestOnly`.
    pub hold_host_for_gpus: bool,
}

/// `policy.fgdPlus.scarcity`: the scarce classes' term.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct FgdPlusScarcity {
    /// Weight of the classes that name GPU models, hundredths (0: off).
    pub models: u32,
    /// Weight of the classes scarce by their shape, hundredths (0: off).
    pub shapes: u32,
    /// How a class's scarcity is measured.
    pub measured: ScarcityConfig,
}

impl Default for FgdPlusScarcity {
    fn default() -> Self {
        FgdPlusConfig::default().scarcity
    }
}

/// `policy.fgdPlus.host`: the host-stranding term.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct FgdPlusHost {
    /// Weight, hundredths (0: off).
    pub weight: u32,
    /// Host slack, hundredths, from which the term has its whole weight (0: always whole).
    pub slack: u32,
}

impl Default for FgdPlusHost {
    fn default() -> Self {
        FgdPlusConfig::default().host
    }
}

/// `policy.fgdPlus.idleNodes`: the idle-node guard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct FgdPlusIdleNodes {
    /// Milli-GPU charged for opening an idle node.
    pub penalty: u32,
    /// Hundredths of the host term's credit a pod opening an idle node earns.
    pub credit: u32,
    /// Idle cover (hundredths) from which that credit is whole (0: always whole).
    pub credit_cover: u32,
    /// Idle cover (hundredths) below which opening an idle node is guarded (0: never).
    pub floor: u32,
    /// Milli-GPU charged more for opening an idle node while guarded.
    pub guard_penalty: u32,
    /// Hundredths: how many times a rise of host stranding there is charged while guarded.
    pub guard_rise: u32,
}

impl Default for FgdPlusIdleNodes {
    fn default() -> Self {
        FgdPlusConfig::default().idle_nodes
    }
}

impl Default for FgdPlusConfig {
    fn default() -> Self {
        Self::from_engine(&fgd_plus::Tuning::default())
    }
}

impl FgdPlusConfig {
    /// The section for the engine's `tuning`.
    pub fn from_engine(tuning: &fgd_plus::Tuning) -> Self {
        Self {
            lookahead: tuning.lookahead,
            scarcity: FgdPlusScarcity {
                models: tuning.scarcity.models,
                shapes: tuning.scarcity.shapes,
                measured: ScarcityConfig::of(tuning.scarcity.measured),
            },
            host: FgdPlusHost {
                weight: tuning.host.weight,
                slack: tuning.host.slack,
            },
            idle_nodes: FgdPlusIdleNodes {
                penalty: tuning.idle_nodes.penalty,
                credit: tuning.idle_nodes.credit,
                credit_cover: tuning.idle_nodes.credit_cover,
                floor: tuning.idle_nodes.floor,
                guard_penalty: tuning.idle_nodes.guard_penalty,
                guard_rise: tuning.idle_nodes.guard_rise,
            },
            hold_host_for_gpus: tuning.hold_host,
        }
    }

    /// The engine's tuning this section sets. A method of the configuration's type, so that the
    /// engine never refers to the configuration.
    pub fn engine(&self) -> fgd_plus::Tuning {
        fgd_plus::Tuning {
            lookahead: self.lookahead,
            scarcity: fgd_plus::ScarcityTerm {
                models: self.scarcity.models,
                shapes: self.scarcity.shapes,
                measured: self.scarcity.measured.engine(),
            },
            host: fgd_plus::HostTerm {
                weight: self.host.weight,
                slack: self.host.slack,
            },
            idle_nodes: fgd_plus::IdleNodeGuard {
                penalty: self.idle_nodes.penalty,
                credit: self.idle_nodes.credit,
                credit_cover: self.idle_nodes.credit_cover,
                floor: self.idle_nodes.floor,
                guard_penalty: self.idle_nodes.guard_penalty,
                guard_rise: self.idle_nodes.guard_rise,
            },
            hold_host: self.hold_host_for_gpus,
        }
    }
}

/// The workload FGD measures fragmentation against.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct TypicalPodsConfig {
    /// Learn the distribution from the pods the cluster runs (the listed pods, if any, are used
    /// until enough pods are seen).
    pub learn: bool,
    /// How often the distribution is relearned.
    pub learn_interval_seconds: u64,
    pub pods: Vec<TypicalPodConfig>,
    /// The old name of `policy.fgdPlus.scarcity.measured`, still read from files (never
    /// written); [`PolicyConfig::fgd_plus_tuning`] says which wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scarcity: Option<ScarcityConfig>,
}

impl Default for TypicalPodsConfig {
    fn default() -> Self {
        Self {
            learn: false,
            learn_interval_seconds: 30,
            pods: Vec::new(),
            scarcity: None,
        }
    }
}

/// `policy.fgdPlus.scarcity.measured`: the engine's [`Scarcity`], by name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScarcityConfig {
    /// Every class scarce on the empty cluster is measured on the nodes as they are, again
    /// within 100 ms of a change to the table (docs/policies.md, "Scarcity measured now").
    #[default]
    Now,
    /// Only the classes scarce by their shape are measured on the nodes as they are; those
    /// that name models as if empty (the default before 2026-11-28).
    Shape,
    /// Every class is measured on the nodes as if empty.
    Empty,
}

impl ScarcityConfig {
    /// The engine's value. A method of the configuration's type, not a `From` impl on the
    /// engine's, so that the engine never refers to the configuration.
    pub fn engine(self) -> Scarcity {
        match self {
            Self::Now => Scarcity::Now,
            Self::Shape => Scarcity::Shape,
            Self::Empty => Scarcity::Empty,
        }
    }

    /// The configuration's name for the engine's `measure`.
    pub fn of(measure: Scarcity) -> Self {
        match measure {
            Scarcity::Now => Self::Now,
            Scarcity::Shape => Self::Shape,
            Scarcity::Empty => Self::Empty,
        }
    }
}

/// One typical pod class.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TypicalPodConfig {
    #[serde(default)]
    pub cpu_milli: u64,
    /// GPUs per pod; 0 for a CPU-only pod.
    #[serde(default)]
    pub gpus: u16,
    /// Milli-GPU on each GPU: 1000 for whole GPUs.
    #[serde(default)]
    pub gpu_milli: u32,
    /// Host memory of the class in MiB (FGD ignores it; fgd-plus uses it for host stranding).
    #[serde(default)]
    pub memory_mib: u64,
    /// Model patterns the class accepts; empty means any.
    #[serde(default)]
    pub models: Vec<String>,
    /// Relative frequency; weights are normalised over the classes that are not `rare`.
    pub weight: f64,
    /// A class past FGD's coverage cut: left out of FGD's measure, weighed only for its
    /// scarcity by `fgd-plus` (docs/policies.md, part 4). Its weight is on the same scale as the
    /// others'.
    #[serde(default)]
    pub rare: bool,
}

/// The two HTTP listeners.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ServerConfig {
    /// Where kube-scheduler calls the extender verbs. Loopback by default: the extender
    /// usually runs beside kube-scheduler.
    pub listen: SocketAddr,
    /// Path prefix of the verbs (`{urlPrefix}/filter`); the same as the scheduler's `urlPrefix`
    /// path.
    pub url_prefix: String,
    /// healthz, readyz, metrics and inspect.
    pub admin_listen: SocketAddr,
    /// The largest request body accepted. The default is sized for `nodeCacheCapable: true`
    /// (what the shipped scheduler configurations set): a pod, at most etcd's 1.5 MiB, plus
    /// node names, or preempt's victims by UID, for thousands of nodes. `nodeCacheCapable:
    /// false` sends whole Node objects, about 10 KiB each: raise it to match.
    pub body_limit_bytes: u64,
    /// Serve the extender listener over TLS with this certificate and key.
    pub tls: Option<TlsConfig>,
    /// Let a `listen` address off loopback serve the verbs without client certificates
    /// (`tls.clientCaFile`). Off: such a configuration is refused at start, since anyone who
    /// reaches the port could then bind pods.
    pub allow_unauthenticated_verbs: bool,
    /// The `spec.schedulerName`s whose pods bind may bind; a bind for any other pod is refused.
    /// Empty: any.
    pub scheduler_names: Vec<String>,
    /// Serve the admin listener over TLS with these files (the bearer tokens of `adminAuth`
    /// then never cross the network in clear text).
    pub admin_tls: Option<TlsConfig>,
    /// The verbs' budget: a request that waits this long for a turn at
    /// `limits.maxConcurrentRequests` is answered 503, and bind gives up on the API server
    /// after this long. Below kube-scheduler's `httpTimeout`.
    pub request_timeout_ms: u64,
    /// Which admin paths need a Kubernetes identity allowed to read them.
    pub admin_auth: AdminAuthConfig,
}

/// Authentication of the admin listener ([`crate::http::auth`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct AdminAuthConfig {
    /// Admin paths answered only to a bearer token that TokenReview accepts and whose user
    /// SubjectAccessReview allows `get` on the path; the others are open.
    pub paths: Vec<String>,
    /// How long a review's outcome is reused for the same token and path (0: never).
    pub cache_ttl_seconds: u64,
    /// The audiences a token must be issued for (TokenReview's `spec.audiences`), so a token
    /// minted for another service (the API server's own, a cloud's) does not replay here.
    /// Empty: the API server's own audiences.
    pub audiences: Vec<String>,
    /// Tokens the API server refused, per client address per minute, before that address is
    /// answered 429 without a review for the rest of the minute (0: no limit).
    pub failed_tokens_per_minute: u32,
}

/// The admin paths [`AdminAuthConfig::paths`] may name.
/// `/ui/data` is the web view's data (`crate::http::ui`); its page and assets hold no cluster
/// data and are never guarded (a browser cannot send a bearer token on a page load).
pub const ADMIN_PATHS: &[&str] = &["/healthz", "/readyz", "/metrics", "/inspect", "/ui/data"];

impl Default for AdminAuthConfig {
    fn default() -> Self {
        Self {
            paths: vec!["/inspect".into(), "/ui/data".into()],
            cache_ttl_seconds: 10,
            audiences: vec!["gpu-extender".into()],
            failed_tokens_per_minute: 10,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8888)),
            url_prefix: "/scheduler".into(),
            admin_listen: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 9090)),
            body_limit_bytes: 8 * 1024 * 1024,
            tls: None,
            allow_unauthenticated_verbs: false,
            scheduler_names: Vec::new(),
            admin_tls: None,
            request_timeout_ms: 2000,
            admin_auth: AdminAuthConfig::default(),
        }
    }
}

/// PEM files for the extender listener or the estimator's (served by [`crate::http::tls`]). Certificate and key are
/// required; they default to empty only so that each can be overridden on its own (validation
/// then insists on both).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct TlsConfig {
    /// The certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// The leaf's private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// When set, clients must present a certificate signed by one of these CAs.
    pub client_ca_file: Option<PathBuf>,
    /// How often the files are read again; a change is served to new connections.
    pub reload_interval_seconds: u64,
    /// With `clientCaFile`: the names (DNS or IP subjectAltNames) a client certificate must be
    /// valid for, any one of them; a certificate the CA signed for another name is refused.
    /// Empty: any certificate the CA signed.
    pub allowed_client_names: Vec<String>,
}

impl Default for TlsConfig {
    fn default() -> Self {
        Self {
            cert_file: PathBuf::new(),
            key_file: PathBuf::new(),
            client_ca_file: None,
            reload_interval_seconds: 10,
            allowed_client_names: Vec::new(),
        }
    }
}

/// Karmada's scheduler-estimator gRPC service ([`crate::estimator`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct EstimatorConfig {
    /// Where the `Estimator` service listens (plain gRPC, or TLS with `tls`); unset: not served.
    /// karmada-scheduler dials port 10352 unless told otherwise (`--scheduler-estimator-port`).
    /// Off loopback, validation requires `tls.clientCaFile` unless `allow_unauthenticated`.
    pub listen: Option<SocketAddr>,
    /// The member cluster's name in Karmada: requests naming another cluster are refused.
    /// Empty: any name is accepted.
    pub cluster: String,
    /// Serve gRPC over TLS (ALPN `h2`) with these files, as karmada-scheduler dials with
    /// `--scheduler-estimator-ca-file` (and a client certificate when `clientCaFile` is set).
    pub tls: Option<TlsConfig>,
    /// Serve a `listen` address off loopback without requiring client certificates: for an
    /// estimator behind something else that authenticates its callers (a mesh's mutual TLS, an
    /// authenticating proxy). Without it such an address needs `tls.clientCaFile`.
    pub allow_unauthenticated: bool,
    /// Estimator calls served at once, over all connections; more are answered
    /// `RESOURCE_EXHAUSTED` at once.
    pub max_concurrent_requests: u32,
}

impl Default for EstimatorConfig {
    fn default() -> Self {
        Self {
            listen: None,
            cluster: String::new(),
            tls: None,
            allow_unauthenticated: false,
            max_concurrent_requests: 16,
        }
    }
}

/// What makes the extender's per-GPU constraints visible to cluster-autoscaler, whose scheduling
/// simulation never calls extenders ([`crate::k8s::node_label`], [`crate::http::webhook`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct WebhookConfig {
    /// Where the mutating admission webhook listens (HTTPS with `tls`, which it then needs:
    /// kube-apiserver calls webhooks over TLS only); unset: not served.
    pub listen: Option<SocketAddr>,
    /// The writer replica keeps the label `gpu-extender.io/largest-free-gpu-mem-mib` on every
    /// memory-sharing node: the most GPU memory free on any one of its healthy GPUs.
    pub label_nodes: bool,
    /// The webhook's certificate and key (and a client CA, when kube-apiserver presents one).
    pub tls: Option<TlsConfig>,
}

/// Binding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct BindConfig {
    /// How long capacity reserved at bind is held if the watch never shows the bound pod.
    pub reservation_ttl_seconds: u64,
    /// Record a `GpusAllocated` Event on each pod bound (one more API write per bind). Off by
    /// default: kube-scheduler's own `Scheduled` Event already names the node, the allocation
    /// record on the pod names the GPUs, and the extra write cost a sixth of the scheduling
    /// loop's throughput (decision 0006).
    pub events: bool,
}

impl Default for BindConfig {
    fn default() -> Self {
        Self {
            reservation_ttl_seconds: 120,
            events: false,
        }
    }
}

/// The Node and Pod watches that keep the allocation table (`src/k8s/watch.rs`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct WatchConfig {
    /// List and watch Pods in kube-apiserver's protobuf encoding, as kube-scheduler does
    /// (`src/k8s/watch/protobuf.rs`): the API server encodes each Pod event once for both, and
    /// the extender decodes only the fields it reads. `false`: JSON, through kube-runtime.
    pub protobuf: bool,
}

impl Default for WatchConfig {
    fn default() -> Self {
        Self { protobuf: true }
    }
}

/// GPUs handed out by Dynamic Resource Allocation (`src/k8s/dra.rs`, docs/dra.md): the
/// ResourceSlices and ResourceClaims of the listed drivers, read as GPUs and claims holding them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct DraConfig {
    /// Watch ResourceSlices and ResourceClaims (`resource.k8s.io/v1`) where the API server
    /// serves them; where it does not, this is said once in the log and nothing waits for it.
    pub enabled: bool,
    /// The DRA drivers whose devices are GPUs, and how to read their devices.
    pub drivers: Vec<DraDriverConfig>,
}

impl Default for DraConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            drivers: vec![DraDriverConfig::default()],
        }
    }
}

/// How one DRA driver describes its GPUs: the attribute and capacity names of its devices.
/// Attribute names are looked up as written and qualified with the driver's name
/// (`gpu.nvidia.com/uuid` and `uuid` are the same attribute), as Kubernetes does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct DraDriverConfig {
    /// The driver's name (`spec.driver` of its ResourceSlices).
    pub name: String,
    /// The DeviceClasses whose claims ask for this driver's GPUs: prioritize ranks nodes for a
    /// pod whose claims ask for whole GPUs of these classes.
    pub device_classes: Vec<String>,
    /// The DeviceClasses whose claims ask for this driver's MIG slices: prioritize ranks nodes
    /// for a pod whose claims ask slices of one profile of these classes (a selector comparing
    /// the profile attribute, docs/dra.md).
    pub mig_device_classes: Vec<String>,
    /// The string attribute that tells a whole GPU from a MIG slice.
    pub type_attribute: String,
    /// Its value for a whole GPU.
    pub gpu_type: String,
    /// Its value for a MIG slice.
    pub mig_type: String,
    /// The string attribute with the GPU's (or the MIG slice's) UUID.
    pub uuid_attribute: String,
    /// The int attribute with the GPU's index on its node.
    pub index_attribute: String,
    /// The string attribute with a MIG slice's parent GPU UUID.
    pub parent_uuid_attribute: String,
    /// The int attribute with a MIG slice's parent GPU index.
    pub parent_index_attribute: String,
    /// The string attribute with the GPU model.
    pub model_attribute: String,
    /// The string attribute with a MIG slice's profile (`1g.10gb`).
    pub profile_attribute: String,
    /// The capacity with the device's memory.
    pub memory_capacity: String,
}

impl Default for DraDriverConfig {
    /// NVIDIA's DRA driver (`k8s-dra-driver-gpu`).
    fn default() -> Self {
        Self {
            name: "gpu.nvidia.com".into(),
            device_classes: vec!["gpu.nvidia.com".into()],
            mig_device_classes: vec!["mig.nvidia.com".into()],
            type_attribute: "type".into(),
            gpu_type: "gpu".into(),
            mig_type: "mig".into(),
            uuid_attribute: "uuid".into(),
            index_attribute: "index".into(),
            parent_uuid_attribute: "parentUUID".into(),
            parent_index_attribute: "parentIndex".into(),
            model_attribute: "productName".into(),
            profile_attribute: "profile".into(),
            memory_capacity: "memory".into(),
        }
    }
}

/// The Lease that makes one replica the writer (`src/k8s/lease.rs`): only its holder runs the
/// tasks that write to the API on their own, requeue and quota reclaim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct WriterLeaseConfig {
    /// The Lease's name.
    pub name: String,
    /// Its namespace; empty: the pod's own (its service account's), else `default`.
    pub namespace: String,
    /// How long a holder that stops renewing keeps it; renewed every third of this.
    pub duration_seconds: u64,
}

impl Default for WriterLeaseConfig {
    fn default() -> Self {
        Self {
            name: "gpu-extender-writer".into(),
            namespace: String::new(),
            duration_seconds: 15,
        }
    }
}

/// Asking kube-scheduler to retry pods it gave up on once capacity frees (`src/k8s/requeue.rs`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct RequeueConfig {
    /// Touch unschedulable pods that now fit a node whose capacity was freed.
    pub enabled: bool,
    /// At most this many pods touched per freed node and round (oldest first).
    pub max_pods_per_node: u16,
    /// A pod is touched at most once in this many seconds.
    pub min_interval_seconds: u64,
}

impl Default for RequeueConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_pods_per_node: 4,
            min_interval_seconds: 10,
        }
    }
}

/// GPU quotas (`ElasticQuota`s are watched whenever their CRD is installed; nothing to switch on).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct QuotaConfig {
    pub reclaim: ReclaimConfig,
}

/// Evicting borrowers' pods for a team under its `min` whose pod waits (`src/k8s/reclaim.rs`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ReclaimConfig {
    /// Evict borrowers through the Eviction API where kube-scheduler cannot preempt them.
    pub enabled: bool,
    /// How often waiting pods are looked at; at most one reclaim starts per round.
    pub interval_seconds: u64,
    /// After a reclaim for a pod, or a PodDisruptionBudget refusing one on a node, this long
    /// before that pod is reclaimed for again (or that node tried again for it).
    pub cool_down_seconds: u64,
}

impl Default for ReclaimConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interval_seconds: 5,
            cool_down_seconds: 60,
        }
    }
}

/// Load shedding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Limits {
    /// Extender requests served at once; more wait. Filter and prioritize come one at a time
    /// from kube-scheduler's loop, binds in parallel, so this mostly bounds binds.
    pub max_concurrent_requests: u32,
    /// Admin requests (`/metrics`, `/inspect`, the web view) served at once; more are answered
    /// 503 at once. The probes (`/healthz`, `/readyz`) are never counted or refused.
    pub max_concurrent_admin_requests: u32,
    /// Open connections per listener (verbs, admin); further clients wait in the kernel's
    /// accept queue until one closes.
    pub max_connections: u32,
    /// An HTTP/1 client that has not sent a request's whole headers within this long (hyper's
    /// `header_read_timeout`) is disconnected.
    pub header_read_timeout_ms: u64,
    /// A request whose body has not arrived whole this long after its headers is answered 408.
    /// Bodies are read before a request waits for its turn, so a slow sender holds no turn.
    pub body_read_timeout_ms: u64,
    /// Request bytes held at once across every request being read or served; a body that
    /// would pass it waits (within `bodyReadTimeoutMs`), so memory stays bounded whatever the
    /// number of clients.
    pub max_buffered_body_bytes: u64,
    /// `/metrics` is rendered at most once per this interval; scrapes within it get the same
    /// text (0: every scrape renders, one render at a time).
    pub metrics_render_interval_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_concurrent_requests: 256,
            max_concurrent_admin_requests: 8,
            max_connections: 1024,
            header_read_timeout_ms: 5000,
            body_read_timeout_ms: 5000,
            max_buffered_body_bytes: 256 * 1024 * 1024,
            metrics_render_interval_ms: 5000,
        }
    }
}

/// `policy.scoring` as its name, with an error that lists the valid names. The check runs inside
/// the string visitor so that the YAML error carries the scalar's own path (`policy.scoring`).
mod scoring_name {
    use std::fmt;

    use serde::{Deserializer, Serializer, de};

    use gpu_engine::ScoringPolicy;

    pub fn serialize<S: Serializer>(value: &ScoringPolicy, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(value.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ScoringPolicy, D::Error> {
        d.deserialize_str(Name)
    }

    struct Name;

    impl de::Visitor<'_> for Name {
        type Value = ScoringPolicy;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("one of binpack, spread, fgd, fgd-plus")
        }

        fn visit_str<E: de::Error>(self, name: &str) -> Result<ScoringPolicy, E> {
            match name {
                "binpack" => Ok(ScoringPolicy::Binpack),
                "spread" => Ok(ScoringPolicy::Spread),
                "fgd" => Ok(ScoringPolicy::Fgd),
                "fgd-plus" => Ok(ScoringPolicy::FgdPlus),
                other => Err(E::custom(format!(
                    "unknown policy {other:?}; expected one of binpack, spread, fgd, fgd-plus"
                ))),
            }
        }
    }
}

impl Config {
    /// The engine policy this configuration describes.
    pub fn engine_policy(&self) -> Policy {
        let (rare, typical): (Vec<_>, Vec<_>) = self
            .policy
            .typical_pods
            .pods
            .iter()
            .map(|pod| {
                (
                    pod.rare,
                    TypicalPod {
                        cpu: gpu_engine::CpuMilli(pod.cpu_milli),
                        memory: gpu_engine::MemMiB(pod.memory_mib),
                        gpus: pod.gpus,
                        milli: pod.gpu_milli,
                        // Validated in `validate`; a pattern that does not parse is simply dropped.
                        models: pod
                            .models
                            .iter()
                            .filter_map(|m| ModelPattern::parse(m).ok())
                            .collect(),
                        weight: pod.weight,
                    },
                )
            })
            .partition(|(rare, _)| *rare);
        let classes =
            |list: Vec<(bool, TypicalPod)>| list.into_iter().map(|(_, pod)| pod).collect();
        Policy {
            scoring: self.policy.scoring,
            max_shares_per_gpu: self.policy.max_pods_per_shared_gpu,
            typical: TypicalPods::with_rare(classes(typical), classes(rare)),
            filter_best_only: self.policy.filter_best_only,
            fgd_plus: self.policy.fgd_plus_tuning(),
            ..Policy::default()
        }
    }

    /// How long a bind's reservation lasts, in milliseconds.
    pub fn reservation_ttl_ms(&self) -> u64 {
        self.bind.reservation_ttl_seconds.saturating_mul(1000)
    }

    /// The configuration as YAML, every key present: what `--print-config` shows.
    pub fn to_yaml(&self) -> String {
        serde_yaml_ng::to_string(self).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_yaml())
    }
}
