//! Routes whose body is JSON refuse any other media type up front: before
//! the idempotency layer claims the key, so a refused request stores nothing
//! and the key stays free for the corrected one.

use crate::error::ApiError;
use axum::extract::Request;
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The media type a JSON route documents and expects.
pub const JSON: &str = "application/json";

/// Middleware: 415 `unsupported_media_type` unless the body is declared JSON.
pub async fn require_json(request: Request, next: Next) -> Response {
    if declares_json(request.headers()) {
        next.run(request).await
    } else {
        ApiError::UnsupportedMediaType { expected: JSON }.into_response()
    }
}

/// `application/json` or a structured `application/...+json` type, any
/// parameters (`charset=utf-8`) and any letter case (RFC 9110 §8.3.1). A
/// missing header is not JSON: the body's type is then unknown.
fn declares_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE).and_then(|value| value.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    let Some(subtype) = essence.strip_prefix("application/") else {
        return false;
    };
    subtype == "json" || (subtype.ends_with("+json") && subtype.len() > "+json".len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with_content_type(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn json_and_structured_json_types_are_json_whatever_their_case_and_parameters() {
        for value in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            "application/json;charset=UTF-8",
            "application/merge-patch+json",
        ] {
            assert!(declares_json(&with_content_type(value)), "{value}");
        }
    }

    #[test]
    fn other_types_and_a_missing_header_are_not_json() {
        for value in [
            "text/plain",
            "application/xml",
            "application/x-www-form-urlencoded",
            "text/json",
            "application/+json",
            "application/jsonp",
            "multipart/form-data; boundary=x",
            "",
        ] {
            assert!(!declares_json(&with_content_type(value)), "{value:?}");
        }
        assert!(!declares_json(&HeaderMap::new()));
    }
}
