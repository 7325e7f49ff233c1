//! Harder workloads for policy research, built the way the FGD paper built its variants of
//! `default`: sampled from a source trace, raising the share of one kind of pod (model-
//! constrained, sharing, multi-GPU, CPU-only). Pure: a workload and a seed in, pods out; the
//! `workload` command (`run_cli`) reads the inputs and writes an openb pod CSV. Every draw comes
//! from Go's `math/rand` port seeded with the seed, so a seed always builds the same file.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use super::go_rand::GoRand;
use super::load;
use super::trace::{Cluster, SimNode, SimPod, Workload};

/// Which kind of pod to raise, and to what.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Raise {
    /// The share (0..=1) of GPU pods, by count, that accept only some GPU models.
    Constrained(f64),
    /// The share (0..=1) of GPU demand (Σ num_gpu × gpu_milli) asked by sharing pods.
    Share(f64),
    /// The share (0..=1) of GPU demand asked by multi-GPU pods.
    MultiGpu(f64),
    /// CPU-only pods' total CPU request as a multiple of the source's (1 = as many).
    CpuOnly(f64),
}

impl Raise {
    /// Parses `constrained=0.25`, `share=0.8`, `multi=0.4` or `cpu=2.5`.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let (key, value) = text
            .split_once('=')
            .with_context(|| format!("--raise {text:?}: expected KIND=VALUE"))?;
        let value: f64 = value
            .trim()
            .parse()
            .with_context(|| format!("--raise {text:?}: {value:?} is not a number"))?;
        if !value.is_finite() || value < 0.0 {
            bail!("--raise {text:?}: the value must be a non-negative number");
        }
        let share = |value: f64| {
            if value > 1.0 {
                bail!("--raise {text:?}: a share is at most 1 (1 = 100%)");
            }
            Ok(value)
        };
        Ok(match key.trim() {
            "constrained" => Self::Constrained(share(value)?),
            "share" => Self::Share(share(value)?),
            "multi" => Self::MultiGpu(share(value)?),
            "cpu" => Self::CpuOnly(value),
            other => bail!(
                "--raise {text:?}: unknown kind {other:?} (known: constrained, share, multi, cpu)"
            ),
        })
    }

    /// A short tag for file names: `constrained25`, `share80`, `multi40`, `cpu250`.
    pub fn tag(self) -> String {
        let (name, value) = match self {
            Self::Constrained(v) => ("constrained", v),
            Self::Share(v) => ("share", v),
            Self::MultiGpu(v) => ("multi", v),
            Self::CpuOnly(v) => ("cpu", v),
        };
        format!("{name}{:.0}", value * 100.0)
    }
}

/// The measures the generator raises, of a list of pods.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shares {
    /// Model-constrained GPU pods / GPU pods (by count).
    pub constrained: f64,
    /// Sharing pods' GPU demand / all GPU demand.
    pub share: f64,
    /// Multi-GPU pods' GPU demand / all GPU demand.
    pub multi_gpu: f64,
    /// CPU-only pods' total CPU request, milli-CPU.
    pub cpu_only_milli: u64,
}

fn is_gpu(pod: &SimPod) -> bool {
    pod.gpu_total() > 0
}

fn is_share(pod: &SimPod) -> bool {
    pod.shape().is_share()
}

fn is_multi(pod: &SimPod) -> bool {
    is_gpu(pod) && pod.gpus > 1
}

impl Shares {
    /// The shares of `pods`.
    pub fn of(pods: &[SimPod]) -> Self {
        let gpu_pods = pods.iter().filter(|p| is_gpu(p)).count();
        let constrained = pods
            .iter()
            .filter(|p| is_gpu(p) && !p.models.is_empty())
            .count();
        let demand: u64 = pods.iter().map(SimPod::gpu_total).sum();
        let demand_of = |keep: fn(&SimPod) -> bool| -> u64 {
            pods.iter().filter(|p| keep(p)).map(SimPod::gpu_total).sum()
        };
        let ratio = |part: u64, whole: u64| {
            if whole == 0 {
                0.0
            } else {
                part as f64 / whole as f64
            }
        };
        Self {
            constrained: ratio(constrained as u64, gpu_pods as u64),
            share: ratio(demand_of(is_share), demand),
            multi_gpu: ratio(demand_of(is_multi), demand),
            cpu_only_milli: pods.iter().filter(|p| !is_gpu(p)).map(|p| p.cpu.0).sum(),
        }
    }
}

/// Whether some empty node of `cluster` whose model `pod`'s list accepts could hold it.
fn placeable(pod: &SimPod, cluster: &Cluster) -> bool {
    cluster.nodes().iter().any(|node: &SimNode| {
        node.gpus >= pod.gpus
            && node.cpu >= pod.cpu
            && node.memory >= pod.memory
            && (pod.models.is_empty() || pod.models.iter().any(|m| m.matches(&node.model)))
    })
}

/// Builds the variant of `source` that `raise` asks for, drawing with `seed`.
///
/// - `Constrained(f)`: GPU pods without a model list, in a seeded random order, get one drawn
///   from `spec_pool` (the lists of a trace that has them, with their frequencies), until `f` of
///   the GPU pods are constrained. A list is only given to a pod that some node of those models
///   could hold when empty (otherwise another is drawn, up to the pool's size of tries).
/// - `Share(f)`, `MultiGpu(f)`: GPU pods of the other kinds, in a seeded random order, are
///   replaced by copies of randomly drawn pods of the raised kind (keeping their names), until
///   the raised kind asks for `f` of the GPU demand.
/// - `CpuOnly(x)`: copies of randomly drawn CPU-only pods are added (named `<name>-cpu-<i>`), or
///   random CPU-only pods removed, until their CPU request is `x` times the source's.
pub fn generate(
    source: &Workload,
    cluster: &Cluster,
    raise: Raise,
    spec_pool: &[SimPod],
    seed: u64,
) -> anyhow::Result<Vec<SimPod>> {
    let mut go = GoRand::new(seed as i64);
    let mut pods = source.pods().to_vec();
    match raise {
        Raise::Constrained(target) => {
            let pool: Vec<&SimPod> = spec_pool
                .iter()
                .filter(|p| is_gpu(p) && !p.models.is_empty())
                .collect();
            if pool.is_empty() && target > Shares::of(&pods).constrained {
                bail!("no model lists to draw from: the spec source has no constrained GPU pod");
            }
            let gpu_pods = pods.iter().filter(|p| is_gpu(p)).count();
            let mut constrained = pods
                .iter()
                .filter(|p| is_gpu(p) && !p.models.is_empty())
                .count();
            let mut candidates: Vec<usize> = (0..pods.len())
                .filter(|&i| is_gpu(&pods[i]) && pods[i].models.is_empty())
                .collect();
            go.shuffle(candidates.len(), |i, j| candidates.swap(i, j));
            for i in candidates {
                if constrained as f64 >= target * gpu_pods as f64 {
                    break;
                }
                for _ in 0..pool.len() {
                    let donor = pool[go.intn(pool.len())];
                    let mut pod = pods[i].clone();
                    pod.gpu_spec.clone_from(&donor.gpu_spec);
                    pod.models.clone_from(&donor.models);
                    if placeable(&pod, cluster) {
                        pods[i] = pod;
                        constrained += 1;
                        break;
                    }
                }
            }
        }
        Raise::Share(target) => replace_towards(&mut pods, is_share, target, &mut go)?,
        Raise::MultiGpu(target) => replace_towards(&mut pods, is_multi, target, &mut go)?,
        Raise::CpuOnly(factor) => {
            let donors: Vec<SimPod> = pods.iter().filter(|p| !is_gpu(p)).cloned().collect();
            let have: u64 = donors.iter().map(|p| p.cpu.0).sum();
            let target = factor * have as f64;
            let mut total = have;
            if factor > 1.0 {
                if donors.is_empty() || have == 0 {
                    bail!("the source has no CPU-only pods to copy");
                }
                let mut added = 0usize;
                while (total as f64) < target {
                    let donor = &donors[go.intn(donors.len())];
                    let mut pod = donor.clone();
                    pod.name = format!("{}-cpu-{added:05}", donor.name);
                    total += pod.cpu.0;
                    pods.push(pod);
                    added += 1;
                }
            } else {
                while total as f64 > target {
                    let cpu_only: Vec<usize> =
                        (0..pods.len()).filter(|&i| !is_gpu(&pods[i])).collect();
                    if cpu_only.is_empty() {
                        break;
                    }
                    let i = cpu_only[go.intn(cpu_only.len())];
                    total -= pods[i].cpu.0;
                    pods.remove(i);
                }
            }
        }
    }
    Ok(pods)
}

/// Replaces GPU pods not of the kind `keep` by copies of random pods of it until that kind
/// asks for `target` of the GPU demand.
fn replace_towards(
    pods: &mut [SimPod],
    kind: fn(&SimPod) -> bool,
    target: f64,
    go: &mut GoRand,
) -> anyhow::Result<()> {
    let donors: Vec<SimPod> = pods.iter().filter(|p| kind(p)).cloned().collect();
    if donors.is_empty() {
        bail!("the source has no pod of the kind to raise");
    }
    let mut of_kind: u64 = donors.iter().map(SimPod::gpu_total).sum();
    let mut demand: u64 = pods.iter().map(SimPod::gpu_total).sum();
    let mut candidates: Vec<usize> = (0..pods.len())
        .filter(|&i| is_gpu(&pods[i]) && !kind(&pods[i]))
        .collect();
    go.shuffle(candidates.len(), |i, j| candidates.swap(i, j));
    for i in candidates {
        if of_kind as f64 >= target * demand as f64 {
            break;
        }
        let donor = &donors[go.intn(donors.len())];
        demand = demand - pods[i].gpu_total() + donor.gpu_total();
        of_kind += donor.gpu_total();
        let name = std::mem::take(&mut pods[i].name);
        pods[i] = SimPod {
            name,
            ..donor.clone()
        };
    }
    Ok(())
}

/// Stretches every pod's lifetime `factor` times (deletion = creation + factor × duration),
/// so that more pods run at once: the trace's own durations keep at most about 1% of the
/// openb cluster's GPUs busy at any time. Pods without a lifetime are left alone.
pub fn stretch(pods: &mut [SimPod], factor: f64) {
    for pod in pods {
        if let Some(lifetime) = &mut pod.lifetime {
            let duration = (lifetime.deleted - lifetime.created) as f64 * factor;
            lifetime.deleted = lifetime.created.saturating_add(duration.round() as u64);
        }
    }
}

/// The openb pod CSV of `pods`: `name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,
/// creation_time,deletion_time`, the columns `simulate` reads (the trace's others are not
/// kept; the times are empty for a pod without them).
pub fn openb_csv(pods: &[SimPod]) -> Result<String, csv::Error> {
    let rows = pods.iter().map(|p| {
        (
            p.name.as_str(),
            p.cpu.0,
            p.memory.0,
            p.gpus,
            p.milli,
            p.gpu_spec.as_str(),
            p.lifetime.map(|l| l.created),
            p.lifetime.map(|l| l.deleted),
        )
    });
    super::report::csv_text(
        [
            "name",
            "cpu_milli",
            "memory_mib",
            "num_gpu",
            "gpu_milli",
            "gpu_spec",
            "creation_time",
            "deletion_time",
        ],
        rows,
    )
}

/// Build a harder workload from an openb trace (see docs/simulate.md).
#[derive(Clone, Debug, clap::Args)]
pub struct WorkloadArgs {
    /// Folder with the openb trace (node list and pod lists).
    #[arg(long, value_name = "DIR")]
    pub trace_dir: PathBuf,

    /// The pod list to sample from: an openb name in --trace-dir or a CSV file.
    #[arg(long, value_name = "NAME|FILE", default_value = "default")]
    pub from: String,

    /// What to raise: constrained=SHARE (of GPU pods), share=SHARE or multi=SHARE (of GPU
    /// demand), cpu=FACTOR (CPU-only pods' CPU request, times the source's).
    #[arg(long, value_name = "KIND=VALUE", required_unless_present = "stretch")]
    pub raise: Option<String>,

    /// Stretch every pod's lifetime (creation to deletion time) this many times, for
    /// `simulate --departures`.
    #[arg(long, value_name = "FACTOR")]
    pub stretch: Option<f64>,

    /// Where model lists are drawn from for `constrained`: an openb name in --trace-dir or a
    /// CSV file.
    #[arg(long, value_name = "NAME|FILE", default_value = "gpuspec10")]
    pub specs_from: String,

    /// Seed of every draw.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,

    /// The workload's name (the file is `openb_pod_list_NAME.csv`); default
    /// `<from>-<kind><percent>-s<seed>`, e.g. `default-constrained25-s42` (and
    /// `-stretch<F>` before the seed when stretched).
    #[arg(long)]
    pub name: Option<String>,

    /// Folder to write into (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

fn pod_list(dir: &Path, name: &str) -> anyhow::Result<Workload> {
    let path = if name.contains('/') || name.contains('.') {
        PathBuf::from(name)
    } else {
        dir.join(format!("openb_pod_list_{name}.csv"))
    };
    Ok(load::load_workload(&path)?)
}

/// Writes `text` as `file` in `out` (created if missing); returns the file's path.
pub(super) fn write_into(out: &Path, file: &str, text: &str) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let path = out.join(file);
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// The `workload` command: writes the variant and prints its shares beside the source's.
pub fn run_cli(args: WorkloadArgs) -> anyhow::Result<()> {
    let raise = args.raise.as_deref().map(Raise::parse).transpose()?;
    if let Some(factor) = args.stretch
        && !(factor.is_finite() && factor > 0.0)
    {
        bail!("--stretch must be a positive number, got {factor}");
    }
    let cluster = load::load_cluster(&args.trace_dir.join(super::cli::OPENB_NODES))?;
    let source = pod_list(&args.trace_dir, &args.from)?;
    let pool = match raise {
        Some(Raise::Constrained(_)) => pod_list(&args.trace_dir, &args.specs_from)?.pods().to_vec(),
        _ => Vec::new(),
    };
    let mut pods = match raise {
        Some(raise) => generate(&source, &cluster, raise, &pool, args.seed)?,
        None => source.pods().to_vec(),
    };
    let mut tags: Vec<String> = raise.iter().map(|r| r.tag()).collect();
    if let Some(factor) = args.stretch {
        if pods.iter().any(|p| p.lifetime.is_none()) {
            bail!(
                "--stretch: {} has pods without creation_time and deletion_time",
                source.name
            );
        }
        stretch(&mut pods, factor);
        tags.push(format!("stretch{factor}"));
    }
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| format!("{}-{}-s{}", source.name, tags.join("-"), args.seed));
    let path = write_into(
        &args.out,
        &format!("openb_pod_list_{name}.csv"),
        &openb_csv(&pods)?,
    )?;
    let (before, after) = (Shares::of(source.pods()), Shares::of(&pods));
    println!(
        "{}: {} pods (source {}: {}); constrained {:.1}% of GPU pods (was {:.1}%), sharing {:.1}% of GPU demand (was {:.1}%), multi-GPU {:.1}% (was {:.1}%), CPU-only CPU {} milli (was {})",
        path.display(),
        pods.len(),
        source.name,
        source.pods().len(),
        100.0 * after.constrained,
        100.0 * before.constrained,
        100.0 * after.share,
        100.0 * before.share,
        100.0 * after.multi_gpu,
        100.0 * before.multi_gpu,
        after.cpu_only_milli,
        before.cpu_only_milli,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{parse_node_csv, parse_pod_csv};

    fn cluster() -> Cluster {
        let nodes = "sn,cpu_milli,memory_mib,gpu,model\n\
                     a,96000,393216,8,G2\nb,104000,524288,2,T4\nc,16000,122880,2,P100\n";
        Cluster::new("c", parse_node_csv(Path::new("nodes.csv"), nodes).unwrap())
    }

    /// 400 pods: 200 whole-GPU (a few multi-GPU), 120 shares, 80 CPU-only; no model lists.
    fn source() -> Workload {
        let mut text = String::from("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n");
        for i in 0..400 {
            let (gpus, milli) = match i % 10 {
                0..=4 if i % 50 == 0 => (4, 1000),
                0..=4 => (1, 1000),
                5..=7 => (1, 250 + 10 * (i % 7)),
                _ => (0, 0),
            };
            text.push_str(&format!("p-{i:04},{},8192,{gpus},{milli},\n", 2000 + i));
        }
        Workload::new("src", parse_pod_csv(Path::new("pods.csv"), &text).unwrap())
    }

    /// Model lists to draw from: one only T4 and P100 could hold, one only G2 (8 GPUs).
    fn specs() -> Vec<SimPod> {
        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
                    s-1,1000,1024,1,1000,T4|P100\ns-2,1000,1024,1,1000,G2\ns-3,0,0,0,0,\n";
        parse_pod_csv(Path::new("specs.csv"), text).unwrap()
    }

    #[test]
    fn each_kind_reaches_its_share_and_leaves_the_rest_of_the_pods_alone() {
        let source = source();
        let before = Shares::of(source.pods());
        let shares =
            |raise| Shares::of(&generate(&source, &cluster(), raise, &specs(), 7).unwrap());
        for target in [0.2, 0.25, 0.33] {
            let after = shares(Raise::Constrained(target));
            assert!(
                after.constrained >= target && after.constrained < target + 0.01,
                "{after:?}"
            );
            assert_eq!(
                (after.share, after.multi_gpu),
                (before.share, before.multi_gpu)
            );
        }
        for target in [0.6, 0.8, 1.0] {
            let after = shares(Raise::Share(target));
            assert!(
                after.share >= target && after.share < target + 0.02,
                "{after:?}"
            );
            assert_eq!(after.cpu_only_milli, before.cpu_only_milli);
        }
        for target in [0.3, 0.5] {
            let after = shares(Raise::MultiGpu(target));
            assert!(
                after.multi_gpu >= target && after.multi_gpu < target + 0.05,
                "{after:?}"
            );
        }
        for factor in [0.5, 1.0, 2.5] {
            let after = shares(Raise::CpuOnly(factor));
            let want = factor * before.cpu_only_milli as f64;
            let got = after.cpu_only_milli as f64;
            assert!(
                (got - want).abs() <= 2400.0,
                "{factor}: {got} against {want}"
            );
        }
    }

    #[test]
    fn model_lists_go_only_where_a_node_could_hold_the_pod() {
        let pods = generate(&source(), &cluster(), Raise::Constrained(0.33), &specs(), 3).unwrap();
        let four_gpu = pods.iter().filter(|p| p.gpus == 4);
        for pod in four_gpu {
            // Neither T4 nor P100 nodes have 4 GPUs: a 4-GPU pod may only be limited to G2.
            assert!(pod.gpu_spec.is_empty() || pod.gpu_spec == "G2", "{pod:?}");
        }
        assert!(pods.iter().any(|p| p.gpu_spec == "T4|P100"));
        // CPU-only pods never get a list.
        assert!(pods.iter().all(|p| p.gpus > 0 || p.gpu_spec.is_empty()));
    }

    #[test]
    fn a_seed_builds_the_same_workload_and_another_seed_another() {
        let (source, cluster, specs) = (source(), cluster(), specs());
        for raise in [
            Raise::Constrained(0.25),
            Raise::Share(0.8),
            Raise::MultiGpu(0.4),
            Raise::CpuOnly(2.0),
        ] {
            let first = generate(&source, &cluster, raise, &specs, 42).unwrap();
            assert_eq!(
                first,
                generate(&source, &cluster, raise, &specs, 42).unwrap()
            );
            assert_ne!(
                first,
                generate(&source, &cluster, raise, &specs, 43).unwrap()
            );
            // Names stay unique: the file is a valid pod list again.
            let text = openb_csv(&first).unwrap();
            let again = parse_pod_csv(Path::new("again.csv"), &text).unwrap();
            assert_eq!(again, first, "{raise:?}");
            let mut names: Vec<&str> = first.iter().map(|p| p.name.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), first.len());
        }
    }

    #[test]
    fn stretching_multiplies_lifetimes_and_keeps_them_through_the_file() {
        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time\n\
                    a,1000,1024,1,1000,,100,110\nb,1000,1024,0,0,,5,5\n";
        let mut pods = parse_pod_csv(Path::new("p.csv"), text).unwrap();
        stretch(&mut pods, 30.0);
        let times: Vec<(u64, u64)> = pods
            .iter()
            .map(|p| p.lifetime.map(|l| (l.created, l.deleted)).unwrap())
            .collect();
        assert_eq!(times, [(100, 400), (5, 5)]);
        let again = parse_pod_csv(Path::new("again.csv"), &openb_csv(&pods).unwrap()).unwrap();
        assert_eq!(again, pods);
    }

    #[test]
    fn bad_requests_are_errors() {
        for text in [
            "constrained",
            "constrained=x",
            "share=1.5",
            "multi=-1",
            "gpu=0.3",
        ] {
            assert!(Raise::parse(text).is_err(), "{text}");
        }
        assert_eq!(Raise::parse("cpu=2.5").unwrap(), Raise::CpuOnly(2.5));
        assert_eq!(
            Raise::parse("constrained=0.25").unwrap().tag(),
            "constrained25"
        );
        let no_specs = generate(&source(), &cluster(), Raise::Constrained(0.2), &[], 1);
        assert!(no_specs.unwrap_err().to_string().contains("no model lists"));
        let empty = Workload::new("e", Vec::new());
        assert!(generate(&empty, &cluster(), Raise::Share(0.5), &[], 1).is_err());
    }
}
