//! The figures of one day-of-keys run, computed from its parsed files, and
//! the growth curve's fit: pure arithmetic.

use super::parse::{LoadFigures, PreloadFigures, Restart, Sample, Scenario};

/// The phase of the steady rate in `samples.csv`.
pub const STEADY_PHASE: &str = "steady";
/// The phase of the peak rate in `samples.csv`.
pub const PEAK_PHASE: &str = "peak";
/// The share of the steady phase left out before the drifts' reference
/// sample: the service's memory grows while its caches and connection pools
/// fill, and the sweeper's first run purges what fell due during the load.
pub const SETTLE_SHARE: f64 = 0.1;

/// The design's size of one record (docs/design.md#sizing).
pub const RECORD_BYTES_TARGET: f64 = 512.0;
/// p99 at the steady rate may be at most this many times the empty store's.
pub const P99_RATIO_TARGET: f64 = 1.5;
/// The record count may move by at most this share over the steady phase.
pub const COUNT_DRIFT_PERCENT_TARGET: f64 = 5.0;
/// The service's resident memory may move by at most this share.
pub const RSS_DRIFT_PERCENT_TARGET: f64 = 10.0;
/// The embedded store's service is ready within this long of a restart.
pub const READY_AFTER_SIGTERM_S_TARGET: f64 = 10.0;
/// ... and within this long after a SIGKILL.
pub const READY_AFTER_SIGKILL_S_TARGET: f64 = 60.0;

/// Everything one folder's files say.
#[derive(Debug, Clone, PartialEq)]
pub struct DayInputs {
    pub scenario: Scenario,
    pub preload: Option<PreloadFigures>,
    pub empty_steady: Option<LoadFigures>,
    pub empty_peak: Option<LoadFigures>,
    pub steady: Option<LoadFigures>,
    pub peak: Option<LoadFigures>,
    pub samples: Vec<Sample>,
    pub restarts: Vec<Restart>,
}

/// How a figure moved over a phase: the reference sample's value and the
/// largest move from it, signed, in percent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Drift {
    pub reference: f64,
    pub largest_percent: f64,
}

/// PostgreSQL's vacuum over the steady and peak phases.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Vacuum {
    pub dead_tuples_first: u64,
    pub dead_tuples_max: u64,
    pub dead_tuples_last: u64,
    /// Autovacuum runs on the records' table during the phases.
    pub autovacuum_runs: u64,
}

/// The figures of one run, as the report prints them.
#[derive(Debug, Clone, PartialEq)]
pub struct DaySummary {
    pub inputs: DayInputs,
    pub purges_per_s: Option<f64>,
    pub inserts_per_s: Option<f64>,
    pub count_drift: Option<Drift>,
    pub rss_drift: Option<Drift>,
    /// The store's size at the last steady sample, in bytes.
    pub store_bytes_steady_end: Option<u64>,
    /// The service's resident memory at the last steady sample, in KiB.
    pub rss_kib_steady_end: Option<u64>,
    pub vacuum: Option<Vacuum>,
}

impl DaySummary {
    pub fn of(inputs: DayInputs) -> Self {
        let steady: Vec<&Sample> = phase_samples(&inputs.samples, STEADY_PHASE);
        let during_load: Vec<&Sample> = inputs
            .samples
            .iter()
            .filter(|sample| sample.phase == STEADY_PHASE || sample.phase == PEAK_PHASE)
            .collect();
        let last_steady = steady.last();
        Self {
            purges_per_s: rate_per_s(&steady, |sample| sample.purged_total),
            inserts_per_s: rate_per_s(&steady, |sample| sample.created_total),
            count_drift: drift(&steady, |sample| sample.record_count),
            rss_drift: drift(&steady, |sample| sample.service_rss_kib),
            store_bytes_steady_end: last_steady.and_then(|sample| sample.store_bytes),
            rss_kib_steady_end: last_steady.and_then(|sample| sample.service_rss_kib),
            vacuum: vacuum(&during_load),
            inputs,
        }
    }

    /// p99 at the steady rate over the empty store's.
    pub fn steady_p99_ratio(&self) -> Option<f64> {
        ratio(self.inputs.steady?.p99_ms, self.inputs.empty_steady?.p99_ms)
    }

    pub fn peak_p99_ratio(&self) -> Option<f64> {
        ratio(self.inputs.peak?.p99_ms, self.inputs.empty_peak?.p99_ms)
    }

    /// The restart after `signal`, if there was one.
    pub fn restart(&self, signal: &str) -> Option<&Restart> {
        self.inputs.restarts.iter().find(|restart| restart.signal == signal)
    }

    /// The targets this run missed, by name; a figure not measured misses
    /// nothing.
    pub fn targets_missed(&self) -> Vec<String> {
        let mut missed = Vec::new();
        let backend = self.inputs.scenario.backend.as_str();
        let bytes = self.inputs.preload.and_then(|preload| preload.bytes_per_record);
        if matches!(backend, "embedded" | "postgres") && bytes.is_some_and(|bytes| bytes > RECORD_BYTES_TARGET) {
            missed.push(format!("bytes/record > {RECORD_BYTES_TARGET:.0}"));
        }
        if self.steady_p99_ratio().is_some_and(|ratio| ratio > P99_RATIO_TARGET) {
            missed.push(format!("p99 at the steady rate > {P99_RATIO_TARGET}x empty"));
        }
        if exceeds(self.count_drift, COUNT_DRIFT_PERCENT_TARGET) {
            missed.push(format!("record count beyond ±{COUNT_DRIFT_PERCENT_TARGET:.0} %"));
        }
        if exceeds(self.rss_drift, RSS_DRIFT_PERCENT_TARGET) {
            missed.push(format!("RSS beyond ±{RSS_DRIFT_PERCENT_TARGET:.0} %"));
        }
        if backend == "embedded" {
            let late = |signal: &str, limit: f64| self.restart(signal).is_some_and(|restart| restart.ready_s > limit);
            if late("SIGTERM", READY_AFTER_SIGTERM_S_TARGET) {
                missed.push(format!("ready > {READY_AFTER_SIGTERM_S_TARGET:.0} s after SIGTERM"));
            }
            if late("SIGKILL", READY_AFTER_SIGKILL_S_TARGET) {
                missed.push(format!("ready > {READY_AFTER_SIGKILL_S_TARGET:.0} s after SIGKILL"));
            }
        }
        for (name, figures) in [
            ("empty steady", self.inputs.empty_steady),
            ("empty peak", self.inputs.empty_peak),
            ("steady", self.inputs.steady),
            ("peak", self.inputs.peak),
        ] {
            if figures.is_some_and(|figures| !figures.audit_passed) {
                missed.push(format!("audit of the {name} run failed"));
            }
        }
        missed
    }
}

fn exceeds(drift: Option<Drift>, limit_percent: f64) -> bool {
    drift.is_some_and(|drift| drift.largest_percent.abs() > limit_percent)
}

fn ratio(numerator: f64, denominator: f64) -> Option<f64> {
    (denominator > 0.0).then(|| numerator / denominator)
}

fn phase_samples<'a>(samples: &'a [Sample], phase: &str) -> Vec<&'a Sample> {
    samples.iter().filter(|sample| sample.phase == phase).collect()
}

/// How fast a counter rose between the first and last sample that have it.
pub fn rate_per_s(samples: &[&Sample], counter: impl Fn(&Sample) -> Option<u64>) -> Option<f64> {
    let counted: Vec<(u64, u64)> = samples
        .iter()
        .filter_map(|&sample| Some((sample.unix_ms, counter(sample)?)))
        .collect();
    let (first, last) = (counted.first()?, counted.last()?);
    let seconds = last.0.checked_sub(first.0)? as f64 / 1_000.0;
    (seconds > 0.0).then(|| last.1.saturating_sub(first.1) as f64 / seconds)
}

/// The largest move of a figure from its reference: the first sample at or
/// after [`SETTLE_SHARE`] of the phase, compared with every later one.
pub fn drift(samples: &[&Sample], figure: impl Fn(&Sample) -> Option<u64>) -> Option<Drift> {
    let measured: Vec<(u64, f64)> = samples
        .iter()
        .filter_map(|&sample| Some((sample.unix_ms, figure(sample)? as f64)))
        .collect();
    let (first_ms, last_ms) = (measured.first()?.0, measured.last()?.0);
    let settled_ms = first_ms + ((last_ms - first_ms) as f64 * SETTLE_SHARE) as u64;
    let start = measured.iter().position(|(at, _)| *at >= settled_ms)?;
    let reference = measured[start].1;
    if reference <= 0.0 {
        return None;
    }
    let largest_percent = measured[start..]
        .iter()
        .map(|(_, value)| (value - reference) / reference * 100.0)
        .fold(
            0.0,
            |largest: f64, change| {
                if change.abs() > largest.abs() { change } else { largest }
            },
        );
    Some(Drift {
        reference,
        largest_percent,
    })
}

fn vacuum(samples: &[&Sample]) -> Option<Vacuum> {
    let dead: Vec<u64> = samples.iter().filter_map(|sample| sample.dead_tuples).collect();
    let runs: Vec<u64> = samples.iter().filter_map(|sample| sample.autovacuum_runs).collect();
    Some(Vacuum {
        dead_tuples_first: *dead.first()?,
        dead_tuples_max: dead.iter().copied().max()?,
        dead_tuples_last: *dead.last()?,
        autovacuum_runs: runs.last()?.saturating_sub(*runs.first()?),
    })
}

/// A least-squares line through `points` (x, y): intercept and slope; at
/// least two distinct x are needed.
pub fn linear_fit(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let count = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mean_x = points.iter().map(|(x, _)| x).sum::<f64>() / count;
    let mean_y = points.iter().map(|(_, y)| y).sum::<f64>() / count;
    let spread: f64 = points.iter().map(|(x, _)| (x - mean_x).powi(2)).sum();
    if spread <= 0.0 {
        return None;
    }
    let slope = points.iter().map(|(x, y)| (x - mean_x) * (y - mean_y)).sum::<f64>() / spread;
    Some((mean_y - slope * mean_x, slope))
}

/// The value of the line through `points` at `x`.
pub fn extrapolate(points: &[(f64, f64)], x: f64) -> Option<f64> {
    let (intercept, slope) = linear_fit(points)?;
    Some(intercept + slope * x)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(second: u64, phase: &str, records: u64, rss_kib: u64, purged: u64, created: u64) -> Sample {
        Sample {
            unix_ms: 1_000_000 + second * 1_000,
            phase: phase.to_owned(),
            store_bytes: Some(records * 500),
            record_count: Some(records),
            service_rss_kib: Some(rss_kib),
            purged_total: Some(purged),
            created_total: Some(created),
            dead_tuples: None,
            autovacuum_runs: None,
        }
    }

    #[test]
    fn rates_are_the_counters_rise_over_the_time_between_samples() {
        let samples = [
            sample(0, STEADY_PHASE, 100, 1, 0, 0),
            sample(10, STEADY_PHASE, 100, 1, 3_900, 4_000),
        ];
        let refs: Vec<&Sample> = samples.iter().collect();
        assert_eq!(rate_per_s(&refs, |sample| sample.created_total), Some(400.0));
        assert_eq!(rate_per_s(&refs, |sample| sample.purged_total), Some(390.0));
        assert_eq!(rate_per_s(&refs[..1], |sample| sample.purged_total), None);
    }

    #[test]
    fn drift_is_the_largest_move_after_the_settling_share_signed() {
        // 0..100 s: the first tenth (a start-up at 50) is left out; the
        // reference is the sample at 10 s (100); the largest move is -8 %.
        let samples: Vec<Sample> = [(0, 50), (10, 100), (40, 105), (70, 92), (100, 101)]
            .iter()
            .map(|(second, rss)| sample(*second, STEADY_PHASE, 1_000, *rss, 0, 0))
            .collect();
        let refs: Vec<&Sample> = samples.iter().collect();
        let found = drift(&refs, |sample| sample.service_rss_kib).unwrap();
        assert_eq!(found.reference, 100.0);
        assert!((found.largest_percent + 8.0).abs() < 1e-9, "{found:?}");
    }

    #[test]
    fn the_fit_goes_through_points_on_a_line_and_needs_two_sizes() {
        let points = [(1.0e6, 510.0e6), (10.0e6, 5_010.0e6), (34.56e6, 17_290.0e6)];
        let at = extrapolate(&points, 172.8e6).unwrap();
        assert!((at - (10.0e6 + 500.0 * 172.8e6)).abs() < 1.0, "{at}");
        assert_eq!(linear_fit(&points[..1]), None);
        assert_eq!(linear_fit(&[(1.0, 1.0), (1.0, 2.0)]), None);
    }
}
