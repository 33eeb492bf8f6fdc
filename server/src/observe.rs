//! The outermost middleware: one structured log line and the request
//! metrics per request, labelled by the matched route pattern.
//!
//! It runs before authentication, so a stranger chooses the method and the
//! path: every metric label comes from a fixed set ([`method_label`],
//! [`route_label`]), or each made-up method would be a new series.
//!
//! The line has the caller, the outcome and the latency; never the
//! idempotency key or the body. An internal error's detail, which the client
//! never sees, is logged here, once.

use crate::app::ROUTES;
use crate::auth::Caller;
use crate::error::{LoggedError, Outcome};
use crate::metrics::{HTTP_REQUEST_DURATION_SECONDS, HTTP_REQUESTS_IN_FLIGHT, HTTP_REQUESTS_TOTAL};
use axum::extract::{MatchedPath, Request};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use std::time::Instant;
use store_core::redact::redact_secrets;

/// Route label for requests that matched no route.
pub const UNMATCHED_ROUTE: &str = "unmatched";
/// Method label for any method outside [`STANDARD_METHODS`] (the name
/// OpenTelemetry's HTTP conventions use for the same purpose).
pub const OTHER_METHOD: &str = "_OTHER";
/// The methods of RFC 9110 and PATCH (RFC 5789): the only method labels
/// besides [`OTHER_METHOD`].
pub const STANDARD_METHODS: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::CONNECT,
    Method::OPTIONS,
    Method::TRACE,
    Method::PATCH,
];

/// The metric label of a request method: its name when standard, else
/// [`OTHER_METHOD`].
pub fn method_label(method: &Method) -> &'static str {
    STANDARD_METHODS
        .iter()
        .find(|standard| *standard == method)
        .map_or(OTHER_METHOD, Method::as_str)
}

/// The metric label of a request's route: the pattern it matched, one of
/// the router's own ([`ROUTES`]), else [`UNMATCHED_ROUTE`]; never the raw
/// path. A `&'static str`, so labelling a request allocates nothing.
pub fn route_label(request: &Request) -> &'static str {
    let Some(matched) = request.extensions().get::<MatchedPath>() else {
        return UNMATCHED_ROUTE;
    };
    ROUTES
        .iter()
        .map(|(route, _)| *route)
        .find(|route| *route == matched.as_str())
        .unwrap_or(UNMATCHED_ROUTE)
}

/// Counts a request in flight until dropped, even if the client hangs up.
struct InFlight {
    route: &'static str,
    /// The bounded label, in the log line too: a made-up method is not
    /// worth a stranger's choice of bytes in every line.
    method: &'static str,
    started: Instant,
    finished: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        metrics::gauge!(HTTP_REQUESTS_IN_FLIGHT).decrement(1.0);
        if !self.finished {
            tracing::info!(method = %self.method, route = %self.route, outcome = "cancelled",
                latency_ms = self.started.elapsed().as_millis() as u64, "request cancelled by the client");
            count(self.route, self.method, "499", "cancelled", self.started);
        }
    }
}

fn count(route: &'static str, method: &'static str, status: &str, outcome: &'static str, started: Instant) {
    metrics::counter!(HTTP_REQUESTS_TOTAL, "route" => route, "method" => method,
        "status" => status.to_owned(), "outcome" => outcome)
    .increment(1);
    metrics::histogram!(HTTP_REQUEST_DURATION_SECONDS, "route" => route, "method" => method)
        .record(started.elapsed().as_secs_f64());
}

/// The outcome of a response that did not name one.
fn outcome_by_status(status: StatusCode) -> &'static str {
    match status.as_u16() {
        200..=299 => "ok",
        404 => "not_found",
        405 => "method_not_allowed",
        400..=499 => "client_error",
        _ => "server_error",
    }
}

pub async fn observe(request: Request, next: Next) -> Response {
    metrics::gauge!(HTTP_REQUESTS_IN_FLIGHT).increment(1.0);
    let mut in_flight = InFlight {
        route: route_label(&request),
        method: method_label(request.method()),
        started: Instant::now(),
        finished: false,
    };
    let response = next.run(request).await;
    in_flight.finished = true;
    let status = response.status();
    let outcome = response
        .extensions()
        .get::<Outcome>()
        .map_or_else(|| outcome_by_status(status), |outcome| outcome.0);
    let caller = response
        .extensions()
        .get::<Caller>()
        .map(|Caller(id)| id.as_str().to_owned());
    // Microsecond resolution is plenty for a log line.
    let latency_ms = (in_flight.started.elapsed().as_secs_f64() * 1_000_000.0).round() / 1_000.0;
    let (route, method) = (in_flight.route, in_flight.method);
    match response.extensions().get::<LoggedError>() {
        Some(LoggedError(detail)) => tracing::error!(%method, %route, status = status.as_u16(), outcome,
            caller = caller.as_deref().unwrap_or("-"), latency_ms, error = %redact_secrets(detail), "request"),
        None => tracing::info!(%method, %route, status = status.as_u16(), outcome,
            caller = caller.as_deref().unwrap_or("-"), latency_ms, "request"),
    }
    count(route, method, status.as_str(), outcome, in_flight.started);
    response
}
