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

use super::saved::{problem_saved, response_from_saved, saved_from_parts};
use super::{FinishPolicy, Idempotency, now_ms};
use crate::error::{ApiError, Disposition, Outcome, retry_after_seconds};
use crate::metrics::{COMPLETION_FAILURES_TOTAL, LEASE_LOST_COMPLETIONS_TOTAL, RESPONSES_NOT_SAVED_TOTAL};
use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
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
    /// Set by whichever method finished the attempt; checked on drop.
    finished: bool,
}

impl Attempt {
    pub(super) fn new(idempotency: Idempotency, acquired: Acquired, fingerprint: Fingerprint) -> Self {
        Self {
            idempotency,
            lease: acquired.lease,
            fingerprint,
            takeover: acquired.takeover,
            finished: false,
        }
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
            Err(error) => self.idempotency.store_error(&error).into_response(),
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
    /// wear the layer: saves it, abandons or releases per `policy`.
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
        metrics::counter!(RESPONSES_NOT_SAVED_TOTAL).increment(1);
        let error = ApiError::ResponseNotSaved { reason };
        let saved = match problem_saved(&error) {
            Ok(saved) => saved,
            // A problem body is small and its headers fixed; should it
            // still be refused, the lease runs out instead of being freed.
            Err(invalid) => {
                self.finished = true;
                return ApiError::Internal(format!("response_not_saved cannot be saved: {invalid}")).into_response();
            }
        };
        let store = self.idempotency.store().clone();
        match self.commit(|lease| complete_resending(store, lease, saved)).await {
            Ok(saved) => {
                let mut response = response_from_saved(&saved, false);
                response.extensions_mut().insert(Outcome(error.outcome()));
                response
            }
            Err(answer) => answer,
        }
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
        metrics::counter!(LEASE_LOST_COMPLETIONS_TOTAL).increment(1);
        tracing::warn!(caller = %lease.caller, key_sha256 = %lease.key.digest(), "lease lost at completion");
        let record = self.idempotency.store().inspect(&lease.caller, &lease.key).await;
        let now = now_ms();
        let mut response = match record {
            Ok(Some(record)) if record.fingerprint == self.fingerprint && !record.is_expired(now) => {
                match &record.state {
                    RecordState::Completed { response, .. } => response_from_saved(response, true),
                    RecordState::Started { lease, .. } => ApiError::RequestInProgress {
                        retry_after_s: retry_after_seconds(lease.locked_until_ms.saturating_sub(now)),
                    }
                    .into_response(),
                }
            }
            _ => ApiError::RequestInProgress { retry_after_s: 1 }.into_response(),
        };
        response.extensions_mut().insert(Outcome("lease_lost"));
        response
    }

    /// The commit failed, and its outcome may be unknown. Release the lease
    /// (a fenced write, safe either way) so a retry can take over, and tell
    /// the caller to retry with the same key.
    async fn answer_completion_failure(&self, error: StoreError) -> Response {
        metrics::counter!(COMPLETION_FAILURES_TOTAL).increment(1);
        tracing::error!(%error, caller = %self.lease.caller, "could not complete an attempt");
        if let Err(release_error) = self.idempotency.store().release(&self.lease).await {
            tracing::warn!(error = %release_error, "could not release after a failed completion");
        }
        self.idempotency.store_error(&error).into_response()
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

/// The attempt a route may take out of the request's extensions.
#[derive(Clone)]
pub struct PendingAttempt(Arc<Mutex<Option<Attempt>>>);

impl PendingAttempt {
    pub fn new(attempt: Attempt) -> Self {
        Self(Arc::new(Mutex::new(Some(attempt))))
    }

    /// The attempt, unless a handler took it already.
    pub fn take(&self) -> Option<Attempt> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take()
    }
}

/// The handler-level API as an extractor: the route must wear the
/// [`super::IdempotencyLayer`], and takes over finishing the attempt.
impl<S: Send + Sync> FromRequestParts<S> for Attempt {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<PendingAttempt>()
            .and_then(PendingAttempt::take)
            .ok_or_else(|| {
                ApiError::Internal("no idempotency attempt: the route does not wear IdempotencyLayer".into())
            })
    }
}
