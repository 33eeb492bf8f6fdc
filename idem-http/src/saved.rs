//! Saved responses to and from HTTP.
//!
//! A saved response keeps the status, an allow-list of headers and the body.
//! The allow-list holds what describes the result (its type, where it lives,
//! its version); hop-by-hop and per-attempt headers (dates, connection
//! management, Retry-After of a transient error) are not part of the answer.

use crate::error::{Outcome, PROBLEM_JSON};
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use store_core::{InvalidInput, RESPONSE_HEADERS_COUNT_MAX, SavedResponse};

/// The header a replayed answer carries (Stripe's convention).
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// Response headers that are saved with the answer and replayed.
pub const SAVED_HEADERS: &[&str] = &[
    "content-type",
    "content-language",
    "location",
    "etag",
    "last-modified",
    "cache-control",
    "link",
];

/// The allow-listed headers of a response, as a saved response keeps them.
pub fn saved_headers(headers: &HeaderMap) -> Vec<(String, String)> {
    let mut kept = Vec::new();
    for name in SAVED_HEADERS {
        for value in headers.get_all(*name) {
            if let Ok(text) = value.to_str() {
                kept.push(((*name).to_owned(), text.to_owned()));
            }
        }
    }
    kept.truncate(RESPONSE_HEADERS_COUNT_MAX);
    kept
}

/// A saved response from an HTTP response's parts.
pub fn saved_from_parts(status: StatusCode, headers: &HeaderMap, body: Vec<u8>) -> Result<SavedResponse, InvalidInput> {
    SavedResponse::new(status.as_u16(), saved_headers(headers), body)
}

/// A problem (RFC 9457) as a saved response: its status, its media type
/// and its body; for a handler that saves a definitive refusal of its own.
pub fn problem_saved(status: StatusCode, body: Vec<u8>) -> Result<SavedResponse, InvalidInput> {
    SavedResponse::new(
        status.as_u16(),
        vec![("content-type".to_owned(), PROBLEM_JSON.to_owned())],
        body,
    )
}

/// The HTTP response for a saved answer; a replay adds `Idempotent-Replayed: true`.
pub fn response_from_saved(saved: &SavedResponse, replayed: bool) -> Response {
    let mut response = Response::new(Body::from(saved.body().to_vec()));
    *response.status_mut() = StatusCode::from_u16(saved.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    for (name, value) in saved.headers() {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name.as_str()), HeaderValue::from_str(value)) {
            headers.append(name, value);
        }
    }
    if replayed {
        headers.insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
        response.extensions_mut().insert(Outcome("replayed"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::header;

    #[test]
    fn only_allow_listed_headers_are_saved_and_replays_are_marked() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(header::LOCATION, HeaderValue::from_static("/v1/labels/L1"));
        headers.insert(header::DATE, HeaderValue::from_static("Tue, 01 Sep 2026 00:00:00 GMT"));
        headers.insert(header::RETRY_AFTER, HeaderValue::from_static("3"));
        let saved = saved_from_parts(StatusCode::CREATED, &headers, b"{}".to_vec()).unwrap();
        assert_eq!(
            saved.headers(),
            &[
                ("content-type".to_owned(), "application/json".to_owned()),
                ("location".to_owned(), "/v1/labels/L1".to_owned())
            ]
        );
        let first = response_from_saved(&saved, false);
        assert!(first.headers().get(REPLAYED_HEADER).is_none());
        let replay = response_from_saved(&saved, true);
        assert_eq!(replay.status(), StatusCode::CREATED);
        assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
        assert_eq!(replay.headers()[header::LOCATION], "/v1/labels/L1");
    }
}
