//! [`Attempt`]: one request's hold on its key, and the handler-level API.
//!
//! An attempt is finished exactly once, in one of four ways:
//! - [`Attempt::complete_with`]: run a commit that writes the effect and
//!   completes the record in one transaction (docs/design.md#transaction-2);
//! - [`Attempt::complete`]: save an answer that has no effect rows;
//! - [`Attempt::abandon`]: nothing happened (validation failed), delete the record;
//! - [`Attempt::release`]: the outcome is unknown, end the lease now.
//!
//! An attempt dropped unfinished (a handler bug or a panic) releases its
//! lease in the background, so the key is not stuck until the lease expires.

use crate::error::{IdempotencyError, Outcome, retry_after_seconds};
use crate::idempotency::Idempotency;
use crate::metrics::MetricNames;
use crate::policy::{Disposition, FinishPolicy};
use crate::saved::{response_from_saved, saved_from_parts};
use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::Response;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use std::future::Future;
use std::sync::{Arc, Mutex};
use store_core::{
    Acquired, Fenced, Fingerprint, HeldLease, IdempotencyStore, RESPONSE_BODY_BYTES_MAX, RecordState, SavedResponse,
    StoreError,
};

/// One attempt holding the lease on (caller, key).
pub struct Attempt {
    idempotency: Idempotency,
    lease: HeldLease,
    fingerprint: Fingerprint,
    takeover: bool,
    /// When the claim answered: the lease runs from about then, so work
    /// that must end inside it counts its budget from here.
    claimed_at: tokio::time::Instant,
    /// Set by whichever method finished the attempt; checked on drop.
    finished: bool,
}

impl Attempt {
    pub(crate) fn new(idempotency: Idempotency, acquired: Acquired, fingerprint: Fingerprint) -> Self {
        Self {
            idempotency,
            lease: acquired.lease,
            fingerprint,
            takeover: acquired.takeover,
            claimed_at: tokio::time::Instant::now(),
            finished: false,
        }
    }

    /// When the claim that acquired the lease answered. A route that must
    /// finish inside the lease (a call to another service) counts its
    /// budget from here, so the steps between the claim and the call (a
    /// wait for a worker after `Prefer: wait`, a lookup) are inside it.
    pub fn claimed_at(&self) -> tokio::time::Instant {
        self.claimed_at
    }

    /// The lease this attempt holds (caller, key, fencing token).
    pub fn lease(&self) -> &HeldLease {
        &self.lease
    }

    /// True when an earlier attempt's lease expired or was released and this
    /// one took over: the earlier one may have done part of the work.
    pub fn is_takeover(&self) -> bool {
        self.takeover
    }

    /// Runs `commit` (the effect plus the fenced completion, in one
    /// transaction) and answers with the response it saved.
    pub async fn complete_with<F, Fut>(mut self, commit: F) -> Response
    where
        F: FnOnce(HeldLease) -> Fut,
        Fut: Future<Output = Result<Fenced<SavedResponse>, StoreError>>,
    {
        match self.commit(commit).await {
            Ok(saved) => {
                let mut response = response_from_saved(&saved, false);
                let outcome = first_run_outcome(response.status());
                response.extensions_mut().insert(outcome);
                response
            }
            Err(answer) => answer,
        }
    }

    /// Saves `saved` as the answer (no effect rows to commit with it).
    pub async fn complete(self, saved: SavedResponse) -> Response {
        let store = self.idempotency.store().clone();
        self.complete_with(|lease| complete_resending(store, lease, saved))
            .await
    }

    /// Deletes the record (nothing happened, so the key is free again) and
    /// sends `answer`. If the store cannot delete it, the caller is told to
    /// retry: a record left behind would refuse a corrected request as a
    /// reused key.
    pub async fn abandon(mut self, answer: Response) -> Response {
        self.finished = true;
        match self.idempotency.store().abandon(&self.lease).await {
            Ok(Fenced::Applied(())) => answer,
            Ok(Fenced::LeaseLost) => self.answer_lease_lost().await,
            Err(error) => self.idempotency.render(self.idempotency.store_error(&error)),
        }
    }

    /// Ends the lease now, keeping the record, and sends `answer`: the
    /// outcome is unknown, and the caller's retry takes over at once.
    pub async fn release(mut self, answer: Response) -> Response {
        self.finished = true;
        if let Err(error) = self.idempotency.store().release(&self.lease).await {
            // The lease then ends by expiring; the retry meets 409 until then.
            tracing::warn!(%error, caller = %self.lease.caller, "could not release a lease");
        }
        answer
    }

    /// Finishes the attempt by the route's answer, for routes that only
    /// wear the layer: saves it, abandons or releases per `policy` (the
    /// layer calls this when the route left the attempt to it).
    pub async fn finish(self, response: Response, policy: &FinishPolicy) -> Response {
        match policy.disposition(&response) {
            Disposition::Save => self.save(response).await,
            Disposition::Abandon => self.abandon(response).await,
            Disposition::Release => self.release(response).await,
        }
    }

    /// Saves the route's answer and sends it (with every header it had, not
    /// only the saved ones), or the completion's own answer if it failed.
    ///
    /// The route has run, so the key must not be freed: an answer that
    /// cannot be saved (unreadable, over the size limit, a header the store
    /// refuses) is replaced by a 500 `response_not_saved` problem, saved
    /// and replayed like any answer, so a retry never runs the effect again.
    async fn save(mut self, response: Response) -> Response {
        let (mut parts, body) = response.into_parts();
        let bytes = match Limited::new(body, RESPONSE_BODY_BYTES_MAX).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(error) => {
                let reason = if error.is::<LengthLimitError>() {
                    format!("its body is larger than {RESPONSE_BODY_BYTES_MAX} bytes")
                } else {
                    "its body could not be read".to_owned()
                };
                tracing::error!(caller = %self.lease.caller, %error, "the route's answer could not be read for saving");
                return self.save_not_saved(reason).await;
            }
        };
        let saved = match saved_from_parts(parts.status, &parts.headers, bytes.to_vec()) {
            Ok(saved) => saved,
            Err(error) => {
                tracing::error!(caller = %self.lease.caller, %error, "the route's answer cannot be saved");
                return self.save_not_saved(error.to_string()).await;
            }
        };
        let store = self.idempotency.store().clone();
        if let Err(answer) = self.commit(|lease| complete_resending(store, lease, saved)).await {
            return answer;
        }
        if parts.extensions.get::<Outcome>().is_none() {
            parts.extensions.insert(first_run_outcome(parts.status));
        }
        Response::from_parts(parts, Body::from(bytes))
    }

    /// Saves and sends a 500 `response_not_saved` in place of an answer
    /// that could not be saved.
    async fn save_not_saved(mut self, reason: String) -> Response {
        MetricNames::count(self.idempotency.metric_names().responses_not_saved_total());
        let error = IdempotencyError::ResponseNotSaved { reason };
        let outcome = Outcome(error.outcome());
        let saved = match self.rendered_saved(error).await {
            Ok(saved) => saved,
            // A rendered problem is small and its headers few; should it
            // still be refused, the lease runs out instead of being freed.
            Err(invalid) => {
                self.finished = true;
                let internal = IdempotencyError::Internal(format!("response_not_saved cannot be saved: {invalid}"));
                return self.idempotency.render(internal);
            }
        };
        let store = self.idempotency.store().clone();
        match self.commit(|lease| complete_resending(store, lease, saved)).await {
            Ok(saved) => {
                let mut response = response_from_saved(&saved, false);
                response.extensions_mut().insert(outcome);
                response
            }
            Err(answer) => answer,
        }
    }

    /// `error` rendered the application's way, as a saved response.
    async fn rendered_saved(&self, error: IdempotencyError) -> Result<SavedResponse, String> {
        let (parts, body) = self.idempotency.render(error).into_parts();
        let bytes = Limited::new(body, RESPONSE_BODY_BYTES_MAX)
            .collect()
            .await
            .map_err(|error| format!("the rendered problem could not be read: {error}"))?
            .to_bytes();
        saved_from_parts(parts.status, &parts.headers, bytes.to_vec()).map_err(|error| error.to_string())
    }

    /// Runs a fenced commit; on anything but success, the answer to send.
    async fn commit<F, Fut>(&mut self, commit: F) -> Result<SavedResponse, Response>
    where
        F: FnOnce(HeldLease) -> Fut,
        Fut: Future<Output = Result<Fenced<SavedResponse>, StoreError>>,
    {
        self.finished = true;
        match commit(self.lease.clone()).await {
            Ok(Fenced::Applied(saved)) => Ok(saved),
            Ok(Fenced::LeaseLost) => Err(self.answer_lease_lost().await),
            Err(error) => Err(self.answer_completion_failure(error).await),
        }
    }

    /// Another attempt took the key over while this one worked: count it,
    /// and answer with what the winner saved, or 409 while it still runs.
    /// Never a second effect: the fenced commit wrote nothing.
    async fn answer_lease_lost(&self) -> Response {
        let lease = &self.lease;
        MetricNames::count(self.idempotency.metric_names().lease_lost_completions_total());
        tracing::warn!(caller = %lease.caller, key_sha256 = %lease.key.digest(), "lease lost at completion");
        let record = self.idempotency.store().inspect(&lease.caller, &lease.key).await;
        // The clock the store reads (`IdempotencyBuilder::clock`), so that
        // "still live" here agrees with the store that refused the commit.
        let now = self.idempotency.clock().now_ms();
        let mut response = match record {
            Ok(Some(record)) if record.fingerprint == self.fingerprint && !record.is_expired(now) => {
                match &record.state {
                    RecordState::Completed { response, .. } => response_from_saved(response, true),
                    RecordState::Started { lease, .. } => {
                        self.idempotency.render(IdempotencyError::RequestInProgress {
                            retry_after_s: retry_after_seconds(lease.locked_until_ms.saturating_sub(now)),
                        })
                    }
                }
            }
            _ => self
                .idempotency
                .render(IdempotencyError::RequestInProgress { retry_after_s: 1 }),
        };
        response.extensions_mut().insert(Outcome("lease_lost"));
        response
    }

    /// The commit failed, and its outcome may be unknown. Release the lease
    /// (a fenced write, safe either way) so a retry can take over, and tell
    /// the caller to retry with the same key.
    async fn answer_completion_failure(&self, error: StoreError) -> Response {
        MetricNames::count(self.idempotency.metric_names().completion_failures_total());
        tracing::error!(%error, caller = %self.lease.caller, "could not complete an attempt");
        if let Err(release_error) = self.idempotency.store().release(&self.lease).await {
            tracing::warn!(error = %release_error, "could not release after a failed completion");
        }
        self.idempotency.render(self.idempotency.store_error(&error))
    }
}

fn first_run_outcome(status: StatusCode) -> Outcome {
    Outcome(if status.is_success() { "created" } else { "failed" })
}

/// Most times the completion of an answer with no effect rows is sent. The
/// work is done by then: freeing the key on the first failed save would let
/// the retry run it again. Completion is fenced and idempotent (a re-sent
/// completion that had committed finds the record completed by its token),
/// so sending it again is always safe.
pub const COMPLETE_SENDS_MAX: u32 = 3;
/// Pause before the n-th re-send of a completion, times n.
pub const COMPLETE_RESEND_BACKOFF_MS: u64 = 50;

/// Saves `saved` under `lease`, sending it again after a retryable error,
/// up to [`COMPLETE_SENDS_MAX`] times.
async fn complete_resending(
    store: Arc<dyn IdempotencyStore>,
    lease: HeldLease,
    saved: SavedResponse,
) -> Result<Fenced<SavedResponse>, StoreError> {
    let mut send = 1;
    loop {
        match store.complete(&lease, saved.clone()).await {
            Ok(Fenced::Applied(())) => return Ok(Fenced::Applied(saved)),
            Ok(Fenced::LeaseLost) => return Ok(Fenced::LeaseLost),
            Err(error) if error.is_retryable() && send < COMPLETE_SENDS_MAX => {
                tracing::warn!(%error, "could not save an answer; sending the completion again");
                tokio::time::sleep(std::time::Duration::from_millis(
                    COMPLETE_RESEND_BACKOFF_MS * u64::from(send),
                ))
                .await;
                send += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let lease = self.lease.clone();
        tracing::error!(caller = %lease.caller, "an attempt was dropped unfinished; releasing its lease");
        let store = self.idempotency.store().clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            self.idempotency.tasks().spawn_on(
                async move {
                    let _ = store.release(&lease).await;
                },
                &runtime,
            );
        }
    }
}

/// The attempt a route may take out of the request's extensions: the layer
/// puts one there before it runs the route. Take it with the [`Attempt`]
/// extractor (or [`PendingAttempt::take`]) and finish it yourself, or leave
/// it and the layer finishes it by the route's answer.
#[derive(Clone)]
pub struct PendingAttempt(Arc<Mutex<Option<Attempt>>>);

impl PendingAttempt {
    /// Wraps an attempt for the request's extensions.
    pub fn new(attempt: Attempt) -> Self {
        Self(Arc::new(Mutex::new(Some(attempt))))
    }

    /// The attempt, unless a handler took it already.
    pub fn take(&self) -> Option<Attempt> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take()
    }
}

/// The handler-level API as an extractor: the route must wear the
/// [`crate::IdempotencyLayer`], and takes over finishing the attempt. On a
/// route without the layer the rejection is a 500 `internal_error`
/// (rendered with [`crate::ProblemJson`]: no configuration is at hand there).
impl<S: Send + Sync> FromRequestParts<S> for Attempt {
    type Rejection = IdempotencyError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<PendingAttempt>()
            .and_then(PendingAttempt::take)
            .ok_or_else(|| {
                IdempotencyError::Internal("no idempotency attempt: the route does not wear IdempotencyLayer".into())
            })
    }
}
