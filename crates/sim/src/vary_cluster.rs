//! Harder clusters for policy research: an openb node list changed the way a platform team's
//! cluster differs from Alibaba's (a GPU model missing, a sample of the nodes, less CPU or memory
//! per GPU, big nodes split into small ones, more of one model), so that a policy tuned on the
//! trace's cluster is checked on others. Pure: a cluster, changes and a seed in, nodes out; the
//! `cluster` command (`run_cli`) reads the inputs and writes an openb node CSV for
//! `simulate --nodes`.

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyhow::{Context, bail};

use super::go_rand::GoRand;
use super::load;
use super::trace::{Cluster, SimNode};
use gpu_engine::{CpuMilli, MemMiB};

/// One change to a cluster.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// Every node of this GPU model removed.
    Without(String),
    /// A random share (0 < share <= 1) of the nodes kept, the rest removed.
    Keep(f64),
    /// Every node's CPU times this factor.
    Cpu(f64),
    /// Every node's memory times this factor.
    Memory(f64),
    /// Every node with more GPUs than this split into nodes of at most this many, its CPU and
    /// memory divided among them in proportion to their GPUs.
    Split(u16),
    /// Every node of this GPU model present this many times in all (`times - 1` copies of
    /// each, named `<name>-c1`, `-c2`, ..., right after it): a cluster richer in one model.
    More { model: String, times: u16 },
}

impl Change {
    /// Parses `without=T4`, `keep=0.5`, `cpu=0.75`, `memory=2`, `split=2` or `more=G3:3`.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let (key, value) = text
            .split_once('=')
            .with_context(|| format!("--change {text:?}: expected KIND=VALUE"))?;
        let value = value.trim();
        let factor = || -> anyhow::Result<f64> {
            let number: f64 = value
                .parse()
                .with_context(|| format!("--change {text:?}: {value:?} is not a number"))?;
            if !(number.is_finite() && number > 0.0) {
                bail!("--change {text:?}: the value must be a positive number");
            }
            Ok(number)
        };
        Ok(match key.trim() {
            "without" if !value.is_empty() => Self::Without(value.to_owned()),
            "without" => bail!("--change {text:?}: name the GPU model to remove"),
            "keep" => {
                let share = factor()?;
                if share > 1.0 {
                    bail!("--change {text:?}: a share is at most 1 (1 = every node)");
                }
                Self::Keep(share)
            }
            "cpu" => Self::Cpu(factor()?),
            "memory" => Self::Memory(factor()?),
            "split" => match value.parse::<u16>() {
                Ok(gpus) if gpus > 0 => Self::Split(gpus),
                _ => bail!("--change {text:?}: split takes a whole number of GPUs, at least 1"),
            },
            "more" => {
                let (model, times) = value.split_once(':').with_context(|| {
                    format!("--change {text:?}: expected more=MODEL:TIMES, e.g. more=G3:3")
                })?;
                let model = model.trim();
                if model.is_empty() {
                    bail!("--change {text:?}: name the GPU model to add nodes of");
                }
                match times.trim().parse::<u16>() {
                    Ok(times) if times >= 1 => Self::More {
                        model: model.to_owned(),
                        times,
                    },
                    _ => bail!(
                        "--change {text:?}: TIMES is a whole number, at least 1 (1 = as many as before)"
                    ),
                }
            }
            other => bail!(
                "--change {text:?}: unknown kind {other:?} (known: without, keep, cpu, memory, split, more)"
            ),
        })
    }

    /// A short tag for file names: `withoutT4`, `keep50`, `cpu75`, `memory200`, `split2`,
    /// `G3x3`.
    pub fn tag(&self) -> String {
        let percent = |factor: f64| (factor * 100.0).round() as u64;
        match self {
            Self::Without(model) => format!("without{model}"),
            Self::Keep(share) => format!("keep{}", percent(*share)),
            Self::Cpu(factor) => format!("cpu{}", percent(*factor)),
            Self::Memory(factor) => format!("memory{}", percent(*factor)),
            Self::Split(gpus) => format!("split{gpus}"),
            Self::More { model, times } => format!("{model}x{times}"),
        }
    }
}

/// `amount` times `factor`, rounded, at least 1 (a node with no CPU or memory runs nothing).
fn scaled(amount: u64, factor: f64) -> u64 {
    ((amount as f64 * factor).round() as u64).max(1)
}

/// `node` split into nodes of at most `most` GPUs (named `<name>-a`, `-b`, ...), CPU and memory
/// divided in proportion to their GPUs; the node itself when it has no more than `most`.
fn split(node: &SimNode, most: u16) -> Vec<SimNode> {
    if node.gpus <= most {
        return vec![node.clone()];
    }
    let parts = node.gpus.div_ceil(most);
    let share = |amount: u64, gpus: u16| amount * u64::from(gpus) / u64::from(node.gpus);
    (0..parts)
        .map(|part| {
            let gpus = most.min(node.gpus - part * most);
            SimNode {
                name: format!("{}-{}", node.name, part_suffix(part)),
                cpu: CpuMilli(share(node.cpu.0, gpus).max(1)),
                memory: MemMiB(share(node.memory.0, gpus).max(1)),
                gpus,
                model: node.model.clone(),
            }
        })
        .collect()
}

/// `a`..`z`, then `a26`...: a suffix that keeps the parts of a node together in name order.
fn part_suffix(part: u16) -> String {
    match u8::try_from(part) {
        Ok(index) if index < 26 => char::from(b'a' + index).to_string(),
        _ => format!("a{part}"),
    }
}

/// `cluster` with `changes` applied in order; `seed` draws the nodes `keep` keeps. Fails when a
/// change names a model no node has (a typo would otherwise change nothing) or when no GPU is
/// left.
pub fn vary(cluster: &Cluster, changes: &[Change], seed: u64) -> anyhow::Result<Cluster> {
    let mut rng = GoRand::new(seed as i64);
    let mut nodes: Vec<SimNode> = cluster.nodes().to_vec();
    for change in changes {
        match change {
            Change::Without(model) => {
                require_model(&nodes, model, "without")?;
                nodes.retain(|node| &node.model != model);
            }
            Change::More { model, times } => {
                require_model(&nodes, model, "more")?;
                nodes = nodes
                    .iter()
                    .flat_map(|node| {
                        let copies = if &node.model == model { *times } else { 1 };
                        (0..copies).map(move |copy| match copy {
                            0 => node.clone(),
                            copy => SimNode {
                                name: format!("{}-c{copy}", node.name),
                                ..node.clone()
                            },
                        })
                    })
                    .collect();
            }
            Change::Keep(share) => {
                let keep = ((nodes.len() as f64 * share).round() as usize).max(1);
                let mut chosen: Vec<usize> = rng.perm(nodes.len()).into_iter().take(keep).collect();
                chosen.sort_unstable();
                nodes = chosen
                    .into_iter()
                    .map(|index| nodes[index].clone())
                    .collect();
            }
            Change::Cpu(factor) => {
                for node in &mut nodes {
                    node.cpu = CpuMilli(scaled(node.cpu.0, *factor));
                }
            }
            Change::Memory(factor) => {
                for node in &mut nodes {
                    node.memory = MemMiB(scaled(node.memory.0, *factor));
                }
            }
            Change::Split(most) => {
                nodes = nodes.iter().flat_map(|node| split(node, *most)).collect();
            }
        }
    }
    let varied = Cluster::new(cluster.name.clone(), nodes);
    if varied.gpu_count() == 0 {
        bail!("no GPU is left after the changes");
    }
    Ok(varied)
}

/// Fails, listing the models there are, when no node of `nodes` has `model` (`kind` names the
/// change): a typo would otherwise change nothing.
fn require_model(nodes: &[SimNode], model: &str, kind: &str) -> anyhow::Result<()> {
    if nodes.iter().any(|node| node.model == model) {
        return Ok(());
    }
    let models: BTreeSet<&str> = nodes
        .iter()
        .map(|node| node.model.as_str())
        .filter(|model| !model.is_empty())
        .collect();
    let models: Vec<&str> = models.into_iter().collect();
    bail!(
        "{kind}={model}: no node has that model (models: {})",
        models.join(", ")
    )
}

/// The openb node CSV of `cluster`: `sn,cpu_milli,memory_mib,gpu,model`, what `simulate` reads.
pub fn openb_node_csv(cluster: &Cluster) -> Result<String, csv::Error> {
    let rows = cluster.nodes().iter().map(|node| {
        (
            node.name.as_str(),
            node.cpu.0,
            node.memory.0,
            node.gpus,
            node.model.as_str(),
        )
    });
    super::report::csv_text(["sn", "cpu_milli", "memory_mib", "gpu", "model"], rows)
}

/// Nodes, GPUs, and cores and GiB of memory per GPU: the line the command prints for a cluster.
fn summary(cluster: &Cluster) -> String {
    let gpus = cluster.gpu_count().max(1) as f64;
    let cpu: u64 = cluster.nodes().iter().map(|node| node.cpu.0).sum();
    let memory: u64 = cluster.nodes().iter().map(|node| node.memory.0).sum();
    format!(
        "{} nodes, {} GPUs, {:.1} cores and {:.1} GiB per GPU",
        cluster.nodes().len(),
        cluster.gpu_count(),
        cpu as f64 / 1000.0 / gpus,
        memory as f64 / 1024.0 / gpus,
    )
}

/// Build a harder cluster from an openb node list (see docs/simulate.md).
#[derive(Clone, Debug, clap::Args)]
pub struct ClusterArgs {
    /// Folder with the openb trace: its node list is the source unless --from says otherwise.
    #[arg(long, value_name = "DIR")]
    pub trace_dir: PathBuf,

    /// The node list to change (CSV or YAML); default the node list of --trace-dir.
    #[arg(long, value_name = "FILE")]
    pub from: Option<PathBuf>,

    /// A change, applied in the order given (repeatable): without=MODEL (every node of that
    /// GPU model removed), keep=SHARE (a random share of the nodes kept), cpu=FACTOR and
    /// memory=FACTOR (every node's CPU or memory times FACTOR), split=GPUS (nodes with more
    /// GPUs split into nodes of at most GPUS, CPU and memory divided in proportion),
    /// more=MODEL:TIMES (every node of that GPU model present TIMES times).
    #[arg(long = "change", value_name = "KIND=VALUE", required = true)]
    pub changes: Vec<String>,

    /// Seed of the draw of keep=SHARE.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,

    /// The cluster's name (the file is `openb_node_list_NAME.csv`); default the changes' tags
    /// and the seed, e.g. `withoutT4-cpu75-s42`.
    #[arg(long)]
    pub name: Option<String>,

    /// Folder to write into (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

/// The `cluster` command: writes the changed node list and prints it beside the source.
pub fn run_cli(args: ClusterArgs) -> anyhow::Result<()> {
    let changes = args
        .changes
        .iter()
        .map(|text| Change::parse(text))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let source_path = args
        .from
        .clone()
        .unwrap_or_else(|| args.trace_dir.join(super::cli::OPENB_NODES));
    let source = load::load_cluster(&source_path)?;
    let varied = vary(&source, &changes, args.seed)?;
    let name = args.name.clone().unwrap_or_else(|| {
        let tags: Vec<String> = changes.iter().map(Change::tag).collect();
        format!("{}-s{}", tags.join("-"), args.seed)
    });
    let path = super::generate::write_into(
        &args.out,
        &format!("openb_node_list_{name}.csv"),
        &openb_node_csv(&varied)?,
    )?;
    println!(
        "{}: {} (source {}: {})",
        path.display(),
        summary(&varied),
        source_path.display(),
        summary(&source),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cpu: u64, memory: u64, gpus: u16, model: &str) -> SimNode {
        SimNode {
            name: name.to_owned(),
            cpu: CpuMilli(cpu),
            memory: MemMiB(memory),
            gpus,
            model: model.to_owned(),
        }
    }

    fn cluster() -> Cluster {
        Cluster::new(
            "c",
            vec![
                node("n0", 96_000, 393_216, 8, "G2"),
                node("n1", 104_000, 524_288, 2, "T4"),
                node("n2", 104_000, 524_288, 2, "T4"),
                node("n3", 16_000, 122_880, 2, "P100"),
                node("n4", 8_000, 32_768, 1, "V100M16"),
                node("n5", 32_000, 65_536, 0, ""),
            ],
        )
    }

    fn names(cluster: &Cluster) -> Vec<&str> {
        cluster.nodes().iter().map(|n| n.name.as_str()).collect()
    }

    #[test]
    fn without_removes_every_node_of_the_model_and_nothing_else() {
        let varied = vary(&cluster(), &[Change::Without("T4".into())], 1).unwrap();
        assert_eq!(names(&varied), ["n0", "n3", "n4", "n5"]);
        assert_eq!(varied.nodes()[0], cluster().nodes()[0]);
    }

    #[test]
    fn keep_draws_a_share_of_the_nodes_the_same_way_for_a_seed() {
        let half = |seed| vary(&cluster(), &[Change::Keep(0.5)], seed).unwrap();
        assert_eq!(half(7).nodes().len(), 3);
        assert_eq!(half(7), half(7));
        // Some seed draws another half: the draw depends on the seed.
        assert!((1..20).any(|seed| half(seed) != half(7)));
        // Every kept node is one of the source's, unchanged.
        for kept in half(7).nodes() {
            assert!(cluster().nodes().contains(kept), "{kept:?}");
        }
        // A tiny share keeps one node, not none.
        assert_eq!(
            vary(&cluster(), &[Change::Keep(0.01)], 3)
                .unwrap()
                .nodes()
                .len(),
            1
        );
    }

    #[test]
    fn cpu_and_memory_scale_every_node() {
        let varied = vary(&cluster(), &[Change::Cpu(0.5), Change::Memory(2.0)], 1).unwrap();
        for (before, after) in cluster().nodes().iter().zip(varied.nodes()) {
            assert_eq!(after.cpu.0, before.cpu.0 / 2);
            assert_eq!(after.memory.0, before.memory.0 * 2);
            assert_eq!((after.gpus, &after.model), (before.gpus, &before.model));
        }
    }

    #[test]
    fn split_divides_big_nodes_and_their_host_in_proportion() {
        let varied = vary(&cluster(), &[Change::Split(3)], 1).unwrap();
        let parts: Vec<&SimNode> = varied
            .nodes()
            .iter()
            .filter(|n| n.name.starts_with("n0-"))
            .collect();
        // 8 GPUs at most 3 each: 3 + 3 + 2, CPU and memory by GPU.
        let shape: Vec<(u16, u64, u64)> = parts
            .iter()
            .map(|n| (n.gpus, n.cpu.0, n.memory.0))
            .collect();
        assert_eq!(
            shape,
            [
                (3, 36_000, 147_456),
                (3, 36_000, 147_456),
                (2, 24_000, 98_304)
            ]
        );
        assert_eq!(varied.gpu_count(), cluster().gpu_count());
        // Nodes at or under the size are kept as they are.
        assert!(varied.nodes().contains(&cluster().nodes()[1]));
    }

    #[test]
    fn more_copies_every_node_of_the_model_beside_it_and_nothing_else() {
        let varied = vary(&cluster(), &[Change::parse("more=T4:3").unwrap()], 1).unwrap();
        assert_eq!(
            names(&varied),
            [
                "n0", "n1", "n1-c1", "n1-c2", "n2", "n2-c1", "n2-c2", "n3", "n4", "n5"
            ]
        );
        // A copy is its node under another name.
        let source = cluster();
        let (copy, original) = (&varied.nodes()[2], &source.nodes()[1]);
        assert_eq!(
            (copy.cpu, copy.memory, copy.gpus, &copy.model),
            (
                original.cpu,
                original.memory,
                original.gpus,
                &original.model
            )
        );
        assert_eq!(varied.gpu_count(), cluster().gpu_count() + 8);
        // Once is as before.
        let once = vary(&cluster(), &[Change::parse("more=T4:1").unwrap()], 1).unwrap();
        assert_eq!(once, cluster());
        assert_eq!(Change::parse("more=G3:3").unwrap().tag(), "G3x3");
    }

    #[test]
    fn changes_apply_in_order_and_the_file_reads_back() {
        let changes = [Change::Without("G2".into()), Change::Cpu(0.75)];
        let varied = vary(&cluster(), &changes, 1).unwrap();
        let text = openb_node_csv(&varied).unwrap();
        let path = std::path::Path::new("varied.csv");
        let read = Cluster::new("c", load::parse_node_csv(path, &text).unwrap());
        assert_eq!(read, varied);
        assert_eq!(varied.nodes()[0].cpu.0, 78_000);
        let tags: Vec<String> = changes.iter().map(Change::tag).collect();
        assert_eq!(tags, ["withoutG2", "cpu75"]);
    }

    #[test]
    fn bad_changes_are_clear_errors() {
        for (text, says) in [
            ("cpu", "expected KIND=VALUE"),
            ("cpu=0", "positive number"),
            ("cpu=-1", "positive number"),
            ("memory=abc", "is not a number"),
            ("keep=1.5", "at most 1"),
            ("split=0", "at least 1"),
            ("split=1.5", "at least 1"),
            ("without=", "name the GPU model"),
            ("more=G3", "expected more=MODEL:TIMES"),
            ("more=:2", "name the GPU model"),
            ("more=G3:0", "at least 1"),
            ("more=G3:1.5", "at least 1"),
            ("gpus=2", "unknown kind"),
        ] {
            let error = Change::parse(text).unwrap_err().to_string();
            assert!(error.contains(says), "{text}: {error}");
        }
        let error = vary(&cluster(), &[Change::Without("A100".into())], 1)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("no node has that model") && error.contains("G2, P100"),
            "{error}"
        );
        let error = vary(&cluster(), &[Change::parse("more=A100:2").unwrap()], 1)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("more=A100: no node has that model"),
            "{error}"
        );
        let all_gone = ["G2", "T4", "P100", "V100M16"].map(|m| Change::Without(m.into()));
        let error = vary(&cluster(), &all_gone, 1).unwrap_err().to_string();
        assert!(error.contains("no GPU is left"), "{error}");
    }
}
