//! The Fulfilment client as a library: what a service that calls an
//! idempotent API must do for exactly-once to hold (docs/design.md,
//! "Status codes" and "The failure table"), written once.
//!
//! - [`IntentKey`]: one key per intent, derived from the parts that name it
//!   and checked against the server's key rules when built, so a bad key
//!   never reaches the wire; every attempt of the intent sends it.
//! - [`RetryPolicy`]: at most N attempts, capped exponential backoff with
//!   full jitter, `Retry-After` honoured (seconds or an HTTP date),
//!   `Prefer: wait` on retries, a deadline per attempt and one per intent.
//! - [`RetryBudget`]: retries at most a fifth of the intents one client
//!   started in the last ten seconds, plus a small reserve (Finagle's retry
//!   budget), so an outage stops the retries instead of multiplying them,
//!   while a short stall at any rate is retried through.
//! - [`AnswerClass`]: every answer classified as the design's status table
//!   says (201 done, a replay done, 409 retried, 422 and 400 never retried,
//!   5xx, timeouts and connection errors retried, other 4xx not).
//! - [`IdempotentRetries`]: all of it as a `reqwest-middleware`
//!   `Middleware` any reqwest user adds to a client chain.
//! - [`IdemClient`]: a typed API over the middleware, whose outcome is
//!   [`Done`] (first run or replay) or an [`IntentError`].
//! - [`IntentRetry`]: the retry decision alone, with no I/O, for a sender
//!   of its own (the bench's open-loop client uses it).
//!
//! Metrics go through the `metrics` facade ([`metrics`] lists them), and each
//! intent is one `tracing` span (`intent`, with the key, the attempts and
//! the outcome) with one child span per attempt (`attempt`).
#![deny(missing_docs)]

mod answer;
mod budget;
mod client;
mod clock;
mod key;
pub mod metrics;
mod middleware;
mod policy;
mod retry;

pub use answer::{
    AnswerClass, PREFER_HEADER, PREFERENCE_APPLIED_HEADER, REPLAYED_HEADER, REQUEST_TIMEOUT_MS_HEADER,
    RETRY_AFTER_MS_HEADER, RetryAfter, is_replayed, wait_was_applied,
};
pub use budget::{
    BudgetError, RETRY_BUDGET_RESERVE_DEFAULT, RETRY_BUDGET_RESERVE_LIMIT, RETRY_BUDGET_SHARE_PERCENT_DEFAULT,
    RETRY_BUDGET_WINDOW_S, RetryBudget,
};
pub use client::{
    BuildError, Done, IdemClient, IdemClientBuilder, IntentError, PROBLEM_CODE_CHARS_MAX, Problem, RESPONSE_BYTES_MAX,
};
pub use clock::{Clock, MANUAL_PAUSES_RECORDED_MAX, ManualClock, Pause, SystemClock};
pub use key::{IntentKey, KEY_BYTES_MAX, KEY_PART_SEPARATOR, KEY_PARTS_MAX, KeyError};
pub use middleware::{GaveUpBeforeSending, IDEMPOTENCY_KEY_HEADER, IdempotentRetries, IntentReport};
pub use policy::{
    ATTEMPT_TIMEOUT_MS_DEFAULT, ATTEMPTS_LIMIT, ATTEMPTS_MAX_DEFAULT, BACKOFF_BASE_MS_DEFAULT, BACKOFF_CAP_MS_DEFAULT,
    INTENT_TIMEOUT_MS_DEFAULT, PREFER_WAIT_S_LIMIT, PolicyError, RETRY_AFTER_MS_MAX_DEFAULT, RetryAfterUse,
    RetryPolicy, RetryPolicyBuilder, TIMEOUT_MS_LIMIT, WhenBudgetEmpty,
};
pub use retry::{AttemptPlan, GiveUpReason, IntentRetry, Step};
