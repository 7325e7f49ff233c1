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
//!     "0.0.0.0:8888".to_owned(),
//!     "flag --listen".to_owned(),
//! )];
//! let cfg = Config::from_sources(Some(("config.yaml", yaml)), &env, &flags).unwrap();
//! assert_eq!(cfg.policy.scoring.as_str(), "spread");
//! assert_eq!(cfg.bind.reservation_ttl_seconds, 60);
//! assert_eq!(cfg.server.listen.port(), 8888);
//! ```

use std::collections::BTreeSet;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_yaml_ng::{Mapping, Value};
use thiserror::Error;

use gpu_engine::policy::fgd_plus;
use gpu_engine::policy::typical::Scarcity;
use gpu_engine::{ModelPattern, Policy, ScoringPolicy, ShareRules, TypicalPod, TypicalPods};

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
    "server.adminAuth.paths",
    "server.adminAuth.cacheTtlSeconds",
    "server.requestTimeoutMs",
    "bind.reservationTtlSeconds",
    "bind.events",
    "watch.protobuf",
    "requeue.enabled",
    "requeue.maxPodsPerNode",
    "requeue.minIntervalSeconds",
    "quota.reclaim.enabled",
    "quota.reclaim.intervalSeconds",
    "quota.reclaim.coolDownSeconds",
    "limits.maxConcurrentRequests",
    "estimator.listen",
    "estimator.cluster",
    "estimator.tls.certFile",
    "estimator.tls.keyFile",
    "estimator.tls.clientCaFile",
    "estimator.tls.reloadIntervalSeconds",
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
    pub quota: QuotaConfig,
    pub limits: Limits,
    pub estimator: EstimatorConfig,
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
    /// The largest request body accepted. The default holds 500 full Node objects (what
    /// `nodeCacheCapable: false` sends) with room to spare.
    pub body_limit_bytes: u64,
    /// Serve the extender listener over TLS with this certificate and key (the admin listener
    /// stays plain HTTP).
    pub tls: Option<TlsConfig>,
    /// Give up on one request after this long; below kube-scheduler's `httpTimeout`.
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
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8888)),
            url_prefix: "/scheduler".into(),
            admin_listen: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 9090)),
            body_limit_bytes: 64 * 1024 * 1024,
            tls: None,
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
}

impl Default for TlsConfig {
    fn default() -> Self {
        Self {
            cert_file: PathBuf::new(),
            key_file: PathBuf::new(),
            client_ca_file: None,
            reload_interval_seconds: 10,
        }
    }
}

/// Karmada's scheduler-estimator gRPC service ([`crate::estimator`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct EstimatorConfig {
    /// Where the `Estimator` service listens (plain gRPC, or TLS with `tls`); unset: not served.
    /// karmada-scheduler dials port 10352 unless told otherwise (`--scheduler-estimator-port`).
    pub listen: Option<SocketAddr>,
    /// The member cluster's name in Karmada: requests naming another cluster are refused.
    /// Empty: any name is accepted.
    pub cluster: String,
    /// Serve gRPC over TLS (ALPN `h2`) with these files, as karmada-scheduler dials with
    /// `--scheduler-estimator-ca-file` (and a client certificate when `clientCaFile` is set).
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
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_concurrent_requests: 256,
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
    /// Loads the configuration the way the binary does: defaults, then the file at `path` (if
    /// any), then the process's `GPU_EXTENDER_*` environment, then `flags` (dotted key, YAML
    /// value, and the flag it came from for messages), and validates the result.
    pub fn load(
        path: Option<&Path>,
        flags: &[(String, String, String)],
    ) -> Result<Self, ConfigError> {
        let text = match path {
            Some(path) => {
                Some(
                    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                        path: path.to_owned(),
                        source,
                    })?,
                )
            }
            None => None,
        };
        let name = path.map(|p| p.display().to_string()).unwrap_or_default();
        let env: Vec<(String, String)> = std::env::vars()
            .filter(|(name, _)| name.starts_with(ENV_PREFIX))
            .collect();
        Self::from_sources(
            text.as_deref().map(|text| (name.as_str(), text)),
            &env,
            flags,
        )
    }

    /// The pure core of [`Config::load`]: `file` is `(name for messages, YAML text)`, `env` the
    /// environment variables to consider (others are ignored), `flags` dotted-key overrides as
    /// `(key, value, origin)`, the origin naming the flag in messages (`flag --scoring`).
    pub fn from_sources(
        file: Option<(&str, &str)>,
        env: &[(String, String)],
        flags: &[(String, String, String)],
    ) -> Result<Self, ConfigError> {
        let mut config = match file {
            // An empty file (or one holding only comments) means "all defaults".
            Some((_, text)) if text.trim().is_empty() => Self::default(),
            Some((name, text)) => {
                let is_null = serde_yaml_ng::from_str::<Value>(text)
                    .map(|value| value.is_null())
                    .unwrap_or(false);
                if is_null {
                    Self::default()
                } else {
                    serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Parse {
                        source_name: name.to_owned(),
                        message: e.to_string(),
                    })?
                }
            }
            None => Self::default(),
        };
        config = config.with_overrides(env_overrides(env)?.iter().chain(flags))?;
        config.validate()?;
        Ok(config)
    }

    /// This configuration with each `(key, value, origin)` set in turn ([`Config::with_override`]).
    pub fn with_overrides<'a>(
        self,
        overrides: impl IntoIterator<Item = &'a (String, String, String)>,
    ) -> Result<Self, ConfigError> {
        overrides
            .into_iter()
            .try_fold(self, |config, (key, value, origin)| {
                config.with_override(key, value, origin)
            })
    }

    /// This configuration with one key set. `value` is read as YAML; if that does not fit the
    /// key's type, as a plain string (so `urlPrefix=123` means the string "123").
    pub fn with_override(self, key: &str, value: &str, origin: &str) -> Result<Self, ConfigError> {
        if !KEYS.contains(&key) {
            return Err(ConfigError::UnknownKey {
                key: key.to_owned(),
                origin: origin.to_owned(),
            });
        }
        let error = |message: String| ConfigError::Override {
            key: key.to_owned(),
            origin: origin.to_owned(),
            message,
        };
        let tree = serde_yaml_ng::to_value(&self).map_err(|e| error(e.to_string()))?;
        let parsed = serde_yaml_ng::from_str::<Value>(value).unwrap_or(Value::Null);
        let first = set_path(tree.clone(), key, parsed.clone()).and_then(from_tree);
        match first {
            Ok(config) => Ok(config),
            Err(first_error) => {
                let as_string = Value::String(value.to_owned());
                if parsed == as_string {
                    return Err(error(first_error));
                }
                set_path(tree, key, as_string)
                    .and_then(from_tree)
                    .map_err(|_| error(first_error))
            }
        }
    }

    /// Checks what types cannot: ranges, names, and consistency between keys. Every problem is
    /// reported, each prefixed with its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        let mut check = |ok: bool, key: &str, message: String| {
            if !ok {
                problems.push(format!("{key}: {message}"));
            }
        };

        for (old, new) in self.policy.renamed_conflicts() {
            check(
                false,
                old,
                format!("is the old name of {new}, which is set to another value: set only {new}"),
            );
        }

        let r = &self.resources;
        for (key, name) in [
            ("resources.wholeGpu", &r.whole_gpu),
            ("resources.gpuMem", &r.gpu_mem),
            ("resources.gpuCore", &r.gpu_core),
            ("resources.topologyGpu", &r.topology_gpu),
        ] {
            check(
                is_extended_resource_name(name),
                key,
                format!("{name:?} is not an extended resource name (like example.com/gpu)"),
            );
        }
        check(
            distinct(&[&r.whole_gpu, &r.gpu_mem, &r.gpu_core, &r.topology_gpu]),
            "resources",
            "wholeGpu, gpuMem, gpuCore and topologyGpu must be different resources".into(),
        );
        check(
            (1..=100).contains(&r.gpu_core_percent_step),
            "resources.gpuCorePercentStep",
            format!("{} is out of range 1..=100", r.gpu_core_percent_step),
        );
        let l = &self.node_labels;
        for (key, name) in [
            ("resources.gpuCount", &r.gpu_count),
            ("nodeLabels.mode", &l.mode),
            ("nodeLabels.placement", &l.placement),
            ("nodeLabels.model", &l.model),
            ("nodeLabels.memory", &l.memory),
            ("nodeLabels.count", &l.count),
            ("nodeLabels.gfdProduct", &l.gfd_product),
            ("nodeLabels.gfdMemory", &l.gfd_memory),
            ("nodeLabels.gfdCount", &l.gfd_count),
        ] {
            check(
                is_qualified_name(name),
                key,
                format!("{name:?} is not a valid label key"),
            );
        }
        let a = &self.annotations;
        let annotation_keys = [
            ("annotations.allocation", &a.allocation),
            ("annotations.nodeGpus", &a.node_gpus),
            ("annotations.modelInclude", &a.model_include),
            ("annotations.modelExclude", &a.model_exclude),
            ("annotations.minGpuMemory", &a.min_gpu_memory),
            ("annotations.placement", &a.placement),
            ("annotations.topology", &a.topology),
            ("annotations.requeue", &a.requeue),
        ];
        for (key, name) in annotation_keys {
            check(
                is_qualified_name(name),
                key,
                format!("{name:?} is not a valid annotation key"),
            );
        }
        check(
            distinct(&annotation_keys.map(|(_, name)| name.as_str())),
            "annotations",
            "every annotation key must be different".into(),
        );

        let p = &self.policy;
        check(
            (1..=1000).contains(&p.max_pods_per_shared_gpu),
            "policy.maxPodsPerSharedGpu",
            format!("{} is out of range 1..=1000", p.max_pods_per_shared_gpu),
        );
        check(
            !p.scoring.uses_typical() || p.typical_pods.learn || !p.typical_pods.pods.is_empty(),
            "policy.typicalPods",
            format!(
                "scoring {} needs typical pods: list them under pods, or set learn: true",
                p.scoring.as_str()
            ),
        );
        for (i, pod) in p.typical_pods.pods.iter().enumerate() {
            let key = format!("policy.typicalPods.pods[{i}]");
            check(
                pod.weight.is_finite() && pod.weight > 0.0,
                &key,
                format!("weight {} must be a positive number", pod.weight),
            );
            check(
                pod.gpu_milli <= 1000,
                &key,
                format!("gpuMilli {} is more than a whole GPU (1000)", pod.gpu_milli),
            );
            check(
                (pod.gpus == 0) == (pod.gpu_milli == 0),
                &key,
                "gpus and gpuMilli must both be 0 (a CPU-only pod) or both positive".into(),
            );
            check(
                pod.gpus <= 64,
                &key,
                format!("gpus {} is more than a node can have (64)", pod.gpus),
            );
            for model in &pod.models {
                if let Err(e) = ModelPattern::parse(model) {
                    check(false, &key, e.to_string());
                }
            }
        }

        let s = &self.server;
        check(
            s.url_prefix.starts_with('/') && !s.url_prefix.contains(['?', '#', ' ']),
            "server.urlPrefix",
            format!("{:?} must be a path starting with '/'", s.url_prefix),
        );
        check(
            s.listen != s.admin_listen,
            "server.adminListen",
            "must differ from server.listen".into(),
        );
        check(
            s.body_limit_bytes >= 64 * 1024,
            "server.bodyLimitBytes",
            format!("{} is too small (at least 65536)", s.body_limit_bytes),
        );
        check(
            (1..=600_000).contains(&s.request_timeout_ms),
            "server.requestTimeoutMs",
            format!("{} is out of range 1..=600000", s.request_timeout_ms),
        );
        for (section, tls) in [
            ("server.tls", &s.tls),
            ("estimator.tls", &self.estimator.tls),
        ] {
            let Some(tls) = tls else { continue };
            check(
                !tls.cert_file.as_os_str().is_empty(),
                &format!("{section}.certFile"),
                "must not be empty".into(),
            );
            check(
                !tls.key_file.as_os_str().is_empty(),
                &format!("{section}.keyFile"),
                "must not be empty".into(),
            );
            check(
                tls.client_ca_file
                    .as_ref()
                    .is_none_or(|f| !f.as_os_str().is_empty()),
                &format!("{section}.clientCaFile"),
                "must not be empty (leave it out for no client certificates)".into(),
            );
            check(
                (1..=3600).contains(&tls.reload_interval_seconds),
                &format!("{section}.reloadIntervalSeconds"),
                format!("{} is out of range 1..=3600", tls.reload_interval_seconds),
            );
        }
        for path in &s.admin_auth.paths {
            check(
                ADMIN_PATHS.contains(&path.as_str()),
                "server.adminAuth.paths",
                format!(
                    "{path:?} is not an admin path (one of {})",
                    ADMIN_PATHS.join(", ")
                ),
            );
        }
        check(
            s.admin_auth.cache_ttl_seconds <= 300,
            "server.adminAuth.cacheTtlSeconds",
            format!("{} is out of range 0..=300", s.admin_auth.cache_ttl_seconds),
        );
        check(
            (1..=86_400).contains(&self.bind.reservation_ttl_seconds),
            "bind.reservationTtlSeconds",
            format!(
                "{} is out of range 1..=86400",
                self.bind.reservation_ttl_seconds
            ),
        );
        check(
            (1..=1000).contains(&self.requeue.max_pods_per_node),
            "requeue.maxPodsPerNode",
            format!(
                "{} is out of range 1..=1000",
                self.requeue.max_pods_per_node
            ),
        );
        check(
            (1..=3600).contains(&self.policy.typical_pods.learn_interval_seconds),
            "policy.typicalPods.learnIntervalSeconds",
            format!(
                "{} is out of range 1..=3600",
                self.policy.typical_pods.learn_interval_seconds
            ),
        );
        check(
            (1..=3600).contains(&self.requeue.min_interval_seconds),
            "requeue.minIntervalSeconds",
            format!(
                "{} is out of range 1..=3600",
                self.requeue.min_interval_seconds
            ),
        );
        check(
            (1..=3600).contains(&self.quota.reclaim.interval_seconds),
            "quota.reclaim.intervalSeconds",
            format!(
                "{} is out of range 1..=3600",
                self.quota.reclaim.interval_seconds
            ),
        );
        check(
            (1..=86400).contains(&self.quota.reclaim.cool_down_seconds),
            "quota.reclaim.coolDownSeconds",
            format!(
                "{} is out of range 1..=86400",
                self.quota.reclaim.cool_down_seconds
            ),
        );
        check(
            self.limits.max_concurrent_requests >= 1,
            "limits.maxConcurrentRequests",
            "must be at least 1".into(),
        );

        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }

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

/// The environment variable that overrides `key`: `policy.maxPodsPerSharedGpu` →
/// `GPU_EXTENDER_POLICY_MAX_PODS_PER_SHARED_GPU`.
pub fn env_var_name(key: &str) -> String {
    let mut name = String::from(ENV_PREFIX);
    for (i, segment) in key.split('.').enumerate() {
        if i > 0 {
            name.push('_');
        }
        for (j, c) in segment.chars().enumerate() {
            if c.is_ascii_uppercase() && j > 0 {
                name.push('_');
            }
            name.push(c.to_ascii_uppercase());
        }
    }
    name
}

/// Every overridable key with its environment variable, in [`KEYS`] order.
pub fn env_vars() -> Vec<(String, &'static str)> {
    KEYS.iter().map(|key| (env_var_name(key), *key)).collect()
}

/// Picks the configuration overrides out of environment variables: `(key, value, origin)` for
/// each `GPU_EXTENDER_*` variable, in [`KEYS`] order (so the result does not depend on the
/// environment's order). Variables without the prefix are ignored; an unknown one with the
/// prefix is an error (a typo would otherwise be silently ignored), except [`RESERVED_ENV`].
pub fn env_overrides(
    env: &[(String, String)],
) -> Result<Vec<(String, String, String)>, ConfigError> {
    let known = env_vars();
    for (name, _) in env {
        let ours = name.starts_with(ENV_PREFIX);
        let reserved = RESERVED_ENV.contains(&name.as_str());
        if ours && !reserved && !known.iter().any(|(var, _)| var == name) {
            return Err(ConfigError::UnknownEnv(name.clone()));
        }
    }
    Ok(known
        .into_iter()
        .filter_map(|(var, key)| {
            env.iter()
                .rev() // the last definition wins, as in a shell
                .find(|(name, _)| *name == var)
                .map(|(_, value)| (key.to_owned(), value.clone(), format!("env {var}")))
        })
        .collect())
}

/// Splits a `KEY=VALUE` flag argument.
pub fn parse_override(arg: &str) -> Result<(String, String), ConfigError> {
    match arg.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_owned(), value.to_owned()))
        }
        _ => Err(ConfigError::MalformedOverride(arg.to_owned())),
    }
}

/// Command-line flags for the configuration that every command reading it takes (`serve`,
/// `check-config`, `inspect`, `explain`): the file, the scoring policy, and `--set key=value`
/// for any key. `serve` adds its own shortcuts, [`ServeFlags`].
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ConfigFlags {
    /// YAML configuration file (see docs/configuration.md).
    #[arg(long = "config", env = "GPU_EXTENDER_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Node scoring policy (policy.scoring).
    #[arg(long, value_name = "POLICY", value_parser = scoring_names())]
    pub scoring: Option<String>,
    /// Set any configuration key, e.g. --set policy.maxPodsPerSharedGpu=10 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

/// `--scoring`'s possible values, from the engine's list of policies (so help and errors list
/// them all).
fn scoring_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(ScoringPolicy::ALL.map(ScoringPolicy::as_str))
}

/// `serve`'s shortcut flags for keys only the running service uses: its listeners and what it
/// writes at bind time. Every one of them can also be set with `--set`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ServeFlags {
    /// Extender listen address (server.listen).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Admin listen address for healthz/readyz/metrics/inspect and the web view /ui (server.adminListen).
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// Path prefix of the extender verbs (server.urlPrefix).
    #[arg(long, value_name = "PATH")]
    pub url_prefix: Option<String>,
    /// Write the gpushare device plugin's annotations: true or false (gpushare.enabled).
    #[arg(long, value_name = "BOOL")]
    pub gpushare: Option<String>,
}

/// `KEY=VALUE` arguments of the flag `flag` (`--set`, or the replay's `--extender-set`) as
/// overrides `(key, value, origin)`, the origin naming the flag and key in messages.
pub fn set_overrides(
    args: &[String],
    flag: &str,
) -> Result<Vec<(String, String, String)>, ConfigError> {
    args.iter()
        .map(|arg| {
            let (key, value) = parse_override(arg)?;
            let origin = format!("flag {flag} {key}");
            Ok((key, value, origin))
        })
        .collect()
}

/// The overrides of the shortcut flags given: `(key, value, origin)`, the origin naming the
/// flag the user typed.
fn shortcut_overrides(
    shortcuts: &[(&str, &str, &Option<String>)],
) -> Vec<(String, String, String)> {
    shortcuts
        .iter()
        .filter_map(|(flag, key, value)| {
            value
                .as_ref()
                .map(|v| ((*key).to_owned(), v.clone(), format!("flag --{flag}")))
        })
        .collect()
}

impl ServeFlags {
    /// The flags as dotted-key overrides, in the form [`ConfigFlags::load_with`] takes.
    pub fn overrides(&self) -> Vec<(String, String, String)> {
        shortcut_overrides(&[
            ("listen", "server.listen", &self.listen),
            ("admin-listen", "server.adminListen", &self.admin_listen),
            ("url-prefix", "server.urlPrefix", &self.url_prefix),
            ("gpushare", "gpushare.enabled", &self.gpushare),
        ])
    }
}

impl ConfigFlags {
    /// The flags as dotted-key overrides `(key, value, origin)`, after `earlier` (a command's
    /// own shortcuts), `--set` last so it wins.
    pub fn overrides(
        &self,
        earlier: Vec<(String, String, String)>,
    ) -> Result<Vec<(String, String, String)>, ConfigError> {
        let mut overrides = earlier;
        overrides.extend(shortcut_overrides(&[(
            "scoring",
            "policy.scoring",
            &self.scoring,
        )]));
        overrides.extend(set_overrides(&self.set, "--set")?);
        Ok(overrides)
    }

    /// Loads the configuration from the file, the environment and these flags.
    pub fn load(&self) -> Result<Config, ConfigError> {
        self.load_with(Vec::new())
    }

    /// [`ConfigFlags::load`] with a command's own shortcut overrides (`serve`'s
    /// [`ServeFlags::overrides`]) applied before these flags.
    pub fn load_with(&self, earlier: Vec<(String, String, String)>) -> Result<Config, ConfigError> {
        Config::load(self.config.as_deref(), &self.overrides(earlier)?)
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_yaml())
    }
}

fn from_tree(tree: Value) -> Result<Config, String> {
    serde_yaml_ng::from_value(tree).map_err(|e| e.to_string())
}

fn set_path(mut tree: Value, key: &str, value: Value) -> Result<Value, String> {
    let segments: Vec<&str> = key.split('.').collect();
    let mut node = &mut tree;
    for (i, segment) in segments.iter().enumerate() {
        if node.is_null() {
            *node = Value::Mapping(Mapping::new());
        }
        let Value::Mapping(map) = node else {
            return Err(format!("{} is not a section", segments[..i].join(".")));
        };
        let slot = Value::String((*segment).to_owned());
        if i + 1 == segments.len() {
            map.insert(slot, value);
            return Ok(tree);
        }
        node = map.entry(slot).or_insert(Value::Null);
    }
    Ok(tree)
}

fn distinct(names: &[&str]) -> bool {
    names.iter().collect::<BTreeSet<_>>().len() == names.len()
}

/// A Kubernetes qualified name: an optional DNS-subdomain prefix and `/`, then a name of at
/// most 63 alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
pub fn is_qualified_name(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    name_ok && prefix.is_none_or(is_dns_subdomain)
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && label.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        })
}

/// An extended resource name: domain-prefixed, outside `kubernetes.io/`.
pub fn is_extended_resource_name(name: &str) -> bool {
    is_qualified_name(name)
        && name.contains('/')
        && !name.starts_with("kubernetes.io/")
        && !name.starts_with("requests.")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--set` overrides, with the origin `ConfigFlags` gives them.
    fn set(pairs: &[(&str, &str)]) -> Vec<(String, String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned(), format!("flag --set {k}")))
            .collect()
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn from_yaml(yaml: &str) -> Result<Config, ConfigError> {
        Config::from_sources(Some(("test.yaml", yaml)), &[], &[])
    }

    #[test]
    fn defaults_are_the_documented_names_and_valid() {
        let cfg = Config::from_sources(None, &[], &[]).unwrap();
        assert_eq!(cfg, Config::default());
        assert_eq!(cfg.resources.whole_gpu, "nvidia.com/gpu");
        assert_eq!(cfg.resources.gpu_mem, "aliyun.com/gpu-mem");
        assert_eq!(cfg.resources.gpu_core, "aliyun.com/gpu-core.percentage");
        assert_eq!(cfg.resources.topology_gpu, "aliyun.com/gpu");
        assert_eq!(cfg.resources.gpu_count, "aliyun.com/gpu-count");
        assert_eq!(cfg.node_labels.mode, "ack.node.gpu.schedule");
        assert_eq!(cfg.node_labels.gfd_memory, "nvidia.com/gpu.memory");
        assert!(cfg.annotations.allocation.starts_with("gpu-extender.io/"));
        assert!(!cfg.gpushare.enabled);
        assert_eq!(cfg.policy.scoring, ScoringPolicy::Binpack);
        assert_eq!(cfg.policy.max_pods_per_shared_gpu, 20);
        assert_eq!(cfg.server.listen.to_string(), "127.0.0.1:8888");
        assert_eq!(cfg.server.admin_listen.to_string(), "0.0.0.0:9090");
        assert_eq!(cfg.server.url_prefix, "/scheduler");
        assert_eq!(cfg.server.body_limit_bytes, 64 << 20);
        assert_eq!(cfg.server.request_timeout_ms, 2000);
        assert_eq!(cfg.bind.reservation_ttl_seconds, 120);
        assert_eq!(cfg.reservation_ttl_ms(), 120_000);
        assert_eq!(cfg.engine_policy().max_shares_per_gpu, 20);
        // An empty file and a comment-only file are the defaults too.
        assert_eq!(from_yaml("").unwrap(), Config::default());
        assert_eq!(from_yaml("# nothing\n").unwrap(), Config::default());
    }

    #[test]
    fn a_full_file_sets_every_section() {
        let yaml = r#"
resources:
  wholeGpu: example.com/gpu
  gpuMem: nvidia.com/gpumem
  gpuCore: nvidia.com/gpucores
  topologyGpu: example.com/topo-gpu
  gpuCount: example.com/gpu-count
nodeLabels:
  mode: example.com/gpu-mode
  placement: example.com/gpu-placement
  model: example.com/gpu-model
  memory: example.com/gpu-memory
  count: example.com/gpu-count
  gfdProduct: nvidia.com/gpu.product
  gfdMemory: nvidia.com/gpu.memory
  gfdCount: nvidia.com/gpu.count
annotations:
  allocation: example.com/alloc
  nodeGpus: example.com/gpus
  modelInclude: example.com/include
  modelExclude: example.com/exclude
  minGpuMemory: example.com/min-mem
  placement: example.com/placement
  topology: example.com/topology
gpushare:
  enabled: true
policy:
  scoring: fgd
  maxPodsPerSharedGpu: 8
  typicalPods:
    learn: false
    pods:
      - {cpuMilli: 4000, gpus: 1, gpuMilli: 500, weight: 3}
      - {cpuMilli: 8000, gpus: 8, gpuMilli: 1000, models: ["A100*"], weight: 1}
server:
  listen: 0.0.0.0:8443
  urlPrefix: /gpu
  adminListen: 127.0.0.1:9091
  bodyLimitBytes: 1048576
  tls: {certFile: /tls/tls.crt, keyFile: /tls/tls.key}
  requestTimeoutMs: 1500
bind:
  reservationTtlSeconds: 30
limits:
  maxConcurrentRequests: 16
"#;
        let cfg = from_yaml(yaml).unwrap();
        assert_eq!(cfg.resources.gpu_mem, "nvidia.com/gpumem");
        assert_eq!(cfg.node_labels.count, "example.com/gpu-count");
        assert_eq!(cfg.annotations.topology, "example.com/topology");
        assert!(cfg.gpushare.enabled);
        assert_eq!(cfg.policy.scoring, ScoringPolicy::Fgd);
        assert_eq!(cfg.policy.typical_pods.pods.len(), 2);
        assert_eq!(cfg.server.listen.port(), 8443);
        assert_eq!(
            cfg.server.tls.as_ref().map(|t| t.key_file.clone()),
            Some(PathBuf::from("/tls/tls.key"))
        );
        assert_eq!(cfg.bind.reservation_ttl_seconds, 30);
        assert_eq!(cfg.limits.max_concurrent_requests, 16);
        let policy = cfg.engine_policy();
        assert_eq!(policy.max_shares_per_gpu, 8);
        assert_eq!(policy.typical.pods().len(), 2);
        assert!((policy.typical.pods()[0].weight - 0.75).abs() < 1e-9);
        // What --print-config shows reads back as the same configuration.
        assert_eq!(from_yaml(&cfg.to_yaml()).unwrap(), cfg);
    }

    #[test]
    fn the_example_file_in_deploy_is_valid() {
        let text = include_str!("../deploy/config.example.yaml");
        from_yaml(text).unwrap();
    }

    #[test]
    fn the_scarcity_measure_is_chosen_by_name_under_its_new_key_and_its_old_one() {
        for (name, engine) in [
            ("now", Scarcity::Now),
            ("shape", Scarcity::Shape),
            ("empty", Scarcity::Empty),
        ] {
            let yaml = format!("policy:\n  fgdPlus:\n    scarcity:\n      measured: {name}\n");
            let cfg = from_yaml(&yaml).unwrap();
            assert_eq!(
                cfg.engine_policy().fgd_plus.scarcity.measured,
                engine,
                "{name}"
            );
            let old = format!("policy:\n  typicalPods:\n    scarcity: {name}\n");
            let cfg = from_yaml(&old).unwrap();
            assert_eq!(
                cfg.engine_policy().fgd_plus.scarcity.measured,
                engine,
                "{name}"
            );
        }
        assert_eq!(ScarcityConfig::default().engine(), Scarcity::Now);
        assert!(from_yaml("policy:\n  typicalPods:\n    scarcity: later\n").is_err());
        // Both names, differently: refused, naming both keys.
        let both = "policy:\n  typicalPods:\n    scarcity: empty\n  fgdPlus:\n    scarcity:\n      measured: shape\n";
        let err = from_yaml(both).unwrap_err().to_string();
        assert!(err.contains("policy.typicalPods.scarcity"), "{err}");
        assert!(err.contains("policy.fgdPlus.scarcity.measured"), "{err}");
    }

    /// `policy.fgdPlus` carries every knob of the engine's FGD+ by the engine's own keys: its
    /// defaults are the engine's, and each key set as an override changes the engine's tuning
    /// exactly as `Tuning::set` (what `gpu-lab simulate` takes) does with the same text.
    #[test]
    fn policy_fgd_plus_sets_every_knob_by_the_engine_s_key() {
        assert_eq!(
            Config::default().engine_policy().fgd_plus,
            fgd_plus::Tuning::default()
        );
        for (key, value) in fgd_plus::Tuning::default().knobs() {
            let other = match value.as_str() {
                "true" => "false".to_owned(),
                "now" => "shape".to_owned(),
                number => (number.parse::<u32>().unwrap() + 3).to_string(),
            };
            let cfg = Config::default()
                .with_override(&format!("policy.fgdPlus.{key}"), &other, "test")
                .unwrap();
            let mut expected = fgd_plus::Tuning::default();
            expected.set(key, &other).unwrap();
            assert_eq!(cfg.engine_policy().fgd_plus, expected, "{key}={other}");
        }
    }

    #[test]
    fn a_typo_names_the_field_and_where_it_is() {
        let err = from_yaml("policy:\n  scorng: spread\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `scorng`"), "{err}");
        assert!(err.contains("policy"), "{err}");
        assert!(err.contains("line 2"), "{err}");
        let err = from_yaml("sever:\n  listen: 1.2.3.4:5\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `sever`"), "{err}");
    }

    #[test]
    fn the_host_hold_is_on_by_default_and_reaches_fgd_plus_tuning() {
        assert!(Config::default().policy.fgd_plus.hold_host_for_gpus);
        assert!(Config::default().engine_policy().fgd_plus.hold_host);
        let cfg = Config::from_sources(
            None,
            &env(&[("GPU_EXTENDER_POLICY_FGD_PLUS_HOLD_HOST_FOR_GPUS", "false")]),
            &[],
        )
        .unwrap();
        assert!(!cfg.engine_policy().fgd_plus.hold_host);
        // The old key, in a file written before `policy.fgdPlus`, still turns it off.
        let old = from_yaml("policy:\n  holdHostForGpus: false\n").unwrap();
        assert!(!old.engine_policy().fgd_plus.hold_host);
    }

    #[test]
    fn an_invalid_value_names_the_key_and_the_choices() {
        let err = from_yaml("policy:\n  scoring: binpak\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                r#"policy.scoring: unknown policy "binpak"; expected one of binpack, spread, fgd, fgd-plus"#
            ),
            "{err}"
        );
        let err = from_yaml("server:\n  listen: localhost\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("server.listen"), "{err}");
        let err =
            from_yaml("policy:\n  maxPodsPerSharedGpu: 0\nbind:\n  reservationTtlSeconds: 0\n")
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("policy.maxPodsPerSharedGpu: 0 is out of range"),
            "{err}"
        );
        assert!(
            err.contains("bind.reservationTtlSeconds"),
            "both problems are listed: {err}"
        );
        let err = from_yaml("resources:\n  gpuMem: gpu-mem\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("resources.gpuMem"), "{err}");
        let err = from_yaml("policy:\n  scoring: fgd\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("policy.typicalPods"), "{err}");
        let err = from_yaml("policy:\n  typicalPods:\n    pods: [{gpus: 1, gpuMilli: 500, weight: 1, models: [\"A|B\"]}]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("policy.typicalPods.pods[0]"), "{err}");
        let err = from_yaml("server:\n  tls: {certFile: /a}\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("keyFile"), "{err}");
        let err =
            from_yaml("estimator:\n  tls: {certFile: /a, keyFile: /b, reloadIntervalSeconds: 0}\n")
                .unwrap_err()
                .to_string();
        assert!(err.contains("estimator.tls.reloadIntervalSeconds"), "{err}");
    }

    #[test]
    fn env_overrides_the_file_and_flags_override_env() {
        let yaml = "policy:\n  scoring: spread\n  maxPodsPerSharedGpu: 10\n";
        let vars = env(&[
            ("GPU_EXTENDER_POLICY_MAX_PODS_PER_SHARED_GPU", "12"),
            ("GPU_EXTENDER_GPUSHARE_ENABLED", "true"),
            ("GPU_EXTENDER_SERVER_URL_PREFIX", "/x"),
            ("GPU_EXTENDER_SERVER_TLS_CERT_FILE", "/c.pem"),
            ("GPU_EXTENDER_SERVER_TLS_KEY_FILE", "/k.pem"),
            ("GPU_EXTENDER_CONFIG", "/ignored/here.yaml"),
            ("HOME", "/root"),
        ]);
        let flags = set(&[("policy.maxPodsPerSharedGpu", "14")]);
        let cfg = Config::from_sources(Some(("f", yaml)), &vars, &flags).unwrap();
        assert_eq!(cfg.policy.scoring, ScoringPolicy::Spread);
        assert_eq!(cfg.policy.max_pods_per_shared_gpu, 14);
        assert!(cfg.gpushare.enabled);
        assert_eq!(cfg.server.url_prefix, "/x");
        assert_eq!(
            cfg.server.tls,
            Some(TlsConfig {
                cert_file: "/c.pem".into(),
                key_file: "/k.pem".into(),
                ..TlsConfig::default()
            })
        );
        let cfg = Config::from_sources(
            None,
            &env(&[("GPU_EXTENDER_POLICY_MAX_PODS_PER_SHARED_GPU", "12")]),
            &[],
        )
        .unwrap();
        assert_eq!(cfg.policy.max_pods_per_shared_gpu, 12);
    }

    #[test]
    fn overrides_take_yaml_values_and_plain_strings() {
        let flags = set(&[
            (
                "policy.typicalPods.pods",
                "[{gpus: 1, gpuMilli: 250, weight: 1}]",
            ),
            ("policy.scoring", "fgd"),
            ("server.urlPrefix", "/123"),
            ("annotations.allocation", "a.b/true"),
        ]);
        let cfg = Config::from_sources(None, &[], &flags).unwrap();
        assert_eq!(cfg.policy.typical_pods.pods[0].gpu_milli, 250);
        assert_eq!(cfg.annotations.allocation, "a.b/true");
    }

    #[test]
    fn bad_overrides_name_their_source() {
        let err = Config::from_sources(None, &env(&[("GPU_EXTENDER_POLICY_SCORNG", "x")]), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("GPU_EXTENDER_POLICY_SCORNG"), "{err}");
        let err = Config::from_sources(
            None,
            &env(&[("GPU_EXTENDER_POLICY_SCORING", "binpak")]),
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("policy.scoring (from env GPU_EXTENDER_POLICY_SCORING)"),
            "{err}"
        );
        assert!(err.contains("unknown policy \"binpak\""), "{err}");
        let flags = set(&[("policy.nope", "1")]);
        let err = Config::from_sources(None, &[], &flags)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown configuration key \"policy.nope\""),
            "{err}"
        );
        let flags = set(&[("bind.reservationTtlSeconds", "soon")]);
        let err = Config::from_sources(None, &[], &flags)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("bind.reservationTtlSeconds (from flag --set bind.reservationTtlSeconds)"),
            "{err}"
        );
        assert!(parse_override("novalue").is_err());
        assert_eq!(
            parse_override("a.b=c=d").unwrap(),
            ("a.b".to_owned(), "c=d".to_owned())
        );
    }

    #[test]
    fn every_key_has_an_env_var_and_exists_in_the_schema() {
        assert_eq!(
            env_var_name("policy.maxPodsPerSharedGpu"),
            "GPU_EXTENDER_POLICY_MAX_PODS_PER_SHARED_GPU"
        );
        assert_eq!(
            env_var_name("nodeLabels.gfdCount"),
            "GPU_EXTENDER_NODE_LABELS_GFD_COUNT"
        );
        let names: BTreeSet<String> = env_vars().into_iter().map(|(v, _)| v).collect();
        assert_eq!(names.len(), KEYS.len(), "env var names are unique");
        // Every key round-trips through an override of its current (default) value, and the
        // documentation mentions every key and variable.
        let docs = include_str!("../docs/configuration.md");
        let mut cfg = Config::default();
        let tls = Some(TlsConfig {
            cert_file: "/c".into(),
            key_file: "/k".into(),
            client_ca_file: Some("/ca".into()),
            ..TlsConfig::default()
        });
        cfg.server.tls.clone_from(&tls);
        cfg.estimator.tls = tls;
        let tree = serde_yaml_ng::to_value(&cfg).unwrap();
        for key in KEYS {
            let mut node = &tree;
            for segment in key.split('.') {
                node = node
                    .get(segment)
                    .unwrap_or_else(|| panic!("{key} is not in the schema"));
            }
            let last = key.rsplit('.').next().unwrap();
            assert!(docs.contains(last), "docs/configuration.md misses {key}");
            assert!(
                docs.contains(&env_var_name(key)),
                "docs miss {}",
                env_var_name(key)
            );
        }
        let mut leaves = Vec::new();
        collect_leaves(&tree, String::new(), &mut leaves);
        for leaf in leaves {
            assert!(KEYS.contains(&leaf.as_str()), "KEYS misses {leaf}");
        }
    }

    fn collect_leaves(value: &Value, path: String, out: &mut Vec<String>) {
        match value {
            Value::Mapping(map) if !path.ends_with("pods") => {
                for (k, v) in map {
                    let k = k.as_str().unwrap_or_default();
                    let next = if path.is_empty() {
                        k.to_owned()
                    } else {
                        format!("{path}.{k}")
                    };
                    collect_leaves(v, next, out);
                }
            }
            _ => out.push(path),
        }
    }

    #[test]
    fn flags_become_overrides() {
        let flags = ConfigFlags {
            scoring: Some("spread".into()),
            set: vec![
                "policy.scoring=fgd".into(),
                "policy.typicalPods.learn=true".into(),
            ],
            ..ConfigFlags::default()
        };
        let serve = ServeFlags {
            listen: Some("0.0.0.0:1".into()),
            ..ServeFlags::default()
        };
        let overrides = flags.overrides(serve.overrides()).unwrap();
        let cfg = Config::from_sources(None, &[], &overrides).unwrap();
        assert_eq!(
            cfg.policy.scoring,
            ScoringPolicy::Fgd,
            "--set comes last and wins"
        );
        assert_eq!(cfg.server.listen.port(), 1);
    }

    #[test]
    fn errors_from_shortcut_flags_name_the_flag_typed() {
        let serve = ServeFlags {
            listen: Some("nowhere".into()),
            ..ServeFlags::default()
        };
        let overrides = ConfigFlags::default().overrides(serve.overrides()).unwrap();
        let err = Config::from_sources(None, &[], &overrides)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("server.listen (from flag --listen): "),
            "{err}"
        );
        let serve = ServeFlags {
            gpushare: Some("maybe".into()),
            ..ServeFlags::default()
        };
        let overrides = ConfigFlags::default().overrides(serve.overrides()).unwrap();
        let err = Config::from_sources(None, &[], &overrides)
            .unwrap_err()
            .to_string();
        assert!(err.contains("(from flag --gpushare)"), "{err}");
        let flags = ConfigFlags {
            set: vec!["server.listen=nowhere".into()],
            ..ConfigFlags::default()
        };
        let err = Config::from_sources(None, &[], &flags.overrides(Vec::new()).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("(from flag --set server.listen)"), "{err}");
    }

    #[test]
    fn a_policy_without_typical_pods_is_named_in_the_error() {
        for policy in ScoringPolicy::ALL.into_iter().filter(|p| p.uses_typical()) {
            let flags = ConfigFlags {
                scoring: Some(policy.as_str().into()),
                ..ConfigFlags::default()
            };
            let err = Config::from_sources(None, &[], &flags.overrides(Vec::new()).unwrap())
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("scoring {} needs typical pods", policy.as_str())),
                "{err}"
            );
        }
    }

    #[test]
    fn name_checks() {
        assert!(is_qualified_name("aliyun.com/gpu-mem"));
        assert!(is_qualified_name("ack.node.gpu.schedule"));
        assert!(is_qualified_name("aliyun.accelerator/nvidia_name"));
        assert!(!is_qualified_name("Bad_Domain/x"));
        assert!(!is_qualified_name("a/"));
        assert!(!is_qualified_name("-x"));
        assert!(is_extended_resource_name("nvidia.com/gpu"));
        assert!(!is_extended_resource_name("gpu"));
        assert!(!is_extended_resource_name("kubernetes.io/gpu"));
    }
}
