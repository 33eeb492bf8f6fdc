//! The one error type of the HTTP API, answered as RFC 9457
//! `application/problem+json` with a machine-readable `code`.
//!
//! Internals never reach the client: an internal error ([`ApiError::internal`]) carries its
//! detail in a response extension ([`LoggedError`]) that the request logger
//! (`observe`) writes once, at the edge, and strips from nothing else.

use crate::labels::ORIGINAL_REQUEST_HEADER;
use crate::request_context::RequestId;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use idem_http::IdempotencyError;
use store_core::{InvalidInput, SavedResponse};

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

/// The milliseconds a shed client should wait before retrying, finer than
/// `Retry-After`'s whole seconds: the name Azure's services use for the
/// same hint (`retry-after-ms`). Clients that do not know it read
/// `Retry-After`, which is always sent beside it.
pub const RETRY_AFTER_MS_HEADER: &str = "retry-after-ms";

/// Detail of an error that must be logged but never sent to the client.
#[derive(Debug, Clone)]
pub struct LoggedError(pub String);

/// Every error the API answers. Status codes and `code` strings are the API
/// contract (docs/design.md#status-codes); do not rename them.
///
/// The idempotency layer's answers are [`ApiError::Idempotency`]: idem-http's
/// own error, whose code, status, title and detail are the layer's, so the
/// layer and the API cannot give one kind two faces. The other kinds are the
/// Label service's own.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// Missing or invalid key, body too large, request in progress, key
    /// reused, store unavailable, record unreadable, response not saved,
    /// internal error (the detail of which is logged, never sent).
    #[error(transparent)]
    Idempotency(IdempotencyError),
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
    #[error("the carrier did not give a definite answer; retry with the same key after {retry_after_s} s")]
    DownstreamUnavailable { retry_after_s: u64 },
    #[error("the carrier refused the label ({carrier_status}): {detail}")]
    DownstreamRejected { carrier_status: u16, detail: String },
    #[error("the server is shutting down; retry on another instance")]
    ShuttingDown { retry_after_s: u64 },
    /// `retry_after_ms`: a finer hint than `Retry-After`'s whole seconds,
    /// sent as `Retry-After-Ms` (admission control's sheds: a queue that
    /// still empties is empty again within CoDel's interval, so a client
    /// that waited a whole second would turn a 20 ms stall into a 1 s
    /// delay).
    #[error("too many requests in flight; retry later")]
    Overloaded {
        retry_after_s: u64,
        retry_after_ms: Option<u64>,
    },
    #[error("the request took longer than {limit_ms} ms; retry with the same key after {retry_after_s} s")]
    RequestTimeout { limit_ms: u64, retry_after_s: u64 },
    /// A purchase of the same parcel's label is still running at the
    /// carrier (another key's request, or this key's earlier attempt that
    /// gave up waiting for it): this attempt bought nothing and its lease
    /// is released, so a retry after `Retry-After` (or one sent with
    /// `Prefer: wait`) gets the parcel's one label.
    #[error(
        "a purchase of this parcel's label is still in progress at the carrier (a request with another \
         idempotency key, or an earlier attempt); retry with the same key after {retry_after_s} s (or send \
         Prefer: wait) to get that label"
    )]
    ParcelInProgress { retry_after_s: u64 },
    /// The body did not arrive within `server.body_read_timeout_ms` of the
    /// request's head; nothing was claimed or saved.
    #[error("the request body did not arrive within {limit_ms} ms; nothing was done")]
    BodyTimeout { limit_ms: u64 },
}

/// The body of every error response (RFC 9457): idem-http's, so the
/// layer's answers and the API's own have one shape, byte for byte.
pub use idem_http::Problem;

/// How many kinds of [`ApiError`] there are: the length of
/// [`ApiError::samples`].
pub const API_ERROR_KINDS: usize = 22;

impl ApiError {
    /// An internal error: `detail` is logged, never sent.
    pub fn internal(detail: impl Into<String>) -> Self {
        ApiError::Idempotency(IdempotencyError::Internal(detail.into()))
    }

    /// The store did not answer; the client retries with the same key.
    pub fn store_unavailable(retry_after_s: u64) -> Self {
        ApiError::Idempotency(IdempotencyError::StoreUnavailable { retry_after_s })
    }

    /// One error of every kind, with the details a typical one has: the
    /// examples of the OpenAPI document, and the list of every `code`.
    /// A new kind must be added here; `every_kind_has_a_sample` fails to
    /// compile until its match names it.
    pub fn samples() -> [ApiError; API_ERROR_KINDS] {
        [
            ApiError::Idempotency(IdempotencyError::KeyMissing),
            ApiError::Idempotency(IdempotencyError::KeyInvalid {
                reason: "idempotency key is empty".into(),
            }),
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
            ApiError::Idempotency(IdempotencyError::PayloadTooLarge { limit_bytes: 65_536 }),
            ApiError::Idempotency(IdempotencyError::RequestInProgress { retry_after_s: 1 }),
            ApiError::Idempotency(IdempotencyError::KeyReused),
            ApiError::DownstreamUnavailable { retry_after_s: 1 },
            ApiError::DownstreamRejected {
                carrier_status: 422,
                detail: "weight exceeds the service's limit".into(),
            },
            ApiError::store_unavailable(1),
            ApiError::Overloaded {
                retry_after_s: 1,
                retry_after_ms: Some(100),
            },
            ApiError::RequestTimeout {
                limit_ms: 30_000,
                retry_after_s: 1,
            },
            ApiError::ShuttingDown { retry_after_s: 1 },
            ApiError::Idempotency(IdempotencyError::RecordUnreadable),
            ApiError::Idempotency(IdempotencyError::ResponseNotSaved {
                reason: "the answer is over the saved-response limit".into(),
            }),
            ApiError::internal("not sent"),
            ApiError::Idempotency(IdempotencyError::DeadlineExceeded { retry_after_s: 1 }),
            ApiError::ParcelInProgress { retry_after_s: 1 },
            ApiError::BodyTimeout { limit_ms: 10_000 },
        ]
    }

    /// The sample of the kind with this `code`.
    pub fn sample(code: &str) -> Option<ApiError> {
        Self::samples().into_iter().find(|error| error.code() == code)
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Idempotency(error) => error.status(),
            ApiError::InvalidRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::UnsupportedMediaType { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::DownstreamRejected { .. } => StatusCode::BAD_GATEWAY,
            ApiError::ParcelInProgress { .. } => StatusCode::CONFLICT,
            ApiError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::DownstreamUnavailable { .. }
            | ApiError::ShuttingDown { .. }
            | ApiError::Overloaded { .. }
            | ApiError::RequestTimeout { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The machine-readable code of the problem body.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Idempotency(error) => error.code(),
            ApiError::InvalidRequest { .. } => "invalid_request",
            ApiError::Unauthorized => "unauthorized",
            ApiError::NotFound => "not_found",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::UnsupportedMediaType { .. } => "unsupported_media_type",
            ApiError::DownstreamUnavailable { .. } => "downstream_unavailable",
            ApiError::DownstreamRejected { .. } => "downstream_rejected",
            ApiError::ShuttingDown { .. } => "shutting_down",
            ApiError::Overloaded { .. } => "overloaded",
            ApiError::RequestTimeout { .. } => "request_timeout",
            ApiError::ParcelInProgress { .. } => "parcel_in_progress",
            ApiError::BodyTimeout { .. } => "body_timeout",
        }
    }

    /// The `outcome` metric label: the layer's names for its kinds, the
    /// code for the others.
    pub fn outcome(&self) -> &'static str {
        match self {
            ApiError::Idempotency(error) => error.outcome(),
            other => other.code(),
        }
    }

    fn title(&self) -> &'static str {
        match self {
            ApiError::Idempotency(error) => error.title(),
            ApiError::InvalidRequest { .. } => "Invalid request",
            ApiError::Unauthorized => "Unauthorized",
            ApiError::NotFound => "Not found",
            ApiError::MethodNotAllowed { .. } => "Method not allowed",
            ApiError::UnsupportedMediaType { .. } => "Unsupported media type",
            ApiError::DownstreamUnavailable { .. } => "Carrier unavailable",
            ApiError::DownstreamRejected { .. } => "Carrier rejected the label",
            ApiError::ShuttingDown { .. } => "Shutting down",
            ApiError::Overloaded { .. } => "Overloaded",
            ApiError::RequestTimeout { .. } => "Request timeout",
            ApiError::ParcelInProgress { .. } => "Parcel in progress",
            ApiError::BodyTimeout { .. } => "Body timeout",
        }
    }

    /// Seconds for the `Retry-After` header, for the errors that carry one.
    pub fn retry_after_s(&self) -> Option<u64> {
        match self {
            ApiError::Idempotency(error) => error.retry_after_s(),
            ApiError::DownstreamUnavailable { retry_after_s }
            | ApiError::ShuttingDown { retry_after_s }
            | ApiError::Overloaded { retry_after_s, .. }
            | ApiError::ParcelInProgress { retry_after_s }
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
            ApiError::Idempotency(IdempotencyError::StoreUnavailable { .. })
            | ApiError::DownstreamUnavailable { .. }
            | ApiError::ShuttingDown { .. }
            | ApiError::Overloaded { .. }
            | ApiError::RequestTimeout { .. }
            | ApiError::ParcelInProgress { .. }
            | ApiError::BodyTimeout { .. }
            | ApiError::Idempotency(IdempotencyError::DeadlineExceeded { .. }) => Disposition::Release,
            _ => Disposition::Save,
        }
    }

    pub fn problem(&self) -> Problem {
        let detail = match self {
            ApiError::Idempotency(error) => error.public_detail(),
            other => other.to_string(),
        };
        Problem::new(self.code(), self.title(), self.status(), detail)
    }

    /// The serialized problem body.
    pub fn body_bytes(&self) -> Vec<u8> {
        self.problem().to_bytes()
    }

    /// This problem as a saved response, for a handler that saves it as
    /// its definitive answer, with the request id of the attempt that
    /// completes the record (`labels::ORIGINAL_REQUEST_HEADER`).
    pub fn saved(&self, completed_by: &RequestId) -> Result<SavedResponse, InvalidInput> {
        let problem = idem_http::saved::problem_saved(self.status(), self.body_bytes())?;
        let mut headers = problem.headers().to_vec();
        headers.push((ORIGINAL_REQUEST_HEADER.to_owned(), completed_by.as_str().to_owned()));
        SavedResponse::new(problem.status(), headers, problem.body().to_vec())
    }
}

/// The idempotency layer's errors are API errors: the layer renders them
/// through this, so its answers are the API's (docs/design.md#status-codes).
/// An unreadable body is the API's `invalid_request`, as any bad body is.
impl From<IdempotencyError> for ApiError {
    fn from(error: IdempotencyError) -> Self {
        match error {
            body_unreadable @ IdempotencyError::BodyUnreadable { .. } => ApiError::InvalidRequest {
                detail: body_unreadable.to_string(),
            },
            other => ApiError::Idempotency(other),
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
        if let ApiError::Overloaded {
            retry_after_ms: Some(milliseconds),
            ..
        } = self
        {
            headers.insert(RETRY_AFTER_MS_HEADER, HeaderValue::from(milliseconds));
        }
        if matches!(self, ApiError::Unauthorized) {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        let extensions = response.extensions_mut();
        extensions.insert(Outcome(self.outcome()));
        extensions.insert(self.disposition());
        if let ApiError::Idempotency(IdempotencyError::Internal(detail)) = self {
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
        let error = ApiError::internal("disk on fire at /var/lib/idem");
        let body = String::from_utf8(error.body_bytes()).unwrap();
        assert!(!body.contains("disk on fire"), "{body}");
        assert!(body.contains("\"code\":\"internal_error\""), "{body}");
    }

    /// Names every kind: a new one does not compile until it is named
    /// here, which is the reminder to add it to `ApiError::samples`.
    fn kind_index(error: &ApiError) -> usize {
        match error {
            ApiError::Idempotency(IdempotencyError::KeyMissing) => 0,
            ApiError::Idempotency(IdempotencyError::KeyInvalid { .. }) => 1,
            ApiError::InvalidRequest { .. } => 2,
            ApiError::Unauthorized => 3,
            ApiError::NotFound => 4,
            ApiError::MethodNotAllowed { .. } => 5,
            ApiError::UnsupportedMediaType { .. } => 6,
            ApiError::Idempotency(IdempotencyError::PayloadTooLarge { .. }) => 7,
            ApiError::Idempotency(IdempotencyError::RequestInProgress { .. }) => 8,
            ApiError::Idempotency(IdempotencyError::KeyReused) => 9,
            ApiError::DownstreamUnavailable { .. } => 10,
            ApiError::DownstreamRejected { .. } => 11,
            ApiError::Idempotency(IdempotencyError::StoreUnavailable { .. }) => 12,
            ApiError::Overloaded { .. } => 13,
            ApiError::RequestTimeout { .. } => 14,
            ApiError::Idempotency(IdempotencyError::Internal(_)) => 15,
            ApiError::ShuttingDown { .. } => 16,
            ApiError::Idempotency(IdempotencyError::RecordUnreadable) => 17,
            ApiError::Idempotency(IdempotencyError::ResponseNotSaved { .. }) => 18,
            ApiError::Idempotency(IdempotencyError::DeadlineExceeded { .. }) => 19,
            ApiError::ParcelInProgress { .. } => 20,
            ApiError::BodyTimeout { .. } => 21,
            // The layer turns an unreadable body into `InvalidRequest`
            // (`From<IdempotencyError>`); it is never an `ApiError` itself.
            ApiError::Idempotency(IdempotencyError::BodyUnreadable { .. }) => usize::MAX,
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
            (
                ApiError::from(IdempotencyError::KeyMissing),
                400,
                "idempotency_key_missing",
            ),
            (
                ApiError::from(IdempotencyError::KeyInvalid { reason: "x".into() }),
                400,
                "idempotency_key_invalid",
            ),
            (ApiError::InvalidRequest { detail: "x".into() }, 400, "invalid_request"),
            (ApiError::Unauthorized, 401, "unauthorized"),
            (
                ApiError::from(IdempotencyError::PayloadTooLarge { limit_bytes: 1 }),
                413,
                "payload_too_large",
            ),
            (
                ApiError::from(IdempotencyError::RequestInProgress { retry_after_s: 1 }),
                409,
                "request_in_progress",
            ),
            (
                ApiError::from(IdempotencyError::KeyReused),
                422,
                "idempotency_key_reused",
            ),
            (
                ApiError::DownstreamUnavailable { retry_after_s: 1 },
                503,
                "downstream_unavailable",
            ),
            (ApiError::store_unavailable(1), 503, "store_unavailable"),
            (
                ApiError::Overloaded {
                    retry_after_s: 1,
                    retry_after_ms: None,
                },
                503,
                "overloaded",
            ),
            (
                ApiError::from(IdempotencyError::DeadlineExceeded { retry_after_s: 1 }),
                503,
                "deadline_exceeded",
            ),
            (ApiError::ShuttingDown { retry_after_s: 1 }, 503, "shutting_down"),
            (
                ApiError::from(IdempotencyError::RecordUnreadable),
                500,
                "record_unreadable",
            ),
            (
                ApiError::from(IdempotencyError::ResponseNotSaved { reason: "x".into() }),
                500,
                "response_not_saved",
            ),
        ];
        for (error, status, code) in cases {
            assert_eq!((error.status().as_u16(), error.code()), (status, code));
        }
    }
}
