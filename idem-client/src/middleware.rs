//! The retry middleware any reqwest user adds to a client chain:
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_client::{IdempotentRetries, IntentKey, RetryPolicy};
//! let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(IdempotentRetries::new(RetryPolicy::default()))
//!     .build();
//! let key = IntentKey::from_parts(&["label", "918273", "1", "v1"])?;
//! let answer = http
//!     .post("http://127.0.0.1:8080/v1/labels")
//!     .bearer_auth("demo-token")
//!     .header("idempotency-key", key.header_value())
//!     .header("content-type", "application/json")
//!     .body(r#"{"order_id":918273,"parcel_no":1,"weight_g":1450,"service":"ground"}"#)
//!     .send()
//!     .await?;
//! # let _ = answer; Ok(()) }
//! ```
//!
//! A request with an `Idempotency-Key` is one intent: every attempt carries
//! the same key, answers are classified as [`AnswerClass`] says, retries
//! wait the backoff and `Retry-After` and are paid from the client's
//! [`RetryBudget`], and each attempt has the policy's deadline (this
//! replaces any timeout set on the request). The middleware returns the
//! last answer (or the last transport error) and leaves an
//! [`IntentReport`] in the request's extensions saying how it ended.
//!
//! A request without the header is sent once: retrying it could run it
//! twice. So is one whose body cannot be sent again (a stream). A header
//! that names no valid key fails the request before anything is sent.

use crate::answer::{AnswerClass, PREFER_HEADER, REQUEST_TIMEOUT_MS_HEADER, RetryAfter, wait_was_applied};
use crate::budget::RetryBudget;
use crate::clock::{Clock, SystemClock};
use crate::key::IntentKey;
use crate::metrics;
use crate::policy::RetryPolicy;
use crate::retry::{AttemptPlan, GiveUpReason, IntentRetry, Step};
use http::Extensions;
use reqwest::header::HeaderValue;
use reqwest::{Request, Response};
use reqwest_middleware::{Error, Middleware, Next, Result};
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

/// The request header that names the intent.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// How one intent went, left in the request's extensions by
/// [`IdempotentRetries`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntentReport {
    /// Attempts sent.
    pub attempts: u32,
    /// The last attempt's answer.
    pub last: AnswerClass,
    /// Set when the last answer was retryable but no retry was allowed.
    pub gave_up: Option<GiveUpReason>,
    /// The last attempt waited at the server (`Preference-Applied`).
    pub waited: bool,
}

/// The retry middleware: one policy, and one budget shared by every intent
/// sent through it.
#[derive(Clone)]
pub struct IdempotentRetries {
    policy: RetryPolicy,
    budget: Arc<RetryBudget>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for IdempotentRetries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotentRetries")
            .field("policy", &self.policy)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl IdempotentRetries {
    /// `policy` with a default budget of its own, on the system clock.
    pub fn new(policy: RetryPolicy) -> Self {
        Self::with_budget(policy, Arc::new(RetryBudget::default()))
    }

    /// `policy` with `budget`, which other clients may share.
    pub fn with_budget(policy: RetryPolicy, budget: Arc<RetryBudget>) -> Self {
        Self {
            policy,
            budget,
            clock: Arc::new(SystemClock),
        }
    }

    /// The same middleware on `clock` (a [`crate::ManualClock`] in tests).
    pub fn on_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The budget its intents share.
    pub fn budget(&self) -> &Arc<RetryBudget> {
        &self.budget
    }

    /// Sends every attempt of one intent and decides between them.
    async fn run_intent(&self, request: Request, extensions: &mut Extensions, next: Next<'_>) -> Result<Response> {
        let mut retry = IntentRetry::new(&self.policy, &self.budget, self.clock.now());
        let mut previous: Option<AnswerClass> = None;
        loop {
            let plan = match (retry.next_attempt(self.clock.now()), previous) {
                (Ok(plan), _) => plan,
                // Only after a pause that outlived the deadline (the
                // decision before it left time for one more attempt): the
                // answer was retryable, and no retry is left.
                (Err(reason), Some(last)) => {
                    let report = IntentReport {
                        attempts: retry.attempts(),
                        last,
                        gave_up: Some(reason),
                        waited: false,
                    };
                    self.end_intent(report, extensions);
                    return Err(Error::middleware(GaveUpBeforeSending(reason)));
                }
                (Err(reason), None) => unreachable!("a valid policy allows a first attempt ({reason:?})"),
            };
            let attempt = attempt_request(&request, &plan)?;
            let span = tracing::info_span!("attempt", number = plan.number, answer = tracing::field::Empty);
            let result = next.clone().run(attempt, extensions).instrument(span.clone()).await;
            let Some(answer) = Answer::of(&result) else {
                return result; // a middleware's own error: not an answer to retry
            };
            span.record("answer", answer.class.name());
            metrics::attempt_answered(&answer.class);
            let now = (self.clock.now(), self.clock.wall_now());
            let step = retry.after(&answer.class, answer.retry_after, now.0, now.1);
            let gave_up = match step {
                Step::Retry { pause } => {
                    metrics::retrying(&answer.class);
                    previous = Some(answer.class);
                    // The answer is not kept over the pause: its connection
                    // goes back to the pool.
                    drop(result);
                    self.clock.sleep(pause).await;
                    continue;
                }
                Step::Finish => None,
                Step::GiveUp(reason) => Some(reason),
            };
            let report = IntentReport {
                attempts: plan.number,
                last: answer.class,
                gave_up,
                waited: answer.waited,
            };
            self.end_intent(report, extensions);
            return result;
        }
    }

    fn end_intent(&self, report: IntentReport, extensions: &mut Extensions) {
        metrics::intent_ended(&report);
        record_on_intent_span(&report);
        extensions.insert(report);
    }
}

/// One attempt's answer, as the retry decision needs it.
struct Answer {
    class: AnswerClass,
    retry_after: Option<RetryAfter>,
    waited: bool,
}

impl Answer {
    /// `None` for errors that are not answers (a middleware's, a request
    /// that could not be built, a redirect refused): returned as they are.
    fn of(result: &Result<Response>) -> Option<Self> {
        match result {
            Ok(response) => Some(Self {
                class: AnswerClass::of_answer(response.status().as_u16(), response.headers()),
                retry_after: RetryAfter::from_headers(response.headers()),
                waited: wait_was_applied(response.headers()),
            }),
            Err(Error::Reqwest(error)) if error.is_builder() || error.is_redirect() => None,
            Err(Error::Reqwest(error)) => Some(Self {
                class: if error.is_timeout() {
                    AnswerClass::Timeout
                } else {
                    AnswerClass::Connection
                },
                retry_after: None,
                waited: false,
            }),
            Err(Error::Middleware(_)) => None,
        }
    }
}

/// The request for one attempt: the same key and body, the attempt's
/// deadline (also told to the server in `Request-Timeout-Ms`, so it starts
/// no work past it), and `Prefer: wait` on a retry that asks for it.
fn attempt_request(request: &Request, plan: &AttemptPlan) -> Result<Request> {
    let mut attempt = request.try_clone().ok_or_else(|| Error::middleware(NotResendable))?;
    *attempt.timeout_mut() = Some(plan.timeout);
    let timeout_ms = u64::try_from(plan.timeout.as_millis()).unwrap_or(u64::MAX).max(1);
    attempt
        .headers_mut()
        .insert(REQUEST_TIMEOUT_MS_HEADER, HeaderValue::from(timeout_ms));
    if let Some(wait) = plan.prefer_wait {
        attempt.headers_mut().append(PREFER_HEADER, prefer_wait_value(wait));
    }
    Ok(attempt)
}

fn prefer_wait_value(wait: Duration) -> HeaderValue {
    HeaderValue::from_str(&format!("wait={}", wait.as_secs())).expect("digits are a valid header value")
}

fn record_on_intent_span(report: &IntentReport) {
    let span = tracing::Span::current();
    span.record("attempts", report.attempts);
    span.record("outcome", metrics::outcome_name(report));
}

/// The request's body cannot be sent again (checked before the first attempt).
#[derive(Debug, thiserror::Error)]
#[error("the request's body cannot be sent again, so it cannot be retried")]
struct NotResendable;

/// The intent's deadline passed during the pause before an attempt: the
/// middleware's error then (the [`IntentReport`] says more).
#[derive(Debug, thiserror::Error)]
#[error("gave up before the next attempt: {}", .0.name())]
pub struct GaveUpBeforeSending(pub GiveUpReason);

#[async_trait::async_trait]
impl Middleware for IdempotentRetries {
    async fn handle(&self, request: Request, extensions: &mut Extensions, next: Next<'_>) -> Result<Response> {
        let Some(header) = request.headers().get(IDEMPOTENCY_KEY_HEADER) else {
            metrics::sent_without_key();
            return next.run(request, extensions).await;
        };
        let key = IntentKey::from_header(header).map_err(Error::middleware)?;
        if request.try_clone().is_none() {
            metrics::sent_without_key();
            return next.run(request, extensions).await;
        }
        let span = tracing::info_span!(
            "intent",
            key = key.as_str(),
            attempts = tracing::field::Empty,
            outcome = tracing::field::Empty
        );
        self.run_intent(request, extensions, next).instrument(span).await
    }
}
