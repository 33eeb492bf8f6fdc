//! Idempotency-Key middleware for any axum/tower application, over any
//! [`store_core::IdempotencyStore`] (the embedded FoundationDB-style store,
//! FoundationDB, Redis or PostgreSQL).
//!
//! A client sends the same `Idempotency-Key` header with every attempt of
//! one intent; the route runs once per (caller, key), and every repeat gets
//! the first answer back byte for byte, marked `Idempotent-Replayed: true`.
//! A repeat while the first attempt still runs gets 409 with `Retry-After`;
//! the same key with a different request gets 422. The algorithm is
//! docs/design.md#two-transactions: claim the key in one short transaction,
//! do the work with none open, then save the answer only while the
//! attempt's lease (a fencing token) still holds.
//!
//! - [`IdempotencyLayer`]: a tower `Layer` any route can wear. It reads the
//!   key and a bounded body, claims the key, and either answers (replay,
//!   409, 422) or runs the route, then saves, abandons or releases by the
//!   route's answer and its [`FinishPolicy`] (which statuses are saved).
//! - [`Attempt`]: the handler-level API, for routes whose effect must
//!   commit with the key (take it as an extractor, then
//!   [`Attempt::complete_with`], [`Attempt::abandon`], [`Attempt::release`]).
//! - [`Idempotency`]: the shared configuration: the store, who the caller is
//!   ([`CallerIdentity`]: keys are scoped by caller), how errors look
//!   ([`IdempotencyError`], rendered as RFC 9457 problem details by
//!   [`ProblemJson`] unless the application gives a [`RenderError`]), the
//!   metric prefix ([`metrics`]), what the attempt's task holds while it
//!   runs ([`IdempotencyBuilder::hold_during_work`]; with
//!   [`IdempotencyBuilder::hold_during_work_regaining`], how a request
//!   that waited takes it again when it becomes the attempt), and the clock it reads
//!   ([`IdempotencyBuilder::clock`]: the one the store reads, so tests can
//!   end a lease by moving a [`store_core::ManualClock`]).
//!
//! The claim and the route run in a task of their own, so a client that
//! hangs up, or a request timeout, never cuts an attempt off between its
//! effect and its record: the work finishes, and the retry is answered
//! from the key. Give the middleware the `TaskTracker` your shutdown waits
//! on ([`IdempotencyBuilder::tasks`]).
//!
//! # Example
//!
//! One idempotent route on the embedded store:
//!
//! ```
//! use axum::{Router, body::Body, handler::Handler, http::Request, routing::post};
//! use idem_http::{Idempotency, IdempotencyLayer, SingleCaller};
//! use std::sync::Arc;
//! use store_core::{CallerId, Policy};
//! use store_fdb::{EmbeddedConfig, EmbeddedStore};
//! use tower::ServiceExt;
//!
//! async fn create_order() -> (axum::http::StatusCode, &'static str) {
//!     (axum::http::StatusCode::CREATED, "order 1")
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store = EmbeddedStore::open_embedded(&EmbeddedConfig::temporary(), Policy::default()).unwrap();
//! // Who the caller is: here one caller for everyone; usually your auth.
//! let caller = SingleCaller(CallerId::new("shop").unwrap());
//! let idempotency = Idempotency::builder(Arc::new(store), caller).build();
//! let app: Router = Router::new().route(
//!     "/orders",
//!     post(create_order.layer(IdempotencyLayer::new(idempotency, 64 * 1024))),
//! );
//!
//! let order = || Request::post("/orders").header("idempotency-key", "order-42").body(Body::from("{}")).unwrap();
//! let first = app.clone().oneshot(order()).await.unwrap();
//! assert_eq!(first.status(), 201);
//! let retry = app.oneshot(order()).await.unwrap();
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! # }
//! ```
//!
//! `examples/embedded.rs` and `examples/postgres.rs` are whole applications.

#![deny(missing_docs)]

mod attempt;
mod caller;
pub mod deadline;
pub mod error;
mod idempotency;
pub mod key_header;
mod layer;
pub mod metrics;
mod policy;
pub mod prefer;
pub mod saved;

pub use attempt::{Attempt, COMPLETE_RESEND_BACKOFF_MS, COMPLETE_SENDS_MAX, PendingAttempt};
pub use caller::{CallerFromExtension, CallerIdentity, SingleCaller};
pub use deadline::{REQUEST_TIMEOUT_MS_HEADER, RequestDeadline, RequestTimeoutInvalid, request_timeout_ms};
pub use error::{IdempotencyError, Outcome, PROBLEM_JSON, Problem, ProblemJson, RenderError, retry_after_seconds};
pub use idempotency::{
    Begun, CLAIM_RESEND_BACKOFF_MS, CLAIM_SENDS_MAX, Idempotency, IdempotencyBuilder, ORPHAN_RELEASE_BACKOFF_MS,
    ORPHAN_RELEASES_MAX, STORE_RETRY_AFTER_S_DEFAULT, STORE_RETRY_AFTER_S_MAX, WAIT_CAP_S_DEFAULT, WAIT_CAP_S_MAX,
};
pub use layer::{
    BODY_DRAIN_BYTES_MAX, BODY_DRAIN_MS_MAX, DEADLINE_EXCEEDED_RETRY_AFTER_S, IdempotencyLayer, IdempotencyService,
    read_body,
};
pub use policy::{Disposition, FinishPolicy, REFUSED_BEFORE_RUNNING_STATUSES, TRANSIENT_STATUSES};
pub use prefer::{PREFER_HEADER, PREFERENCE_APPLIED_HEADER, prefer_wait_seconds};
pub use saved::REPLAYED_HEADER;
