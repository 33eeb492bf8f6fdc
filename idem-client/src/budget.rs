//! The retry budget shared by every intent of one client: the AWS SDKs'
//! standard retry mode ("Retry behavior" in the AWS SDKs and Tools
//! reference guide). The bucket starts full; a retry after an error costs
//! [`RETRY_COST_TOKENS`] (after a timeout [`RETRY_TIMEOUT_COST_TOKENS`]);
//! an intent that succeeds gives back what its retries cost, or
//! [`SUCCESS_REFUND_TOKENS`] when it needed none. When the bucket cannot pay
//! for a retry the client does not retry, so an overloaded service sees the
//! retries of its clients stop rather than multiply.

use crate::answer::AnswerClass;
use std::sync::atomic::{AtomicU64, Ordering};

/// Tokens in a full bucket.
pub const RETRY_BUDGET_TOKENS_DEFAULT: u64 = 500;
/// Most tokens a bucket may hold.
pub const RETRY_BUDGET_TOKENS_LIMIT: u64 = 1_000_000;
/// What a retry after an error answer or a failed connection costs.
pub const RETRY_COST_TOKENS: u64 = 5;
/// What a retry after a timeout costs: a timeout says more about load.
pub const RETRY_TIMEOUT_COST_TOKENS: u64 = 10;
/// What an intent done at its first attempt gives back.
pub const SUCCESS_REFUND_TOKENS: u64 = 1;

/// Why a budget was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a retry budget holds 1 to {RETRY_BUDGET_TOKENS_LIMIT} tokens")]
pub struct BudgetError;

/// A token bucket of retries, shared by one client's intents.
#[derive(Debug)]
pub struct RetryBudget {
    /// `None`: unlimited, every retry is paid for.
    capacity: Option<u64>,
    tokens: AtomicU64,
    refused: AtomicU64,
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self::with_tokens(RETRY_BUDGET_TOKENS_DEFAULT).expect("the default size is within the limit")
    }
}

impl RetryBudget {
    /// A full bucket of `tokens`.
    pub fn with_tokens(tokens: u64) -> Result<Self, BudgetError> {
        if !(1..=RETRY_BUDGET_TOKENS_LIMIT).contains(&tokens) {
            return Err(BudgetError);
        }
        Ok(Self {
            capacity: Some(tokens),
            tokens: AtomicU64::new(tokens),
            refused: AtomicU64::new(0),
        })
    }

    /// A budget that pays for every retry: a client that retries whatever
    /// the load (a retry storm, for load tests that want one).
    pub fn unlimited() -> Self {
        Self {
            capacity: None,
            tokens: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// What a retry after `answer` costs.
    pub fn cost_of_retry_after(answer: &AnswerClass) -> u64 {
        match answer {
            AnswerClass::Timeout => RETRY_TIMEOUT_COST_TOKENS,
            _ => RETRY_COST_TOKENS,
        }
    }

    /// Takes the cost of one retry after `answer`: `Some(cost)` when paid,
    /// `None` when the bucket cannot pay it (no retry then).
    pub fn try_take(&self, answer: &AnswerClass) -> Option<u64> {
        if self.capacity.is_none() {
            return Some(0);
        }
        let cost = Self::cost_of_retry_after(answer);
        let taken = self
            .tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tokens| tokens.checked_sub(cost));
        match taken {
            Ok(_) => Some(cost),
            Err(_) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// An intent succeeded after its retries cost `spent`: gives that
    /// back, or [`SUCCESS_REFUND_TOKENS`] when it needed no retry.
    pub fn refund(&self, spent: u64) {
        let Some(capacity) = self.capacity else {
            return;
        };
        let refund = if spent == 0 { SUCCESS_REFUND_TOKENS } else { spent };
        let refilled = self.tokens.fetch_update(Ordering::AcqRel, Ordering::Acquire, |tokens| {
            Some(tokens.saturating_add(refund).min(capacity))
        });
        debug_assert!(refilled.is_ok(), "the update always returns Some");
    }

    /// Tokens left (`u64::MAX` when unlimited).
    pub fn tokens(&self) -> u64 {
        match self.capacity {
            Some(_) => self.tokens.load(Ordering::Acquire),
            None => u64::MAX,
        }
    }

    /// Retries the bucket could not pay for, so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_runs_dry_under_failures_and_refills_with_successes() {
        let budget = RetryBudget::default();
        let busy = AnswerClass::Unavailable { status: 503 };
        for _ in 0..RETRY_BUDGET_TOKENS_DEFAULT / RETRY_COST_TOKENS {
            assert_eq!(budget.try_take(&busy), Some(RETRY_COST_TOKENS));
        }
        assert_eq!(budget.try_take(&busy), None, "an empty bucket pays for no retry");
        assert_eq!(budget.refused(), 1);
        budget.refund(2 * RETRY_COST_TOKENS);
        assert_eq!(budget.try_take(&AnswerClass::Timeout), Some(RETRY_TIMEOUT_COST_TOKENS));
        assert_eq!(budget.try_take(&busy), None);
        for _ in 0..RETRY_COST_TOKENS {
            budget.refund(0);
        }
        assert_eq!(budget.try_take(&busy), Some(RETRY_COST_TOKENS));
        budget.refund(10 * RETRY_BUDGET_TOKENS_DEFAULT);
        assert_eq!(budget.tokens(), RETRY_BUDGET_TOKENS_DEFAULT, "never above capacity");
    }

    #[test]
    fn an_unlimited_budget_pays_for_everything_and_sizes_are_bounded() {
        let budget = RetryBudget::unlimited();
        for _ in 0..10_000 {
            assert!(budget.try_take(&AnswerClass::Timeout).is_some());
        }
        assert_eq!(budget.refused(), 0);
        assert_eq!(RetryBudget::with_tokens(0).unwrap_err(), BudgetError);
        assert!(RetryBudget::with_tokens(RETRY_BUDGET_TOKENS_LIMIT + 1).is_err());
    }
}
