//! Turning run results into outputs: the summary table (mean over seeds per trace and policy),
//! per-run and per-step CSVs, the reference's discrete allocation CSV, and one SVG plot per
//! trace of allocation ratio against arrived workload. Pure formatting: no files are touched.

use std::fmt::Write as _;

use plotters::drawing::DrawingAreaErrorKind;
use plotters::prelude::*;
use serde::Serialize;

use super::ceiling::RunSliver;
use super::metrics::{LAST_COLUMN, PodKind, mean, std_dev};
use super::replay::{RunResult, SimPolicy};
use crate::reference::ReferencePolicy;

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

/// A mean count (pods per run) to one decimal.
fn count_cell(value: Option<f64>) -> String {
    value.map_or_else(|| "–".to_owned(), |v| format!("{v:.1}"))
}

/// Starts a table of the (trace, policy) groups whose every run `has` what it shows, and
/// returns them: after a blank line its introduction, the header with `columns` (right-aligned
/// numbers) after `trace` and `policy`, and the rule. Writes nothing when no group qualifies.
fn open_table<'a>(
    out: &mut String,
    results: &'a [RunResult],
    has: impl Fn(&RunResult) -> bool,
    intro: &str,
    columns: &[&str],
) -> Vec<Group<'a>> {
    let groups: Vec<Group<'a>> = group(results)
        .into_iter()
        .filter(|g| g.runs.iter().all(|r| has(r)))
        .collect();
    if !groups.is_empty() {
        let _ = writeln!(out, "\n{intro}\n");
        let _ = writeln!(out, "| trace | policy | {} |", columns.join(" | "));
        let _ = writeln!(out, "|---|---|{}", "---:|".repeat(columns.len()));
    }
    groups
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
            count_cell(failed),
            cell(failed_gpu),
            count_cell(idle),
        );
    }
    curve_tables(&mut out, results);
    ceiling_table(&mut out, results);
    window_table(&mut out, results);
    out
}

/// With kube-scheduler's window replayed, the pods per run it turned away while a node outside
/// it had room (mean over seeds); nothing when no run replayed the window.
fn window_table(out: &mut String, results: &[RunResult]) {
    let groups = open_table(
        out,
        results,
        |r| r.window_misses.is_some(),
        "Pods turned away by kube-scheduler's window (no node it sent had room, a node it did not send had; mean over seeds):",
        &["window misses per run", "of failed pods"],
    );
    for group in groups {
        let misses = group.mean_of(|r| r.window_misses.map(|m| m as f64));
        let failed = group.mean_of(|r| Some(r.failed as f64));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            group.trace,
            group.policy.label(),
            count_cell(misses),
            count_cell(failed),
        );
    }
}

/// The ceiling beside each (trace, policy): the allocation no online policy exceeds on the
/// same arrival orders, the lower bound for policies that never reject a pod of the sliver
/// class, how many of the runs did reject one, and the bound for policies at or above the
/// policy's curve from 50% on (means over seeds, at the last pod).
fn ceiling_table(out: &mut String, results: &[RunResult]) {
    let groups = open_table(
        out,
        results,
        |r| r.ceiling.is_some(),
        &format!(
            "Ceiling at the last pod (mean over seeds; docs/simulate.md, \"Ceiling\"): no online policy allocates more than `any`; one that rejects no pod of the sliver class (one GPU, more than half of it) no more than `sliver placed`; one whose curve is at or above this policy's at every whole % from {CURVE_FROM}% on no more than `at or above`:"
        ),
        &[
            "alloc %",
            "ceiling % (any)",
            "sliver milli",
            "ceiling % (sliver placed)",
            "runs that rejected a sliver pod",
            "ceiling % (at or above)",
        ],
    );
    for group in groups {
        let alloc = group.mean_of(|r| Some(r.last.alloc_percent(r.capacity_milli)));
        let any = group.mean_of(|r| r.ceiling.as_ref().map(|c| c.last_any));
        let placed = group.mean_of(|r| sliver(r).map(|s| s.last_while_placed));
        let milli = sliver(group.runs[0]).map_or_else(|| "–".to_owned(), |s| s.milli.to_string());
        let rejecting = group
            .runs
            .iter()
            .filter(|r| sliver(r).is_some_and(|s| s.rejected))
            .count();
        let at_or_above = group.mean_of(|r| r.ceiling.as_ref().map(|c| c.last_at_or_above));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} of {} | {} |",
            group.trace,
            group.policy.label(),
            cell(alloc),
            cell(any),
            milli,
            cell(placed),
            rejecting,
            group.runs.len(),
            cell(at_or_above),
        );
    }
}

/// The arrival columns the curve tables show: every 10 points from 50% to 130%.
pub const CURVE_COLUMNS: [usize; 9] = [50, 60, 70, 80, 90, 100, 110, 120, LAST_COLUMN];

/// The first arrival column the worst difference from FGD is taken over (every whole percent
/// from it to 130%).
pub const CURVE_FROM: usize = 50;

/// The whole curve, after the one-line summary: allocation % at every [`CURVE_COLUMNS`] point
/// (mean over seeds), each policy's difference from FGD's (where FGD ran on the trace) with the
/// worst difference over every whole percent from 50% to 130%, and the rejected pods by kind.
fn curve_tables(out: &mut String, results: &[RunResult]) {
    let groups = group(results);
    let heading = CURVE_COLUMNS
        .iter()
        .map(|k| format!(" {k}% |"))
        .collect::<String>();
    let rule = "---:|".repeat(CURVE_COLUMNS.len());
    let _ = writeln!(out, "\nAlloc % at each arrived % (mean over seeds):\n");
    let _ = writeln!(out, "| trace | policy |{heading}");
    let _ = writeln!(out, "|---|---|{rule}");
    for group in &groups {
        let cells: String = CURVE_COLUMNS
            .iter()
            .map(|&k| format!(" {} |", cell(group.alloc_at(k).0)))
            .collect();
        let _ = writeln!(out, "| {} | {} |{cells}", group.trace, group.policy.label());
    }
    let fgd = SimPolicy::Reference(ReferencePolicy::Fgd);
    let against: Vec<(&Group<'_>, &Group<'_>)> = groups
        .iter()
        .filter(|g| g.policy != fgd)
        .filter_map(|g| {
            let base = groups
                .iter()
                .find(|b| b.trace == g.trace && b.policy == fgd)?;
            Some((g, base))
        })
        .collect();
    if !against.is_empty() {
        let _ = writeln!(
            out,
            "\nDifference from FGD in alloc % points (mean over seeds; worst: the lowest over every whole % from {CURVE_FROM}% to {LAST_COLUMN}%):\n"
        );
        let _ = writeln!(out, "| trace | policy |{heading} worst | at |");
        let _ = writeln!(out, "|---|---|{rule}---:|---:|");
        for (group, base) in against {
            let diff = |k: usize| Some(group.alloc_at(k).0? - base.alloc_at(k).0?);
            let cells: String = CURVE_COLUMNS
                .iter()
                .map(|&k| format!(" {} |", signed(diff(k))))
                .collect();
            let worst = (CURVE_FROM..=LAST_COLUMN)
                .filter_map(|k| Some((k, diff(k)?)))
                .min_by(|a, b| a.1.total_cmp(&b.1));
            let _ = writeln!(
                out,
                "| {} | {} |{cells} {} | {} |",
                group.trace,
                group.policy.label(),
                signed(worst.map(|w| w.1)),
                worst.map_or_else(|| "–".to_owned(), |w| format!("{}%", w.0)),
            );
        }
    }
    let _ = writeln!(
        out,
        "\nRejected pods by kind up to each arrived % (mean over seeds, cumulative):\n"
    );
    let _ = writeln!(out, "| trace | policy | kind |{heading}");
    let _ = writeln!(out, "|---|---|---|{rule}");
    for group in &groups {
        for kind in PodKind::ALL {
            let cells: String = CURVE_COLUMNS
                .iter()
                .map(|&k| {
                    let value = group.mean_of(|r| r.rejected.at(k, kind).map(f64::from));
                    format!(" {} |", count_cell(value))
                })
                .collect();
            let _ = writeln!(
                out,
                "| {} | {} | {} |{cells}",
                group.trace,
                group.policy.label(),
                kind.label()
            );
        }
    }
}

/// A difference with its sign, 2 decimals.
fn signed(value: Option<f64>) -> String {
    value.map_or_else(|| "–".to_owned(), |v| format!("{v:+.2}"))
}

/// CSV text: `header`, then one record per row. Rows carry their numbers already formatted
/// (or as integers), so the digits are this module's choice, not the crate's float formatting;
/// the crate quotes a field only where it holds a comma, a quote or a line break.
pub fn csv_text<R: Serialize>(
    header: impl IntoIterator<Item = impl AsRef<[u8]>>,
    rows: impl IntoIterator<Item = R>,
) -> Result<String, csv::Error> {
    // The header is written by hand so that a file with no rows still has it.
    let mut writer = csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(Vec::new());
    writer.write_record(header)?;
    for row in rows {
        writer.serialize(row)?;
    }
    let bytes = writer
        .into_inner()
        .map_err(|error| csv::Error::from(error.into_error()))?;
    String::from_utf8(bytes)
        .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidData, error).into())
}

/// `v` with `decimals` decimals, or an empty field.
fn fixed(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(String::new, |v| format!("{v:.decimals$}"))
}

/// One row of `runs.csv`; the field names are [`RUNS_HEADER`].
#[derive(Serialize)]
struct RunRow<'a> {
    trace: &'a str,
    policy: String,
    seed: u64,
    pods: usize,
    added: usize,
    failed: usize,
    failed_gpu_milli: u64,
    alloc_100: String,
    alloc_130: String,
    frag_amount_100: String,
    frag_ratio_50: String,
    final_alloc: String,
    final_idle_gpu_nodes: u32,
    ceiling_130: String,
    ceiling_final: String,
    sliver_milli: String,
    sliver_ceiling_final: String,
    sliver_rejected: String,
}

const RUNS_HEADER: [&str; 18] = [
    "trace",
    "policy",
    "seed",
    "pods",
    "added",
    "failed",
    "failed_gpu_milli",
    "alloc_100",
    "alloc_130",
    "frag_amount_100",
    "frag_ratio_50",
    "final_alloc",
    "final_idle_gpu_nodes",
    "ceiling_130",
    "ceiling_final",
    "sliver_milli",
    "sliver_ceiling_final",
    "sliver_rejected",
];

/// One CSV row per run.
pub fn runs_csv(results: &[RunResult]) -> Result<String, csv::Error> {
    csv_text(
        RUNS_HEADER,
        results.iter().map(|r| RunRow {
            trace: &r.trace,
            policy: r.policy.name(),
            seed: r.seed,
            pods: r.pods,
            added: r.added,
            failed: r.failed,
            failed_gpu_milli: r.failed_milli,
            alloc_100: fixed(r.curves.alloc[100], 4),
            alloc_130: fixed(r.curves.alloc[LAST_COLUMN], 4),
            frag_amount_100: fixed(r.curves.frag_amount[100], 4),
            frag_ratio_50: fixed(r.curves.frag_ratio[50], 4),
            final_alloc: fixed(Some(r.last.alloc_percent(r.capacity_milli)), 4),
            final_idle_gpu_nodes: r.last.idle_nodes,
            ceiling_130: fixed(r.ceiling.as_ref().and_then(|c| c.any[LAST_COLUMN]), 4),
            ceiling_final: fixed(r.ceiling.as_ref().map(|c| c.last_any), 4),
            sliver_milli: sliver(r).map_or_else(String::new, |s| s.milli.to_string()),
            sliver_ceiling_final: fixed(sliver(r).map(|s| s.last_while_placed), 4),
            sliver_rejected: sliver(r).map_or_else(String::new, |s| s.rejected.to_string()),
        }),
    )
}

/// The run's sliver-class bound, where its workload has one (docs/simulate.md, "Ceiling").
fn sliver(result: &RunResult) -> Option<&RunSliver> {
    result.ceiling.as_ref()?.sliver.as_ref()
}

/// The reference's `analysis_allo_discrete.csv`: one row per run, columns 0..=130.
pub fn discrete_csv(results: &[RunResult], tune: f64) -> Result<String, csv::Error> {
    let header = ["workload", "sc_policy", "tune", "seed", "total_gpus"]
        .map(str::to_owned)
        .into_iter()
        .chain((0..=LAST_COLUMN).map(|k| k.to_string()));
    // One record of strings per run: the 131 curve columns make a struct pointless.
    let rows = results.iter().map(|r| {
        [
            r.trace.clone(),
            r.policy.name(),
            tune.to_string(),
            r.seed.to_string(),
            (r.capacity_milli / 1000).to_string(),
        ]
        .into_iter()
        .chain(r.curves.alloc.iter().map(|v| fixed(*v, 2)))
        .collect::<Vec<String>>()
    });
    csv_text(header, rows)
}

/// One row of `steps.csv`; the field names are [`STEPS_HEADER`].
#[derive(Serialize)]
struct StepRow<'a> {
    trace: &'a str,
    policy: &'a str,
    seed: u64,
    step: usize,
    arrived_milli: u64,
    arrive_pct: i64,
    used_milli: u64,
    alloc_pct: String,
    frag_milli: String,
    frag_pct: String,
    frag_ratio: String,
    failed: u32,
    idle_gpu_nodes: u32,
}

const STEPS_HEADER: [&str; 13] = [
    "trace",
    "policy",
    "seed",
    "step",
    "arrived_milli",
    "arrive_pct",
    "used_milli",
    "alloc_pct",
    "frag_milli",
    "frag_pct",
    "frag_ratio",
    "failed",
    "idle_gpu_nodes",
];

/// Per-step rows of the runs that kept their steps.
pub fn steps_csv(results: &[RunResult]) -> Result<String, csv::Error> {
    let names: Vec<String> = results.iter().map(|r| r.policy.name()).collect();
    let rows = results.iter().zip(&names).flat_map(|(r, name)| {
        r.steps.iter().flatten().enumerate().map(move |(i, step)| {
            let capacity = r.capacity_milli;
            StepRow {
                trace: &r.trace,
                policy: name,
                seed: r.seed,
                step: i + 1,
                arrived_milli: step.arrived_milli,
                arrive_pct: step.arrive_percent(capacity),
                used_milli: step.used_milli,
                alloc_pct: fixed(Some(step.alloc_percent(capacity)), 2),
                frag_milli: fixed(Some(step.frag_milli), 1),
                frag_pct: fixed(Some(step.frag_percent(capacity)), 3),
                frag_ratio: fixed(step.frag_ratio(), 3),
                failed: step.failed,
                idle_gpu_nodes: step.idle_nodes,
            }
        })
    });
    csv_text(STEPS_HEADER, rows)
}

/// Line colours for the plot, one per policy in order (colour-blind-safe Okabe–Ito set).
const COLOURS: [RGBColor; 8] = [
    RGBColor(0x99, 0x99, 0x99),
    RGBColor(0xE6, 0x9F, 0x00),
    RGBColor(0x56, 0xB4, 0xE9),
    RGBColor(0x00, 0x9E, 0x73),
    RGBColor(0x00, 0x72, 0xB2),
    RGBColor(0xD5, 0x5E, 0x00),
    RGBColor(0xCC, 0x79, 0xA7),
    RGBColor(0x00, 0x00, 0x00),
];

/// Why the plot could not be drawn (into a string, so in practice never).
pub type PlotError = DrawingAreaErrorKind<std::io::Error>;

/// An SVG line plot of one trace: mean allocation ratio over seeds against arrived workload
/// (0..=130%), one line per policy, with the y = x line for reference. The legend names each
/// policy with its mean allocation at 130% arrived.
pub fn alloc_svg(trace: &str, groups: &[&Group<'_>]) -> Result<String, PlotError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (760, 480)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("GPU allocation vs arrived workload: {trace}"),
                ("sans-serif", 16),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..LAST_COLUMN as f64, 0.0..100.0)?;
        chart
            .configure_mesh()
            .x_desc("arrived GPU workload (% of capacity)")
            .y_desc("GPU allocation ratio (%)")
            .x_labels(LAST_COLUMN / 10 + 1)
            .y_labels(11)
            // One grid line per labelled tick, as the labels are every 10 points.
            .max_light_lines(0)
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw()?;
        // Where every arrived GPU would be placed: the ceiling below 100% arrived.
        chart.draw_series(DashedLineSeries::new(
            [(0.0, 0.0), (100.0, 100.0)],
            4,
            4,
            RGBColor(0xBB, 0xBB, 0xBB).into(),
        ))?;
        for (i, group) in groups.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let points = (0..=LAST_COLUMN).filter_map(|k| {
                mean(group.runs.iter().map(|r| r.curves.alloc[k])).map(|v| (k as f64, v))
            });
            let (m130, _) = group.alloc_at(LAST_COLUMN);
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(2)))?
                .label(format!("{} ({})", group.policy.label(), cell(m130)))
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(3))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::cli::EXAMPLE_SCENARIO;
    use crate::load::parse_scenario;
    use crate::reference::ReferencePolicy;
    use crate::replay::{Prepared, run};

    /// The built-in example under two policies, one seed; the first run keeps its steps.
    fn results(tune: f64) -> Vec<RunResult> {
        let scenario = parse_scenario(Path::new("example"), EXAMPLE_SCENARIO).unwrap();
        let prepared = Prepared::new(&scenario.cluster.unwrap(), &scenario.workload.unwrap());
        [ReferencePolicy::Fgd, ReferencePolicy::BestFit]
            .into_iter()
            .enumerate()
            .map(|(i, policy)| {
                run(
                    &prepared,
                    SimPolicy::Reference(policy),
                    42,
                    tune,
                    i == 0,
                    &|_| {},
                )
            })
            .collect()
    }

    /// The lines the hand-written formatting wrote before the csv crate: the files' layout
    /// (columns, decimals, empty cells) must not change.
    fn runs_lines(results: &[RunResult]) -> Vec<String> {
        let opt = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.4}"));
        results
            .iter()
            .map(|r| {
                let sliver = sliver(r);
                format!(
                    "{},{},{},{},{},{},{},{},{},{},{},{:.4},{},{},{},{},{},{}",
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
                    opt(r.ceiling.as_ref().and_then(|c| c.any[LAST_COLUMN])),
                    opt(r.ceiling.as_ref().map(|c| c.last_any)),
                    sliver.map_or_else(String::new, |s| s.milli.to_string()),
                    opt(sliver.map(|s| s.last_while_placed)),
                    sliver.map_or_else(String::new, |s| s.rejected.to_string()),
                )
            })
            .collect()
    }

    #[test]
    fn csv_outputs_keep_the_hand_written_layout() {
        for tune in [1.3, 0.0] {
            let results = results(tune);
            let runs = runs_csv(&results).unwrap();
            let mut lines = runs.lines();
            assert_eq!(
                lines.next(),
                Some(
                    "trace,policy,seed,pods,added,failed,failed_gpu_milli,alloc_100,alloc_130,\
                     frag_amount_100,frag_ratio_50,final_alloc,final_idle_gpu_nodes,ceiling_130,\
                     ceiling_final,sliver_milli,sliver_ceiling_final,sliver_rejected"
                )
            );
            assert_eq!(
                lines.map(str::to_owned).collect::<Vec<_>>(),
                runs_lines(&results)
            );
            assert!(runs.ends_with('\n'));

            let steps = steps_csv(&results).unwrap();
            let r = &results[0];
            let step = &r.steps.as_ref().unwrap()[0];
            let c = r.capacity_milli;
            let first = format!(
                "small-example,fgd,42,1,{},{},{},{:.2},{:.1},{:.3},{},{},{}",
                step.arrived_milli,
                step.arrive_percent(c),
                step.used_milli,
                step.alloc_percent(c),
                step.frag_milli,
                step.frag_percent(c),
                step.frag_ratio()
                    .map_or_else(String::new, |v| format!("{v:.3}")),
                step.failed,
                step.idle_nodes,
            );
            let mut lines = steps.lines();
            assert_eq!(
                lines.next(),
                Some(
                    "trace,policy,seed,step,arrived_milli,arrive_pct,used_milli,alloc_pct,\
                     frag_milli,frag_pct,frag_ratio,failed,idle_gpu_nodes"
                )
            );
            assert_eq!(lines.next(), Some(first.as_str()));
            // Only the first run kept its steps.
            assert_eq!(steps.lines().count(), 1 + r.pods);

            let discrete = discrete_csv(&results, tune).unwrap();
            let mut lines = discrete.lines();
            let header = lines.next().unwrap();
            assert!(header.starts_with("workload,sc_policy,tune,seed,total_gpus,0,1,2,"));
            assert!(header.ends_with(",129,130"));
            let row: Vec<&str> = lines.next().unwrap().split(',').collect();
            assert_eq!(
                row[..5],
                ["small-example", "fgd", &tune.to_string(), "42", "108"]
            );
            assert_eq!(row.len(), 5 + LAST_COLUMN + 1);
            for (cell, value) in row[5..].iter().zip(&r.curves.alloc) {
                assert_eq!(*cell, value.map_or_else(String::new, |v| format!("{v:.2}")));
            }
        }
    }

    #[test]
    fn csv_outputs_have_a_header_without_rows_and_quote_what_needs_it() {
        assert_eq!(
            runs_csv(&[]).unwrap(),
            "trace,policy,seed,pods,added,failed,failed_gpu_milli,alloc_100,alloc_130,\
             frag_amount_100,frag_ratio_50,final_alloc,final_idle_gpu_nodes,ceiling_130,\
             ceiling_final,sliver_milli,sliver_ceiling_final,sliver_rejected\n"
        );
        let mut results = results(1.3);
        results[0].steps = None;
        assert_eq!(steps_csv(&results).unwrap().lines().count(), 1);
        // A trace named after a file may hold a comma or a quote: quoted, not a column more.
        results[1].trace = "a,b \"c\"".to_owned();
        let runs = runs_csv(&results).unwrap();
        assert!(
            runs.lines()
                .nth(2)
                .unwrap()
                .starts_with("\"a,b \"\"c\"\"\",best-fit,42,")
        );
        let mut reader = csv::Reader::from_reader(runs.as_bytes());
        let row = reader.records().nth(1).unwrap().unwrap();
        assert_eq!((&row[0], row.len()), ("a,b \"c\"", RUNS_HEADER.len()));
    }

    /// The cells of the summary row that starts with `prefix` (after the prefix's own cells).
    fn row_cells<'s>(summary: &'s str, section: &str, prefix: &str) -> Vec<&'s str> {
        let (_, rest) = summary.split_once(section).unwrap();
        let line = rest
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no row {prefix:?} in {rest}"));
        line[prefix.len()..]
            .split('|')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect()
    }

    #[test]
    fn the_summary_shows_the_whole_curve_the_difference_from_fgd_and_rejections_by_kind() {
        let results = results(1.3);
        let summary = summary_markdown(&results);
        let (fgd, best_fit) = (&results[0], &results[1]);
        let alloc = row_cells(
            &summary,
            "Alloc % at each arrived %",
            "| small-example | FGD |",
        );
        assert_eq!(alloc.len(), CURVE_COLUMNS.len());
        for (cell_text, &k) in alloc.iter().zip(&CURVE_COLUMNS) {
            assert_eq!(*cell_text, cell(fgd.curves.alloc[k]), "column {k}");
        }
        let diff = row_cells(
            &summary,
            "Difference from FGD",
            "| small-example | BestFit |",
        );
        assert_eq!(diff.len(), CURVE_COLUMNS.len() + 2);
        let at = |r: &RunResult, k: usize| r.curves.alloc[k];
        for (cell_text, &k) in diff.iter().zip(&CURVE_COLUMNS) {
            let expected = at(best_fit, k).zip(at(fgd, k)).map(|(b, f)| b - f);
            assert_eq!(*cell_text, signed(expected), "column {k}");
        }
        let worst = (CURVE_FROM..=LAST_COLUMN)
            .filter_map(|k| Some((k, at(best_fit, k)? - at(fgd, k)?)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap();
        assert_eq!(diff[CURVE_COLUMNS.len()], signed(Some(worst.1)));
        assert_eq!(diff[CURVE_COLUMNS.len() + 1], format!("{}%", worst.0));
        // FGD is the baseline: no row of its own there.
        assert!(
            !summary
                .split_once("Difference from FGD")
                .unwrap()
                .1
                .split_once("Rejected pods")
                .unwrap()
                .0
                .contains("| FGD |")
        );
        // Rejections: every kind of every policy, and they add up to the failed pods.
        let mut at_end = 0.0;
        for kind in PodKind::ALL {
            let prefix = format!("| small-example | BestFit | {} |", kind.label());
            let cells = row_cells(&summary, "Rejected pods by kind", &prefix);
            for (cell_text, &k) in cells.iter().zip(&CURVE_COLUMNS) {
                let count = best_fit.rejected.at(k, kind).unwrap();
                assert_eq!(
                    *cell_text,
                    format!("{:.1}", f64::from(count)),
                    "{prefix} column {k}"
                );
            }
            at_end += f64::from(best_fit.rejected.total(kind));
        }
        assert!(best_fit.failed > 0, "the example rejects pods at 130%");
        assert_eq!(at_end, best_fit.failed as f64);
    }

    #[test]
    fn without_fgd_there_is_no_difference_table() {
        let mut results = results(1.3);
        results.remove(0);
        let summary = summary_markdown(&results);
        assert!(summary.contains("Alloc % at each arrived %"));
        assert!(!summary.contains("Difference from FGD"));
        assert!(summary.contains("Rejected pods by kind"));
    }

    #[test]
    fn the_window_table_appears_only_with_a_replayed_window() {
        let mut results = results(1.3);
        assert!(!summary_markdown(&results).contains("kube-scheduler's window"));
        results[0].window_misses = Some(3);
        results[1].window_misses = Some(0);
        let summary = summary_markdown(&results);
        let table = summary
            .split("Pods turned away by kube-scheduler's window")
            .nth(1)
            .expect("the window table");
        assert!(
            table.contains("| trace | policy | window misses per run | of failed pods |"),
            "{table}"
        );
        let fgd = format!(
            "| {} | FGD | 3.0 | {:.1} |",
            results[0].trace, results[0].failed as f64
        );
        assert!(table.contains(&fgd), "{table}");
    }

    /// Every tag opened is closed, in order (the SVG is XML; no XML parser is a dependency).
    fn assert_well_formed(svg: &str) {
        let mut open = Vec::new();
        let mut rest = svg;
        while let Some(start) = rest.find('<') {
            let end = start + rest[start..].find('>').unwrap();
            let tag = &rest[start + 1..end];
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(open.pop(), Some(name.trim()), "closing {tag}");
            } else if !tag.ends_with('/') {
                open.push(tag.split_whitespace().next().unwrap());
            }
            rest = &rest[end + 1..];
        }
        assert!(open.is_empty(), "left open: {open:?}");
    }

    /// The `points` of the polylines drawn in `colour` at `width`.
    fn lines_in<'s>(svg: &'s str, colour: &str, width: u32) -> Vec<&'s str> {
        let stroke = format!("stroke=\"{colour}\" stroke-width=\"{width}\" points=\"");
        svg.lines()
            .filter(|l| l.starts_with("<polyline"))
            .filter_map(|l| l.split_once(stroke.as_str()))
            .map(|(_, points)| points.split('"').next().unwrap())
            .collect()
    }

    #[test]
    fn the_plot_has_axes_a_legend_entry_and_a_line_per_policy() {
        let mut results = results(1.3);
        for r in &mut results {
            r.trace = "a<b & c".to_owned();
        }
        let groups = group(&results);
        let refs: Vec<&Group<'_>> = groups.iter().collect();
        let svg = alloc_svg("a<b & c", &refs).unwrap();
        assert!(svg.starts_with("<svg "), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_well_formed(&svg);
        let texts: Vec<&str> = svg
            .split("<text")
            .skip(1)
            .map(|t| {
                t.split_once('>')
                    .unwrap()
                    .1
                    .split("</text>")
                    .next()
                    .unwrap()
                    .trim()
            })
            .collect();
        for wanted in [
            "GPU allocation vs arrived workload: a&lt;b &amp; c",
            "arrived GPU workload (% of capacity)",
            "GPU allocation ratio (%)",
            "0",
            "100",
            "130",
        ] {
            assert!(texts.contains(&wanted), "no text {wanted:?} in {texts:?}");
        }
        for (i, group) in groups.iter().enumerate() {
            let (m130, _) = group.alloc_at(LAST_COLUMN);
            let entry = format!("{} ({})", group.policy.label(), cell(m130));
            assert!(texts.contains(&entry.as_str()), "no legend {entry:?}");
            let RGBColor(red, green, blue) = COLOURS[i];
            let colour = format!("#{red:02X}{green:02X}{blue:02X}");
            // The data: one point per arrival point with a value.
            let data = lines_in(&svg, &colour, 2);
            let values = group.runs[0].curves.alloc.iter().flatten().count();
            assert_eq!(data.len(), 1, "{colour}");
            assert_eq!(data[0].split_whitespace().count(), values, "{colour}");
            // The legend's sample of the line.
            assert_eq!(lines_in(&svg, &colour, 3).len(), 1, "{colour}");
        }
    }
}
