//! Where completed operations are counted: HDR histograms of latency from
//! each operation's intended start, counts by outcome, and one bucket per
//! second for the charts.

use hdrhistogram::Histogram;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Longest latency the histograms track, in microseconds; longer ones are
/// clamped to it (and still counted).
pub const LATENCY_US_MAX: u64 = 600_000_000;
/// Significant decimal digits of the whole-run histograms (0.1% precision).
pub const HISTOGRAM_DIGITS: u8 = 3;
/// Significant digits of the per-second histograms: 1% precision is enough
/// for a chart and keeps each bucket small.
pub const SECOND_HISTOGRAM_DIGITS: u8 = 2;
/// Most per-second buckets kept, so a long run cannot grow memory without
/// bound; later seconds are folded into the last bucket.
pub const SECONDS_MAX: usize = 24 * 60 * 60;

/// What one operation ended with. `label` names the outcome in the counts
/// (`first_run`, `replay`, `gave_up`, ...); `success` says whether it
/// achieved what it was sent for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub label: &'static str,
    pub success: bool,
}

impl Outcome {
    pub const fn success(label: &'static str) -> Self {
        Self { label, success: true }
    }

    pub const fn failure(label: &'static str) -> Self {
        Self { label, success: false }
    }
}

/// Latency histogram in microseconds, 1 µs to [`LATENCY_US_MAX`].
pub fn latency_histogram(digits: u8) -> Histogram<u64> {
    // The bounds are constants that satisfy the constructor's rules
    // (low >= 1, high >= 2 * low, digits <= 5), so it cannot fail.
    Histogram::new_with_bounds(1, LATENCY_US_MAX, digits).expect("constant histogram bounds are valid")
}

/// Microseconds, clamped into the histograms' range.
pub fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros())
        .unwrap_or(u64::MAX)
        .clamp(1, LATENCY_US_MAX)
}

/// One second of a run, by the intended start of its operations (latency)
/// and by completion time (throughput).
#[derive(Debug, Clone)]
pub struct SecondBucket {
    /// Latencies of the operations meant to start in this second.
    pub latency: Histogram<u64>,
    /// Operations meant to start in this second that failed.
    pub failures: u64,
    /// Operations that completed successfully during this second.
    pub successes_completed: u64,
    /// Operations that completed (either way) during this second.
    pub completed: u64,
}

impl SecondBucket {
    fn new() -> Self {
        Self {
            latency: latency_histogram(SECOND_HISTOGRAM_DIGITS),
            failures: 0,
            successes_completed: 0,
            completed: 0,
        }
    }
}

/// Everything recorded for the measured part of a run. Operations meant to
/// start during the warm-up are only counted in `warmup_completed`.
#[derive(Debug, Clone)]
pub struct Recording {
    /// Start of the measured window (the end of the warm-up).
    pub measured_start: Instant,
    pub latency: Histogram<u64>,
    /// How late the load generator itself started operations, from their
    /// intended start: its own overhead, included in `latency`.
    pub start_lag: Histogram<u64>,
    pub outcomes: BTreeMap<&'static str, u64>,
    /// Each outcome's latency on its own, so that a few slow outcomes (the
    /// HTTP client's intents that met a shed) are seen apart from the rest.
    pub latency_by_outcome: BTreeMap<&'static str, Histogram<u64>>,
    pub successes: u64,
    pub failures: u64,
    /// Latest completion of a measured operation, from `measured_start`.
    pub last_completion: Duration,
    pub seconds: Vec<SecondBucket>,
    pub warmup_completed: u64,
}

impl Recording {
    pub fn new(measured_start: Instant) -> Self {
        Self {
            measured_start,
            latency: latency_histogram(HISTOGRAM_DIGITS),
            start_lag: latency_histogram(HISTOGRAM_DIGITS),
            outcomes: BTreeMap::new(),
            latency_by_outcome: BTreeMap::new(),
            successes: 0,
            failures: 0,
            last_completion: Duration::ZERO,
            seconds: Vec::new(),
            warmup_completed: 0,
        }
    }

    /// Records one finished operation: `intended` is when it should have
    /// started, `completed` when its outcome was known.
    pub fn record(&mut self, intended: Instant, completed: Instant, outcome: Outcome) {
        if intended < self.measured_start {
            self.warmup_completed += 1;
            return;
        }
        let latency = micros(completed.saturating_duration_since(intended));
        self.latency.saturating_record(latency);
        *self.outcomes.entry(outcome.label).or_insert(0) += 1;
        self.latency_by_outcome
            .entry(outcome.label)
            .or_insert_with(|| latency_histogram(HISTOGRAM_DIGITS))
            .saturating_record(latency);
        if outcome.success {
            self.successes += 1;
        } else {
            self.failures += 1;
        }
        let since_start = completed.saturating_duration_since(self.measured_start);
        self.last_completion = self.last_completion.max(since_start);
        let intended_bucket = self.bucket(intended.saturating_duration_since(self.measured_start));
        intended_bucket.latency.saturating_record(latency);
        if !outcome.success {
            intended_bucket.failures += 1;
        }
        let completed_bucket = self.bucket(since_start);
        completed_bucket.completed += 1;
        if outcome.success {
            completed_bucket.successes_completed += 1;
        }
    }

    /// Records how late an operation started, from its intended start.
    pub fn record_start_lag(&mut self, intended: Instant, started: Instant) {
        if intended >= self.measured_start {
            self.start_lag
                .saturating_record(micros(started.saturating_duration_since(intended)));
        }
    }

    fn bucket(&mut self, since_start: Duration) -> &mut SecondBucket {
        let second = (since_start.as_secs() as usize).min(SECONDS_MAX - 1);
        while self.seconds.len() <= second {
            self.seconds.push(SecondBucket::new());
        }
        &mut self.seconds[second]
    }

    pub fn completed(&self) -> u64 {
        self.successes + self.failures
    }

    /// Adds another recording of the same kind of work (a later round):
    /// counts and histograms add up; the time series are not joined, and
    /// the other's completions count as on time (its window is added by
    /// the caller).
    pub fn absorb(&mut self, other: &Recording) {
        // Both histograms have the same bounds, so adding cannot fail.
        let _ = self.latency.add(&other.latency);
        let _ = self.start_lag.add(&other.start_lag);
        for (label, count) in &other.outcomes {
            *self.outcomes.entry(label).or_insert(0) += count;
        }
        for (label, latency) in &other.latency_by_outcome {
            let _ = self
                .latency_by_outcome
                .entry(label)
                .or_insert_with(|| latency_histogram(HISTOGRAM_DIGITS))
                .add(latency);
        }
        self.successes += other.successes;
        self.failures += other.failures;
        self.warmup_completed += other.warmup_completed;
        self.last_completion = Duration::ZERO;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_counts_from_the_intended_start_and_warmup_is_kept_apart() {
        let start = Instant::now();
        let measured_start = start + Duration::from_secs(1);
        let mut recording = Recording::new(measured_start);
        recording.record(start, start + Duration::from_millis(5), Outcome::success("first_run"));
        let intended = measured_start + Duration::from_millis(1_500);
        recording.record(
            intended,
            intended + Duration::from_millis(40),
            Outcome::success("first_run"),
        );
        recording.record(
            intended,
            intended + Duration::from_millis(2),
            Outcome::failure("gave_up"),
        );
        assert_eq!(recording.warmup_completed, 1);
        assert_eq!(recording.completed(), 2);
        assert_eq!((recording.successes, recording.failures), (1, 1));
        assert_eq!(recording.outcomes.get("first_run"), Some(&1));
        assert_eq!(recording.outcomes.get("gave_up"), Some(&1));
        // Each outcome's latency apart: the slow success is not the failure.
        let max_ms_of = |outcome: &str| recording.latency_by_outcome[outcome].max() as f64 / 1_000.0;
        assert!((max_ms_of("first_run") - 40.0).abs() < 0.1);
        assert!((max_ms_of("gave_up") - 2.0).abs() < 0.1);
        assert_eq!(recording.latency_by_outcome["first_run"].len(), 1, "warm-up left out");
        let max_ms = recording.latency.max() as f64 / 1_000.0;
        assert!((max_ms - 40.0).abs() < 0.1, "{max_ms}");
        assert_eq!(recording.seconds.len(), 2);
        assert_eq!(recording.seconds[1].latency.len(), 2);
        assert_eq!(recording.seconds[1].failures, 1);
        assert_eq!(recording.seconds[1].successes_completed, 1);
    }

    #[test]
    fn rounds_add_up() {
        let start = Instant::now();
        let mut first = Recording::new(start);
        first.record(start, start + Duration::from_millis(2), Outcome::success("ok"));
        let mut second = Recording::new(start);
        second.record(start, start + Duration::from_millis(9), Outcome::failure("bad"));
        first.absorb(&second);
        assert_eq!((first.successes, first.failures, first.latency.len()), (1, 1, 2));
        assert_eq!(first.outcomes.get("bad"), Some(&1));
        assert_eq!(first.latency_by_outcome["bad"].len(), 1);
        assert_eq!(first.latency_by_outcome["ok"].len(), 1);
    }

    #[test]
    fn latencies_beyond_the_histogram_are_clamped_not_lost() {
        let start = Instant::now();
        let mut recording = Recording::new(start);
        recording.record(start, start + Duration::from_secs(3_600), Outcome::failure("timeout"));
        assert_eq!(recording.latency.len(), 1);
        assert!(recording.latency.max() >= LATENCY_US_MAX - LATENCY_US_MAX / 1_000);
    }
}
