//! The middleware's counters, through the `metrics` facade, under a
//! configurable prefix ([`METRIC_PREFIX_DEFAULT`] unless the application
//! chooses another with [`crate::IdempotencyBuilder::metric_prefix`]).
//!
//! Every counter counts a rare event an operator should hear of (a
//! takeover, a late key, a failed completion), so none has a label: no
//! caller, key or route ever becomes a series. The waits of `Prefer: wait`
//! (docs/design.md#waiting) have a gauge of the requests waiting now, and a
//! counter and a histogram labelled only by how a wait ended
//! ([`WaitOutcome`], a fixed set). The application installs the recorder
//! (Prometheus or another); without one, counting costs nothing.

/// The prefix of every metric name unless the application chooses another.
pub const METRIC_PREFIX_DEFAULT: &str = "idem_";

/// Longest metric prefix accepted, in bytes.
pub const METRIC_PREFIX_BYTES_MAX: usize = 64;

/// Why a metric prefix was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "metric prefix {prefix:?} is not valid: it must be at most {METRIC_PREFIX_BYTES_MAX} bytes of ASCII letters, digits, '_' or ':', not starting with a digit"
)]
pub struct InvalidMetricPrefix {
    /// The prefix refused.
    pub prefix: String,
}

/// The full names of the middleware's counters under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricNames {
    lease_takeovers_total: String,
    lease_lost_completions_total: String,
    late_keys_total: String,
    completion_failures_total: String,
    responses_not_saved_total: String,
    claim_resends_total: String,
    waiters: String,
    waits_total: String,
    wait_duration_seconds: String,
}

/// How one wait of a request with `Prefer: wait` ended: the `outcome`
/// label of [`MetricNames::waits_total`] and
/// [`MetricNames::wait_duration_seconds`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOutcome {
    /// The other attempt saved its answer, which this request replays.
    Replayed,
    /// The other attempt released or abandoned the key, or its lease ran
    /// out: this request claimed it and runs as the attempt.
    BecameAttempt,
    /// The key was claimed meanwhile with another request body: 422.
    KeyReused,
    /// The other attempt was still running when the wait ended: 409.
    TimedOut,
    /// Refused at once: the waiters on the key or in the store instance
    /// were at their cap (or the store cannot wake waiters): 409.
    RefusedCap,
    /// The client hung up while waiting.
    ClientGone,
    /// The store failed while the request waited: 503 (500 when it is not
    /// an outage).
    Error,
}

/// Every [`WaitOutcome`], for registering the wait metrics at zero.
pub const WAIT_OUTCOMES: [WaitOutcome; 7] = [
    WaitOutcome::Replayed,
    WaitOutcome::BecameAttempt,
    WaitOutcome::KeyReused,
    WaitOutcome::TimedOut,
    WaitOutcome::RefusedCap,
    WaitOutcome::ClientGone,
    WaitOutcome::Error,
];

impl WaitOutcome {
    /// The value of the `outcome` label.
    pub fn label(self) -> &'static str {
        match self {
            WaitOutcome::Replayed => "replayed",
            WaitOutcome::BecameAttempt => "became_attempt",
            WaitOutcome::KeyReused => "key_reused",
            WaitOutcome::TimedOut => "timed_out",
            WaitOutcome::RefusedCap => "refused_cap",
            WaitOutcome::ClientGone => "client_gone",
            WaitOutcome::Error => "error",
        }
    }
}

impl Default for MetricNames {
    fn default() -> Self {
        Self::named(METRIC_PREFIX_DEFAULT)
    }
}

impl MetricNames {
    /// The names under `prefix`, which must be a valid start of a
    /// Prometheus metric name (an empty prefix is allowed).
    pub fn with_prefix(prefix: &str) -> Result<Self, InvalidMetricPrefix> {
        let valid_char = |(index, char): (usize, char)| {
            char.is_ascii_alphabetic() || char == '_' || char == ':' || (index > 0 && char.is_ascii_digit())
        };
        if prefix.len() > METRIC_PREFIX_BYTES_MAX || !prefix.chars().enumerate().all(valid_char) {
            return Err(InvalidMetricPrefix {
                prefix: prefix.to_owned(),
            });
        }
        Ok(Self::named(prefix))
    }

    fn named(prefix: &str) -> Self {
        Self {
            lease_takeovers_total: format!("{prefix}lease_takeovers_total"),
            lease_lost_completions_total: format!("{prefix}lease_lost_completions_total"),
            late_keys_total: format!("{prefix}late_keys_total"),
            completion_failures_total: format!("{prefix}completion_failures_total"),
            responses_not_saved_total: format!("{prefix}responses_not_saved_total"),
            claim_resends_total: format!("{prefix}claim_resends_total"),
            waiters: format!("{prefix}waiters"),
            waits_total: format!("{prefix}waits_total"),
            wait_duration_seconds: format!("{prefix}wait_duration_seconds"),
        }
    }

    /// Claims that took over an expired or released lease.
    pub fn lease_takeovers_total(&self) -> &str {
        &self.lease_takeovers_total
    }

    /// Completions refused because another attempt had taken the key over.
    pub fn lease_lost_completions_total(&self) -> &str {
        &self.lease_lost_completions_total
    }

    /// Requests whose key had been purged: each is a possible duplicate.
    pub fn late_keys_total(&self) -> &str {
        &self.late_keys_total
    }

    /// Attempts whose outcome could not be recorded (store failure after the work).
    pub fn completion_failures_total(&self) -> &str {
        &self.completion_failures_total
    }

    /// Route answers that could not be saved and were replaced by a saved
    /// 500 `response_not_saved`.
    pub fn responses_not_saved_total(&self) -> &str {
        &self.responses_not_saved_total
    }

    /// Claims sent again with the same token after an error that may hide a commit.
    pub fn claim_resends_total(&self) -> &str {
        &self.claim_resends_total
    }

    /// Gauge: requests waiting now (`Prefer: wait`) for another attempt on
    /// their key to end.
    pub fn waiters(&self) -> &str {
        &self.waiters
    }

    /// Counter, by `outcome` ([`WaitOutcome`]): waits that ended.
    pub fn waits_total(&self) -> &str {
        &self.waits_total
    }

    /// Histogram, by `outcome` ([`WaitOutcome`]): time from the start of a
    /// wait to its end, in seconds.
    pub fn wait_duration_seconds(&self) -> &str {
        &self.wait_duration_seconds
    }

    /// Every unlabelled counter's name with its description (the wait
    /// metrics, labelled by outcome, are not among them).
    pub fn all(&self) -> [(&str, &'static str); 6] {
        [
            (
                self.lease_takeovers_total(),
                "Claims that took over an expired or released lease.",
            ),
            (
                self.lease_lost_completions_total(),
                "Completions refused because another attempt took the key over.",
            ),
            (
                self.late_keys_total(),
                "Requests whose key had already been purged (possible duplicates).",
            ),
            (
                self.completion_failures_total(),
                "Attempts whose outcome could not be saved because the store failed after the work.",
            ),
            (
                self.responses_not_saved_total(),
                "Route answers that could not be saved, replaced by a saved 500 response_not_saved.",
            ),
            (
                self.claim_resends_total(),
                "Claims sent again with the same token after an error that may hide a commit.",
            ),
        ]
    }

    /// Describes every metric to the installed recorder (its `# HELP` line).
    pub fn describe(&self) {
        for (name, description) in self.all() {
            metrics::describe_counter!(name.to_owned(), description);
        }
        metrics::describe_gauge!(
            self.waiters.clone(),
            "Requests waiting (Prefer: wait) for another attempt on their key to end."
        );
        metrics::describe_counter!(self.waits_total.clone(), "Waits (Prefer: wait) that ended, by outcome.");
        metrics::describe_histogram!(
            self.wait_duration_seconds.clone(),
            metrics::Unit::Seconds,
            "Time requests spent waiting (Prefer: wait), by outcome."
        );
    }

    /// Exports every counter at zero before its first event. Prometheus'
    /// `increase(x[15m]) > 0` needs a sample from before the event: a series
    /// born with the event itself has none, so the first late key or lost
    /// completion would never fire its alert.
    /// The wait counter and histogram are registered with every outcome, and
    /// the waiters gauge without changing its value (another application in
    /// the same process may have waiters already).
    pub fn register_at_zero(&self) {
        for (name, _) in self.all() {
            metrics::counter!(name.to_owned()).increment(0);
        }
        metrics::gauge!(self.waiters.clone()).increment(0.0);
        for outcome in WAIT_OUTCOMES {
            metrics::counter!(self.waits_total.clone(), "outcome" => outcome.label()).increment(0);
            // Asking the recorder for the handle registers the series.
            let _registered = metrics::histogram!(self.wait_duration_seconds.clone(), "outcome" => outcome.label());
        }
    }

    /// Adds one to the counter named `name` (one of these names).
    pub(crate) fn count(name: &str) {
        metrics::counter!(name.to_owned()).increment(1);
    }
}

/// One request's wait as the metrics see it: in the waiters gauge from
/// [`WaitObserved::start`] until dropped; [`WaitObserved::end`] records how
/// it ended and how long it took. A wait dropped without an end (its task
/// aborted) only leaves the gauge.
pub(crate) struct WaitObserved<'names> {
    names: &'names MetricNames,
    started: std::time::Instant,
}

impl<'names> WaitObserved<'names> {
    pub(crate) fn start(names: &'names MetricNames) -> Self {
        metrics::gauge!(names.waiters.clone()).increment(1.0);
        Self {
            names,
            started: std::time::Instant::now(),
        }
    }

    pub(crate) fn end(self, outcome: WaitOutcome) {
        let label = outcome.label();
        metrics::counter!(self.names.waits_total.clone(), "outcome" => label).increment(1);
        metrics::histogram!(self.names.wait_duration_seconds.clone(), "outcome" => label)
            .record(self.started.elapsed().as_secs_f64());
    }
}

impl Drop for WaitObserved<'_> {
    fn drop(&mut self) {
        metrics::gauge!(self.names.waiters.clone()).decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_prefix_gives_the_documented_names() {
        let names = MetricNames::default();
        assert_eq!(names.lease_takeovers_total(), "idem_lease_takeovers_total");
        assert_eq!(names.claim_resends_total(), "idem_claim_resends_total");
        assert_eq!(names.waiters(), "idem_waiters");
        assert_eq!(names.waits_total(), "idem_waits_total");
        assert_eq!(names.wait_duration_seconds(), "idem_wait_duration_seconds");
        let custom = MetricNames::with_prefix("shop_idem_").unwrap();
        assert_eq!(custom.late_keys_total(), "shop_idem_late_keys_total");
        assert!(custom.all().iter().all(|(name, _)| name.starts_with("shop_idem_")));
        assert_eq!(custom.waits_total(), "shop_idem_waits_total");
        assert_eq!(
            MetricNames::with_prefix("").unwrap().late_keys_total(),
            "late_keys_total"
        );
    }

    #[test]
    fn a_prefix_that_makes_no_metric_name_is_refused() {
        for bad in [
            "1idem_",
            "idem-",
            "idem ",
            "idém_",
            &"a".repeat(METRIC_PREFIX_BYTES_MAX + 1),
        ] {
            assert!(MetricNames::with_prefix(bad).is_err(), "{bad:?}");
        }
        assert!(MetricNames::with_prefix("a:b_2").is_ok());
    }
}
