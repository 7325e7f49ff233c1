//! Reading Prometheus text format as the tests and the lab's throughput report need it: one
//! series' value, and the sum of a metric's samples whose labels include some pairs.

/// The value of one series: `series` is the metric's name with its labels as the exposition
/// writes them, e.g. `gpu_extender_requests_total{verb="filter"}` (the prometheus crate writes
/// labels in the order they were declared).
pub fn series_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// The sum of the samples of metric `name` whose labels include all of `labels`.
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, label_text) = match series.split_once('{') {
                Some((metric, rest)) => (metric, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let all_match = metric == name
                && labels
                    .iter()
                    .all(|(k, v)| label_text.contains(&format!("{k}=\"{v}\"")));
            if all_match {
                value.parse::<f64>().ok()
            } else {
                None
            }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP x_total X.\n# TYPE x_total counter\n\
                        x_total{verb=\"filter\",code=\"200\"} 3\n\
                        x_total{verb=\"filter\",code=\"500\"} 1\n\
                        x_total{verb=\"bind\",code=\"200\"} 5\n\
                        x_total_other 9\ny 2.5\n";

    #[test]
    fn one_series_and_sums_over_labels() {
        assert_eq!(series_value(TEXT, "y"), Some(2.5));
        assert_eq!(
            series_value(TEXT, "x_total{verb=\"bind\",code=\"200\"}"),
            Some(5.0)
        );
        assert_eq!(series_value(TEXT, "x"), None);
        assert_eq!(metric_sum(TEXT, "x_total", &[("verb", "filter")]), 4.0);
        assert_eq!(metric_sum(TEXT, "x_total", &[]), 9.0);
        assert_eq!(metric_sum(TEXT, "x_total", &[("code", "404")]), 0.0);
    }
}
