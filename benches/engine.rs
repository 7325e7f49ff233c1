//! Engine benchmarks: filter plus score of one pod over a whole cluster (what the extender does
//! for every scheduling cycle), reserve plus release on a large table, a full rebuild, and
//! indexing one node's link matrix, and Karmada's estimate of one template over a whole cluster.
//!
//! Clusters are generated from a fixed seed so runs compare: 8-GPU nodes of four card models,
//! pre-loaded to a mixed occupancy (some empty, some full, most in between) by the engine's own
//! `fit`, so the state is one the engine could really reach.
//!
//! Times are the benchmark thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), so that on a shared,
//! loaded machine they still mean "on one core"; set `BENCH_CLOCK=wall` for wall-clock time.
//!
//! Run: `cargo bench --bench engine -- --warm-up-time 1 --measurement-time 3`

#![allow(
    clippy::unwrap_used,
    reason = "set-up of fixed, known-valid inputs: a panic is a broken bench, not a user error"
)]

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;

use std::time::Instant;

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use gpu_engine::policy::typical::Scarcity;
use gpu_engine::{
    AlikeScores, Change, CpuMilli, GpuDemand, GpuMode, GpuPlacement, Link, LinkMatrix, MemMiB,
    ModelPattern, NodeSpec, NodeState, PodAllocation, PodKey, PodRequest, Policy, RejectReason,
    ScoringPolicy, Table, TopologyIndex, TypicalPod, TypicalPods, fit, max_replicas,
};
use gpu_extender::config::Config;
use gpu_extender::estimator::EstimatorService;
use gpu_extender::estimator::proto::{pb, resource};
use gpu_extender::state::{ClusterState, PolicyCell};
use gpu_extender::telemetry::Metrics;
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use prost::Message as _;
use rustix::time::{ClockId, clock_gettime};

/// Which clock the benchmarks read: the thread's CPU time by default, wall-clock on request.
#[derive(Clone, Copy)]
enum Clock {
    ThreadCpu,
    Wall(Instant),
}

impl Clock {
    fn from_env() -> Self {
        match std::env::var("BENCH_CLOCK").as_deref() {
            Ok("wall") => Self::Wall(Instant::now()),
            _ => Self::ThreadCpu,
        }
    }

    fn now_ns(self) -> u64 {
        match self {
            Self::ThreadCpu => {
                let t = clock_gettime(ClockId::ThreadCPUTime);
                t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
            }
            Self::Wall(origin) => origin.elapsed().as_nanos() as u64,
        }
    }
}

impl Measurement for Clock {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        self.now_ns()
    }
    fn end(&self, start: u64) -> u64 {
        self.now_ns().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, value: &u64) -> f64 {
        *value as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &Nanoseconds
    }
}

/// Formats nanoseconds like criterion's own wall-clock formatter.
struct Nanoseconds;

impl ValueFormatter for Nanoseconds {
    fn scale_values(&self, typical_ns: f64, values: &mut [f64]) -> &'static str {
        let (factor, unit) = match typical_ns {
            ns if ns < 1e3 => (1.0, "ns"),
            ns if ns < 1e6 => (1e-3, "µs"),
            ns if ns < 1e9 => (1e-6, "ms"),
            _ => (1e-9, "s"),
        };
        for value in values {
            *value *= factor;
        }
        unit
    }

    fn scale_throughputs(
        &self,
        _typical_ns: f64,
        throughput: &Throughput,
        values: &mut [f64],
    ) -> &'static str {
        let elements = match *throughput {
            Throughput::Elements(n) | Throughput::ElementsAndBytes { elements: n, .. } => n,
            Throughput::Bytes(n) | Throughput::BytesDecimal(n) | Throughput::Bits(n) => n,
        } as f64;
        for value in values {
            *value = elements * 1e9 / *value;
        }
        "elem/s"
    }

    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

/// SplitMix64: a tiny deterministic generator, so the bench needs no randomness crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

const GPUS_PER_NODE: u16 = 8;
const MODELS: [(&str, u64); 4] = [
    ("A100-SXM4-80GB", 80),
    ("A10", 24),
    ("Tesla-V100-SXM2-32GB", 32),
    ("Tesla-T4", 16),
];

/// Which kind of node pool the cluster is: the extender only sees nodes kube-scheduler already
/// found to carry the pod's extended resource, so a share pod is evaluated against sharing nodes
/// and a whole-GPU pod against exclusive ones.
#[derive(Clone, Copy)]
enum Pool {
    Shared,
    Whole,
}

/// Two NVLink islands of four GPUs, PCIe across sockets between them (DGX-like).
fn two_islands() -> LinkMatrix {
    LinkMatrix::from_fn(8, |a, b| {
        if a / 4 == b / 4 {
            Link::NvLink(2)
        } else {
            Link::CrossSocket
        }
    })
}

fn node_spec(name: &str, pool: Pool, rng: &mut Rng) -> NodeSpec {
    let (model, gib) = rng.pick(&MODELS);
    let spec = match pool {
        Pool::Shared => {
            let mode = if rng.chance(30) {
                GpuMode::CoreMem
            } else {
                GpuMode::ShareMemory
            };
            let placement = if rng.chance(25) {
                GpuPlacement::Spread
            } else {
                GpuPlacement::Binpack
            };
            NodeSpec::uniform(name, mode, GPUS_PER_NODE, model, MemMiB(gib * 1024))
                .with_placement(placement)
        }
        Pool::Whole => {
            let spec = NodeSpec::uniform(
                name,
                GpuMode::Exclusive,
                GPUS_PER_NODE,
                model,
                MemMiB(gib * 1024),
            );
            // Half the nodes publish per-GPU detail with their NVLink islands.
            if rng.chance(50) {
                spec.with_links(two_islands())
            } else {
                spec
            }
        }
    };
    spec.with_host(CpuMilli(96_000), MemMiB(786_432), 110)
}

/// A random pod of the kind that runs on `pool`.
fn random_pod(pool: Pool, mode: GpuMode, rng: &mut Rng) -> PodRequest {
    let cpu = CpuMilli(rng.pick(&[500, 1000, 2000, 4000, 8000]));
    let memory = MemMiB(rng.pick(&[1024, 4096, 16_384]));
    let demand = match pool {
        Pool::Shared if rng.chance(10) => GpuDemand::whole(1),
        Pool::Shared if rng.chance(8) => GpuDemand::share(rng.pick(&[8, 16]), 2, None),
        Pool::Shared => {
            let core = (mode == GpuMode::CoreMem).then(|| rng.pick(&[10, 20, 25, 30, 50]));
            GpuDemand::share(rng.pick(&[2, 4, 4, 8, 8, 12]), 1, core)
        }
        Pool::Whole => GpuDemand::whole(rng.pick(&[1, 1, 1, 2, 2, 4, 8])),
    };
    PodRequest::single(cpu, memory, demand.unwrap_or_default())
}

fn used_fraction(node: &NodeState) -> f64 {
    let free: u64 = (0..node.gpus.len())
        .map(|position| u64::from(node.gpu_free_milli(position)))
        .sum();
    1.0 - free as f64 / (1000.0 * node.gpus.len() as f64)
}

/// A generated cluster: the table the extender would hold, and the facts it was built from.
struct Cluster {
    table: Table,
    specs: Vec<NodeSpec>,
    pods: Vec<(PodKey, PodAllocation)>,
}

/// How full to make each node.
#[derive(Clone, Copy)]
enum Fill {
    /// 10% empty, 15% as full as they get, the rest to a random 20..90% of GPU capacity.
    Mixed,
    /// Exactly this many pods on every node.
    Pods(usize),
}

/// `count` nodes filled by the engine itself, as `fill` says. Nodes enter the table first and
/// pods after, as after a restart (`Table::rebuild`), so the node states sit in memory the way
/// the extender's own table would hold them.
fn cluster(count: usize, pool: Pool, fill: Fill, seed: u64) -> Cluster {
    cluster_named(count, pool, fill, seed, |index| {
        format!("gpu-node-{index:05}")
    })
}

/// [`cluster`] with the nodes named by `name`.
fn cluster_named(
    count: usize,
    pool: Pool,
    fill: Fill,
    seed: u64,
    name: impl Fn(usize) -> String,
) -> Cluster {
    let mut rng = Rng(seed);
    let policy = Policy::default();
    let specs: Vec<NodeSpec> = (0..count)
        .map(|index| node_spec(&name(index), pool, &mut rng))
        .collect();
    let mut table = Table::rebuild(20, specs.iter().cloned(), []);
    let mut pods = Vec::new();
    for spec in &specs {
        let (target, max_pods_per_node) = match fill {
            Fill::Pods(pods) => (1.0, pods),
            Fill::Mixed => match rng.below(100) {
                0..10 => (0.0, usize::MAX),
                10..25 => (1.0, usize::MAX),
                _ => (0.2 + 0.7 * (rng.below(1000) as f64 / 1000.0), usize::MAX),
            },
        };
        let mut misses = 0;
        let mut placed = 0;
        while misses < 20 && placed < max_pods_per_node {
            let node = table.node(&spec.name).unwrap();
            if used_fraction(node) >= target {
                break;
            }
            let request = random_pod(pool, spec.mode, &mut rng);
            match fit(node, &request, &policy) {
                Ok(allocation) => {
                    let pod = PodKey::new("bench", &format!("pod-{}", pods.len()));
                    table.apply(Change::PodBound {
                        pod: pod.clone(),
                        allocation: allocation.clone(),
                    });
                    pods.push((pod, allocation));
                    placed += 1;
                }
                Err(_) => misses += 1,
            }
        }
    }
    Cluster { table, specs, pods }
}

/// About 30 pod classes in the shape of a production trace: many small shares, some whole GPUs,
/// a few multi-GPU and CPU-only classes, some tied to card models.
fn typical_pods() -> TypicalPods {
    let mut classes = Vec::new();
    let patterns = [
        None,
        None,
        Some("A100*"),
        None,
        Some("Tesla-T4"),
        Some("Tesla-V100*"),
    ];
    let mut weight = 1000.0;
    for (i, milli) in [100, 150, 200, 250, 300, 400, 500, 600, 700, 800, 900, 1000]
        .into_iter()
        .enumerate()
    {
        for (j, cpu) in [2000, 8000].into_iter().enumerate() {
            let model = patterns[(i + j) % patterns.len()];
            classes.push(TypicalPod {
                cpu: CpuMilli(cpu),
                memory: MemMiB(0),
                gpus: 1,
                milli,
                models: model
                    .map(|p| ModelPattern::parse(p).unwrap())
                    .into_iter()
                    .collect(),
                weight,
            });
            weight *= 0.9;
        }
    }
    for (gpus, cpu) in [(2, 16_000), (4, 32_000), (8, 64_000)] {
        classes.push(TypicalPod {
            cpu: CpuMilli(cpu),
            memory: MemMiB(0),
            gpus,
            milli: 1000,
            models: Vec::new(),
            weight: 30.0,
        });
    }
    for cpu in [1000, 4000, 16_000] {
        classes.push(TypicalPod {
            cpu: CpuMilli(cpu),
            memory: MemMiB(0),
            gpus: 0,
            milli: 0,
            models: Vec::new(),
            weight: 50.0,
        });
    }
    TypicalPods::new(classes)
}

fn policy(scoring: ScoringPolicy) -> Policy {
    Policy::scoring(scoring).with_typical(typical_pods())
}

/// What filter plus prioritize do for one pod: judge every node of the table, keep the
/// feasible ones with their scores and count the rejections by reason. `judge` is
/// `Policy::evaluate_score` (what the extender calls) or the full `Policy::evaluate`.
fn filter_and_score<'t>(
    table: &'t Table,
    mut judge: impl FnMut(&'t NodeState) -> Result<f64, RejectReason>,
) -> (Vec<(usize, f64)>, [u32; RejectReason::ALL.len()]) {
    let mut feasible = Vec::with_capacity(table.node_count());
    let mut rejected = [0u32; RejectReason::ALL.len()];
    for (index, node) in table.nodes().enumerate() {
        match judge(node) {
            Ok(score) => feasible.push((index, score)),
            Err(reason) => rejected[reason as usize] += 1,
        }
    }
    (feasible, rejected)
}

/// The pods the cluster-wide benchmarks ask about: an 8 GiB share for the shared pool, two whole
/// GPUs for the exclusive one.
fn probe_pods() -> (PodRequest, PodRequest) {
    let share_pod = PodRequest::single(
        CpuMilli(2000),
        MemMiB(4096),
        GpuDemand::share(8, 1, None).unwrap(),
    );
    let whole_pod =
        PodRequest::single(CpuMilli(8000), MemMiB(16_384), GpuDemand::whole(2).unwrap());
    (share_pod, whole_pod)
}

fn bench_evaluate(c: &mut Criterion<Clock>) {
    let (share_pod, whole_pod) = probe_pods();
    let mut group = c.benchmark_group("filter_score");
    for size in [500, 5000] {
        let shared = cluster(size, Pool::Shared, Fill::Mixed, 42);
        let whole = cluster(size, Pool::Whole, Fill::Mixed, 43);
        for scoring in [
            ScoringPolicy::Binpack,
            ScoringPolicy::Spread,
            ScoringPolicy::Fgd,
        ] {
            let policy = policy(scoring);
            for (label, table, pod) in [
                ("share", &shared.table, &share_pod),
                ("whole2", &whole.table, &whole_pod),
            ] {
                let id = BenchmarkId::new(format!("{}/{label}", scoring.as_str()), size);
                group.bench_with_input(id, table, |b, table| {
                    b.iter(|| {
                        filter_and_score(black_box(table), |node| {
                            policy.evaluate_score(node, black_box(pod))
                        })
                    })
                });
            }
        }
        // The full evaluation (placement built for every node), for comparison: what filter and
        // prioritize called before the score-only path.
        if size == 5000 {
            let policy = policy(ScoringPolicy::Binpack);
            for (label, table, pod) in [
                ("share", &shared.table, &share_pod),
                ("whole2", &whole.table, &whole_pod),
            ] {
                let id = BenchmarkId::new(format!("binpack/{label}/full"), size);
                group.bench_with_input(id, table, |b, table| {
                    b.iter(|| {
                        filter_and_score(black_box(table), |node| {
                            policy
                                .evaluate(node, black_box(pod))
                                .map(|evaluation| evaluation.score)
                        })
                    })
                });
            }
        }
    }
    group.finish();
}

/// Filter and prioritize judge their candidates through `AlikeScores`, which places once for
/// each set of nodes placement cannot tell apart. Against `Policy::evaluate_score` per node: on
/// the mixed clusters above (nearly every node differs: the memo's cost) and on empty ones (a
/// fresh node pool, or kube-scheduler's throughput run: the memo's gain).
fn bench_alike(c: &mut Criterion<Clock>) {
    let (share_pod, whole_pod) = probe_pods();
    let mut group = c.benchmark_group("filter_alike");
    let size = 5000;
    let mixed = cluster(size, Pool::Whole, Fill::Mixed, 43);
    let mixed_shared = cluster(size, Pool::Shared, Fill::Mixed, 42);
    let empty = cluster(size, Pool::Whole, Fill::Pods(0), 43);
    for scoring in [ScoringPolicy::Binpack, ScoringPolicy::Fgd] {
        let policy = policy(scoring);
        for (label, table, pod) in [
            ("share", &mixed_shared.table, &share_pod),
            ("whole2", &mixed.table, &whole_pod),
            ("whole2-empty", &empty.table, &whole_pod),
        ] {
            let id = BenchmarkId::new(format!("{}/{label}/per-node", scoring.as_str()), size);
            group.bench_with_input(id, table, |b, table| {
                b.iter(|| {
                    filter_and_score(black_box(table), |node| {
                        policy.evaluate_score(node, black_box(pod))
                    })
                })
            });
            let id = BenchmarkId::new(format!("{}/{label}/alike", scoring.as_str()), size);
            group.bench_with_input(id, table, |b, table| {
                b.iter(|| {
                    let mut alike = AlikeScores::new(&policy, black_box(pod), table.node_count());
                    let (feasible, rejected) =
                        filter_and_score(black_box(table), |node| alike.score(node));
                    (feasible.len(), rejected)
                })
            });
        }
    }
    group.finish();
}

/// What the extender's filter does for one pod in kube-scheduler's loop (`ClusterState::filter`):
/// look up the names kube-scheduler sent (its window: about 42% of 1,000 nodes, 10% of 5,000)
/// and judge each through `AlikeScores`, the best one kept (`filterBestOnly`). "cold" first
/// writes 64 MiB, untimed, as the other processes of the loop (kube-scheduler, kube-apiserver,
/// etcd) run between two filter calls on a shared machine and leave little of the table cached.
/// "-long" names the nodes as EC2 does (41 bytes, `ip-10-0-3-17.us-west-2.compute.internal`);
/// "-mixed" asks on the mixed cluster, where `AlikeScores` stops remembering after 64 nodes.
fn bench_names(c: &mut Criterion<Clock>) {
    let (_, whole_pod) = probe_pods();
    let policy = Policy {
        filter_best_only: true,
        ..policy(ScoringPolicy::Binpack)
    };
    let mut group = c.benchmark_group("filter_names");
    let mut evict = vec![0u8; 64 << 20];
    for (size, window, label) in [
        (1000, 420, ""),
        (5000, 500, ""),
        (1000, 420, "-long"),
        (1000, 420, "-mixed"),
    ] {
        let built = match label {
            "-long" => cluster_named(size, Pool::Whole, Fill::Pods(0), 43, |index| {
                format!(
                    "ip-10-0-{}-{}.us-west-2.compute.internal",
                    index / 250,
                    index % 250
                )
            }),
            "-mixed" => cluster(size, Pool::Whole, Fill::Mixed, 43),
            _ => cluster(size, Pool::Whole, Fill::Pods(0), 43),
        };
        // kube-scheduler's order is not the table's: its window starts where the last stopped.
        // The names lie one after another in one buffer, as in the request body they are
        // borrowed from.
        let mut body = String::new();
        let mut spans = Vec::with_capacity(window);
        for i in 0..window {
            let start = body.len();
            body.push_str(built.specs[(i * 7 + size / 3) % size].name.as_str());
            spans.push(start..body.len());
        }
        let names: Vec<&str> = spans.into_iter().map(|span| &body[span]).collect();
        let table = &built.table;
        let run = |names: &[&str]| {
            let verdict = gpu_extender::state::decide::filter(
                table.nodes_by_names(names),
                black_box(&whole_pod),
                &policy,
            );
            verdict.passed.len()
        };
        if label != "-long" {
            group.bench_function(BenchmarkId::new(format!("warm{label}"), size), |b| {
                b.iter(|| run(black_box(&names)))
            });
        }
        group.bench_function(BenchmarkId::new(format!("cold{label}"), size), |b| {
            b.iter_batched(
                || {
                    for (i, byte) in evict.iter_mut().enumerate().step_by(64) {
                        *byte = byte.wrapping_add(i as u8);
                    }
                },
                |()| run(black_box(&names)),
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

fn bench_table(c: &mut Criterion<Clock>) {
    // 5,000 nodes and exactly 4 pods on each: 20,000 pods.
    let cluster = cluster(5000, Pool::Shared, Fill::Pods(4), 7);
    assert_eq!(cluster.pods.len(), 20_000, "every node takes its 4 pods");
    let mut group = c.benchmark_group("table");
    let mut table = cluster.table;
    let policy = Policy::default();
    let request = PodRequest::single(
        CpuMilli(1000),
        MemMiB(1024),
        GpuDemand::share(2, 1, None).unwrap(),
    );
    let allocation = table
        .nodes()
        .find_map(|node| fit(node, &request, &policy).ok())
        .unwrap();
    let key = PodKey::new("bench", "reserved");
    group.bench_function("reserve_release/5000x20000", |b| {
        b.iter(|| {
            table
                .reserve(key.clone(), black_box(allocation.clone()), u64::MAX)
                .unwrap();
            table.release(black_box(&key))
        })
    });
    group.sample_size(10);
    group.bench_function(
        BenchmarkId::new(
            "rebuild",
            format!("{}x{}", cluster.specs.len(), cluster.pods.len()),
        ),
        |b| {
            b.iter_batched(
                || (cluster.specs.clone(), cluster.pods.clone()),
                |(specs, pods)| Table::rebuild(20, specs, pods),
                BatchSize::LargeInput,
            )
        },
    );
    group.finish();
}

/// What FGD+'s scarcity measured now costs the extender each second
/// (`state::policy::remeasure_scarcity`): the typical classes measured over every node of a
/// mixed, partly used cluster, as they are.
fn bench_scarcity(c: &mut Criterion<Clock>) {
    let mut group = c.benchmark_group("scarcity");
    group.sample_size(20);
    for count in [1000, 5000] {
        let cluster = cluster(count, Pool::Whole, Fill::Mixed, 11);
        let typical = typical_pods();
        group.bench_with_input(
            BenchmarkId::new("remeasure_now", count),
            &cluster.table,
            |b, table| {
                b.iter(|| {
                    typical
                        .clone()
                        .with_scarcity(black_box(table).nodes(), Scarcity::Now)
                })
            },
        );
    }
    group.finish();
}

/// What indexing one node's link matrix costs (every node update builds its spec's index):
/// tabulated as the engine builds it, and by search only, for comparison.
fn bench_topology(c: &mut Criterion<Clock>) {
    let links = two_islands();
    let mut group = c.benchmark_group("topology");
    group.bench_function("build/two_islands", |b| {
        b.iter(|| TopologyIndex::build(black_box(&links)))
    });
    group.bench_function("build_searching/two_islands", |b| {
        b.iter(|| TopologyIndex::build_searching(black_box(&links)))
    });
    group.finish();
}

/// Karmada's estimate for one template over 5,000 nodes of mixed fill (most nodes a shape of
/// their own): the engine's count alone, and the whole estimator call (template read,
/// kube-scheduler's node-level filters on every node, count) as the gRPC method runs it.
fn bench_estimate(c: &mut Criterion<Clock>) {
    let mut group = c.benchmark_group("estimate");
    let shared = cluster(5000, Pool::Shared, Fill::Mixed, 42);
    let whole = cluster(5000, Pool::Whole, Fill::Mixed, 43);
    let (share_pod, whole_pod) = probe_pods();
    let policy = Policy::default();
    for (label, table, pod) in [
        ("share", &shared.table, &share_pod),
        ("whole2", &whole.table, &whole_pod),
    ] {
        group.bench_with_input(
            BenchmarkId::new(format!("engine/{label}"), 5000),
            table,
            |b, table| {
                b.iter(|| {
                    max_replicas(
                        black_box(table).nodes(),
                        black_box(pod),
                        &policy,
                        i32::MAX as u64,
                    )
                })
            },
        );
    }
    let cfg = Config::default();
    let service = |generated: &Cluster| {
        let table = Table::rebuild(20, generated.specs.clone(), generated.pods.clone());
        let cluster = Arc::new(ClusterState::with_table(table));
        for node in &generated.specs {
            let labels = BTreeMap::from([("zone".to_owned(), "a".to_owned())]);
            // What kube-scheduler's NodeResourcesFit reads: the GPU resources advertised.
            let gpus = node.gpus.len() as u64;
            let gib: u64 = node.gpus.iter().map(|g| g.memory.0 / 1024).sum();
            let allocatable = BTreeMap::from([
                (cfg.resources.whole_gpu.clone(), Quantity(gpus.to_string())),
                (cfg.resources.gpu_mem.clone(), Quantity(gib.to_string())),
            ]);
            // Keyed by the table's own name, as the feed keys them.
            let name = cluster
                .read()
                .node(&node.name)
                .map(|known| known.spec.name.clone())
                .unwrap();
            cluster.note_node_claims(
                name,
                &Node {
                    metadata: ObjectMeta {
                        name: Some(node.name.to_string()),
                        labels: Some(labels),
                        ..ObjectMeta::default()
                    },
                    status: Some(NodeStatus {
                        allocatable: Some(allocatable),
                        ..NodeStatus::default()
                    }),
                    ..Node::default()
                },
            );
        }
        EstimatorService::new(
            cluster,
            PolicyCell::from(Arc::new(cfg.engine_policy())),
            Arc::new(cfg.clone()),
            Metrics::new().unwrap(),
        )
    };
    let quantity = |text: &str| {
        resource::Quantity {
            string: Some(text.to_owned()),
        }
        .encode_to_vec()
    };
    let share = [
        (cfg.resources.gpu_mem.clone(), "8"),
        ("cpu".to_owned(), "2"),
    ];
    let zone_a = Some(pb::NodeClaim {
        node_selector: [("zone".to_owned(), "a".to_owned())].into(),
        ..pb::NodeClaim::default()
    });
    // With a node selector, every node's claims are read; without one (`share-unclaimed`, the
    // common template), only those of cordoned or tainted nodes are.
    for (label, generated, resources, node_claim) in [
        ("share", &shared, share.clone(), zone_a.clone()),
        ("share-unclaimed", &shared, share, None),
        (
            "whole2",
            &whole,
            [
                (cfg.resources.whole_gpu.clone(), "2"),
                ("cpu".to_owned(), "8"),
            ],
            zone_a.clone(),
        ),
    ] {
        let service = service(generated);
        let request = pb::MaxAvailableReplicasRequest {
            cluster: "member".to_owned(),
            replica_requirements: Some(pb::ReplicaRequirements {
                node_claim,
                namespace: "default".to_owned(),
                resource_request_bytes: resources
                    .iter()
                    .map(|(name, amount)| (name.clone(), quantity(amount)))
                    .collect(),
                ..pb::ReplicaRequirements::default()
            }),
            ..pb::MaxAvailableReplicasRequest::default()
        };
        let answer = service.max_available_replicas(&request).unwrap();
        assert!(
            answer > 0,
            "{label}: every node is admitted and most have room"
        );
        group.bench_function(BenchmarkId::new(format!("service/{label}"), 5000), |b| {
            b.iter(|| service.max_available_replicas(black_box(&request)).unwrap())
        });
    }
    group.finish();
}

fn config() -> Criterion<Clock> {
    Criterion::default().with_measurement(Clock::from_env())
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_evaluate, bench_alike, bench_names, bench_table, bench_scarcity, bench_topology, bench_estimate
}
criterion_main!(benches);
