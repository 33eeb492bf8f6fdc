//! Operations routes: liveness, readiness, metrics and the API document.
//!
//! None of them reaches a store or blocks: they sit outside the API's caps
//! (a load balancer and Prometheus must reach them when the API is
//! saturated), so what they report is gathered by one background task
//! ([`spawn_refresh`]): the stores' readiness, which `/readyz` answers from
//! (`readiness.rs`), and the embedded store's gauges, whose disk usage
//! walks the data directory and takes the journal's writer lock, on a
//! blocking thread instead of an async worker.

use crate::error::{ApiError, Outcome};
use crate::metrics::{READINESS_CHECKS_TOTAL, READY};
use crate::readiness::Checked;
use crate::setting::RETRY_AFTER_S_DEFAULT;
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use store_core::StoreError;
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;

/// Media type of the Prometheus text exposition format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Default time between two background readiness checks: a load balancer
/// probing every few seconds sees a state at most this old.
pub const READINESS_REFRESH_MS_DEFAULT: u64 = 1_000;
/// Shortest refresh accepted: below it the check itself becomes load.
pub const READINESS_REFRESH_MS_MIN: u64 = 100;
/// Longest refresh accepted.
pub const READINESS_REFRESH_MS_MAX: u64 = 60_000;

/// The `result` labels of [`READINESS_CHECKS_TOTAL`].
pub const READINESS_RESULTS: [&str; 2] = ["ok", "error"];

/// Pings the records and the labels, within `within` (a store that does
/// not answer in time is not ready), and sets the gauges the embedded
/// engine reports, on a blocking thread.
pub async fn check(state: &AppState, within: Duration) -> Checked {
    if let Some(engine) = state.embedded.clone() {
        let observed = tokio::task::spawn_blocking(move || crate::metrics::observe_embedded(&engine));
        if let Err(error) = observed.await {
            tracing::warn!(%error, "observing the embedded store failed");
        }
    }
    let pinged = async {
        state.idempotency.store().ping().await?;
        state.labels.ping().await
    };
    let pinged = match tokio::time::timeout(within, pinged).await {
        Ok(pinged) => pinged,
        Err(_elapsed) => Err(StoreError::Unavailable {
            detail: format!("no answer to the readiness check within {} ms", within.as_millis()),
            source: None,
        }),
    };
    let checked = match pinged {
        Ok(()) => Checked::Ready,
        Err(error) => {
            let detail = store_core::redact::redact_secrets(&error.to_string());
            tracing::warn!(error = %detail, "readiness check: store unreachable");
            Checked::Unreachable(state.idempotency.store_error(&error))
        }
    };
    let (ready, result) = match checked {
        Checked::Ready => (1.0, READINESS_RESULTS[0]),
        Checked::Unreachable(_) => (0.0, READINESS_RESULTS[1]),
    };
    metrics::gauge!(READY).set(ready);
    metrics::counter!(READINESS_CHECKS_TOTAL, "result" => result).increment(1);
    checked
}

/// Checks readiness every `every` until `stop`, each check within the
/// same time, and keeps the result for `/readyz`.
pub fn spawn_refresh(state: AppState, every: Duration, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // The first check was made before serving (`App::build`).
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let checked = check(&state, every).await;
            state.readiness.set(checked);
        }
    })
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok` (process up) or `ready` (stores reachable).
    pub status: String,
    /// The configured `store.kind`.
    pub store: String,
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "The process is up.", body = Health, content_type = "application/json")))]
pub async fn healthz(State(state): State<AppState>) -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        store: state.store_kind.into(),
    })
}

/// The stores answer.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Records and labels are reachable.", body = Health, content_type = "application/json"),
        (status = 503, description = "`store_unavailable`, or `shutting_down` (the server stops soon; its listener is still open).", body = crate::error::Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds to wait before asking again.")))
    ))]
pub async fn readyz(State(state): State<AppState>) -> Response {
    if state.shutting_down.is_cancelled() {
        return ApiError::ShuttingDown {
            retry_after_s: RETRY_AFTER_S_DEFAULT,
        }
        .into_response();
    }
    // As the background check last found it: a probe reaches no store.
    match state.readiness.get() {
        Checked::Ready => Json(Health {
            status: "ready".into(),
            store: state.store_kind.into(),
        })
        .into_response(),
        Checked::Unreachable(error) => {
            let mut response = ApiError::from(error).into_response();
            response.extensions_mut().insert(Outcome("unavailable"));
            response
        }
    }
}

/// Prometheus metrics.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text exposition format 0.0.4.", body = String, content_type = "text/plain")))]
pub async fn metrics(State(state): State<AppState>) -> Response {
    // The embedded store's gauges are set by the background check
    // ([`spawn_refresh`]), off the async workers.
    state.metrics.run_upkeep();
    let mut response = state.metrics.render().into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROMETHEUS_TEXT));
    response
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "The OpenAPI 3.1 description of this API, with the configured idempotency policy.", body = Object, content_type = "application/json")))]
pub async fn openapi_json(State(state): State<AppState>) -> Response {
    Json(crate::openapi::document_for(&state.policy)).into_response()
}

/// A path that exists, with a method it does not serve. axum adds the
/// `Allow` header.
pub async fn method_not_allowed(method: axum::http::Method) -> ApiError {
    ApiError::MethodNotAllowed {
        method: method.to_string(),
    }
}

/// Any other path.
pub async fn not_found() -> ApiError {
    ApiError::NotFound
}
