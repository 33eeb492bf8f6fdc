//! The request's deadline: how long its client will still wait for the
//! answer, so that no work is started for a client that has given up
//! (docs/design.md#deadlines).
//!
//! The client sends the milliseconds it will still wait in
//! `Request-Timeout-Ms`, relative to when it sends the request, as Envoy's
//! `x-envoy-expected-rq-timeout-ms` does (a relative time needs no clock
//! agreement between client and server; gRPC's `grpc-timeout` is relative
//! for the same reason). The application turns it into a
//! [`RequestDeadline`] in the request's extensions (capped by its own
//! request budget); the layer then refuses to claim a key for a request
//! whose deadline has passed (503 `deadline_exceeded`), and a route reads
//! the deadline through the extractor before each step that starts work
//! elsewhere.

use axum::http::HeaderMap;
use axum::http::request::Parts;
use std::time::Duration;
use tokio::time::Instant;

/// The request header: the milliseconds the client will still wait.
pub const REQUEST_TIMEOUT_MS_HEADER: &str = "request-timeout-ms";
/// Largest value accepted (an hour): longer budgets are the application's
/// own request timeout's business, and a bounded number keeps the
/// arithmetic on instants safe.
pub const REQUEST_TIMEOUT_MS_MAX: u64 = 3_600_000;
/// Most bytes of the header's value read; longer is refused.
pub const REQUEST_TIMEOUT_HEADER_BYTES_MAX: usize = 16;

/// Why a `Request-Timeout-Ms` header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the Request-Timeout-Ms header must be one whole number of milliseconds from 1 to {REQUEST_TIMEOUT_MS_MAX}: {reason}"
)]
pub struct RequestTimeoutInvalid {
    /// What was wrong with it.
    pub reason: &'static str,
}

/// The milliseconds the request's `Request-Timeout-Ms` asks for, if it
/// carries the header: one header, ASCII digits only, 1 to
/// [`REQUEST_TIMEOUT_MS_MAX`].
pub fn request_timeout_ms(headers: &HeaderMap) -> Result<Option<u64>, RequestTimeoutInvalid> {
    let mut values = headers.get_all(REQUEST_TIMEOUT_MS_HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(RequestTimeoutInvalid { reason: "sent twice" });
    }
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > REQUEST_TIMEOUT_HEADER_BYTES_MAX || !bytes.iter().all(u8::is_ascii_digit) {
        return Err(RequestTimeoutInvalid {
            reason: "not a number of milliseconds",
        });
    }
    let milliseconds = std::str::from_utf8(bytes)
        .ok()
        .and_then(|text| text.parse::<u64>().ok())
        .ok_or(RequestTimeoutInvalid {
            reason: "not a number of milliseconds",
        })?;
    if milliseconds == 0 || milliseconds > REQUEST_TIMEOUT_MS_MAX {
        return Err(RequestTimeoutInvalid { reason: "out of range" });
    }
    Ok(Some(milliseconds))
}

/// When the request's client stops waiting, in the request's extensions.
/// Read it with the extractor: a request without one has no deadline
/// beyond the application's own timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestDeadline(pub Instant);

impl RequestDeadline {
    /// The deadline `timeout` from `now`.
    pub fn after(now: Instant, timeout: Duration) -> Self {
        Self(now + timeout)
    }

    /// Whether the client has stopped waiting.
    pub fn has_passed(&self) -> bool {
        self.remaining().is_zero()
    }

    /// The time the client will still wait (zero once passed).
    pub fn remaining(&self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }
}

/// The request's deadline, if it has one: never refuses.
impl<S: Send + Sync> axum::extract::OptionalFromRequestParts<S> for RequestDeadline {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<RequestDeadline>().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(REQUEST_TIMEOUT_MS_HEADER, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn a_whole_number_of_milliseconds_in_range_is_read_and_anything_else_refused() {
        assert_eq!(request_timeout_ms(&headers(&[])), Ok(None));
        assert_eq!(request_timeout_ms(&headers(&["250"])), Ok(Some(250)));
        assert_eq!(
            request_timeout_ms(&headers(&["3600000"])),
            Ok(Some(REQUEST_TIMEOUT_MS_MAX))
        );
        for refused in ["0", "3600001", "", "-5", "2.5", "250ms", " 250", "99999999999999999999"] {
            assert!(
                request_timeout_ms(&headers(&[refused])).is_err(),
                "{refused:?} must be refused"
            );
        }
        assert_eq!(
            request_timeout_ms(&headers(&["250", "250"])),
            Err(RequestTimeoutInvalid { reason: "sent twice" })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_passes_when_its_time_has_gone_by() {
        let deadline = RequestDeadline::after(Instant::now(), Duration::from_millis(250));
        assert!(!deadline.has_passed());
        assert_eq!(deadline.remaining(), Duration::from_millis(250));
        tokio::time::advance(Duration::from_millis(250)).await;
        assert!(deadline.has_passed());
        assert_eq!(deadline.remaining(), Duration::ZERO);
    }
}
