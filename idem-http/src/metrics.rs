//! The middleware's counters, through the `metrics` facade, under a
//! configurable prefix ([`METRIC_PREFIX_DEFAULT`] unless the application
//! chooses another with [`crate::IdempotencyBuilder::metric_prefix`]).
//!
//! Every counter counts a rare event an operator should hear of (a
//! takeover, a late key, a failed completion), so none has a label: no
//! caller, key or route ever becomes a series. The application installs
//! the recorder (Prometheus or another); without one, counting costs
//! nothing.

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

    /// Every counter's name with its description.
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

    /// Describes every counter to the installed recorder (its `# HELP` line).
    pub fn describe(&self) {
        for (name, description) in self.all() {
            metrics::describe_counter!(name.to_owned(), description);
        }
    }

    /// Exports every counter at zero before its first event. Prometheus'
    /// `increase(x[15m]) > 0` needs a sample from before the event: a series
    /// born with the event itself has none, so the first late key or lost
    /// completion would never fire its alert.
    pub fn register_at_zero(&self) {
        for (name, _) in self.all() {
            metrics::counter!(name.to_owned()).increment(0);
        }
    }

    /// Adds one to the counter named `name` (one of these names).
    pub(crate) fn count(name: &str) {
        metrics::counter!(name.to_owned()).increment(1);
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
        let custom = MetricNames::with_prefix("shop_idem_").unwrap();
        assert_eq!(custom.late_keys_total(), "shop_idem_late_keys_total");
        assert!(custom.all().iter().all(|(name, _)| name.starts_with("shop_idem_")));
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
