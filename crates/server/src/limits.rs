//! Request limits: a cap on API requests in flight (beyond it, an
//! immediate 503 `overloaded` instead of a queue), and a per-request budget.

use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

#[derive(Clone)]
pub struct Limits {
    in_flight: Arc<Semaphore>,
    request_timeout: Duration,
    retry_after_s: u64,
}

impl Limits {
    pub fn new(in_flight_max: usize, request_timeout: Duration, retry_after_s: u64) -> Self {
        Self {
            in_flight: Arc::new(Semaphore::new(in_flight_max)),
            request_timeout,
            retry_after_s,
        }
    }
}

/// Sheds load: a request that finds every slot taken is refused at once.
pub async fn shed_overload(State(limits): State<Limits>, request: Request, next: Next) -> Response {
    let Ok(_permit) = limits.in_flight.clone().try_acquire_owned() else {
        return ApiError::Overloaded {
            retry_after_s: limits.retry_after_s,
        }
        .into_response();
    };
    next.run(request).await
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
