//! Turning run results into outputs: the summary table (mean over seeds per trace and policy),
//! per-run and per-step CSVs, the reference's discrete allocation CSV, and one SVG plot per
//! trace of allocation ratio against arrived workload. Pure formatting: no files are touched.

use std::fmt::Write as _;

use super::metrics::{LAST_COLUMN, mean, std_dev};
use super::replay::{RunResult, SimPolicy};

/// The runs of one (trace, policy), all seeds.
#[derive(Debug)]
pub struct Group<'a> {
    pub trace: &'a str,
    pub policy: SimPolicy,
    pub runs: Vec<&'a RunResult>,
}

impl Group<'_> {
    /// Mean and sample standard deviation over seeds of the allocation ratio at column `k`.
    pub fn alloc_at(&self, k: usize) -> (Option<f64>, Option<f64>) {
        let values: Vec<Option<f64>> = self.runs.iter().map(|r| r.curves.alloc[k]).collect();
        (
            mean(values.iter().copied()),
            std_dev(values.iter().copied()),
        )
    }

    fn mean_of(&self, value: impl Fn(&RunResult) -> Option<f64>) -> Option<f64> {
        mean(self.runs.iter().map(|r| value(r)))
    }
}

/// Groups runs by trace then policy, in first-seen order.
pub fn group(results: &[RunResult]) -> Vec<Group<'_>> {
    let mut groups: Vec<Group<'_>> = Vec::new();
    for result in results {
        match groups
            .iter_mut()
            .find(|g| g.trace == result.trace && g.policy == result.policy)
        {
            Some(group) => group.runs.push(result),
            None => groups.push(Group {
                trace: &result.trace,
                policy: result.policy,
                runs: vec![result],
            }),
        }
    }
    groups
}

fn cell(value: Option<f64>) -> String {
    value.map_or_else(|| "–".to_owned(), |v| format!("{v:.2}"))
}

fn mean_sd(mean: Option<f64>, sd: Option<f64>) -> String {
    match (mean, sd) {
        (Some(m), Some(s)) => format!("{m:.2} ± {s:.2}"),
        (Some(m), None) => format!("{m:.2}"),
        _ => "–".to_owned(),
    }
}

/// The summary as a Markdown table: one row per (trace, policy), means over seeds.
pub fn summary_markdown(results: &[RunResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| trace | policy | seeds | alloc % at 100% arrived | alloc % at 130% arrived | frag % at 100% | failed pods | failed GPU % | idle GPU nodes (end) |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    for group in group(results) {
        let (m100, s100) = group.alloc_at(100);
        let (m130, s130) = group.alloc_at(LAST_COLUMN);
        let frag = group.mean_of(|r| r.curves.frag_amount[100]);
        let failed = group.mean_of(|r| Some(r.failed as f64));
        let failed_gpu =
            group.mean_of(|r| Some(100.0 * r.failed_milli as f64 / r.capacity_milli as f64));
        let idle = group.mean_of(|r| Some(f64::from(r.last.idle_nodes)));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            group.trace,
            group.policy.label(),
            group.runs.len(),
            mean_sd(m100, s100),
            mean_sd(m130, s130),
            cell(frag),
            failed.map_or_else(|| "–".to_owned(), |v| format!("{v:.1}")),
            cell(failed_gpu),
            idle.map_or_else(|| "–".to_owned(), |v| format!("{v:.1}")),
        );
    }
    out
}

/// One CSV row per run.
pub fn runs_csv(results: &[RunResult]) -> String {
    let mut out = String::from(
        "trace,policy,seed,pods,added,failed,failed_gpu_milli,alloc_100,alloc_130,frag_amount_100,frag_ratio_50,final_alloc,final_idle_gpu_nodes\n",
    );
    for r in results {
        let opt = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.4}"));
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{:.4},{}",
            r.trace,
            r.policy.name(),
            r.seed,
            r.pods,
            r.added,
            r.failed,
            r.failed_milli,
            opt(r.curves.alloc[100]),
            opt(r.curves.alloc[LAST_COLUMN]),
            opt(r.curves.frag_amount[100]),
            opt(r.curves.frag_ratio[50]),
            r.last.alloc_percent(r.capacity_milli),
            r.last.idle_nodes,
        );
    }
    out
}

/// The reference's `analysis_allo_discrete.csv`: one row per run, columns 0..=130.
pub fn discrete_csv(results: &[RunResult], tune: f64) -> String {
    let mut out = String::from("workload,sc_policy,tune,seed,total_gpus");
    for k in 0..=LAST_COLUMN {
        let _ = write!(out, ",{k}");
    }
    out.push('\n');
    for r in results {
        let _ = write!(
            out,
            "{},{},{},{},{}",
            r.trace,
            r.policy.name(),
            tune,
            r.seed,
            r.capacity_milli / 1000
        );
        for value in &r.curves.alloc {
            match value {
                Some(v) => {
                    let _ = write!(out, ",{v:.2}");
                }
                None => out.push(','),
            }
        }
        out.push('\n');
    }
    out
}

/// The header of the per-step CSV.
pub const STEPS_HEADER: &str = "trace,policy,seed,step,arrived_milli,arrive_pct,used_milli,alloc_pct,frag_milli,frag_pct,frag_ratio,failed,idle_gpu_nodes\n";

/// Per-step rows of the runs that kept their steps.
pub fn steps_csv(results: &[RunResult]) -> String {
    let mut out = String::from(STEPS_HEADER);
    for r in results {
        let Some(steps) = &r.steps else { continue };
        let name = r.policy.name();
        for (i, step) in steps.iter().enumerate() {
            let ratio = step
                .frag_ratio()
                .map_or_else(String::new, |v| format!("{v:.3}"));
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{:.2},{:.1},{:.3},{},{},{}",
                r.trace,
                name,
                r.seed,
                i + 1,
                step.arrived_milli,
                step.arrive_percent(r.capacity_milli),
                step.used_milli,
                step.alloc_percent(r.capacity_milli),
                step.frag_milli,
                step.frag_percent(r.capacity_milli),
                ratio,
                step.failed,
                step.idle_nodes,
            );
        }
    }
    out
}

/// Line colours for the plot, one per policy in order (colour-blind-safe Okabe–Ito set).
const COLOURS: [&str; 8] = [
    "#999999", "#E69F00", "#56B4E9", "#009E73", "#0072B2", "#D55E00", "#CC79A7", "#000000",
];

/// An SVG line plot of one trace: mean allocation ratio over seeds against arrived workload
/// (0..=130%), one line per policy, with the y = x line for reference.
pub fn alloc_svg(trace: &str, groups: &[&Group<'_>]) -> String {
    let (width, height) = (760.0, 480.0);
    let (left, right, top, bottom) = (60.0, 180.0, 40.0, 50.0);
    let plot_w = width - left - right;
    let plot_h = height - top - bottom;
    let x = |k: f64| left + k / LAST_COLUMN as f64 * plot_w;
    let y = |v: f64| top + (1.0 - v / 100.0) * plot_h;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="{width}" height="{height}" fill="white"/><text x="{}" y="22" text-anchor="middle" font-size="14">GPU allocation vs arrived workload: {}</text>"#,
        left + plot_w / 2.0,
        escape(trace)
    );
    for tick in (0..=LAST_COLUMN).step_by(10) {
        let px = x(tick as f64);
        let _ = writeln!(
            svg,
            r##"<line x1="{px:.1}" y1="{top}" x2="{px:.1}" y2="{:.1}" stroke="#eeeeee"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{tick}</text>"##,
            top + plot_h,
            top + plot_h + 16.0
        );
    }
    for tick in (0..=100).step_by(10) {
        let py = y(f64::from(tick));
        let _ = writeln!(
            svg,
            r##"<line x1="{left}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#eeeeee"/><text x="{:.1}" y="{:.1}" text-anchor="end">{tick}</text>"##,
            left + plot_w,
            left - 6.0,
            py + 4.0
        );
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333333"/>"##
    );
    let _ = writeln!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">arrived GPU workload (% of capacity)</text>"##,
        left + plot_w / 2.0,
        height - 12.0
    );
    let _ = writeln!(
        svg,
        r##"<text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">GPU allocation ratio (%)</text>"##,
        top + plot_h / 2.0
    );
    let _ = writeln!(
        svg,
        r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#bbbbbb" stroke-dasharray="4 4"/>"##,
        x(0.0),
        y(0.0),
        x(100.0),
        y(100.0)
    );
    for (i, group) in groups.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let points: Vec<String> = (0..=LAST_COLUMN)
            .filter_map(|k| {
                mean(group.runs.iter().map(|r| r.curves.alloc[k]))
                    .map(|v| format!("{:.1},{:.1}", x(k as f64), y(v)))
            })
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/>"#,
            points.join(" ")
        );
        let ly = top + 10.0 + 20.0 * i as f64;
        let lx = left + plot_w + 14.0;
        let (m130, _) = group.alloc_at(LAST_COLUMN);
        let _ = writeln!(
            svg,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{colour}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{} ({})</text>"#,
            lx + 20.0,
            lx + 26.0,
            ly + 4.0,
            escape(&group.policy.label()),
            cell(m130)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
