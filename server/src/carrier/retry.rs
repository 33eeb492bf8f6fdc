//! Retrying a carrier call inside the request (docs/design.md#carrier-retries).
//!
//! A call whose answer was lost (the connection dropped) or that met a
//! carrier error (5xx) is asked again at once, with the same carrier key,
//! while the call's budget lasts: the carrier dedupes the repeat, so a
//! retry buys nothing new and usually turns an unknown outcome into the
//! label. The alternative is what happens without it: the lease is
//! released, the client gets `503 downstream_unavailable` and comes back a
//! `Retry-After` later; at the simulator's 0.1 % of lost replies, that
//! second is the p99.9 of every benchmark run (BENCHMARKS.md).
//!
//! Two limits keep retries from feeding an outage:
//! - **per call**: at most [`CarrierRetries::retries_max`] retries, after a
//!   full-jitter exponential backoff ("Exponential Backoff And Jitter", AWS
//!   Architecture Blog, 2015), and never past the call's own timeout;
//! - **per client**: a retry budget, gRPC's retry throttling (proposal A6,
//!   "gRPC Retry Design"): a bucket of [`RETRY_TOKENS_MAX`] tokens, each
//!   call that failed in a way worth retrying takes one, each definite
//!   answer gives back [`RETRY_TOKEN_RATIO`]; retries are made only while
//!   more than half the bucket is left. When more than about one call in
//!   ten fails, retries stop until the carrier answers again, and each
//!   failure goes back to the client as before.

use rand::Rng;
use std::sync::Mutex;
use std::time::Duration;

/// Most retries of one carrier call the config may ask for.
pub const CARRIER_RETRIES_LIMIT: u32 = 10;
/// Default retries of one carrier call.
pub const CARRIER_RETRIES_MAX_DEFAULT: u32 = 2;
/// Default first backoff before a retry, in milliseconds.
pub const CARRIER_RETRY_BACKOFF_MS_DEFAULT: u64 = 10;
/// Longest first backoff the config may set, in milliseconds.
pub const CARRIER_RETRY_BACKOFF_MS_MAX: u64 = 10_000;
/// No backoff grows past this, in milliseconds.
pub const CARRIER_RETRY_BACKOFF_CAP_MS: u64 = 1_000;
/// Tokens in the retry budget's bucket (gRPC's `maxTokens`).
pub const RETRY_TOKENS_MAX: f64 = 100.0;
/// Tokens a successful call gives back (gRPC's `tokenRatio`).
pub const RETRY_TOKEN_RATIO: f64 = 0.1;

/// How a carrier call is retried; `retries_max` 0 turns retries off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CarrierRetries {
    pub retries_max: u32,
    /// The first backoff's upper bound; each retry doubles it, up to
    /// [`CARRIER_RETRY_BACKOFF_CAP_MS`].
    pub backoff_base: Duration,
}

impl CarrierRetries {
    pub const NONE: Self = Self {
        retries_max: 0,
        backoff_base: Duration::ZERO,
    };

    /// The pause before retry number `retry` (0 for the first): uniform in
    /// zero to the base doubled `retry` times, capped (full jitter, so
    /// instances that failed together do not retry together).
    pub fn backoff(&self, retry: u32) -> Duration {
        let cap_ms = CARRIER_RETRY_BACKOFF_CAP_MS as u128;
        let ceiling_ms = (self.backoff_base.as_millis() << retry.min(20)).min(cap_ms) as u64;
        Duration::from_millis(rand::rng().random_range(0..=ceiling_ms))
    }
}

/// gRPC's retry throttling: one bucket per carrier client, shared by every
/// call of the instance.
#[derive(Debug)]
pub struct RetryBudget {
    tokens: Mutex<f64>,
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self {
            tokens: Mutex::new(RETRY_TOKENS_MAX),
        }
    }
}

impl RetryBudget {
    /// A call failed in a way worth retrying: it takes a token.
    pub fn record_failure(&self) {
        let mut tokens = self.tokens.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *tokens = (*tokens - 1.0).max(0.0);
    }

    /// A call got a definite answer: it gives back a fraction of a token.
    pub fn record_success(&self) {
        let mut tokens = self.tokens.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *tokens = (*tokens + RETRY_TOKEN_RATIO).min(RETRY_TOKENS_MAX);
    }

    /// True while more than half the bucket is left.
    pub fn allows_retry(&self) -> bool {
        let tokens = self.tokens.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *tokens > RETRY_TOKENS_MAX / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_jittered_below_a_doubling_capped_ceiling() {
        let retries = CarrierRetries {
            retries_max: 3,
            backoff_base: Duration::from_millis(10),
        };
        for _ in 0..1_000 {
            assert!(retries.backoff(0) <= Duration::from_millis(10));
            assert!(retries.backoff(2) <= Duration::from_millis(40));
            assert!(retries.backoff(30) <= Duration::from_millis(CARRIER_RETRY_BACKOFF_CAP_MS));
        }
        let pauses: std::collections::HashSet<Duration> = (0..1_000).map(|_| retries.backoff(2)).collect();
        assert!(pauses.len() > 10, "full jitter spreads the pauses: {pauses:?}");
        assert_eq!(CarrierRetries::NONE.backoff(5), Duration::ZERO);
    }

    #[test]
    fn the_budget_stops_retries_once_half_the_bucket_is_spent_and_refills_on_successes() {
        let budget = RetryBudget::default();
        let failures_allowed = (RETRY_TOKENS_MAX / 2.0) as usize;
        for _ in 0..failures_allowed - 1 {
            budget.record_failure();
            assert!(budget.allows_retry());
        }
        budget.record_failure();
        assert!(!budget.allows_retry(), "half the bucket spent");
        // One failure costs what ten successes give back.
        let successes_per_token = (1.0 / RETRY_TOKEN_RATIO).round() as usize;
        for _ in 0..successes_per_token + 1 {
            budget.record_success();
        }
        assert!(budget.allows_retry());
    }
}
