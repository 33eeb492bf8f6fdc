//! `POST /v1/labels` and `GET /v1/labels/{label_id}`.
//!
//! Creating a label is the two-transaction algorithm (docs/design.md#two-transactions) on the handler-level API: the
//! idempotency layer has claimed the key (transaction 1); the handler
//! validates (abandoning the key on failure), asks the carrier with the
//! derived key between the transactions, and commits the label with the
//! record (transaction 2). An unknown carrier outcome releases the lease.

use super::{CreateLabelRequest, Label, StoredLabel};
use crate::admission::WorkerSeat;
use crate::auth::Caller;
use crate::carrier::{CarrierLabel, CarrierLabelRequest, CarrierOutcome, carrier_key};
use crate::error::{ApiError, Outcome, Problem};
use crate::failpoints;
use crate::idempotency::Attempt;
use crate::metrics::LABELS_EXISTING_TOTAL;
use crate::request_context::{RequestContext, RequestId};
use crate::state::AppState;
use crate::time::{now_ms, rfc3339_from_ms};
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use idem_http::{DEADLINE_EXCEEDED_RETRY_AFTER_S, IdempotencyError, RequestDeadline, prefer_wait_seconds};
use std::time::Duration;
use store_core::HeldLease;
use tokio::time::Instant;

/// Pause between two asks to the carrier while another request for the
/// same parcel (another key) is buying it and the client asked to wait
/// (`Prefer: wait`). The carrier answers such an ask at once (its 409 for
/// a key in progress, or the label it sold), so a wait costs one small
/// call per pause.
pub const PARCEL_IN_PROGRESS_POLL_MS: u64 = 200;

/// Create a shipping label, once per idempotency key.
///
/// A client may send `Request-Timeout-Ms: N`, the milliseconds it will
/// still wait for this answer (1 to 3600000, counted from when it sends, as
/// Envoy's `x-envoy-expected-rq-timeout-ms`). The server then starts no work
/// past it: a request still queued for a worker, or not yet claimed, gets 503
/// `deadline_exceeded` and leaves no record; a claimed one releases its key
/// rather than start (or wait out) the carrier call. A malformed value is 400
/// `invalid_request`. Without it, the server's own request timeout applies,
/// and work it cuts off is finished and saved for the retry.
#[utoipa::path(
    post,
    path = "/v1/labels",
    tag = "labels",
    security(("bearer" = [])),
    params(
        ("Idempotency-Key" = String, Header,
            description = "One key per intent, 1 to 255 printable ASCII characters, bare or as an RFC 8941 quoted string. Reuse it on every retry of the same request."),
        ("Prefer" = Option<String>, Header,
            description = "RFC 7240. `wait=N`: if an attempt with this key is in progress, wait up to N seconds (at most the server's `prefer_wait_max_s`, 10 by default) for it to end and get its answer, instead of 409 at once. Other preferences, and a malformed `wait`, are ignored.")
    ),
    request_body(content = CreateLabelRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "The label: created now, or replayed (with `Idempotent-Replayed: true`) for a repeat of a completed request.",
            body = Label, content_type = "application/json",
            headers(
                ("Location" = String, description = "`/v1/labels/{label_id}`"),
                ("Idempotent-Replayed" = String, description = "`true` on a replayed answer; absent on the first run."),
                ("Original-Request" = String, description = "The `X-Request-Id` of the attempt that did the work and saved this answer: the same on the first run and every replay (Stripe's convention), so a replay can be traced to that attempt's logs."),
                ("Preference-Applied" = String, description = "`wait=N` when the request waited (`Prefer: wait`) for another attempt with its key; N is the wait granted.")
            )),
        (status = 400, description = "`idempotency_key_missing`, `idempotency_key_invalid`, or `invalid_request` (nothing was saved; the key is free again).",
            body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: no valid bearer token.", body = Problem, content_type = "application/problem+json",
            headers(("WWW-Authenticate" = String, description = "`Bearer`"))),
        (status = 408, description = "`body_timeout`: the body did not arrive within the server's `body_read_timeout_ms` of the request's head (nothing was claimed or saved). Retry with the same key.",
            body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`request_in_progress`: an attempt with this key holds the lease (after the granted wait, with `Prefer: wait`); or `parcel_in_progress`: a purchase of the same parcel's label is still in progress at the carrier (a request with another key, or an earlier attempt; after the granted wait, with `Prefer: wait`), and this attempt bought nothing. Retry with the same key: the retry gets the parcel's one label.",
            body = Problem, content_type = "application/problem+json",
            headers(
                ("Retry-After" = u64, description = "Seconds until the lease ends, rounded up."),
                ("Preference-Applied" = String, description = "`wait=N` when the request waited N seconds first.")
            )),
        (status = 413, description = "`payload_too_large`: the body is over 64 KiB.", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "`unsupported_media_type`: the Content-Type is not `application/json` (nothing was saved).",
            body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`idempotency_key_reused`: same key, different request. Never retry blindly.",
            body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "`internal_error`, `record_unreadable` (the key's stored record cannot be decoded; retrying will not help), or `response_not_saved` (the answer could not be saved; saved as this problem, so a retry gets it again and nothing runs twice).", body = Problem, content_type = "application/problem+json"),
        (status = 502, description = "`downstream_rejected`: the carrier refused the label for good (its 422, a business refusal). Saved and replayed.",
            body = Problem, content_type = "application/problem+json",
            headers(
                ("Original-Request" = String, description = "The `X-Request-Id` of the attempt that saved this answer, as on a 201."),
                ("Idempotent-Replayed" = String, description = "`true` on a replayed answer.")
            )),
        (status = 503, description = "`downstream_unavailable` (the carrier gave no definite or usable answer: a timeout, 5xx, 401, 403, 404, 415, a redirect, a label that does not match the request; the lease was released), `store_unavailable`, `overloaded`, `deadline_exceeded` (the `Request-Timeout-Ms` passed before the work started; nothing was done) or `request_timeout`. Retry with the same key.",
            body = Problem, content_type = "application/problem+json",
            headers(
                ("Retry-After" = u64, description = "Seconds to wait before retrying."),
                ("Retry-After-Ms" = Option<u64>, description = "On `overloaded` from admission control: the milliseconds to wait, finer than `Retry-After`: as long as the admission queue has stood so far, at least CoDel's interval (100 ms, a burst) and at most the whole `Retry-After` (sustained overload).")
            ))
    )
)]
pub async fn create_label(
    State(state): State<AppState>,
    context: RequestContext,
    seat: WorkerSeat,
    deadline: Option<RequestDeadline>,
    headers: HeaderMap,
    attempt: Attempt,
    body: Bytes,
) -> Response {
    failpoints::reached(failpoints::AFTER_CLAIM).await;
    let request = match CreateLabelRequest::parse(&body) {
        Ok(request) => request,
        Err(detail) => {
            return attempt
                .abandon(ApiError::InvalidRequest { detail }.into_response())
                .await;
        }
    };
    let lease = attempt.lease().clone();
    let RequestContext { id: request_id, trace } = context;
    match state.labels.find_for_parcel(&lease.caller, request.parcel()).await {
        Ok(Some(existing)) => {
            // A new key for a parcel that has its label: answer with it,
            // buy nothing (the second line of defence).
            metrics::counter!(LABELS_EXISTING_TOTAL).increment(1);
            let stored = stored_label(&lease, existing);
            return commit(&state, attempt, stored, request_id).await;
        }
        Ok(None) => {}
        Err(error) => {
            return attempt
                .release(ApiError::from(state.idempotency.store_error(&error)).into_response())
                .await;
        }
    }
    // A purchase nobody waits for is not started: the key is free again
    // for the retry at once (docs/design.md#deadlines).
    if deadline.is_some_and(|deadline| deadline.has_passed()) {
        let answer = ApiError::from(IdempotencyError::DeadlineExceeded {
            retry_after_s: DEADLINE_EXCEEDED_RETRY_AFTER_S,
        });
        return attempt.release(answer.into_response()).await;
    }
    let Some(budget) = carrier_budget(&state, &attempt, deadline) else {
        let answer = ApiError::DownstreamUnavailable {
            retry_after_s: state.carrier_retry_after_s,
        };
        return attempt.release(answer.into_response()).await;
    };
    let purchase = Purchase {
        carrier_key: carrier_key(&lease.caller, request.parcel()),
        request: CarrierLabelRequest::from(&request),
        traceparent: trace.traceparent(),
        budget,
        wait: prefer_wait_seconds(&headers)
            .map(|seconds| Duration::from_secs(seconds.min(state.idempotency.wait_cap_s()))),
    };
    // The carrier call needs neither this service's CPU nor its store: the
    // admission worker waits it out elsewhere (docs/design.md#admission).
    // It ends by the client's deadline: an unknown outcome then releases
    // the lease like any other.
    let outcome = seat.set_aside_while(purchase.buy(&state)).await;
    match outcome {
        CarrierOutcome::Purchased { label, .. } => {
            failpoints::reached(failpoints::AFTER_CARRIER).await;
            let stored = stored_label(&lease, label_from_carrier(label, now_ms()));
            commit(&state, attempt, stored, request_id).await
        }
        CarrierOutcome::Rejected { status, detail } => save_rejection(attempt, status, detail, &request_id).await,
        CarrierOutcome::Indeterminate { reason: IN_PROGRESS } => {
            // Not an outage: another purchase of this parcel (another key's
            // request, or an earlier attempt) holds the carrier's key. Say
            // so, with the same Retry-After.
            let answer = ApiError::ParcelInProgress {
                retry_after_s: state.carrier_retry_after_s,
            };
            attempt.release(answer.into_response()).await
        }
        CarrierOutcome::Indeterminate { reason } => {
            tracing::warn!(caller = %lease.caller, reason, "carrier outcome unknown; releasing the lease");
            let answer = ApiError::DownstreamUnavailable {
                retry_after_s: state.carrier_retry_after_s,
            };
            attempt.release(answer.into_response()).await
        }
    }
}

/// What is left of the carrier budget (`carrier.timeout_ms`), counted from
/// the claim, so the steps since (a wait for a worker after `Prefer:
/// wait`, the parcel lookup) are inside it and the call ends while the
/// lease, checked at startup to outlast the budget by a margin, still
/// holds (docs/design.md#lease-outlasts-call); never past the client's
/// deadline. `None` when nothing is left: no call is started.
fn carrier_budget(state: &AppState, attempt: &Attempt, deadline: Option<RequestDeadline>) -> Option<Duration> {
    let since_claim = state.carrier.timeout().saturating_sub(attempt.claimed_at().elapsed());
    let budget = deadline.map_or(since_claim, |deadline| since_claim.min(deadline.remaining()));
    (!budget.is_zero()).then_some(budget)
}

/// The carrier's reason for a purchase another call with the same carrier
/// key is making: for us, another key's request for the same parcel.
const IN_PROGRESS: &str = "in_progress";

/// One label's purchase at the carrier, within its budget.
struct Purchase {
    carrier_key: String,
    request: CarrierLabelRequest,
    traceparent: String,
    budget: Duration,
    /// The wait granted to `Prefer: wait`, if the client asked for one.
    wait: Option<Duration>,
}

impl Purchase {
    /// Buys the label. While the carrier answers that another request for
    /// the parcel is buying it, and the client asked to wait, asks again
    /// every [`PARCEL_IN_PROGRESS_POLL_MS`] until the granted wait or the
    /// budget ends: the carrier's own key then hands back the label the
    /// other request bought, as it would to a retry.
    async fn buy(&self, state: &AppState) -> CarrierOutcome {
        let started = Instant::now();
        let budget_ends = started + self.budget;
        let wait_ends = started + self.wait.unwrap_or(Duration::ZERO);
        loop {
            let outcome = state
                .carrier
                .buy_traced(
                    &self.carrier_key,
                    &self.request,
                    Some(&self.traceparent),
                    Some(budget_ends.saturating_duration_since(Instant::now())),
                )
                .await;
            let next_ask = Instant::now() + Duration::from_millis(PARCEL_IN_PROGRESS_POLL_MS);
            let in_progress = matches!(outcome, CarrierOutcome::Indeterminate { reason: IN_PROGRESS });
            if !in_progress || next_ask >= wait_ends.min(budget_ends) {
                return outcome;
            }
            tokio::time::sleep_until(next_ask).await;
        }
    }
}

/// Transaction 2: the label and the completed record, together.
async fn commit(state: &AppState, attempt: Attempt, stored: StoredLabel, request_id: RequestId) -> Response {
    let labels = state.labels.clone();
    let response = attempt
        .complete_with(|lease| async move { labels.commit(&lease, &stored, &request_id).await })
        .await;
    failpoints::reached(failpoints::AFTER_COMMIT).await;
    response
}

/// A definitive refusal by the carrier is saved and replayed like a label.
async fn save_rejection(attempt: Attempt, carrier_status: u16, detail: String, request_id: &RequestId) -> Response {
    let error = ApiError::DownstreamRejected { carrier_status, detail };
    let saved = match error.saved(request_id) {
        Ok(saved) => saved,
        Err(invalid) => {
            let answer = ApiError::internal(format!("carrier refusal cannot be saved: {invalid}"));
            return attempt.release(answer.into_response()).await;
        }
    };
    let mut response = attempt.complete(saved).await;
    if response.extensions().get::<Outcome>() == Some(&Outcome("failed")) {
        response.extensions_mut().insert(Outcome("downstream_rejected"));
    }
    response
}

fn label_from_carrier(bought: CarrierLabel, now_ms: u64) -> Label {
    Label {
        label_id: bought.carrier_label_id,
        order_id: bought.order_id,
        parcel_no: bought.parcel_no,
        label_version: bought.label_version,
        service: bought.service,
        weight_g: bought.weight_g,
        tracking_no: bought.tracking_no,
        cost_cents: bought.cost_cents,
        created_at: rfc3339_from_ms(now_ms),
    }
}

fn stored_label(lease: &HeldLease, label: Label) -> StoredLabel {
    StoredLabel {
        label,
        caller: lease.caller.as_str().to_owned(),
        created_by_key_sha256: lease.key.digest().to_string(),
    }
}

/// Read one of your labels.
#[utoipa::path(
    get,
    path = "/v1/labels/{label_id}",
    tag = "labels",
    security(("bearer" = [])),
    params(("label_id" = String, Path, description = "The label's id, from the `Location` of its creation.")),
    responses(
        (status = 200, description = "The label.", body = Label, content_type = "application/json"),
        (status = 401, description = "`unauthorized`.", body = Problem, content_type = "application/problem+json",
            headers(("WWW-Authenticate" = String, description = "`Bearer`"))),
        (status = 404, description = "`not_found`: no such label, or it belongs to another caller.",
            body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "`internal_error`, or `record_unreadable` (the key's stored record cannot be decoded; retrying will not help).", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`store_unavailable`, `overloaded`, `deadline_exceeded` (the `Request-Timeout-Ms` passed before a worker was free) or `request_timeout`.",
            body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying.")))
    )
)]
pub async fn get_label(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(label_id): Path<String>,
) -> Result<Response, ApiError> {
    if label_id.is_empty() || label_id.len() > super::LABEL_ID_BYTES_MAX {
        return Err(ApiError::NotFound);
    }
    match state.labels.find_by_id(&caller, &label_id).await {
        Ok(Some(label)) => {
            let mut response = Json(label).into_response();
            response.extensions_mut().insert(Outcome("ok"));
            Ok(response)
        }
        Ok(None) => Err(ApiError::NotFound),
        Err(error) => Err(state.idempotency.store_error(&error).into()),
    }
}
