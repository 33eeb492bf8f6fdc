//! What a run reports: summaries of the engine's recordings (percentiles,
//! rates, counts, one point per second), the JSON report, and plain-text
//! tables for the terminal.

use crate::engine::{OpenLoopResult, SaturationResult};
use crate::recorder::Recording;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub count: u64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

impl LatencySummary {
    pub fn of(histogram: &Histogram<u64>) -> Self {
        let ms = |micros: u64| micros as f64 / 1_000.0;
        if histogram.is_empty() {
            return Self {
                count: 0,
                p50_ms: 0.0,
                p90_ms: 0.0,
                p99_ms: 0.0,
                p999_ms: 0.0,
                max_ms: 0.0,
                mean_ms: 0.0,
            };
        }
        Self {
            count: histogram.len(),
            p50_ms: ms(histogram.value_at_quantile(0.50)),
            p90_ms: ms(histogram.value_at_quantile(0.90)),
            p99_ms: ms(histogram.value_at_quantile(0.99)),
            p999_ms: ms(histogram.value_at_quantile(0.999)),
            max_ms: ms(histogram.max()),
            mean_ms: histogram.mean() / 1_000.0,
        }
    }
}

/// One second of a run, for charts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SecondPoint {
    pub second: u64,
    /// Operations that completed successfully during this second.
    pub throughput_per_s: u64,
    /// Operations meant to start during this second that failed.
    pub failures: u64,
    /// Latency of the operations meant to start during this second.
    pub latency: LatencySummary,
}

/// The summary of one run of the engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub label: String,
    /// `open_loop` or `saturation`.
    pub kind: String,
    /// The requested rate (open loop only).
    pub target_rate_per_s: Option<f64>,
    /// Operations meant to start in the measured window, per second.
    pub offered_rate_per_s: Option<f64>,
    /// Successful operations per second of the measured window (to the last
    /// completion, when that came after the window's end).
    pub achieved_rate_per_s: f64,
    pub warmup_s: f64,
    pub duration_s: f64,
    /// Open-loop in-flight bound, or closed-loop concurrency.
    pub concurrency: usize,
    pub intended: Option<u64>,
    pub completed: u64,
    pub successes: u64,
    pub failures: u64,
    pub outcomes: BTreeMap<String, u64>,
    /// Each outcome's latency (absent from reports written before it).
    #[serde(default)]
    pub latency_by_outcome: BTreeMap<String, LatencySummary>,
    /// Operations that waited for a free in-flight slot.
    pub started_late: u64,
    pub not_sent: u64,
    pub unfinished: u64,
    /// From intended start (open loop) or actual start (saturation).
    pub latency: LatencySummary,
    /// The load generator's own lateness in starting operations.
    pub start_lag: LatencySummary,
    pub series: Vec<SecondPoint>,
}

impl RunSummary {
    pub fn of_open_loop(result: &OpenLoopResult) -> Self {
        let plan = &result.plan;
        let mut summary = Self::of_recording(&plan.label, "open_loop", &result.recording, plan.warmup, plan.duration);
        summary.target_rate_per_s = Some(plan.rate_per_s);
        summary.offered_rate_per_s = Some(result.intended as f64 / plan.duration.as_secs_f64());
        summary.concurrency = plan.inflight_max;
        summary.intended = Some(result.intended);
        summary.started_late = result.started_late;
        summary.not_sent = result.not_sent;
        summary.unfinished = result.unfinished;
        summary
    }

    pub fn of_saturation(result: &SaturationResult) -> Self {
        let plan = &result.plan;
        let mut summary = Self::of_recording(&plan.label, "saturation", &result.recording, plan.warmup, plan.duration);
        summary.concurrency = plan.concurrency;
        summary
    }

    pub(crate) fn of_recording(
        label: &str,
        kind: &str,
        recording: &Recording,
        warmup: Duration,
        duration: Duration,
    ) -> Self {
        let elapsed = recording.last_completion.max(duration).as_secs_f64();
        let series = recording
            .seconds
            .iter()
            .enumerate()
            .map(|(second, bucket)| SecondPoint {
                second: second as u64,
                throughput_per_s: bucket.successes_completed,
                failures: bucket.failures,
                latency: LatencySummary::of(&bucket.latency),
            })
            .collect();
        Self {
            label: label.to_owned(),
            kind: kind.to_owned(),
            target_rate_per_s: None,
            offered_rate_per_s: None,
            achieved_rate_per_s: recording.successes as f64 / elapsed,
            warmup_s: warmup.as_secs_f64(),
            duration_s: duration.as_secs_f64(),
            concurrency: 0,
            intended: None,
            completed: recording.completed(),
            successes: recording.successes,
            failures: recording.failures,
            outcomes: recording.outcomes.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            latency_by_outcome: recording
                .latency_by_outcome
                .iter()
                .map(|(outcome, latency)| ((*outcome).to_owned(), LatencySummary::of(latency)))
                .collect(),
            started_late: 0,
            not_sent: 0,
            unfinished: 0,
            latency: LatencySummary::of(&recording.latency),
            start_lag: LatencySummary::of(&recording.start_lag),
            series,
        }
    }

    /// Achieved rate as a share of the target (open loop only).
    pub fn achieved_share_of_target(&self) -> Option<f64> {
        self.target_rate_per_s.map(|target| self.achieved_rate_per_s / target)
    }

    /// Achieved rate as a share of the rate the schedule actually offered
    /// (open loop only). A Poisson schedule's count over T seconds varies by
    /// about 1/sqrt(rate x T) around the target (2% for 250/s over 10 s),
    /// so keeping up is judged against what was offered; for fixed arrivals
    /// the two are the same.
    pub fn achieved_share_of_offered(&self) -> Option<f64> {
        self.offered_rate_per_s
            .filter(|offered| *offered > 0.0)
            .map(|offered| self.achieved_rate_per_s / offered)
    }

    /// Outcome counts as `name=count` pairs; with more than one outcome,
    /// each one's latency too.
    pub fn outcomes_text(&self) -> String {
        let several = self.outcomes.len() > 1;
        let parts: Vec<String> = self
            .outcomes
            .iter()
            .map(|(name, count)| match self.latency_by_outcome.get(name) {
                Some(latency) if several => format!(
                    "{name}={count} (p50 {:.2} / p99 {:.2} / p99.9 {:.2} ms)",
                    latency.p50_ms, latency.p99_ms, latency.p999_ms
                ),
                _ => format!("{name}={count}"),
            })
            .collect();
        parts.join(" ")
    }
}

/// A plain-text table with a header row; numbers right-aligned.
#[derive(Debug, Clone, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Self {
        Self {
            headers: headers.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (column, cell) in row.iter().enumerate().take(columns) {
                widths[column] = widths[column].max(cell.chars().count());
            }
        }
        let mut text = String::new();
        let line = |text: &mut String, cells: &[String]| {
            let padded: Vec<String> = cells
                .iter()
                .enumerate()
                .take(columns)
                .map(|(column, cell)| {
                    if column > 0 && looks_numeric(cell) {
                        format!("{cell:>width$}", width = widths[column])
                    } else {
                        format!("{cell:<width$}", width = widths[column])
                    }
                })
                .collect();
            let _ = writeln!(text, "{}", padded.join("  ").trim_end());
        };
        line(&mut text, &self.headers);
        let rule: Vec<String> = widths.iter().map(|width| "-".repeat(*width)).collect();
        line(&mut text, &rule);
        for row in &self.rows {
            line(&mut text, row);
        }
        text
    }
}

fn looks_numeric(cell: &str) -> bool {
    cell.chars().next().is_some_and(|c| c.is_ascii_digit() || c == '-') && !cell.starts_with("--")
}

/// Milliseconds with two decimals.
pub fn ms(value: f64) -> String {
    format!("{value:.2}")
}

/// A rate with no decimals.
pub fn rate(value: f64) -> String {
    format!("{value:.0}")
}

/// The usual row of a run: rates, percentiles, counts.
pub fn run_row(name: &str, summary: &RunSummary) -> Vec<String> {
    vec![
        name.to_owned(),
        summary.target_rate_per_s.map(rate).unwrap_or_else(|| "max".into()),
        rate(summary.achieved_rate_per_s),
        ms(summary.latency.p50_ms),
        ms(summary.latency.p90_ms),
        ms(summary.latency.p99_ms),
        ms(summary.latency.p999_ms),
        ms(summary.latency.max_ms),
        summary.successes.to_string(),
        summary.failures.to_string(),
        summary.started_late.to_string(),
    ]
}

pub const RUN_HEADERS: [&str; 11] = [
    "run",
    "target/s",
    "achieved/s",
    "p50 ms",
    "p90 ms",
    "p99 ms",
    "p99.9 ms",
    "max ms",
    "ok",
    "failed",
    "late starts",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recorder::{Outcome, latency_histogram};
    use std::time::Instant;

    #[test]
    fn percentiles_come_from_the_histogram_in_milliseconds() {
        let mut histogram = latency_histogram(3);
        for micros in 1..=1_000u64 {
            histogram.record(micros * 10).unwrap();
        }
        let summary = LatencySummary::of(&histogram);
        assert_eq!(summary.count, 1_000);
        assert!((summary.p50_ms - 5.0).abs() < 0.01, "{}", summary.p50_ms);
        assert!((summary.p99_ms - 9.9).abs() < 0.01, "{}", summary.p99_ms);
        assert!((summary.max_ms - 10.0).abs() < 0.01, "{}", summary.max_ms);
        assert_eq!(LatencySummary::of(&latency_histogram(3)).count, 0);
    }

    #[test]
    fn a_summary_serialises_with_the_documented_fields() {
        let start = Instant::now();
        let mut recording = Recording::new(start);
        recording.record(start, start + Duration::from_millis(3), Outcome::success("first_run"));
        recording.record(start, start + Duration::from_millis(7), Outcome::failure("gave_up"));
        let summary = RunSummary::of_recording(
            "embedded",
            "open_loop",
            &recording,
            Duration::ZERO,
            Duration::from_secs(1),
        );
        let json = serde_json::to_value(&summary).unwrap();
        for field in [
            "label",
            "kind",
            "achieved_rate_per_s",
            "latency",
            "start_lag",
            "outcomes",
            "series",
            "successes",
            "failures",
            "not_sent",
            "unfinished",
            "started_late",
        ] {
            assert!(json.get(field).is_some(), "missing {field}");
        }
        for field in ["p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms"] {
            assert!(json["latency"][field].is_number(), "missing latency.{field}");
        }
        assert_eq!(json["outcomes"]["first_run"], 1);
        assert_eq!(json["latency_by_outcome"]["gave_up"]["count"], 1);
        assert_eq!(
            summary.outcomes_text(),
            "first_run=1 (p50 3.00 / p99 3.00 / p99.9 3.00 ms) gave_up=1 (p50 7.00 / p99 7.00 / p99.9 7.00 ms)"
        );
        assert_eq!(json["series"][0]["throughput_per_s"], 1);
        assert_eq!(json["series"][0]["failures"], 1);
        assert_eq!(json["achieved_rate_per_s"], 1.0);
        let back: RunSummary = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back, summary);
        // A report written before each outcome's latency was kept still reads.
        let mut older = json;
        older.as_object_mut().unwrap().remove("latency_by_outcome");
        let back: RunSummary = serde_json::from_value(older).unwrap();
        assert!(back.latency_by_outcome.is_empty());
    }

    #[test]
    fn tables_align_columns() {
        let mut table = Table::new(&["name", "rate"]);
        table.row(vec!["embedded".into(), "2000".into()]);
        table.row(vec!["redis".into(), "15".into()]);
        let text = table.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "name      rate");
        assert_eq!(lines[2], "embedded  2000");
        assert_eq!(lines[3], "redis       15");
    }
}
