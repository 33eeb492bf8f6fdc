//! Request limits: the adaptive limit on requests in flight
//! ([`crate::admission`]) and the per-request budget.

use crate::admission::Admission;
use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::time::Duration;

#[derive(Clone)]
pub struct Limits {
    pub admission: Admission,
    request_timeout: Duration,
    retry_after_s: u64,
}

impl Limits {
    /// `in_flight_max`: the most requests in flight the admission limit may
    /// allow; `claim_latency_target`: the claim latency above which it shrinks.
    pub fn new(
        in_flight_max: usize,
        claim_latency_target: Duration,
        request_timeout: Duration,
        retry_after_s: u64,
    ) -> Self {
        Self {
            admission: Admission::new(in_flight_max, claim_latency_target, retry_after_s),
            request_timeout,
            retry_after_s,
        }
    }
}

/// Answers 503 `request_timeout` when the budget runs out. Idempotent work
/// runs in its own task and is not cut off: it finishes and saves its
/// answer, which the caller's retry with the same key then gets.
pub async fn request_timeout(State(limits): State<Limits>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(limits.request_timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_elapsed) => ApiError::RequestTimeout {
            limit_ms: limits.request_timeout.as_millis() as u64,
            retry_after_s: limits.retry_after_s,
        }
        .into_response(),
    }
}
