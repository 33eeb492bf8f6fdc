//! The one error type of the HTTP API, answered as RFC 9457
//! `application/problem+json` with a machine-readable `code`.
//!
//! Internals never reach the client: an [`ApiError::Internal`] carries its
//! detail in a response extension ([`LoggedError`]) that the request logger
//! (`observe`) writes once, at the edge, and strips from nothing else.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use idem_http::IdempotencyError;
use serde::Serialize;
use store_core::{InvalidInput, SavedResponse};
use utoipa::ToSchema;

/// Media type of every error body; `Retry-After` rounding. Both are
/// idem-http's, so the layer's answers and the API's agree.
pub use idem_http::{PROBLEM_JSON, retry_after_seconds};

/// How a response should be counted and logged: the `outcome` label of
/// `idem_http_requests_total`. Set by whoever makes the response; the
/// idempotency layer sets it on the answers it makes or finishes.
pub use idem_http::Outcome;

/// What the idempotency layer does with the key once the route answered;
/// every [`ApiError`] carries one.
pub use idem_http::Disposition;

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

    /// This problem as a saved response, for a handler that saves it as
    /// its definitive answer.
    pub fn saved(&self) -> Result<SavedResponse, InvalidInput> {
        idem_http::saved::problem_saved(self.status(), self.body_bytes())
    }
}

/// The idempotency layer's errors are API errors of the same `code`,
/// status and detail: the layer renders them through this, so its answers
/// are the API's (docs/design.md#status-codes).
impl From<IdempotencyError> for ApiError {
    fn from(error: IdempotencyError) -> Self {
        match error {
            IdempotencyError::KeyMissing => ApiError::IdempotencyKeyMissing,
            IdempotencyError::KeyInvalid { reason } => ApiError::IdempotencyKeyInvalid { reason },
            body_unreadable @ IdempotencyError::BodyUnreadable { .. } => ApiError::InvalidRequest {
                detail: body_unreadable.to_string(),
            },
            IdempotencyError::PayloadTooLarge { limit_bytes } => ApiError::PayloadTooLarge { limit_bytes },
            IdempotencyError::RequestInProgress { retry_after_s } => ApiError::RequestInProgress { retry_after_s },
            IdempotencyError::KeyReused => ApiError::IdempotencyKeyReused,
            IdempotencyError::StoreUnavailable { retry_after_s } => ApiError::StoreUnavailable { retry_after_s },
            IdempotencyError::RecordUnreadable => ApiError::RecordUnreadable,
            IdempotencyError::ResponseNotSaved { reason } => ApiError::ResponseNotSaved { reason },
            IdempotencyError::Internal(detail) => ApiError::Internal(detail),
        }
    }
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

    /// The layer's errors answer as the API's own: same status, code,
    /// outcome label and body, byte for byte, as idem-http's default
    /// rendering would give them.
    #[test]
    fn the_layers_errors_map_to_api_errors_of_the_same_code_and_body() {
        let errors = [
            IdempotencyError::KeyMissing,
            IdempotencyError::KeyInvalid { reason: "x".into() },
            IdempotencyError::BodyUnreadable { reason: "reset".into() },
            IdempotencyError::PayloadTooLarge { limit_bytes: 7 },
            IdempotencyError::RequestInProgress { retry_after_s: 3 },
            IdempotencyError::KeyReused,
            IdempotencyError::StoreUnavailable { retry_after_s: 2 },
            IdempotencyError::RecordUnreadable,
            IdempotencyError::ResponseNotSaved {
                reason: "too big".into(),
            },
            IdempotencyError::Internal("secret".into()),
        ];
        for error in errors {
            let api = ApiError::from(error.clone());
            assert_eq!(
                (api.status(), api.code(), api.outcome(), api.retry_after_s()),
                (error.status(), error.code(), error.outcome(), error.retry_after_s()),
                "{error:?}"
            );
            assert_eq!(api.body_bytes(), error.problem().to_bytes(), "{error:?}");
        }
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
