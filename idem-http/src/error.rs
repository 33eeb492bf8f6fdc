//! [`IdempotencyError`]: every answer the middleware gives on its own, and
//! how it is rendered.
//!
//! Each kind has a stable machine-readable [`IdempotencyError::code`], the
//! HTTP status it maps to (docs/design.md#status-codes) and, where waiting
//! helps, a `Retry-After`. By default an error is rendered as RFC 9457
//! `application/problem+json` ([`ProblemJson`]); an application that has
//! its own error format gives the middleware a [`RenderError`] instead
//! ([`crate::IdempotencyBuilder::render_errors_with`]), so every answer of
//! its API looks the same.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// Media type of a problem body (RFC 9457).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The prefix of every problem `type` the default rendering writes; the
/// error's [`IdempotencyError::code`] follows it.
pub const PROBLEM_TYPE_PREFIX: &str = "urn:idem:problem:";

/// What went wrong, as the middleware answers it. The `code` strings and
/// statuses are a contract: they do not change between versions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdempotencyError {
    /// No `Idempotency-Key` header: 400 `idempotency_key_missing`.
    #[error("the Idempotency-Key header is required")]
    KeyMissing,
    /// The header is not a valid key (see [`crate::key_header`]): 400
    /// `idempotency_key_invalid`.
    #[error("the Idempotency-Key header is not valid: {reason}")]
    KeyInvalid {
        /// Why the value was refused.
        reason: String,
    },
    /// The request body could not be read (the connection failed while
    /// sending it): 400 `invalid_request`.
    #[error("the request body could not be read: {reason}")]
    BodyUnreadable {
        /// What the body reader reported.
        reason: String,
    },
    /// The request body is over the layer's limit: 413 `payload_too_large`.
    #[error("the request body is larger than {limit_bytes} bytes")]
    PayloadTooLarge {
        /// The layer's `body_bytes_max`.
        limit_bytes: usize,
    },
    /// Another attempt with this key holds the lease: 409
    /// `request_in_progress`, with `Retry-After`.
    #[error("another request with this key is in progress; retry with the same key after {retry_after_s} s")]
    RequestInProgress {
        /// Seconds to wait before retrying.
        retry_after_s: u64,
    },
    /// The key was used with a different request (method, path or body):
    /// 422 `idempotency_key_reused`.
    #[error("this key was used with a different request; use a new key for a new request")]
    KeyReused,
    /// The store is unreachable or gave up; a retry may succeed: 503
    /// `store_unavailable`, with `Retry-After`. An outage is never a 500.
    #[error("the idempotency store is unavailable; retry with the same key after {retry_after_s} s")]
    StoreUnavailable {
        /// Seconds to wait before retrying.
        retry_after_s: u64,
    },
    /// The request's deadline ([`crate::RequestDeadline`]) passed before its
    /// work started: nothing was claimed or done. 503 `deadline_exceeded`,
    /// with `Retry-After`; its client has most likely given up already.
    #[error("the request's deadline passed before its work started; nothing was done. Retry with the same key")]
    DeadlineExceeded {
        /// Seconds to wait before retrying.
        retry_after_s: u64,
    },
    /// The stored record of this key cannot be decoded: 500
    /// `record_unreadable`. Retrying will not help until an operator
    /// deletes the record.
    #[error("the stored record of this key is unreadable; the error was logged, and retrying will not help")]
    RecordUnreadable,
    /// The route ran, but its answer could not be saved under the key; this
    /// problem is saved in its place, so a retry never runs the route again:
    /// 500 `response_not_saved`.
    #[error(
        "the request was processed, but its answer could not be saved ({reason}); this key answers with this problem from now on"
    )]
    ResponseNotSaved {
        /// Why the answer could not be saved.
        reason: String,
    },
    /// A failure the client cannot act on (a misconfigured route, a failed
    /// task, a store error that is not an outage): 500 `internal_error`.
    /// The string is for the logs, never for the client.
    #[error("internal error")]
    Internal(String),
}

impl IdempotencyError {
    /// The machine-readable code of the problem body.
    pub fn code(&self) -> &'static str {
        match self {
            IdempotencyError::KeyMissing => "idempotency_key_missing",
            IdempotencyError::KeyInvalid { .. } => "idempotency_key_invalid",
            IdempotencyError::BodyUnreadable { .. } => "invalid_request",
            IdempotencyError::PayloadTooLarge { .. } => "payload_too_large",
            IdempotencyError::RequestInProgress { .. } => "request_in_progress",
            IdempotencyError::KeyReused => "idempotency_key_reused",
            IdempotencyError::StoreUnavailable { .. } => "store_unavailable",
            IdempotencyError::DeadlineExceeded { .. } => "deadline_exceeded",
            IdempotencyError::RecordUnreadable => "record_unreadable",
            IdempotencyError::ResponseNotSaved { .. } => "response_not_saved",
            IdempotencyError::Internal(_) => "internal_error",
        }
    }

    /// The HTTP status this error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            IdempotencyError::KeyMissing
            | IdempotencyError::KeyInvalid { .. }
            | IdempotencyError::BodyUnreadable { .. } => StatusCode::BAD_REQUEST,
            IdempotencyError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            IdempotencyError::RequestInProgress { .. } => StatusCode::CONFLICT,
            IdempotencyError::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            IdempotencyError::StoreUnavailable { .. } | IdempotencyError::DeadlineExceeded { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            IdempotencyError::RecordUnreadable
            | IdempotencyError::ResponseNotSaved { .. }
            | IdempotencyError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Seconds for the `Retry-After` header, for the errors that carry one.
    pub fn retry_after_s(&self) -> Option<u64> {
        match self {
            IdempotencyError::RequestInProgress { retry_after_s }
            | IdempotencyError::StoreUnavailable { retry_after_s }
            | IdempotencyError::DeadlineExceeded { retry_after_s } => Some(*retry_after_s),
            _ => None,
        }
    }

    /// A short, human-readable summary of the kind (the problem's `title`).
    pub fn title(&self) -> &'static str {
        match self {
            IdempotencyError::KeyMissing => "Idempotency-Key missing",
            IdempotencyError::KeyInvalid { .. } => "Idempotency-Key invalid",
            IdempotencyError::BodyUnreadable { .. } => "Invalid request",
            IdempotencyError::PayloadTooLarge { .. } => "Payload too large",
            IdempotencyError::RequestInProgress { .. } => "Request in progress",
            IdempotencyError::KeyReused => "Idempotency-Key reused",
            IdempotencyError::StoreUnavailable { .. } => "Store unavailable",
            IdempotencyError::DeadlineExceeded { .. } => "Deadline exceeded",
            IdempotencyError::RecordUnreadable => "Record unreadable",
            IdempotencyError::ResponseNotSaved { .. } => "Response not saved",
            IdempotencyError::Internal(_) => "Internal error",
        }
    }

    /// The bounded label that names this answer in metrics and logs (the
    /// [`Outcome`] the default rendering attaches).
    pub fn outcome(&self) -> &'static str {
        match self {
            IdempotencyError::KeyMissing => "missing_key",
            IdempotencyError::KeyInvalid { .. } => "invalid_key",
            IdempotencyError::RequestInProgress { .. } => "in_progress",
            IdempotencyError::KeyReused => "mismatch",
            IdempotencyError::StoreUnavailable { .. } => "unavailable",
            other => other.code(),
        }
    }

    /// What the client may read: the message, except for an internal
    /// error, whose detail stays in the logs.
    pub fn public_detail(&self) -> String {
        match self {
            IdempotencyError::Internal(_) => "the server failed to answer; the error was logged".to_owned(),
            other => other.to_string(),
        }
    }

    /// The RFC 9457 problem body of the default rendering.
    pub fn problem(&self) -> Problem {
        Problem::new(self.code(), self.title(), self.status(), self.public_detail())
    }
}

/// `Retry-After` in whole seconds, rounded up and at least 1, from a
/// millisecond duration.
pub fn retry_after_seconds(retry_after_ms: u64) -> u64 {
    retry_after_ms.div_ceil(1_000).max(1)
}

/// An RFC 9457 problem body, as the default rendering writes it. An
/// application whose own errors are problems too builds them with
/// [`Problem::new`], so its answers and the middleware's have one shape;
/// with the `openapi` feature the type is also its OpenAPI schema
/// (`utoipa::ToSchema`, named `Problem`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

impl Problem {
    /// The problem of kind `code` (its `type` is [`PROBLEM_TYPE_PREFIX`]
    /// and the code), answered with `status`.
    pub fn new(code: &str, title: &str, status: StatusCode, detail: String) -> Self {
        Self {
            problem_type: format!("{PROBLEM_TYPE_PREFIX}{code}"),
            title: title.to_owned(),
            status: status.as_u16(),
            detail,
            code: code.to_owned(),
        }
    }

    /// The serialized body.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_else(|_| b"{}".to_vec())
    }
}

/// How a response is counted and logged: a bounded label (`created`,
/// `replayed`, `failed`, `lease_lost`, or an error's
/// [`IdempotencyError::outcome`]) the middleware puts in the extensions of
/// every response it makes or finishes. An application's request logger
/// or metrics middleware reads it; applications may set it on their own
/// responses too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome(pub &'static str);

/// Turns an [`IdempotencyError`] into the HTTP answer. The middleware
/// calls it for every error it answers itself, and for the problem it
/// saves in place of an answer that could not be saved (so the rendering
/// is replayed too: keep its body under the saved-response limit and its
/// headers among [`crate::saved::SAVED_HEADERS`]).
///
/// Any `Fn(IdempotencyError) -> Response` is one.
pub trait RenderError: Send + Sync + 'static {
    /// The response for `error`. Keep [`IdempotencyError::status`] and its
    /// `Retry-After`: clients act on them.
    fn render(&self, error: IdempotencyError) -> Response;
}

impl<F> RenderError for F
where
    F: Fn(IdempotencyError) -> Response + Send + Sync + 'static,
{
    fn render(&self, error: IdempotencyError) -> Response {
        self(error)
    }
}

/// The default rendering: `application/problem+json` with the
/// [`Problem`] body, `Retry-After` where the error has one, and the
/// [`Outcome`] in the response's extensions. An internal error's detail is
/// logged here, once, and never sent.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProblemJson;

impl RenderError for ProblemJson {
    fn render(&self, error: IdempotencyError) -> Response {
        if let IdempotencyError::Internal(detail) = &error {
            tracing::error!(error = %detail, "idempotency middleware: internal error");
        }
        let mut response = (error.status(), error.problem().to_bytes()).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = error.retry_after_s() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response.extensions_mut().insert(Outcome(error.outcome()));
        response
    }
}

/// Rendered with [`ProblemJson`]: where no configured rendering is at hand
/// (the [`crate::Attempt`] extractor's rejection on a route that does not
/// wear the layer).
impl IntoResponse for IdempotencyError {
    fn into_response(self) -> Response {
        ProblemJson.render(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_and_is_at_least_one() {
        assert_eq!(retry_after_seconds(0), 1);
        assert_eq!(retry_after_seconds(1), 1);
        assert_eq!(retry_after_seconds(1_000), 1);
        assert_eq!(retry_after_seconds(1_001), 2);
        assert_eq!(retry_after_seconds(29_999), 30);
    }

    #[test]
    fn codes_statuses_and_retry_after_are_the_contract() {
        let cases = [
            (IdempotencyError::KeyMissing, 400, "idempotency_key_missing", None),
            (
                IdempotencyError::KeyInvalid { reason: "x".into() },
                400,
                "idempotency_key_invalid",
                None,
            ),
            (
                IdempotencyError::BodyUnreadable { reason: "x".into() },
                400,
                "invalid_request",
                None,
            ),
            (
                IdempotencyError::PayloadTooLarge { limit_bytes: 1 },
                413,
                "payload_too_large",
                None,
            ),
            (
                IdempotencyError::RequestInProgress { retry_after_s: 3 },
                409,
                "request_in_progress",
                Some(3),
            ),
            (IdempotencyError::KeyReused, 422, "idempotency_key_reused", None),
            (
                IdempotencyError::StoreUnavailable { retry_after_s: 2 },
                503,
                "store_unavailable",
                Some(2),
            ),
            (
                IdempotencyError::DeadlineExceeded { retry_after_s: 1 },
                503,
                "deadline_exceeded",
                Some(1),
            ),
            (IdempotencyError::RecordUnreadable, 500, "record_unreadable", None),
            (
                IdempotencyError::ResponseNotSaved { reason: "x".into() },
                500,
                "response_not_saved",
                None,
            ),
            (IdempotencyError::Internal("x".into()), 500, "internal_error", None),
        ];
        for (error, status, code, retry_after_s) in cases {
            assert_eq!(
                (error.status().as_u16(), error.code(), error.retry_after_s()),
                (status, code, retry_after_s)
            );
        }
    }

    #[tokio::test]
    async fn the_default_rendering_is_a_problem_with_retry_after_and_no_internal_detail() {
        let response = ProblemJson.render(IdempotencyError::RequestInProgress { retry_after_s: 4 });
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(response.headers()[header::RETRY_AFTER], "4");
        assert_eq!(response.extensions().get::<Outcome>(), Some(&Outcome("in_progress")));
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let problem: Problem = serde_json::from_slice(&body).unwrap();
        assert_eq!(problem.problem_type, "urn:idem:problem:request_in_progress");
        assert_eq!((problem.status, problem.code.as_str()), (409, "request_in_progress"));

        let internal = ProblemJson.render(IdempotencyError::Internal("disk on fire at /var/lib/idem".into()));
        let body = internal.into_body().collect().await.unwrap().to_bytes();
        let body = String::from_utf8(body.to_vec()).unwrap();
        assert!(!body.contains("disk on fire"), "{body}");
        assert!(body.contains("\"code\":\"internal_error\""), "{body}");
    }
}
