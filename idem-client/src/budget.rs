//! The retry budget shared by every intent of one client: retries may be at
//! most a share of the intents the client started lately, plus a small
//! reserve. This is Finagle's `RetryBudget` with its defaults (20 % of the
//! requests of the last 10 s, at least 10 retries a second), which Linkerd
//! also uses; Google's SRE book ("Addressing Cascading Failures") gives the
//! same rule with 10 %. When the budget cannot pay for a retry the client
//! does not retry, so an overloaded service sees at most a fifth more
//! requests from its clients' retries, never a multiple.
//!
//! The budget grows with the client's traffic. A fixed bucket (the AWS
//! SDKs' standard mode, 500 tokens at 5 a retry, which this client used
//! before) pays for 100 retries whatever the rate: at 2,000 intents a
//! second a single 100 ms store stall answered 503 emptied it, and the rest
//! of the stall's intents gave up although the service was back a moment
//! later (BENCHMARKS.md, "Retry budgets"). Here the same stall meets a
//! budget of 4,000 retries, while under sustained overload the retries
//! stay a fifth of the load.
//!
//! Time is counted in whole seconds of the client's clock, in a window of
//! [`RETRY_BUDGET_WINDOW_S`] of them: what the intents and retries of a
//! second earn and spend is forgotten once it leaves the window.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

/// The share of the intents started in the window that retries may add, in percent.
pub const RETRY_BUDGET_SHARE_PERCENT_DEFAULT: u32 = 20;
/// Retries always allowed in the window, however few intents started in
/// it: Finagle's default of 10 a second, so a client with little traffic
/// can still retry.
pub const RETRY_BUDGET_RESERVE_DEFAULT: u32 = 100;
/// The longest reserve accepted.
pub const RETRY_BUDGET_RESERVE_LIMIT: u32 = 1_000_000;
/// Seconds an intent or a retry counts for (Finagle's time to live).
pub const RETRY_BUDGET_WINDOW_S: u64 = 10;

/// Why a budget was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a retry budget's share is 0 to 100 percent and its reserve 0 to {RETRY_BUDGET_RESERVE_LIMIT} retries")]
pub struct BudgetError;

/// Retries allowed as a share of recent intents, shared by one client's intents.
#[derive(Debug)]
pub struct RetryBudget {
    /// `None`: unlimited, every retry is paid for.
    limits: Option<BudgetLimits>,
    window: Mutex<Window>,
    refused: AtomicU64,
}

#[derive(Debug, Clone, Copy)]
struct BudgetLimits {
    share_percent: u32,
    reserve: u32,
}

/// Intents started and retries paid for, per second of the window.
#[derive(Debug, Default)]
struct Window {
    /// The instant second 0 starts at: the first time the budget was used.
    origin: Option<Instant>,
    seconds: [SecondCounts; RETRY_BUDGET_WINDOW_S as usize],
}

#[derive(Debug, Default, Clone, Copy)]
struct SecondCounts {
    /// Which second (since the origin) these counts are of.
    second: u64,
    intents: u64,
    retries: u64,
}

impl Window {
    /// The counts of `now`'s second, emptied if its slot held an older one.
    fn counts_at(&mut self, now: Instant) -> &mut SecondCounts {
        let second = self.second_of(now);
        let slot = &mut self.seconds[(second % RETRY_BUDGET_WINDOW_S) as usize];
        if slot.second != second {
            *slot = SecondCounts {
                second,
                ..SecondCounts::default()
            };
        }
        slot
    }

    /// Intents and retries of the window ending at `now`'s second.
    fn totals_at(&mut self, now: Instant) -> (u64, u64) {
        let second = self.second_of(now);
        let oldest = second.saturating_sub(RETRY_BUDGET_WINDOW_S - 1);
        self.seconds
            .iter()
            .filter(|counts| (oldest..=second).contains(&counts.second))
            .fold((0, 0), |(intents, retries), counts| {
                (intents + counts.intents, retries + counts.retries)
            })
    }

    /// Seconds since the origin; an instant a concurrent intent read a
    /// moment before the origin counts as second 0.
    fn second_of(&mut self, now: Instant) -> u64 {
        let origin = *self.origin.get_or_insert(now);
        now.saturating_duration_since(origin).as_secs()
    }
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self::share_of_intents(RETRY_BUDGET_SHARE_PERCENT_DEFAULT, RETRY_BUDGET_RESERVE_DEFAULT)
            .expect("the defaults are within the limits")
    }
}

impl RetryBudget {
    /// Retries in any window of [`RETRY_BUDGET_WINDOW_S`] seconds may be at
    /// most `share_percent` % of the intents started in it, plus `reserve`.
    pub fn share_of_intents(share_percent: u32, reserve: u32) -> Result<Self, BudgetError> {
        if share_percent > 100 || reserve > RETRY_BUDGET_RESERVE_LIMIT {
            return Err(BudgetError);
        }
        Ok(Self::with_limits(Some(BudgetLimits { share_percent, reserve })))
    }

    /// A budget that pays for every retry: a client that retries whatever
    /// the load (a retry storm, for load tests that want one).
    pub fn unlimited() -> Self {
        Self::with_limits(None)
    }

    fn with_limits(limits: Option<BudgetLimits>) -> Self {
        Self {
            limits,
            window: Mutex::new(Window::default()),
            refused: AtomicU64::new(0),
        }
    }

    /// An intent started at `now`: it earns its share of a retry.
    pub fn intent_started(&self, now: Instant) {
        if self.limits.is_some() {
            self.window().counts_at(now).intents += 1;
        }
    }

    /// Pays for one retry at `now`: `true` when paid, `false` when the
    /// budget cannot pay (no retry then).
    pub fn try_take(&self, now: Instant) -> bool {
        let Some(limits) = self.limits else {
            return true;
        };
        let mut window = self.window();
        let (intents, retries) = window.totals_at(now);
        if retries >= limits.allowed(intents) {
            drop(window);
            self.refused.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        window.counts_at(now).retries += 1;
        true
    }

    /// Retries the budget could still pay for at `now` (`u64::MAX` when unlimited).
    pub fn retries_left(&self, now: Instant) -> u64 {
        let Some(limits) = self.limits else {
            return u64::MAX;
        };
        let (intents, retries) = self.window().totals_at(now);
        limits.allowed(intents).saturating_sub(retries)
    }

    /// Retries the budget could not pay for, so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    fn window(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl BudgetLimits {
    /// Retries allowed in a window in which `intents` started.
    fn allowed(&self, intents: u64) -> u64 {
        u64::from(self.reserve) + intents * u64::from(self.share_percent) / 100
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn retries_are_a_share_of_the_intents_plus_the_reserve() {
        let budget = RetryBudget::share_of_intents(10, 5).unwrap();
        let now = Instant::now();
        for _ in 0..200 {
            budget.intent_started(now);
        }
        assert_eq!(budget.retries_left(now), 5 + 20);
        for _ in 0..25 {
            assert!(budget.try_take(now));
        }
        assert!(!budget.try_take(now), "the share and the reserve are spent");
        assert_eq!(budget.refused(), 1);
        for _ in 0..10 {
            budget.intent_started(now);
        }
        assert!(budget.try_take(now), "ten more intents earn one more retry");
        assert!(!budget.try_take(now));
    }

    #[test]
    fn what_a_second_earned_and_spent_leaves_the_window_after_ten_seconds() {
        let budget = RetryBudget::share_of_intents(50, 0).unwrap();
        let start = Instant::now();
        for _ in 0..4 {
            budget.intent_started(start);
        }
        assert!(budget.try_take(start));
        assert!(budget.try_take(start + Duration::from_secs(3)));
        assert!(
            !budget.try_take(start + Duration::from_secs(9)),
            "both retries still count"
        );
        let later = start + Duration::from_secs(RETRY_BUDGET_WINDOW_S);
        assert_eq!(
            budget.retries_left(later),
            0,
            "the intents that earned them left the window too"
        );
        budget.intent_started(later);
        budget.intent_started(later);
        assert_eq!(
            budget.retries_left(later),
            0,
            "the retry of second 3 is still in the window and spends the new one"
        );
        budget.intent_started(later + Duration::from_secs(4));
        budget.intent_started(later + Duration::from_secs(4));
        assert_eq!(budget.retries_left(later + Duration::from_secs(4)), 2);
    }

    #[test]
    fn an_unlimited_budget_pays_for_everything_and_limits_are_checked() {
        let budget = RetryBudget::unlimited();
        let now = Instant::now();
        for _ in 0..10_000 {
            assert!(budget.try_take(now));
        }
        assert_eq!(budget.refused(), 0);
        assert_eq!(budget.retries_left(now), u64::MAX);
        assert_eq!(RetryBudget::share_of_intents(101, 0).unwrap_err(), BudgetError);
        assert!(RetryBudget::share_of_intents(10, RETRY_BUDGET_RESERVE_LIMIT + 1).is_err());
        assert_eq!(
            RetryBudget::default().retries_left(now),
            u64::from(RETRY_BUDGET_RESERVE_DEFAULT)
        );
    }
}
