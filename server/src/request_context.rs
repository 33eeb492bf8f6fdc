//! The outermost middleware: a request id on every answer and in the span
//! of every log line the request writes, and the W3C trace context the
//! carrier call carries on.
//!
//! - `x-request-id`: the caller's, when it is 1 to [`REQUEST_ID_BYTES_MAX`]
//!   bytes of letters, digits and `.`, `_`, `:`, `-` (anything else would
//!   let a stranger write what they like into our logs); otherwise 32 random
//!   hex digits. Echoed on the answer.
//! - `traceparent` (W3C Trace Context, version `00`): a valid one is
//!   continued, a new span id under the caller's trace id and flags; an
//!   absent or invalid one starts a new trace. The carrier call sends it on.

use axum::extract::{FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use std::convert::Infallible;
use tracing::Instrument;

/// The request id header, on requests and answers.
pub const REQUEST_ID_HEADER: &str = "x-request-id";
/// Longest incoming request id kept, in bytes.
pub const REQUEST_ID_BYTES_MAX: usize = 64;
/// The W3C Trace Context header.
pub const TRACEPARENT_HEADER: &str = "traceparent";
/// Length of a version-00 `traceparent` value, in bytes.
pub const TRACEPARENT_BYTES: usize = 55;

/// This request's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(String);

impl RequestId {
    /// The caller's id when it is sane, else a new one.
    pub fn from_headers(headers: &HeaderMap) -> Self {
        headers
            .get(REQUEST_ID_HEADER)
            .and_then(|value| value.to_str().ok())
            .filter(|id| is_sane_request_id(id))
            .map_or_else(Self::generate, |id| Self(id.to_owned()))
    }

    /// `id` when it is sane (what `from_headers` keeps), else `None`.
    pub fn new(id: &str) -> Option<Self> {
        is_sane_request_id(id).then(|| Self(id.to_owned()))
    }

    fn generate() -> Self {
        Self(format!("{:032x}", rand::random::<u128>()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn is_sane_request_id(id: &str) -> bool {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-');
    !id.is_empty() && id.len() <= REQUEST_ID_BYTES_MAX && id.bytes().all(allowed)
}

/// The trace this request belongs to, and its own span in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    trace_id: u128,
    span_id: u64,
    flags: u8,
}

impl TraceContext {
    /// Continues the caller's trace when its `traceparent` is valid, else
    /// starts a new one (not sampled: this service records no traces).
    pub fn from_headers(headers: &HeaderMap) -> Self {
        let span_id = nonzero_random_u64();
        match headers
            .get(TRACEPARENT_HEADER)
            .and_then(|value| value.to_str().ok())
            .and_then(parse_traceparent)
        {
            Some((trace_id, flags)) => Self {
                trace_id,
                span_id,
                flags,
            },
            None => Self {
                trace_id: nonzero_random_u128(),
                span_id,
                flags: 0,
            },
        }
    }

    /// The `traceparent` value for a call this request makes.
    pub fn traceparent(&self) -> String {
        format!("00-{:032x}-{:016x}-{:02x}", self.trace_id, self.span_id, self.flags)
    }

    pub fn trace_id_hex(&self) -> String {
        format!("{:032x}", self.trace_id)
    }
}

/// The trace id and flags of a valid `traceparent`: lowercase hex, trace
/// and parent ids not all zero, a version other than `ff`; a later version
/// may append fields after a dash.
fn parse_traceparent(value: &str) -> Option<(u128, u8)> {
    let bytes = value.as_bytes();
    let lower_hex = |part: &[u8]| part.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b));
    if bytes.len() < TRACEPARENT_BYTES || [2, 35, 52].iter().any(|&at| bytes[at] != b'-') {
        return None;
    }
    let (version, trace_id, parent_id, flags) = (&bytes[0..2], &bytes[3..35], &bytes[36..52], &bytes[53..55]);
    let well_formed = [version, trace_id, parent_id, flags].iter().all(|part| lower_hex(part));
    let length_fits = if version == b"00" {
        bytes.len() == TRACEPARENT_BYTES
    } else {
        bytes.len() == TRACEPARENT_BYTES || bytes[TRACEPARENT_BYTES] == b'-'
    };
    if !well_formed || version == b"ff" || !length_fits {
        return None;
    }
    let trace_id = u128::from_str_radix(&value[3..35], 16).ok()?;
    let parent_id = u64::from_str_radix(&value[36..52], 16).ok()?;
    let flags = u8::from_str_radix(&value[53..55], 16).ok()?;
    (trace_id != 0 && parent_id != 0).then_some((trace_id, flags))
}

fn nonzero_random_u64() -> u64 {
    rand::random::<u64>().max(1)
}

fn nonzero_random_u128() -> u128 {
    rand::random::<u128>().max(1)
}

/// The middleware: ids into the request's extensions and a span around
/// everything the request does, the id onto the answer.
pub async fn request_context(mut request: Request, next: Next) -> Response {
    let id = RequestId::from_headers(request.headers());
    let trace = TraceContext::from_headers(request.headers());
    let span = tracing::info_span!("request", request_id = %id.as_str(), trace_id = %trace.trace_id_hex());
    request.extensions_mut().insert(id.clone());
    request.extensions_mut().insert(trace);
    let mut response = next.run(request).instrument(span).await;
    if let Ok(value) = HeaderValue::from_str(id.as_str()) {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    response
}

/// What a handler knows of its request's context: its id and its trace.
#[derive(Debug, Clone)]
pub struct RequestContext {
    pub id: RequestId,
    pub trace: TraceContext,
}

/// From the middleware's extensions; read from the headers (a new id, a new
/// trace where they have none) when the middleware did not run.
impl<S: Send + Sync> FromRequestParts<S> for RequestContext {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let id = parts.extensions.get::<RequestId>().cloned();
        let trace = parts.extensions.get::<TraceContext>().copied();
        Ok(Self {
            id: id.unwrap_or_else(|| RequestId::from_headers(&parts.headers)),
            trace: trace.unwrap_or_else(|| TraceContext::from_headers(&parts.headers)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_are_parsed_by_the_w3c_rules() {
        let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(parse_traceparent(valid), Some((0x4bf92f3577b34da6a3ce929d0e0e4736, 1)));
        assert!(parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later").is_some());
        for invalid in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse_traceparent(invalid), None, "{invalid}");
        }
    }

    #[test]
    fn request_ids_are_bounded_in_length_and_charset() {
        assert!(is_sane_request_id("fulfilment-4711.retry_2:a"));
        assert!(is_sane_request_id(&"a".repeat(REQUEST_ID_BYTES_MAX)));
        assert!(!is_sane_request_id(&"a".repeat(REQUEST_ID_BYTES_MAX + 1)));
        for insane in ["", "a b", "a\tb", "é", "a;b", "a\"b", "a/b"] {
            assert!(!is_sane_request_id(insane), "{insane:?}");
        }
    }
}
