//! How an intent is retried: at most N attempts, capped exponential backoff
//! with full jitter, the server's `Retry-After`, `Prefer: wait` on retries,
//! a deadline per attempt and one for the whole intent. Checked when built.

use std::time::Duration;

/// Most attempts an intent may be given.
pub const ATTEMPTS_LIMIT: u32 = 100;
/// Attempts per intent by default (docs/design.md#client-attempts).
pub const ATTEMPTS_MAX_DEFAULT: u32 = 4;
/// Deadline of one attempt by default (docs/design.md#client-deadline).
pub const ATTEMPT_TIMEOUT_MS_DEFAULT: u64 = 250;
/// Deadline of a whole intent by default.
pub const INTENT_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Longest deadline of an attempt or an intent.
pub const TIMEOUT_MS_LIMIT: u64 = 24 * 3600 * 1000;
/// First backoff by default.
pub const BACKOFF_BASE_MS_DEFAULT: u64 = 20;
/// Longest backoff by default.
pub const BACKOFF_CAP_MS_DEFAULT: u64 = 1_000;
/// Longest `Retry-After` honoured by default; a longer one is cut to it.
pub const RETRY_AFTER_MS_MAX_DEFAULT: u64 = 30_000;
/// Longest `Prefer: wait` a retry may ask for, in seconds (the Label
/// service grants at most 300).
pub const PREFER_WAIT_S_LIMIT: u64 = 300;

/// Why a policy was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Attempts outside 1 to [`ATTEMPTS_LIMIT`].
    #[error("attempts per intent must be 1 to {ATTEMPTS_LIMIT}")]
    Attempts,
    /// A deadline of zero or above [`TIMEOUT_MS_LIMIT`].
    #[error("the attempt and intent deadlines must be 1 ms to {TIMEOUT_MS_LIMIT} ms")]
    Timeout,
    /// A backoff base of zero, or a cap below the base or above [`TIMEOUT_MS_LIMIT`].
    #[error("the backoff base must be at least 1 ms and at most its cap, and the cap at most {TIMEOUT_MS_LIMIT} ms")]
    Backoff,
    /// `Prefer: wait` outside 1 to [`PREFER_WAIT_S_LIMIT`] seconds.
    #[error("Prefer: wait must be 1 to {PREFER_WAIT_S_LIMIT} seconds")]
    PreferWait,
}

/// What a retry does with the server's `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryAfterUse {
    /// Waits it (at most `max`) before the jittered backoff.
    Honour {
        /// A longer `Retry-After` is cut to this.
        max: Duration,
    },
    /// Ignores it: the backoff alone (a client that presses an overloaded
    /// service, for load tests that want one).
    Ignore,
}

/// What a retry does when the budget cannot pay for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenBudgetEmpty {
    /// The intent gives up (Finagle's and the AWS SDKs' clients do).
    GiveUp,
    /// The retry waits the longest backoff more and goes ahead unpaid, as a
    /// service that puts the intent back on its queue for later instead of
    /// losing it would: the retries slow down rather than stop.
    WaitBackoffCap,
}

/// A checked retry policy. Build one with [`RetryPolicy::builder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    pub(crate) attempts_max: u32,
    pub(crate) attempt_timeout: Duration,
    pub(crate) intent_timeout: Duration,
    pub(crate) backoff_base: Duration,
    pub(crate) backoff_cap: Duration,
    pub(crate) retry_after: RetryAfterUse,
    pub(crate) prefer_wait: Option<Duration>,
    pub(crate) when_budget_empty: WhenBudgetEmpty,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::builder().build().expect("the defaults are valid")
    }
}

impl RetryPolicy {
    /// The defaults: 4 attempts of 250 ms each within 10 s, backoff from
    /// 20 ms doubling to 1 s, `Retry-After` honoured up to 30 s, no
    /// `Prefer: wait`, giving up when the budget is empty.
    pub fn builder() -> RetryPolicyBuilder {
        RetryPolicyBuilder {
            policy: RetryPolicy {
                attempts_max: ATTEMPTS_MAX_DEFAULT,
                attempt_timeout: Duration::from_millis(ATTEMPT_TIMEOUT_MS_DEFAULT),
                intent_timeout: Duration::from_millis(INTENT_TIMEOUT_MS_DEFAULT),
                backoff_base: Duration::from_millis(BACKOFF_BASE_MS_DEFAULT),
                backoff_cap: Duration::from_millis(BACKOFF_CAP_MS_DEFAULT),
                retry_after: RetryAfterUse::Honour {
                    max: Duration::from_millis(RETRY_AFTER_MS_MAX_DEFAULT),
                },
                prefer_wait: None,
                when_budget_empty: WhenBudgetEmpty::GiveUp,
            },
        }
    }

    /// Attempts per intent, the first included.
    pub fn attempts_max(&self) -> u32 {
        self.attempts_max
    }

    /// The deadline of one attempt without `Prefer: wait`.
    pub fn attempt_timeout(&self) -> Duration {
        self.attempt_timeout
    }

    /// The deadline of a whole intent.
    pub fn intent_timeout(&self) -> Duration {
        self.intent_timeout
    }

    /// The wait every retry asks for, if any.
    pub fn prefer_wait(&self) -> Option<Duration> {
        self.prefer_wait
    }

    /// The largest backoff before retry `attempt` (from 1, the attempt that
    /// failed): min(cap, base x 2^(attempt-1)).
    pub fn backoff_ceiling(&self, attempt: u32) -> Duration {
        let doubling = 1u32 << attempt.saturating_sub(1).min(20);
        self.backoff_base.saturating_mul(doubling).min(self.backoff_cap)
    }

    /// Full jitter: a random pause from zero to the ceiling, so the retries
    /// of many clients spread out instead of arriving together.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let ceiling = self.backoff_ceiling(attempt);
        Duration::from_micros(rand::random_range(0..=ceiling.as_micros() as u64))
    }

    /// The deadline of attempt `attempt` (from 1): a retry that asks the
    /// server to wait is given the wait on top.
    pub fn timeout_of_attempt(&self, attempt: u32) -> Duration {
        self.attempt_timeout + self.wait_of_attempt(attempt).unwrap_or_default()
    }

    /// The wait attempt `attempt` asks for. Only retries ask: a first
    /// attempt cannot find its own key in progress, and it keeps the plain
    /// deadline; a retry is exactly the request that may meet its earlier
    /// attempt still running.
    pub fn wait_of_attempt(&self, attempt: u32) -> Option<Duration> {
        self.prefer_wait.filter(|_| attempt > 1)
    }
}

/// Builds a [`RetryPolicy`]; every setting is checked in [`RetryPolicyBuilder::build`].
#[derive(Debug, Clone)]
pub struct RetryPolicyBuilder {
    policy: RetryPolicy,
}

impl RetryPolicyBuilder {
    /// Attempts per intent, the first included: 1 to [`ATTEMPTS_LIMIT`].
    pub fn attempts_max(mut self, attempts: u32) -> Self {
        self.policy.attempts_max = attempts;
        self
    }

    /// The deadline of one attempt.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.policy.attempt_timeout = timeout;
        self
    }

    /// The deadline of the whole intent, backoffs included.
    pub fn intent_timeout(mut self, timeout: Duration) -> Self {
        self.policy.intent_timeout = timeout;
        self
    }

    /// The first backoff's ceiling and the longest backoff.
    pub fn backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.policy.backoff_base = base;
        self.policy.backoff_cap = cap;
        self
    }

    /// What retries do with `Retry-After`.
    pub fn retry_after(mut self, retry_after: RetryAfterUse) -> Self {
        self.policy.retry_after = retry_after;
        self
    }

    /// `Prefer: wait=S` on every retry (whole seconds, 1 to
    /// [`PREFER_WAIT_S_LIMIT`]), so a retry that finds its key in progress
    /// waits at the server for the answer instead of getting 409. Such a
    /// retry's deadline is the attempt deadline plus the wait, and after a
    /// 409 it does not wait the 409's `Retry-After` first: the server waits
    /// for it.
    pub fn prefer_wait(mut self, wait: Option<Duration>) -> Self {
        self.policy.prefer_wait = wait;
        self
    }

    /// What a retry does when the budget cannot pay for it.
    pub fn when_budget_empty(mut self, when: WhenBudgetEmpty) -> Self {
        self.policy.when_budget_empty = when;
        self
    }

    /// The policy, checked.
    pub fn build(self) -> Result<RetryPolicy, PolicyError> {
        let policy = self.policy;
        if !(1..=ATTEMPTS_LIMIT).contains(&policy.attempts_max) {
            return Err(PolicyError::Attempts);
        }
        let limit = Duration::from_millis(TIMEOUT_MS_LIMIT);
        let valid_timeout = |timeout: Duration| !timeout.is_zero() && timeout <= limit;
        if !valid_timeout(policy.attempt_timeout) || !valid_timeout(policy.intent_timeout) {
            return Err(PolicyError::Timeout);
        }
        if policy.backoff_base.is_zero() || policy.backoff_cap < policy.backoff_base || policy.backoff_cap > limit {
            return Err(PolicyError::Backoff);
        }
        if let Some(wait) = policy.prefer_wait {
            let whole_seconds = wait.subsec_nanos() == 0;
            if !whole_seconds || !(1..=PREFER_WAIT_S_LIMIT).contains(&wait.as_secs()) {
                return Err(PolicyError::PreferWait);
            }
        }
        Ok(policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter_below_it() {
        let policy = RetryPolicy::builder()
            .backoff(Duration::from_millis(10), Duration::from_millis(70))
            .build()
            .unwrap();
        let ceilings: Vec<u128> = (1..=5).map(|a| policy.backoff_ceiling(a).as_millis()).collect();
        assert_eq!(ceilings, [10, 20, 40, 70, 70]);
        for attempt in 1..=5 {
            assert!(policy.backoff(attempt) <= policy.backoff_ceiling(attempt));
        }
        assert_eq!(policy.backoff_ceiling(u32::MAX), Duration::from_millis(70));
    }

    #[test]
    fn only_retries_ask_to_wait_and_are_given_the_wait() {
        let policy = RetryPolicy::builder()
            .prefer_wait(Some(Duration::from_secs(2)))
            .build()
            .unwrap();
        assert_eq!(policy.wait_of_attempt(1), None);
        assert_eq!(policy.timeout_of_attempt(1), Duration::from_millis(250));
        assert_eq!(policy.wait_of_attempt(2), Some(Duration::from_secs(2)));
        assert_eq!(policy.timeout_of_attempt(3), Duration::from_millis(2_250));
    }

    #[test]
    fn settings_outside_their_limits_are_refused() {
        let refused = |builder: RetryPolicyBuilder| builder.build().unwrap_err();
        assert_eq!(refused(RetryPolicy::builder().attempts_max(0)), PolicyError::Attempts);
        assert_eq!(refused(RetryPolicy::builder().attempts_max(101)), PolicyError::Attempts);
        assert_eq!(
            refused(RetryPolicy::builder().attempt_timeout(Duration::ZERO)),
            PolicyError::Timeout
        );
        assert_eq!(
            refused(RetryPolicy::builder().intent_timeout(Duration::from_secs(100_000))),
            PolicyError::Timeout
        );
        assert_eq!(
            refused(RetryPolicy::builder().backoff(Duration::from_millis(50), Duration::from_millis(10))),
            PolicyError::Backoff
        );
        for wait in [Duration::ZERO, Duration::from_millis(1_500), Duration::from_secs(301)] {
            assert_eq!(
                refused(RetryPolicy::builder().prefer_wait(Some(wait))),
                PolicyError::PreferWait
            );
        }
        assert_eq!(RetryPolicy::default().attempts_max(), ATTEMPTS_MAX_DEFAULT);
    }
}
