//! The report's markdown: one row per backend for the day of keys, one row
//! per size for the growth curve with its extrapolation, and the panels of
//! a run's chart.

use super::parse::{LoadFigures, Sample};
use super::summary::{DaySummary, Drift, RECORD_BYTES_TARGET, extrapolate};
use crate::chart::{TimeLine, TimePanel};

/// The design's worst case: a whole day at the 2,000/s peak (docs/design.md#sizing).
pub const WORST_CASE_RECORDS: u64 = 172_800_000;

/// A markdown table.
struct Markdown {
    text: String,
}

impl Markdown {
    fn new(headers: &[&str]) -> Self {
        let mut text = format!("| {} |\n", headers.join(" | "));
        text.push_str(&format!("|{}\n", "---|".repeat(headers.len())));
        Self { text }
    }

    fn row(&mut self, cells: &[String]) {
        self.text.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
}

/// 34560000 as "34,560,000".
pub fn thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut grouped = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

const ABSENT: &str = "—";

fn or_absent<T>(value: Option<T>, show: impl FnOnce(T) -> String) -> String {
    value.map(show).unwrap_or_else(|| ABSENT.to_owned())
}

fn percentiles(figures: &LoadFigures) -> String {
    format!("{:.2} / {:.2} / {:.2}", figures.p50_ms, figures.p99_ms, figures.p999_ms)
}

/// "loaded (empty store)", with the loaded store's achieved rate.
fn latency_cell(loaded: Option<LoadFigures>, empty: Option<LoadFigures>) -> String {
    let loaded_text = or_absent(loaded, |figures| {
        format!("{} at {:.0}/s", percentiles(&figures), figures.achieved_per_s)
    });
    format!("{loaded_text} ({})", or_absent(empty, |figures| percentiles(&figures)))
}

fn drift_cell(drift: Option<Drift>) -> String {
    or_absent(drift, |drift| format!("{:+.1} %", drift.largest_percent))
}

fn restart_cell(summary: &DaySummary) -> String {
    let ready = |signal: &str| or_absent(summary.restart(signal), |restart| format!("{:.1} s", restart.ready_s));
    format!("{} / {}", ready("SIGTERM"), ready("SIGKILL"))
}

fn records_cell(summary: &DaySummary) -> String {
    let scenario = &summary.inputs.scenario;
    if scenario.records == scenario.records_requested {
        thousands(scenario.records)
    } else {
        format!(
            "{} (of {} asked)",
            thousands(scenario.records),
            thousands(scenario.records_requested)
        )
    }
}

fn bytes_cell(summary: &DaySummary) -> String {
    or_absent(
        summary.inputs.preload.and_then(|preload| preload.bytes_per_record),
        |bytes| format!("{bytes:.0}"),
    )
}

fn pace_cell(summary: &DaySummary) -> String {
    format!(
        "{} / {}",
        or_absent(summary.purges_per_s, |rate| format!("{rate:.0}")),
        or_absent(summary.inserts_per_s, |rate| format!("{rate:.0}"))
    )
}

fn vacuum_cell(summary: &DaySummary) -> String {
    or_absent(summary.vacuum, |vacuum| {
        format!(
            "{} / {} / {}, {} runs",
            thousands(vacuum.dead_tuples_first),
            thousands(vacuum.dead_tuples_max),
            thousands(vacuum.dead_tuples_last),
            vacuum.autovacuum_runs
        )
    })
}

/// One row per run: the day-of-keys table.
pub fn day_table(summaries: &[DaySummary]) -> String {
    let mut table = Markdown::new(&[
        "backend",
        "records",
        format!("bytes/record (≤ {RECORD_BYTES_TARGET:.0})").as_str(),
        "steady rate: p50 / p99 / p99.9 ms (empty store)",
        "p99 / empty (≤ 1.5)",
        "peak rate: p50 / p99 / p99.9 ms (empty store)",
        "purges/s / inserts/s",
        "record count drift (±5 %)",
        "RSS drift (±10 %)",
        "ready after SIGTERM / SIGKILL",
        "dead tuples first / max / last, autovacuum",
        "targets missed",
    ]);
    for summary in summaries {
        let inputs = &summary.inputs;
        let missed = summary.targets_missed();
        table.row(&[
            inputs.scenario.backend.clone(),
            records_cell(summary),
            bytes_cell(summary),
            latency_cell(inputs.steady, inputs.empty_steady),
            or_absent(summary.steady_p99_ratio(), |ratio| format!("{ratio:.2}")),
            latency_cell(inputs.peak, inputs.empty_peak),
            pace_cell(summary),
            drift_cell(summary.count_drift),
            drift_cell(summary.rss_drift),
            restart_cell(summary),
            vacuum_cell(summary),
            if missed.is_empty() {
                "none".to_owned()
            } else {
                missed.join("; ")
            },
        ]);
    }
    table.text
}

/// What each run was asked to do, one line each, under the table.
pub fn day_notes(summaries: &[DaySummary]) -> String {
    summaries
        .iter()
        .map(|summary| {
            let scenario = &summary.inputs.scenario;
            let preload = or_absent(summary.inputs.preload, |preload| {
                let rest = match preload.settle {
                    Some((waited_s, true)) => format!(", at rest {waited_s:.0} s later"),
                    Some((waited_s, false)) => format!(", not at rest {waited_s:.0} s later"),
                    None => String::new(),
                };
                format!("loaded at {:.0} records/s{rest}", preload.records_per_s)
            });
            format!(
                "- {}: {} s at {:.0}/s then {} s at {:.0}/s, retention {} s, {preload}, {} samples\n",
                scenario.backend,
                scenario.steady_s,
                scenario.steady_rate_per_s,
                scenario.peak_s,
                scenario.peak_rate_per_s,
                scenario.retention_s,
                summary.inputs.samples.len()
            )
        })
        .collect()
}

/// One figure of a growth row, for the fit: (records, value).
type Figure = fn(&DaySummary) -> Option<f64>;

/// How a figure is carried to the worst case: along its own line, or, for a
/// figure per record, as its total's line divided by the records (a ratio
/// that falls as a fixed cost spreads would cross zero along its own line).
#[derive(Debug, Clone, Copy)]
enum Fit {
    Line,
    PerRecord,
}

const GROWTH_FIGURES: [(&str, Figure, Fit); 6] = [
    (
        "store size, MiB",
        |summary| summary.store_bytes_steady_end.map(|bytes| bytes as f64 / 1_048_576.0),
        Fit::Line,
    ),
    (
        "bytes/record",
        |summary| summary.inputs.preload.and_then(|preload| preload.bytes_per_record),
        Fit::PerRecord,
    ),
    (
        "p99 at the steady rate, ms",
        |summary| summary.inputs.steady.map(|figures| figures.p99_ms),
        Fit::Line,
    ),
    (
        "service RSS, MiB",
        |summary| summary.rss_kib_steady_end.map(|kib| kib as f64 / 1_024.0),
        Fit::Line,
    ),
    (
        "ready after SIGTERM, s",
        |summary| summary.restart("SIGTERM").map(|restart| restart.ready_s),
        Fit::Line,
    ),
    (
        "ready after SIGKILL, s",
        |summary| summary.restart("SIGKILL").map(|restart| restart.ready_s),
        Fit::Line,
    ),
];

/// One row per size, then each figure extrapolated along a straight line to
/// the design's worst case.
pub fn growth_table(summaries: &[DaySummary]) -> String {
    let mut headers = vec!["records"];
    headers.extend(GROWTH_FIGURES.iter().map(|(name, _, _)| *name));
    headers.push("purges/s / inserts/s");
    let mut table = Markdown::new(&headers);
    for summary in summaries {
        let mut cells = vec![records_cell(summary)];
        cells.extend(
            GROWTH_FIGURES
                .iter()
                .map(|(_, figure, _)| or_absent(figure(summary), |value| format!("{value:.1}"))),
        );
        cells.push(pace_cell(summary));
        table.row(&cells);
    }
    let mut cells = vec![format!("{} (linear fit)", thousands(WORST_CASE_RECORDS))];
    cells.extend(
        GROWTH_FIGURES
            .iter()
            .map(|(_, figure, fit)| or_absent(worst_case(summaries, *figure, *fit), |value| format!("{value:.1}"))),
    );
    cells.push(ABSENT.to_owned());
    table.row(&cells);
    table.text
}

/// One figure at the design's worst case, from the sizes measured.
fn worst_case(summaries: &[DaySummary], figure: Figure, fit: Fit) -> Option<f64> {
    let worst = WORST_CASE_RECORDS as f64;
    let points: Vec<(f64, f64)> = summaries
        .iter()
        .filter_map(|summary| {
            let records = summary.inputs.scenario.records as f64;
            let value = figure(summary)?;
            Some(match fit {
                Fit::Line => (records, value),
                Fit::PerRecord => (records, value * records),
            })
        })
        .collect();
    let at_worst = extrapolate(&points, worst)?;
    Some(match fit {
        Fit::Line => at_worst,
        Fit::PerRecord => at_worst / worst,
    })
}

/// The chart of one run: the store's size, the service's memory, the
/// record count and, on PostgreSQL, the dead tuples, one line per phase.
pub fn chart_panels(samples: &[Sample]) -> Vec<TimePanel> {
    vec![
        time_panel(samples, "store size", "MiB", |sample| {
            sample.store_bytes.map(|bytes| bytes as f64 / 1_048_576.0)
        }),
        time_panel(samples, "service resident memory", "MiB", |sample| {
            sample.service_rss_kib.map(|kib| kib as f64 / 1_024.0)
        }),
        time_panel(samples, "records", "count", |sample| {
            sample.record_count.map(|count| count as f64)
        }),
        time_panel(samples, "dead tuples of idempotency_keys", "count", |sample| {
            sample.dead_tuples.map(|count| count as f64)
        }),
    ]
}

fn time_panel(samples: &[Sample], title: &str, unit: &str, figure: fn(&Sample) -> Option<f64>) -> TimePanel {
    TimePanel {
        title: title.to_owned(),
        unit: unit.to_owned(),
        lines: phase_lines(samples, figure),
    }
}

/// One line per phase, in the order the phases came.
fn phase_lines(samples: &[Sample], figure: fn(&Sample) -> Option<f64>) -> Vec<TimeLine> {
    let Some(first) = samples.first() else {
        return Vec::new();
    };
    let mut lines: Vec<TimeLine> = Vec::new();
    for sample in samples {
        let Some(value) = figure(sample) else { continue };
        let second = sample.unix_ms.saturating_sub(first.unix_ms) as f64 / 1_000.0;
        match lines.iter_mut().find(|line| line.name == sample.phase) {
            Some(line) => line.points.push((second, value)),
            None => lines.push(TimeLine {
                name: sample.phase.clone(),
                points: vec![(second, value)],
            }),
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(512), "512");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(34_560_000), "34,560,000");
    }

    #[test]
    fn a_markdown_table_has_a_rule_under_its_header() {
        let mut table = Markdown::new(&["a", "b"]);
        table.row(&["1".to_owned(), "2".to_owned()]);
        assert_eq!(table.text, "| a | b |\n|---|---|\n| 1 | 2 |\n");
    }
}
