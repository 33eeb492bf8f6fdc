//! [`IdempotencyLayer`]: idempotency for any axum route.
//!
//! The layer holds only its configuration and the shared [`Idempotency`];
//! the [`IdempotencyService`] wraps the route. Per request it:
//! 1. asks the application who the caller is ([`crate::CallerIdentity`]:
//!    the application's authentication runs outside the layer),
//! 2. reads the `Idempotency-Key` header (400 missing / invalid),
//! 3. reads the body up to the limit (413),
//! 4. fingerprints method, path and body, and claims the key: replay,
//!    409 with `Retry-After`, 422, or 503 when the store is down; a request
//!    with `Prefer: wait=N` that finds the key in progress first waits up to
//!    `min(N, cap)` seconds for the other attempt to end, holding no work
//!    slot meanwhile, and takes one again if it becomes the attempt
//!    (docs/design.md#waiting),
//! 5. runs the route with the [`Attempt`] in the request's extensions, and
//!    finishes the attempt by the route's answer and the layer's
//!    [`FinishPolicy`] unless the route took it (the handler-level API).
//!    Once the route ran, the key is never freed for a second run by
//!    accident: an answer that cannot be saved is replaced by a saved
//!    500 `response_not_saved`; only a transient status releases it.
//!
//! Steps 4 and 5 run in a tracked task of their own, so neither a client
//! hanging up nor a request timeout stops them half-way: not between an
//! effect and its record, and not between a committed claim and the
//! attempt that holds it (a claim cut off there would leave a lease no one
//! holds, answering 409 to every retry until it ran out). Steps 1 to 3 stay
//! in the request's future, bounded by its budget: a client trickling its
//! body holds nothing once the budget runs out. The task holds the request
//! extensions the application named with
//! [`crate::IdempotencyBuilder::hold_during_work`] (a slot under its cap on
//! work in flight) until it ends.

use crate::attempt::{Attempt, PendingAttempt};
use crate::deadline::RequestDeadline;
use crate::error::IdempotencyError;
use crate::idempotency::{Begun, Idempotency, WorkGuard};
use crate::key_header::idempotency_key;
use crate::policy::FinishPolicy;
use crate::prefer::{PREFERENCE_APPLIED_HEADER, prefer_wait_seconds};
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use futures::future::BoxFuture;
use http_body_util::BodyExt;
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use store_core::{CallerId, Fingerprint, IdempotencyKey};
use tokio_util::sync::CancellationToken;
use tower::{Layer, Service, ServiceExt};
use tracing::Instrument;

/// Makes every route it wraps idempotent: per route, the body limit and
/// the [`FinishPolicy`] (which answers are saved).
#[derive(Clone)]
pub struct IdempotencyLayer {
    idempotency: Idempotency,
    body_bytes_max: usize,
    /// Shared, not copied, into each service the layer makes: axum makes
    /// one per request for a handler's layer (`Handler::layer`).
    finish_policy: Arc<FinishPolicy>,
}

impl IdempotencyLayer {
    /// `body_bytes_max`: the largest request body read; larger ones get 413.
    pub fn new(idempotency: Idempotency, body_bytes_max: usize) -> Self {
        Self {
            idempotency,
            body_bytes_max,
            finish_policy: Arc::new(FinishPolicy::default()),
        }
    }

    /// How the attempt is finished by the route's answer (the default:
    /// [`FinishPolicy::default`]).
    pub fn with_finish_policy(mut self, finish_policy: FinishPolicy) -> Self {
        self.finish_policy = Arc::new(finish_policy);
        self
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            idempotency: self.idempotency.clone(),
            body_bytes_max: self.body_bytes_max,
            finish_policy: Arc::clone(&self.finish_policy),
        }
    }
}

/// The route wrapped by an [`IdempotencyLayer`].
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    idempotency: Idempotency,
    body_bytes_max: usize,
    finish_policy: Arc<FinishPolicy>,
}

impl<S> Service<Request> for IdempotencyService<S>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner service is driven with `oneshot` on a clone, which polls
        // its readiness itself.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let inner = self.inner.clone();
        let idempotency = self.idempotency.clone();
        let body_bytes_max = self.body_bytes_max;
        let finish_policy = self.finish_policy.clone();
        Box::pin(async move {
            // Steps 1 to 3 in the request's own future: cut off by the
            // request budget or a hang-up, they leave nothing behind.
            let mut prepared = match prepare(&idempotency, body_bytes_max, request).await {
                Ok(prepared) => prepared,
                Err(error) => return Ok(idempotency.render(error)),
            };
            // The task keeps what the application asked it to hold (its
            // place under a cap on work in flight) until its work is done,
            // even after the client hung up; a waiter drops it while waiting.
            let guards = idempotency.work_guards(prepared.request.extensions_mut());
            // Cancelled when this future ends or is dropped (the client hung
            // up): a waiting task then stops waiting.
            let hung_up = CancellationToken::new();
            let _hang_up_on_drop = hung_up.clone().drop_guard();
            let task_idempotency = idempotency.clone();
            // In the request's span, so its log lines carry the request id.
            let task = idempotency.tasks().clone().spawn(
                async move {
                    let idempotency = task_idempotency;
                    let (claimed, applied_wait_s, _guards) = claim(&idempotency, prepared, guards, hung_up).await;
                    let mut response = match claimed {
                        Ok(Claimed::Run(claimed)) => {
                            let (attempt, request) = *claimed;
                            // A waiter that became the attempt waited too.
                            // The header is added after the answer was
                            // saved: it describes this exchange, and a
                            // replay does not carry it.
                            run_route(attempt, inner, request, &finish_policy).await
                        }
                        Ok(Claimed::Answer(response)) => response,
                        Err(error) => idempotency.render(error),
                    };
                    if let Some(seconds) = applied_wait_s
                        && let Ok(applied) = HeaderValue::try_from(format!("wait={seconds}"))
                    {
                        response.headers_mut().insert(PREFERENCE_APPLIED_HEADER, applied);
                    }
                    response
                }
                .instrument(tracing::Span::current()),
            );
            Ok(match task.await {
                Ok(response) => response,
                Err(error) => idempotency.render(IdempotencyError::Internal(format!(
                    "the request's task failed: {error}"
                ))),
            })
        })
    }
}

/// A request read whole and fingerprinted, ready to claim its key.
struct Prepared {
    caller: CallerId,
    key: IdempotencyKey,
    fingerprint: Fingerprint,
    /// The request again, its body now the bytes read.
    request: Request,
    /// Seconds its `Prefer: wait=N` asked to wait, if it asked.
    wait_s: Option<u64>,
}

enum Claimed {
    /// Boxed: the attempt and the request are large, and this is built once per request.
    Run(Box<(Attempt, Request)>),
    /// Answered without running the route: a replay, or a waiter that
    /// became the attempt but was refused a work slot.
    Answer(Response),
}

/// Steps 1 to 3: the caller, the key, the bounded body and the fingerprint.
async fn prepare(
    idempotency: &Idempotency,
    body_bytes_max: usize,
    request: Request,
) -> Result<Prepared, IdempotencyError> {
    let (parts, body) = request.into_parts();
    let Some(caller) = idempotency.caller_of(&parts) else {
        return Err(IdempotencyError::Internal(
            "IdempotencyLayer found no caller: the application's authentication must run before it".into(),
        ));
    };
    let key = idempotency_key(&parts.headers)?;
    let bytes = read_body(&parts.headers, body, body_bytes_max).await?;
    let fingerprint = Fingerprint::of_request(parts.method.as_str(), parts.uri.path(), &bytes);
    let wait_s = prefer_wait_seconds(&parts.headers);
    Ok(Prepared {
        caller,
        key,
        fingerprint,
        request: Request::from_parts(parts, Body::from(bytes)),
        wait_s,
    })
}

/// The work guards a task holds; emptied while it waits.
type WorkGuards = Vec<WorkGuard>;

/// Step 4: claim the key, waiting if the request asked to. Gives back the
/// wait applied (for `Preference-Applied`) and the guards held for the
/// route: those of the request when it did not wait; when it waited (and
/// held none meanwhile: docs/design.md#waiting), those it took again on
/// becoming the attempt ([`regain_work_guards`]).
async fn claim(
    idempotency: &Idempotency,
    prepared: Prepared,
    guards: WorkGuards,
    hung_up: CancellationToken,
) -> (Result<Claimed, IdempotencyError>, Option<u64>, WorkGuards) {
    let Prepared {
        caller,
        key,
        fingerprint,
        request,
        wait_s,
    } = prepared;
    // No work is started for a client that has stopped waiting: not even
    // the claim (docs/design.md#deadlines).
    let deadline = request.extensions().get::<RequestDeadline>().copied();
    if deadline.is_some_and(|deadline| deadline.has_passed()) {
        return (Err(deadline_exceeded()), None, guards);
    }
    let claimed = |begun: Begun| match begun {
        Begun::Replay(response) => Claimed::Answer(response),
        Begun::Acquired(attempt) => Claimed::Run(Box::new((attempt, request))),
    };
    let Some(wait_s) = wait_s else {
        return (
            idempotency.begin(caller, key, fingerprint).await.map(claimed),
            None,
            guards,
        );
    };
    let mut guards = Some(guards);
    let waited = idempotency
        .begin_waiting(
            caller,
            key,
            fingerprint,
            wait_s,
            || drop(guards.take()),
            hung_up.cancelled_owned(),
        )
        .await;
    let claimed = waited.begun.map(claimed);
    let (claimed, guards) = match guards {
        Some(guards) => (claimed, guards),
        None => regain_work_guards(idempotency, claimed).await,
    };
    (claimed, waited.applied_wait_s, guards)
}

/// A waiter gave its work guards up while it waited; one that became the
/// attempt takes them again before the route runs, so no work runs outside
/// the application's cap on it. Refused, it releases the key it claimed
/// (the next waiter or retry takes over at once) and answers with the
/// refusal.
async fn regain_work_guards(
    idempotency: &Idempotency,
    claimed: Result<Claimed, IdempotencyError>,
) -> (Result<Claimed, IdempotencyError>, WorkGuards) {
    let run = match claimed {
        Ok(Claimed::Run(run)) => run,
        answered => return (answered, WorkGuards::new()),
    };
    let (attempt, request) = *run;
    // The wait may have outlasted the client: then the key goes to the next
    // waiter or retry at once, and nothing runs for this one.
    let deadline = request.extensions().get::<RequestDeadline>().copied();
    if deadline.is_some_and(|deadline| deadline.has_passed()) {
        let answer = attempt.release(idempotency.render(deadline_exceeded())).await;
        return (Ok(Claimed::Answer(answer)), WorkGuards::new());
    }
    match idempotency.regain_work_guards(request.extensions()).await {
        Ok(guards) => (Ok(Claimed::Run(Box::new((attempt, request)))), guards),
        Err(refusal) => (Ok(Claimed::Answer(attempt.release(refusal).await)), WorkGuards::new()),
    }
}

/// The answer to a request whose deadline passed before its work started:
/// its client has given up, so the `Retry-After` only paces a client that
/// has not.
fn deadline_exceeded() -> IdempotencyError {
    IdempotencyError::DeadlineExceeded {
        retry_after_s: DEADLINE_EXCEEDED_RETRY_AFTER_S,
    }
}

/// `Retry-After` of a `deadline_exceeded` answer.
pub const DEADLINE_EXCEEDED_RETRY_AFTER_S: u64 = 1;

/// Most bytes of an oversized body read and discarded before answering 413.
/// A server that answers without reading the body closes the connection
/// under the client's feet, and most clients then report a broken pipe
/// instead of the 413; draining a bounded amount lets them read the answer.
pub const BODY_DRAIN_BYTES_MAX: usize = 1024 * 1024;
/// Longest time spent draining an oversized body.
pub const BODY_DRAIN_MS_MAX: u64 = 1_000;

/// Reads the whole body, refusing more than `limit` bytes with 413. The
/// layer's own step 3; public for an application that reads the body
/// earlier, under a deadline of its own, and hands the layer the bytes.
pub async fn read_body(
    headers: &HeaderMap,
    mut body: Body,
    limit: usize,
) -> Result<axum::body::Bytes, IdempotencyError> {
    let too_large = IdempotencyError::PayloadTooLarge { limit_bytes: limit };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        if declared.is_some_and(|length| length <= BODY_DRAIN_BYTES_MAX as u64) {
            drain(body, 0).await;
        }
        return Err(too_large);
    }
    let mut collected = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| IdempotencyError::BodyUnreadable {
            reason: error.to_string(),
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if collected.len() + data.len() > limit {
            drain(body, collected.len() + data.len()).await;
            return Err(too_large);
        }
        collected.extend_from_slice(&data);
    }
    Ok(collected.into())
}

/// Reads and discards the rest of a body, up to the drain limits.
async fn drain(mut body: Body, already_read: usize) {
    let discard = async {
        let mut read = already_read;
        while read <= BODY_DRAIN_BYTES_MAX {
            match body.frame().await {
                Some(Ok(frame)) => read += frame.data_ref().map_or(0, |data| data.len()),
                _ => return,
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_millis(BODY_DRAIN_MS_MAX), discard).await;
}

/// Step 5: the route, then the attempt finished by its answer unless the
/// route took the attempt itself.
async fn run_route<S>(attempt: Attempt, inner: S, mut request: Request, finish_policy: &FinishPolicy) -> Response
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    let pending = PendingAttempt::new(attempt);
    request.extensions_mut().insert(pending.clone());
    let response = match inner.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    match pending.take() {
        Some(attempt) => attempt.finish(response, finish_policy).await,
        None => response,
    }
}
