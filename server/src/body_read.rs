//! The request body, read whole before admission, under a deadline of its
//! own (`server.body_read_timeout_ms`).
//!
//! An admission worker stands for work in this service and its store
//! (`admission.rs`), and the idempotency layer reads the body after
//! admission. Left there, a client that sends its head and then its body a
//! byte at a time (on purpose, or on a bad mobile network) would keep a
//! worker for the whole request budget, and a handful of them would leave
//! every other caller 503 `overloaded`. So the body is read here, after
//! authentication (an unknown client makes the server buffer nothing) and
//! before admission: a slow body holds only its connection and its place
//! under the in-flight cap, and for at most its deadline, then gets 408
//! `body_timeout` with nothing claimed. The layer then reads the same
//! bytes from memory. This is what nginx's `client_body_timeout` and
//! buffering the body before proxying do for the servers behind it.
//!
//! Only `POST` bodies are read: the API's other routes take none.

use crate::error::ApiError;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::time::Duration;

/// Default time a client has to send a whole request body, from the end
/// of its head (`body_read.rs`): 64 KiB in 10 s is 6.4 KB/s, which even a
/// poor mobile link sends. The body is read before admission, so a slow
/// one holds its connection and its place under the in-flight cap for at
/// most this long, and never an admission worker.
pub const BODY_READ_TIMEOUT_MS_DEFAULT: u64 = 10_000;

/// Longest body-read timeout accepted.
pub const BODY_READ_TIMEOUT_MS_MAX: u64 = 10 * 60 * 1000;

/// How a body is read before admission.
#[derive(Debug, Clone, Copy)]
pub struct BodyRead {
    /// From the end of the head to the body's last byte.
    pub timeout: Duration,
    /// The largest body read; a larger one is 413.
    pub bytes_max: usize,
}

/// The middleware: reads a `POST` body whole within its deadline, then
/// passes the request on with the bytes read; 408 `body_timeout` past the
/// deadline, and the layer's own 413 or 400 for a body too large or cut.
pub async fn read_body_first(State(read): State<BodyRead>, request: Request, next: Next) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = tokio::time::timeout(read.timeout, idem_http::read_body(&parts.headers, body, read.bytes_max)).await;
    match bytes {
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, Body::from(bytes))).await,
        Ok(Err(refused)) => ApiError::from(refused).into_response(),
        Err(_elapsed) => {
            let mut response = ApiError::BodyTimeout {
                limit_ms: read.timeout.as_millis() as u64,
            }
            .into_response();
            // The rest of the body is still on its way: the connection
            // cannot carry another request.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }
    }
}
