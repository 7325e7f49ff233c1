use gpu_extender::sim::load::{load_cluster, load_workload};
use gpu_extender::sim::replay::{Prepared, SimPolicy, run};
use std::collections::BTreeMap;
use std::path::Path;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = Path::new("/work/shared/traces/openb");
    let cluster = load_cluster(&dir.join("openb_node_list_gpu_node.csv")).unwrap();
    let workload = load_workload(&dir.join(format!("openb_pod_list_{}.csv", args.get(2).map(|s| s.as_str()).unwrap_or("default")))).unwrap();
    let prepared = Prepared::new(&cluster, &workload);
    let policy = SimPolicy::parse(&args[1]).unwrap();
    let r = run(&prepared, policy, 42, 1.3, true, &|_| {});
    println!("{} alloc130 {:?} failed {}", policy.name(), r.curves.alloc[130], r.failed);
    let steps = r.steps.as_ref().unwrap();
    for k in [85i64, 90, 93, 95, 96, 97, 100] {
        if let Some(st) = steps.iter().filter(|s| s.arrive_percent(r.capacity_milli) <= k).last() { println!("arrive {k}: failed {} alloc {:.2}", st.failed, st.alloc_percent(r.capacity_milli)); }
    }
    let nodes = r.end_nodes.unwrap();
    // free capacity by (model/gpus/cpu, cpu_free bucket, free gpu vector)
    let mut by: BTreeMap<String, (u32, u64)> = BTreeMap::new();
    let mut tot = 0u64;
    for n in &nodes {
        let free: Vec<u32> = (0..n.gpus.len()).map(|i| n.gpu_free_milli(i)).collect();
        let f: u64 = free.iter().map(|&x| x as u64).sum();
        if f == 0 { continue; }
        tot += f;
        let whole = free.iter().filter(|&&x| x == 1000).count();
        let part: Vec<u32> = free.iter().copied().filter(|&x| x > 0 && x < 1000).collect();
        let key = format!("{}x{} cpu{} | cpufree {:>6} memfree {:>7} | whole {} part {:?}", n.spec.gpus.len(), n.spec.gpus[0].model, n.spec.cpu.0/1000, n.cpu_free().0, n.mem_free().0, whole, part);
        let e = by.entry(key).or_default(); e.0 += 1; e.1 += f;
    }
    let (mut sliver, mut whole_starved, mut whole_ok, mut sl_hist) = (0u64, 0u64, 0u64, BTreeMap::<u32, u32>::new());
    for n in &nodes {
        for i in 0..n.gpus.len() {
            let f = n.gpu_free_milli(i);
            if f == 1000 { if n.cpu_free().0 < 4000 || n.mem_free().0 < 16000 { whole_starved += 1000 } else { whole_ok += 1000 } }
            else if f > 0 { sliver += f as u64; *sl_hist.entry(f).or_default() += 1; }
        }
    }
    println!("slivers {sliver} whole-starved {whole_starved} whole-ok {whole_ok}");
    // classify every free milli against the original workload's pod shapes (cpu, milli, mem)
    let shapes: Vec<(u64, u32, u64)> = workload.pods().iter().filter(|p| p.gpus == 1 && p.milli > 0).map(|p| (p.cpu.0, p.milli, p.memory.0)).collect();
    let (mut size_blocked, mut host_blocked, mut usable, mut mem_blocked) = (0u64, 0u64, 0u64, 0u64);
    let mut fill: BTreeMap<u32, u64> = BTreeMap::new();
    for n in &nodes {
        for i in 0..n.gpus.len() {
            let f = n.gpu_free_milli(i);
            if f == 0 { continue; }
            let by_size = shapes.iter().any(|s| s.1 <= f);
            let by_all = shapes.iter().any(|s| s.1 <= f && s.0 <= n.cpu_free().0 && s.2 <= n.mem_free().0);
            let by_cpu = shapes.iter().any(|s| s.1 <= f && s.0 <= n.cpu_free().0);
            let frac = shapes.iter().filter(|s| s.1 <= f && s.0 <= n.cpu_free().0 && s.2 <= n.mem_free().0).count() as f64 / shapes.len() as f64;
            *fill.entry(if frac == 0.0 {0} else if frac < 0.01 {1} else if frac < 0.05 {2} else {3}).or_default() += f as u64;
            if !by_size { size_blocked += f as u64 } else if !by_cpu { host_blocked += f as u64 } else if !by_all { mem_blocked += f as u64 } else { usable += f as u64 }
        }
    }
    println!("size-blocked {size_blocked} cpu-blocked {host_blocked} mem-blocked {mem_blocked} usable {usable}; by share of 1-GPU pods that fit (0, <1%, <5%, more): {fill:?}");
    let mut h: Vec<_> = sl_hist.into_iter().collect(); h.sort_by_key(|(f, c)| std::cmp::Reverse(*f as u64 * *c as u64));
    println!("sliver hist (milli x count): {:?}", &h[..h.len().min(15)]);
    let mut v: Vec<_> = by.into_iter().collect();
    v.sort_by_key(|(_, (_, f))| std::cmp::Reverse(*f));
    println!("total free {}", tot);
    for (k, (c, f)) in v.iter().take(args.get(3).and_then(|s| s.parse().ok()).unwrap_or(40)) { println!("{:>5} {:>7} {}", c, f, k); }
}
