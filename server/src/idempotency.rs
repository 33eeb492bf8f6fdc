//! The server's use of idem-http: the idempotency middleware configured
//! for the Label service, through idem-http's public API like any other
//! application's.
//!
//! - who the caller is: the bearer-token caller [`crate::auth::require_caller`]
//!   authenticated ([`crate::auth::BearerCaller`]);
//! - how errors look: as every other [`ApiError`], so the API's answers
//!   are one format (docs/design.md#status-codes);
//! - what the attempt's task holds: the request's [`InFlightSlot`], so
//!   work that outlives its client still counts against the in-flight cap
//!   and admission control; a request that waited (`Prefer: wait`, holding
//!   no admission worker meanwhile) and becomes the attempt is admitted
//!   again first ([`crate::admission::readmit`]), and answered 503
//!   `overloaded` like any shed request when no worker frees in time;
//! - metric names: idem-http's default prefix `idem_`, which the alert
//!   rules and the dashboard use;
//! - the clock: the server's one [`SharedClock`], the one the embedded and
//!   FoundationDB stores read (ARCHITECTURE.md, "Which clock decides lease
//!   expiry").

pub use idem_http::{
    Attempt, Begun, CLAIM_SENDS_MAX, FinishPolicy, Idempotency, IdempotencyBuilder, IdempotencyLayer,
    IdempotencyService, PendingAttempt, saved,
};

use crate::admission::readmit;
use crate::auth::BearerCaller;
use crate::error::ApiError;
use crate::limits::InFlightSlot;
use axum::response::IntoResponse;
use std::sync::Arc;
use store_core::{IdempotencyStore, SharedClock};
use tokio_util::task::TaskTracker;

/// The middleware over `store` as the server runs it: attempts on `tasks`
/// (shutdown waits for them), `Retry-After: store_retry_after_s` during
/// store outages, time read from `clock` (the one `store` reads), and
/// `Prefer: wait` granted up to `prefer_wait_max_s` (docs/design.md#waiting),
/// with the store's default waiter caps.
pub fn configure(
    store: Arc<dyn IdempotencyStore>,
    tasks: TaskTracker,
    store_retry_after_s: u64,
    prefer_wait_max_s: u64,
    clock: SharedClock,
) -> Idempotency {
    builder(store, tasks, store_retry_after_s, prefer_wait_max_s, clock).build()
}

/// [`configure`]'s settings, before building: the application sets what
/// else its config names (the waiter caps, `IdempotencyBuilder::wait_limits`).
pub fn builder(
    store: Arc<dyn IdempotencyStore>,
    tasks: TaskTracker,
    store_retry_after_s: u64,
    prefer_wait_max_s: u64,
    clock: SharedClock,
) -> IdempotencyBuilder {
    Idempotency::builder(store, BearerCaller)
        .clock(clock)
        .tasks(tasks)
        .store_retry_after_s(store_retry_after_s)
        .wait_cap_s(prefer_wait_max_s)
        .render_errors_with(|error| ApiError::from(error).into_response())
        .hold_during_work_regaining::<InFlightSlot, _, _, _>(readmit)
}
