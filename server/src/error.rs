//! The one error type of the HTTP API, answered as RFC 9457
//! `application/problem+json` with a machine-readable `code`.
//!
//! Internals never reach the client: an [`ApiError::Internal`] carries its
//! detail in a response extension ([`LoggedError`]) that the request logger
//! (`observe`) writes once, at the edge, and strips from nothing else.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// Media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// How a response should be counted and logged: the `outcome` label of
/// `idem_http_requests_total`. Set by whoever makes the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome(pub &'static str);

/// What the idempotency layer does with the key once the route answered.
/// Routes that finish their attempt themselves (the handler-level API) never
/// need this; routes that only wear the layer may set it on a response to
/// override the layer's `FinishPolicy` for that answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// A definitive answer: save it and replay it to every repeat.
    Save,
    /// Nothing happened (validation failed before any effect): delete the
    /// record, so the key is free for a corrected request.
    Abandon,
    /// The outcome is unknown: keep the record, end the lease now, so the
    /// caller's retry takes over at once.
    Release,
}

/// Detail of an error that must be logged but never sent to the client.
#[derive(Debug, Clone)]
pub struct LoggedError(pub String);

/// Every error the API answers. Status codes and `code` strings are the API
/// contract (docs/design.md#status-codes); do not rename them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    #[error("the Idempotency-Key header is required")]
    IdempotencyKeyMissing,
    #[error("the Idempotency-Key header is not valid: {reason}")]
    IdempotencyKeyInvalid { reason: String },
    #[error("{detail}")]
    InvalidRequest { detail: String },
    #[error("a valid bearer token is required")]
    Unauthorized,
    #[error("no such resource")]
    NotFound,
    #[error("this resource does not accept the {method} method")]
    MethodNotAllowed { method: String },
    #[error("the request body must be {expected}, declared in the Content-Type header")]
    UnsupportedMediaType { expected: &'static str },
    #[error("the request body is larger than {limit_bytes} bytes")]
    PayloadTooLarge { limit_bytes: usize },
    #[error("another request with this key is in progress; retry with the same key after {retry_after_s} s")]
    RequestInProgress { retry_after_s: u64 },
    #[error("this key was used with a different request; use a new key for a new request")]
    IdempotencyKeyReused,
    #[error("the carrier did not give a definite answer; retry with the same key after {retry_after_s} s")]
    DownstreamUnavailable { retry_after_s: u64 },
    #[error("the carrier refused the label ({carrier_status}): {detail}")]
    DownstreamRejected { carrier_status: u16, detail: String },
    #[error("the idempotency store is unavailable; retry with the same key after {retry_after_s} s")]
    StoreUnavailable { retry_after_s: u64 },
    #[error("the server is shutting down; retry on another instance")]
    ShuttingDown { retry_after_s: u64 },
    #[error("too many requests in flight; retry later")]
    Overloaded { retry_after_s: u64 },
    #[error("the request took longer than {limit_ms} ms; retry with the same key after {retry_after_s} s")]
    RequestTimeout { limit_ms: u64, retry_after_s: u64 },
    /// The stored record of this key cannot be decoded; the purge has set
    /// it aside. Retrying will not help until an operator deletes it.
    #[error("the stored record of this key is unreadable; the error was logged, and retrying will not help")]
    RecordUnreadable,
    /// The route ran, but its answer could not be saved under the key; this
    /// problem is saved in its place, so a retry never runs the route again.
    #[error(
        "the request was processed, but its answer could not be saved ({reason}); this key answers with this problem from now on"
    )]
    ResponseNotSaved { reason: String },
    /// The string is logged, never sent.
    #[error("internal error")]
    Internal(String),
}

/// The body of every error response (RFC 9457).
#[derive(Debug, Clone, Serialize, serde::Deserialize, ToSchema)]
pub struct Problem {
    /// A URI naming the problem type: `urn:idem:problem:<code>`.
    #[serde(rename = "type")]
    pub problem_type: String,
    /// Short, human-readable summary of the problem type.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong with this request.
    pub detail: String,
    /// Machine-readable code; one of the codes listed in the API description.
    pub code: String,
}

/// How many kinds of [`ApiError`] there are: the length of
/// [`ApiError::samples`].
pub const API_ERROR_KINDS: usize = 19;

impl ApiError {
    /// One error of every kind, with the details a typical one has: the
    /// examples of the OpenAPI document, and the list of every `code`.
    /// A new kind must be added here; `every_kind_has_a_sample` fails to
    /// compile until its match names it.
    pub fn samples() -> [ApiError; API_ERROR_KINDS] {
        [
            ApiError::IdempotencyKeyMissing,
            ApiError::IdempotencyKeyInvalid {
                reason: "idempotency key is empty".into(),
            },
            ApiError::InvalidRequest {
                detail: "weight_g must be between 1 and 70000".into(),
            },
            ApiError::Unauthorized,
            ApiError::NotFound,
            ApiError::MethodNotAllowed {
                method: "DELETE".into(),
            },
            ApiError::UnsupportedMediaType {
                expected: "application/json",
            },
            ApiError::PayloadTooLarge { limit_bytes: 65_536 },
            ApiError::RequestInProgress { retry_after_s: 1 },
            ApiError::IdempotencyKeyReused,
            ApiError::DownstreamUnavailable { retry_after_s: 1 },
            ApiError::DownstreamRejected {
                carrier_status: 422,
                detail: "weight exceeds the service's limit".into(),
            },
            ApiError::StoreUnavailable { retry_after_s: 1 },
            ApiError::Overloaded { retry_after_s: 1 },
            ApiError::RequestTimeout {
                limit_ms: 30_000,
                retry_after_s: 1,
            },
            ApiError::ShuttingDown { retry_after_s: 1 },
            ApiError::RecordUnreadable,
            ApiError::ResponseNotSaved {
                reason: "the answer is over the saved-response limit".into(),
            },
            ApiError::Internal("not sent".into()),
        ]
    }

    /// The sample of the kind with this `code`.
    pub fn sample(code: &str) -> Option<ApiError> {
        Self::samples().into_iter().find(|error| error.code() == code)
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::IdempotencyKeyMissing
            | ApiError::IdempotencyKeyInvalid { .. }
            | ApiError::InvalidRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::UnsupportedMediaType { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::RequestInProgress { .. } => StatusCode::CONFLICT,
            ApiError::IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::DownstreamRejected { .. } => StatusCode::BAD_GATEWAY,
            ApiError::DownstreamUnavailable { .. }
            | ApiError::StoreUnavailable { .. }
            | ApiError::ShuttingDown { .. }
            | ApiError::Overloaded { .. }
            | ApiError::RequestTimeout { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::RecordUnreadable | ApiError::ResponseNotSaved { .. } | ApiError::Internal(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// The machine-readable code of the problem body.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::IdempotencyKeyMissing => "idempotency_key_missing",
            ApiError::IdempotencyKeyInvalid { .. } => "idempotency_key_invalid",
            ApiError::InvalidRequest { .. } => "invalid_request",
            ApiError::Unauthorized => "unauthorized",
            ApiError::NotFound => "not_found",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::UnsupportedMediaType { .. } => "unsupported_media_type",
            ApiError::PayloadTooLarge { .. } => "payload_too_large",
            ApiError::RequestInProgress { .. } => "request_in_progress",
            ApiError::IdempotencyKeyReused => "idempotency_key_reused",
            ApiError::DownstreamUnavailable { .. } => "downstream_unavailable",
            ApiError::DownstreamRejected { .. } => "downstream_rejected",
            ApiError::StoreUnavailable { .. } => "store_unavailable",
            ApiError::ShuttingDown { .. } => "shutting_down",
            ApiError::Overloaded { .. } => "overloaded",
            ApiError::RequestTimeout { .. } => "request_timeout",
            ApiError::RecordUnreadable => "record_unreadable",
            ApiError::ResponseNotSaved { .. } => "response_not_saved",
            ApiError::Internal(_) => "internal_error",
        }
    }

    /// The `outcome` metric label: the names where it gives them.
    pub fn outcome(&self) -> &'static str {
        match self {
            ApiError::IdempotencyKeyMissing => "missing_key",
            ApiError::IdempotencyKeyInvalid { .. } => "invalid_key",
            ApiError::RequestInProgress { .. } => "in_progress",
            ApiError::IdempotencyKeyReused => "mismatch",
            ApiError::StoreUnavailable { .. } => "unavailable",
            other => other.code(),
        }
    }

    fn title(&self) -> &'static str {
        match self {
            ApiError::IdempotencyKeyMissing => "Idempotency-Key missing",
            ApiError::IdempotencyKeyInvalid { .. } => "Idempotency-Key invalid",
            ApiError::InvalidRequest { .. } => "Invalid request",
            ApiError::Unauthorized => "Unauthorized",
            ApiError::NotFound => "Not found",
            ApiError::MethodNotAllowed { .. } => "Method not allowed",
            ApiError::UnsupportedMediaType { .. } => "Unsupported media type",
            ApiError::PayloadTooLarge { .. } => "Payload too large",
            ApiError::RequestInProgress { .. } => "Request in progress",
            ApiError::IdempotencyKeyReused => "Idempotency-Key reused",
            ApiError::DownstreamUnavailable { .. } => "Carrier unavailable",
            ApiError::DownstreamRejected { .. } => "Carrier rejected the label",
            ApiError::StoreUnavailable { .. } => "Store unavailable",
            ApiError::ShuttingDown { .. } => "Shutting down",
            ApiError::Overloaded { .. } => "Overloaded",
            ApiError::RequestTimeout { .. } => "Request timeout",
            ApiError::RecordUnreadable => "Record unreadable",
            ApiError::ResponseNotSaved { .. } => "Response not saved",
            ApiError::Internal(_) => "Internal error",
        }
    }

    /// Seconds for the `Retry-After` header, for the errors that carry one.
    pub fn retry_after_s(&self) -> Option<u64> {
        match self {
            ApiError::RequestInProgress { retry_after_s }
            | ApiError::DownstreamUnavailable { retry_after_s }
            | ApiError::StoreUnavailable { retry_after_s }
            | ApiError::ShuttingDown { retry_after_s }
            | ApiError::Overloaded { retry_after_s }
            | ApiError::RequestTimeout { retry_after_s, .. } => Some(*retry_after_s),
            _ => None,
        }
    }

    /// What the idempotency layer does with the key after this error. An
    /// internal error is saved: the route may have done part of its work,
    /// and a retry must not run it again.
    pub fn disposition(&self) -> Disposition {
        match self {
            ApiError::InvalidRequest { .. } | ApiError::UnsupportedMediaType { .. } => Disposition::Abandon,
            ApiError::DownstreamUnavailable { .. }
            | ApiError::StoreUnavailable { .. }
            | ApiError::ShuttingDown { .. }
            | ApiError::Overloaded { .. }
            | ApiError::RequestTimeout { .. } => Disposition::Release,
            _ => Disposition::Save,
        }
    }

    pub fn problem(&self) -> Problem {
        let detail = match self {
            ApiError::Internal(_) => "the server failed to answer; the error was logged".to_owned(),
            other => other.to_string(),
        };
        Problem {
            problem_type: format!("urn:idem:problem:{}", self.code()),
            title: self.title().to_owned(),
            status: self.status().as_u16(),
            detail,
            code: self.code().to_owned(),
        }
    }

    /// The serialized problem body.
    pub fn body_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&self.problem()).unwrap_or_else(|_| b"{}".to_vec())
    }
}

/// `Retry-After` in whole seconds, rounded up and at least 1, from a
/// millisecond duration.
pub fn retry_after_seconds(retry_after_ms: u64) -> u64 {
    retry_after_ms.div_ceil(1_000).max(1)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), self.body_bytes()).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = self.retry_after_s() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if matches!(self, ApiError::Unauthorized) {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        let extensions = response.extensions_mut();
        extensions.insert(Outcome(self.outcome()));
        extensions.insert(self.disposition());
        if let ApiError::Internal(detail) = self {
            extensions.insert(LoggedError(detail));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_and_is_at_least_one() {
        assert_eq!(retry_after_seconds(0), 1);
        assert_eq!(retry_after_seconds(1), 1);
        assert_eq!(retry_after_seconds(1_000), 1);
        assert_eq!(retry_after_seconds(1_001), 2);
        assert_eq!(retry_after_seconds(29_999), 30);
    }

    #[test]
    fn internal_details_never_reach_the_body() {
        let error = ApiError::Internal("disk on fire at /var/lib/idem".into());
        let body = String::from_utf8(error.body_bytes()).unwrap();
        assert!(!body.contains("disk on fire"), "{body}");
        assert!(body.contains("\"code\":\"internal_error\""), "{body}");
    }

    /// Names every kind: a new one does not compile until it is named
    /// here, which is the reminder to add it to `ApiError::samples`.
    fn kind_index(error: &ApiError) -> usize {
        match error {
            ApiError::IdempotencyKeyMissing => 0,
            ApiError::IdempotencyKeyInvalid { .. } => 1,
            ApiError::InvalidRequest { .. } => 2,
            ApiError::Unauthorized => 3,
            ApiError::NotFound => 4,
            ApiError::MethodNotAllowed { .. } => 5,
            ApiError::UnsupportedMediaType { .. } => 6,
            ApiError::PayloadTooLarge { .. } => 7,
            ApiError::RequestInProgress { .. } => 8,
            ApiError::IdempotencyKeyReused => 9,
            ApiError::DownstreamUnavailable { .. } => 10,
            ApiError::DownstreamRejected { .. } => 11,
            ApiError::StoreUnavailable { .. } => 12,
            ApiError::Overloaded { .. } => 13,
            ApiError::RequestTimeout { .. } => 14,
            ApiError::Internal(_) => 15,
            ApiError::ShuttingDown { .. } => 16,
            ApiError::RecordUnreadable => 17,
            ApiError::ResponseNotSaved { .. } => 18,
        }
    }

    #[test]
    fn every_kind_has_a_sample() {
        let samples = ApiError::samples();
        let mut indexes: Vec<usize> = samples.iter().map(kind_index).collect();
        indexes.sort_unstable();
        assert_eq!(indexes, (0..API_ERROR_KINDS).collect::<Vec<_>>());
        let mut codes: Vec<&str> = samples.iter().map(ApiError::code).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), API_ERROR_KINDS, "codes are distinct");
    }

    #[test]
    fn codes_and_statuses_are_the_contract() {
        let cases = [
            (ApiError::IdempotencyKeyMissing, 400, "idempotency_key_missing"),
            (
                ApiError::IdempotencyKeyInvalid { reason: "x".into() },
                400,
                "idempotency_key_invalid",
            ),
            (ApiError::InvalidRequest { detail: "x".into() }, 400, "invalid_request"),
            (ApiError::Unauthorized, 401, "unauthorized"),
            (ApiError::PayloadTooLarge { limit_bytes: 1 }, 413, "payload_too_large"),
            (
                ApiError::RequestInProgress { retry_after_s: 1 },
                409,
                "request_in_progress",
            ),
            (ApiError::IdempotencyKeyReused, 422, "idempotency_key_reused"),
            (
                ApiError::DownstreamUnavailable { retry_after_s: 1 },
                503,
                "downstream_unavailable",
            ),
            (
                ApiError::StoreUnavailable { retry_after_s: 1 },
                503,
                "store_unavailable",
            ),
            (ApiError::Overloaded { retry_after_s: 1 }, 503, "overloaded"),
            (ApiError::ShuttingDown { retry_after_s: 1 }, 503, "shutting_down"),
            (ApiError::RecordUnreadable, 500, "record_unreadable"),
            (
                ApiError::ResponseNotSaved { reason: "x".into() },
                500,
                "response_not_saved",
            ),
        ];
        for (error, status, code) in cases {
            assert_eq!((error.status().as_u16(), error.code()), (status, code));
        }
    }
}
