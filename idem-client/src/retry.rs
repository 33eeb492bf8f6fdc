//! The retry decision of one intent, with no I/O: after each answer it says
//! whether the intent is over, or how long to pause before the next attempt
//! with the same key. The middleware and any other sender (the bench's
//! open-loop client) drive the attempts; this decides between them.

use crate::answer::{AnswerClass, RetryAfter};
use crate::budget::RetryBudget;
use crate::policy::{RetryAfterUse, RetryPolicy, WhenBudgetEmpty};
use std::time::{Duration, Instant, SystemTime};

/// Why an intent stopped asking without a final answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GiveUpReason {
    /// Every attempt the policy allows was made.
    AttemptsExhausted,
    /// The retry budget could not pay for another retry.
    BudgetExhausted,
    /// The next attempt could not start before the intent's deadline.
    DeadlineExceeded,
}

impl GiveUpReason {
    /// A short, fixed name, for metric labels and spans.
    pub fn name(&self) -> &'static str {
        match self {
            GiveUpReason::AttemptsExhausted => "attempts_exhausted",
            GiveUpReason::BudgetExhausted => "budget_exhausted",
            GiveUpReason::DeadlineExceeded => "deadline_exceeded",
        }
    }
}

/// What to do after an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The answer is final: a success, or an answer never retried.
    Finish,
    /// Pause this long, then send the next attempt with the same key.
    Retry {
        /// The pause.
        pause: Duration,
    },
    /// Stop: the answer was retryable but no retry is allowed.
    GiveUp(GiveUpReason),
}

/// The next attempt to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptPlan {
    /// From 1.
    pub number: u32,
    /// Its deadline: the policy's for this attempt, cut to what is left of
    /// the intent's.
    pub timeout: Duration,
    /// `Prefer: wait` to send, if any.
    pub prefer_wait: Option<Duration>,
}

/// One intent's retry state.
#[derive(Debug)]
pub struct IntentRetry<'a> {
    policy: &'a RetryPolicy,
    budget: &'a RetryBudget,
    deadline: Instant,
    /// Attempts planned so far.
    attempts: u32,
}

impl<'a> IntentRetry<'a> {
    /// An intent starting at `now`, which earns the budget its share of a retry.
    pub fn new(policy: &'a RetryPolicy, budget: &'a RetryBudget, now: Instant) -> Self {
        budget.intent_started(now);
        Self {
            policy,
            budget,
            deadline: now + policy.intent_timeout,
            attempts: 0,
        }
    }

    /// Attempts planned so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The next attempt, or why there is none.
    pub fn next_attempt(&mut self, now: Instant) -> Result<AttemptPlan, GiveUpReason> {
        if self.attempts >= self.policy.attempts_max {
            return Err(GiveUpReason::AttemptsExhausted);
        }
        let left = self.deadline.saturating_duration_since(now);
        if left.is_zero() {
            return Err(GiveUpReason::DeadlineExceeded);
        }
        self.attempts += 1;
        let number = self.attempts;
        Ok(AttemptPlan {
            number,
            timeout: self.policy.timeout_of_attempt(number).min(left),
            prefer_wait: self.policy.wait_of_attempt(number),
        })
    }

    /// What to do after the last attempt's `answer`, which came with
    /// `retry_after`, at `now` (`wall_now` reads an HTTP-date `Retry-After`).
    pub fn after(
        &mut self,
        answer: &AnswerClass,
        retry_after: Option<RetryAfter>,
        now: Instant,
        wall_now: SystemTime,
    ) -> Step {
        debug_assert!(self.attempts >= 1, "an answer follows an attempt");
        if !answer.is_retried() {
            return Step::Finish;
        }
        if self.attempts >= self.policy.attempts_max {
            return Step::GiveUp(GiveUpReason::AttemptsExhausted);
        }
        let server_wait = self.server_wait(answer, retry_after, wall_now);
        let mut pause = server_wait + self.policy.backoff(self.attempts);
        if now + pause >= self.deadline {
            return Step::GiveUp(GiveUpReason::DeadlineExceeded);
        }
        match (self.budget.try_take(now), self.policy.when_budget_empty) {
            (true, _) => {}
            (false, WhenBudgetEmpty::GiveUp) => return Step::GiveUp(GiveUpReason::BudgetExhausted),
            (false, WhenBudgetEmpty::WaitBackoffCap) => pause += self.policy.backoff_cap,
        }
        Step::Retry { pause }
    }

    /// The part of the pause the server asked for. A 409 retried with
    /// `Prefer: wait` asks the server to wait for the other attempt, so its
    /// `Retry-After` (the lease's end) is not waited first.
    fn server_wait(&self, answer: &AnswerClass, retry_after: Option<RetryAfter>, wall_now: SystemTime) -> Duration {
        let RetryAfterUse::Honour { max } = self.policy.retry_after else {
            return Duration::ZERO;
        };
        let next_waits_at_server = self.policy.wait_of_attempt(self.attempts + 1).is_some();
        if *answer == AnswerClass::InProgress && next_waits_at_server {
            return Duration::ZERO;
        }
        retry_after.map_or(Duration::ZERO, |retry_after| retry_after.delay(wall_now, max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUSY: AnswerClass = AnswerClass::Unavailable { status: 503 };

    fn policy() -> RetryPolicy {
        RetryPolicy::builder()
            .attempts_max(4)
            .backoff(Duration::from_millis(10), Duration::from_millis(40))
            .intent_timeout(Duration::from_secs(60))
            .build()
            .unwrap()
    }

    /// Attempts until the intent stops, every answer being `answer`.
    fn run_to_end(policy: &RetryPolicy, budget: &RetryBudget, answer: AnswerClass) -> (u32, Step) {
        let now = Instant::now();
        let mut retry = IntentRetry::new(policy, budget, now);
        loop {
            retry.next_attempt(now).expect("an attempt is allowed");
            match retry.after(&answer, None, now, SystemTime::now()) {
                Step::Retry { .. } => continue,
                end => return (retry.attempts(), end),
            }
        }
    }

    #[test]
    fn final_answers_end_at_once_and_retryable_ones_end_at_the_attempt_limit() {
        let budget = RetryBudget::default();
        for answer in [
            AnswerClass::Done { replayed: false },
            AnswerClass::KeyReused,
            AnswerClass::BadRequest,
            AnswerClass::Refused { status: 404 },
        ] {
            assert_eq!(run_to_end(&policy(), &budget, answer), (1, Step::Finish), "{answer:?}");
        }
        for answer in [
            BUSY,
            AnswerClass::InProgress,
            AnswerClass::Timeout,
            AnswerClass::Connection,
        ] {
            assert_eq!(
                run_to_end(&policy(), &budget, answer),
                (4, Step::GiveUp(GiveUpReason::AttemptsExhausted)),
                "{answer:?}"
            );
        }
    }

    #[test]
    fn an_empty_budget_gives_up_or_slows_down_as_the_policy_says() {
        let budget = RetryBudget::share_of_intents(0, 2).unwrap();
        assert_eq!(
            run_to_end(&policy(), &budget, BUSY),
            (3, Step::GiveUp(GiveUpReason::BudgetExhausted))
        );
        let patient = RetryPolicy::builder()
            .backoff(Duration::from_millis(10), Duration::from_millis(40))
            .when_budget_empty(WhenBudgetEmpty::WaitBackoffCap)
            .build()
            .unwrap();
        let now = Instant::now();
        let mut retry = IntentRetry::new(&patient, &budget, now);
        retry.next_attempt(now).unwrap();
        let Step::Retry { pause } = retry.after(&BUSY, None, now, SystemTime::now()) else {
            panic!("a patient client retries unpaid");
        };
        assert!(pause >= Duration::from_millis(40), "{pause:?}");
    }

    #[test]
    fn retry_after_is_waited_before_the_jitter_unless_ignored() {
        let budget = RetryBudget::default();
        let now = Instant::now();
        let seconds = Some(RetryAfter::Seconds(3));
        let honouring = policy();
        let mut retry = IntentRetry::new(&honouring, &budget, now);
        retry.next_attempt(now).unwrap();
        let Step::Retry { pause } = retry.after(&BUSY, seconds, now, SystemTime::now()) else {
            panic!("retried");
        };
        assert!(
            (Duration::from_secs(3)..=Duration::from_millis(3_010)).contains(&pause),
            "{pause:?}"
        );
        let ignoring = RetryPolicy::builder()
            .retry_after(RetryAfterUse::Ignore)
            .build()
            .unwrap();
        let mut retry = IntentRetry::new(&ignoring, &budget, now);
        retry.next_attempt(now).unwrap();
        let Step::Retry { pause } = retry.after(&BUSY, seconds, now, SystemTime::now()) else {
            panic!("retried");
        };
        assert!(pause < Duration::from_secs(1), "{pause:?}");
    }

    #[test]
    fn a_409_retried_with_prefer_wait_does_not_wait_its_retry_after() {
        let budget = RetryBudget::default();
        let now = Instant::now();
        let waiting = RetryPolicy::builder()
            .prefer_wait(Some(Duration::from_secs(5)))
            .build()
            .unwrap();
        let mut retry = IntentRetry::new(&waiting, &budget, now);
        assert_eq!(retry.next_attempt(now).unwrap().prefer_wait, None);
        let step = retry.after(
            &AnswerClass::InProgress,
            Some(RetryAfter::Seconds(30)),
            now,
            SystemTime::now(),
        );
        assert!(
            matches!(step, Step::Retry { pause } if pause < Duration::from_secs(1)),
            "{step:?}"
        );
        let second = retry.next_attempt(now).unwrap();
        assert_eq!(second.prefer_wait, Some(Duration::from_secs(5)));
        assert_eq!(second.timeout, Duration::from_millis(5_250));
    }

    #[test]
    fn the_intent_deadline_cuts_attempts_and_refuses_pauses_past_it() {
        let budget = RetryBudget::default();
        let short = RetryPolicy::builder()
            .attempt_timeout(Duration::from_secs(2))
            .intent_timeout(Duration::from_secs(3))
            .build()
            .unwrap();
        let start = Instant::now();
        let mut retry = IntentRetry::new(&short, &budget, start);
        assert_eq!(retry.next_attempt(start).unwrap().timeout, Duration::from_secs(2));
        let later = start + Duration::from_millis(2_500);
        assert_eq!(
            retry.after(&BUSY, Some(RetryAfter::Seconds(1)), later, SystemTime::now()),
            Step::GiveUp(GiveUpReason::DeadlineExceeded)
        );
        assert_eq!(retry.next_attempt(later).unwrap().timeout, Duration::from_millis(500));
        assert_eq!(
            retry.next_attempt(start + Duration::from_secs(3)),
            Err(GiveUpReason::DeadlineExceeded)
        );
    }

    #[test]
    fn each_intent_earns_its_share_and_each_retry_spends_one() {
        let budget = RetryBudget::share_of_intents(50, 0).unwrap();
        let now = Instant::now();
        let policy = policy();
        let mut first = IntentRetry::new(&policy, &budget, now);
        let _second = IntentRetry::new(&policy, &budget, now);
        assert_eq!(budget.retries_left(now), 1, "two intents at 50 % earn one retry");
        first.next_attempt(now).unwrap();
        assert!(matches!(
            first.after(&AnswerClass::Timeout, None, now, SystemTime::now()),
            Step::Retry { .. }
        ));
        assert_eq!(budget.retries_left(now), 0);
        first.next_attempt(now).unwrap();
        assert_eq!(
            first.after(&AnswerClass::Timeout, None, now, SystemTime::now()),
            Step::GiveUp(GiveUpReason::BudgetExhausted)
        );
    }
}
