//! Where the free GPU capacity lies after the last pod of one `simulate` run: per GPU, by how
//! much of it is free and how much CPU its node has left, so that what no later pod could use
//! (slivers beside 810-milli pods, crumbs of shares, GPUs on nodes out of CPU) can be told apart.
//!
//! `cargo run --release --example end_state -- TRACE_DIR TRACE POLICY SEED`, e.g.
//! `../shared/traces/openb default fgd-plus 42` (arrivals inflated to 130%, as `simulate`).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, bail};
use gpu_sim::{Prepared, SimPolicy, load_cluster, load_workload, run};

/// A GPU's free share, in 50-milli steps, and its node's free cores, in four bands.
fn bucket(free_milli: u32, idle: bool, cpu_free_milli: u64) -> String {
    let gpu = if idle {
        "idle".to_owned()
    } else {
        let low = free_milli / 50 * 50;
        format!("{low}-{} free", low + 49)
    };
    let cpu = match cpu_free_milli {
        0..1000 => "< 1 core",
        1000..4000 => "1-4 cores",
        4000..8000 => "4-8 cores",
        _ => ">= 8 cores",
    };
    format!("{gpu:>14}, node {cpu}")
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, trace, policy, seed] = args.as_slice() else {
        bail!("usage: end_state TRACE_DIR TRACE POLICY SEED");
    };
    let dir = Path::new(dir);
    let policy = SimPolicy::parse(policy).map_err(anyhow::Error::msg)?;
    let seed: u64 = seed.parse().with_context(|| format!("seed {seed}"))?;
    let cluster = load_cluster(&dir.join("openb_node_list_gpu_node.csv"))?;
    let workload = load_workload(&dir.join(format!("openb_pod_list_{trace}.csv")))?;
    let prepared = Prepared::new(&cluster, &workload);
    let result = run(&prepared, policy, seed, 1.3, true, &|_| {});
    let nodes = result.end_nodes.context("the run kept no end state")?;
    let capacity = result.capacity_milli as f64;
    let mut buckets: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for node in &nodes {
        let cpu_free = node.cpu_free().0;
        for position in 0..node.gpus.len() {
            let free = node.gpu_free_milli(position);
            if free == 0 {
                continue;
            }
            let entry = buckets
                .entry(bucket(free, node.gpus[position].is_idle(), cpu_free))
                .or_default();
            entry.0 += 1;
            entry.1 += u64::from(free);
        }
    }
    let free: u64 = buckets.values().map(|&(_, milli)| milli).sum();
    println!(
        "{trace} {} seed {seed}: allocated {:.2}%, free {:.2}% of {:.0} GPUs",
        policy.label(),
        100.0 - free as f64 * 100.0 / capacity,
        free as f64 * 100.0 / capacity,
        capacity / 1000.0
    );
    println!("| GPU, its node's free CPU | GPUs | free, GPUs | free, % of capacity |");
    println!("|---|---:|---:|---:|");
    for (name, (gpus, milli)) in &buckets {
        println!(
            "| {name} | {gpus} | {:.1} | {:.2} |",
            *milli as f64 / 1000.0,
            *milli as f64 * 100.0 / capacity
        );
    }
    Ok(())
}
