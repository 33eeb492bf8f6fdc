//! Idempotency for HTTP routes.
//!
//! - [`IdempotencyLayer`] (module `layer`): a tower layer any axum route can
//!   wear. It reads the key and a bounded body, claims the key, and either
//!   answers (replay, 409, 422) or runs the route with an [`Attempt`] in the
//!   request's extensions. If the route leaves the attempt there, the layer
//!   saves, abandons or releases by the route's answer ([`crate::error::Disposition`]).
//! - [`Attempt`] (module `attempt`): the handler-level API. A handler that
//!   must commit its effect with the key (the label route) takes the attempt
//!   as an extractor and finishes it itself with [`Attempt::complete_with`].
//!
//! The route runs in a task of its own, so a client that hangs up, or a
//! request timeout, never cuts an attempt off between its effect and its
//! record: the work finishes and the next retry is answered from the key.

mod attempt;
mod layer;
mod policy;
pub mod saved;

pub use attempt::{Attempt, PendingAttempt};
pub use layer::{IdempotencyLayer, IdempotencyService};
pub use policy::FinishPolicy;

use crate::error::{ApiError, retry_after_seconds};
use crate::metrics::{CLAIM_RESENDS_TOTAL, LATE_KEYS_TOTAL, LEASE_TAKEOVERS_TOTAL};
use axum::response::Response;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use store_core::{
    CallerId, ClaimOutcome, ClaimRequest, Fingerprint, HeldLease, IdempotencyKey, IdempotencyStore, StoreError,
};
use tokio_util::task::TaskTracker;

/// Most times one attempt sends its claim. A claim whose reply was lost
/// (a response timeout, an operation timeout during COMMIT, a failed sync)
/// may have committed; sent again with the same token it gets its lease
/// back (`store_core::machine`'s re-sent claim), or claims afresh if it
/// never committed.
pub const CLAIM_SENDS_MAX: u32 = 3;
/// Pause before the n-th re-send of a claim, times n.
pub const CLAIM_RESEND_BACKOFF_MS: u64 = 50;
/// Most times the lease of a claim whose every reply was lost is released
/// in the background.
pub const ORPHAN_RELEASES_MAX: u32 = 4;
/// Pause before the first background release; doubled before each next one.
pub const ORPHAN_RELEASE_BACKOFF_MS: u64 = 100;

/// The shared part of the layer and the handler-level API: the store, the
/// tracker of attempts in flight (shutdown waits for them), and the
/// `Retry-After` answered during store outages.
#[derive(Clone)]
pub struct Idempotency {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn IdempotencyStore>,
    tasks: TaskTracker,
    store_retry_after_s: u64,
}

/// What claiming a key gave.
pub enum Begun {
    /// This attempt holds the lease: do the work, then finish the attempt.
    Acquired(Attempt),
    /// The key completed before with the same request: send this.
    Replay(Response),
}

impl Idempotency {
    pub fn new(store: Arc<dyn IdempotencyStore>, tasks: TaskTracker, store_retry_after_s: u64) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                tasks,
                store_retry_after_s,
            }),
        }
    }

    pub fn store(&self) -> &Arc<dyn IdempotencyStore> {
        &self.inner.store
    }

    /// Attempts in flight; shutdown waits for them.
    pub fn tasks(&self) -> &TaskTracker {
        &self.inner.tasks
    }

    /// Claims (caller, key) for a request with this fingerprint.
    pub async fn begin(
        &self,
        caller: CallerId,
        key: IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Result<Begun, ApiError> {
        // One token for every send: a re-sent claim is the same attempt.
        let request = ClaimRequest::new(caller, key, fingerprint);
        let outcome = self.claim_resending(&request).await?;
        match outcome {
            ClaimOutcome::Acquired(acquired) => {
                if acquired.takeover {
                    metrics::counter!(LEASE_TAKEOVERS_TOTAL).increment(1);
                }
                if acquired.late_key {
                    metrics::counter!(LATE_KEYS_TOTAL).increment(1);
                    tracing::warn!(
                        caller = %request.caller,
                        key_sha256 = %request.key.digest(),
                        "late key: this key was purged before; the request may duplicate an earlier one"
                    );
                }
                Ok(Begun::Acquired(Attempt::new(self.clone(), acquired, fingerprint)))
            }
            ClaimOutcome::Replay(saved) => Ok(Begun::Replay(saved::response_from_saved(&saved, true))),
            // "Wait briefly" (the specification's status table): the first
            // attempt usually ends in milliseconds, and the lease's end is
            // only the bound for an attempt that died, so the advice is the
            // lease's remaining time capped at server.retry_after_s.
            ClaimOutcome::InProgress { retry_after_ms } => Err(ApiError::RequestInProgress {
                retry_after_s: retry_after_seconds(retry_after_ms).min(self.inner.store_retry_after_s),
            }),
            ClaimOutcome::Mismatch => Err(ApiError::IdempotencyKeyReused),
        }
    }

    /// Sends the claim, and again with the same token after an error that
    /// may hide a commit, up to [`CLAIM_SENDS_MAX`] times. If every reply
    /// was lost, a lease may be live that no attempt holds (every retry
    /// would get 409 until it ran out): it is released in the background.
    async fn claim_resending(&self, request: &ClaimRequest) -> Result<ClaimOutcome, ApiError> {
        let mut send = 1;
        loop {
            let error = match self.store().claim(request).await {
                Ok(outcome) => return Ok(outcome),
                Err(error) => error,
            };
            if let StoreError::Corrupt(codec) = &error {
                // The caller and digest are what the operator's command
                // takes to clear the key (RELIABILITY.md section 10).
                tracing::error!(error = %codec, caller = %request.caller, key_sha256 = %request.key.digest(),
                    "a stored record is unreadable; if it stays so, clear it with \
                     `server forget-unreadable-record --caller CALLER --key-sha256 KEY_SHA256`");
                return Err(ApiError::RecordUnreadable);
            }
            if !error.is_retryable() {
                return Err(self.store_error(&error));
            }
            if send == CLAIM_SENDS_MAX {
                tracing::warn!(%error, caller = %request.caller, key_sha256 = %request.key.digest(),
                    "no claim reply; releasing any lease it took in the background");
                self.release_orphan_in_background(request);
                return Err(self.store_error(&error));
            }
            metrics::counter!(CLAIM_RESENDS_TOTAL).increment(1);
            tokio::time::sleep(Duration::from_millis(CLAIM_RESEND_BACKOFF_MS * u64::from(send))).await;
            send += 1;
        }
    }

    /// Releases the lease `request` may hold without knowing it, a bounded
    /// number of times. Release is fenced by the token: it ends this
    /// attempt's lease if the claim committed, and writes nothing otherwise.
    fn release_orphan_in_background(&self, request: &ClaimRequest) {
        let lease = HeldLease {
            caller: request.caller.clone(),
            key: request.key.clone(),
            token: request.token,
            locked_until_ms: 0,
        };
        let store = self.store().clone();
        self.tasks().spawn(async move {
            let mut backoff_ms = ORPHAN_RELEASE_BACKOFF_MS;
            for _ in 0..ORPHAN_RELEASES_MAX {
                tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
                match store.release(&lease).await {
                    Ok(_) => return,
                    Err(error) if error.is_retryable() => backoff_ms *= 2,
                    Err(error) => {
                        tracing::warn!(%error, "could not release an orphaned lease; it ends when it expires");
                        return;
                    }
                }
            }
            tracing::warn!("could not release an orphaned lease; it ends when it expires");
        });
    }

    /// The API error for a store failure: 503 with `Retry-After` when a
    /// retry may succeed (an outage is never a 500), 500 `record_unreadable`
    /// for a record no codec reads, else an internal error.
    pub fn store_error(&self, error: &StoreError) -> ApiError {
        match error {
            _ if error.is_retryable() => ApiError::StoreUnavailable {
                retry_after_s: self.inner.store_retry_after_s,
            },
            StoreError::Corrupt(codec) => {
                tracing::error!(error = %codec, "a stored record is unreadable");
                ApiError::RecordUnreadable
            }
            _ => ApiError::Internal(format!("store: {error}")),
        }
    }
}

/// Milliseconds since the Unix epoch by this process's clock.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as u64)
        .unwrap_or(0)
}
