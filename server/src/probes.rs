//! Operations routes: liveness, readiness, metrics and the API document.

use crate::error::{ApiError, Outcome};
use crate::setting::RETRY_AFTER_S_DEFAULT;
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Media type of the Prometheus text exposition format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

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
    let pinged = match state.idempotency.store().ping().await {
        Ok(()) => state.labels.ping().await,
        Err(error) => Err(error),
    };
    match pinged {
        Ok(()) => Json(Health {
            status: "ready".into(),
            store: state.store_kind.into(),
        })
        .into_response(),
        Err(error) => {
            let detail = store_core::redact::redact_secrets(&error.to_string());
            tracing::warn!(error = %detail, "readiness probe: store unreachable");
            let mut response = state.idempotency.store_error(&error).into_response();
            response.extensions_mut().insert(Outcome("unavailable"));
            response
        }
    }
}

/// Prometheus metrics.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text exposition format 0.0.4.", body = String, content_type = "text/plain")))]
pub async fn metrics(State(state): State<AppState>) -> Response {
    if let Some(engine) = &state.embedded {
        crate::metrics::observe_embedded(engine);
    }
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
