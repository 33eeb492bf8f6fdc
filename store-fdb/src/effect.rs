//! The handler-level atomic API on the FDB-style store: the effect's rows
//! and the completed record commit in one transaction, or neither does
//! (docs/design.md#transaction-2), on either engine.
//!
//! The effect writes through the store's own [`Transaction`] (its rows go
//! under [`crate::KeyLayout::effects`]). Engine errors of its reads and
//! writes go to the engine's retry loop like the store's own (a conflict
//! runs the whole body again, effect included); only a
//! [`TxError::Abort`] it returns is its own failure,
//! [`CompleteWithError::Effect`].

use crate::engine::{Engine, MaybeCommitted, TxError};
use crate::store::FdbStore;
use std::sync::Mutex;
use store_core::machine::{self, CompletionFence, Write};
use store_core::{
    AtomicCompletion, CompleteWithError, CompleteWithFuture, Completion, EffectFuture, EffectScope, HeldLease,
    StoreError,
};

impl<E: Engine> AtomicCompletion for FdbStore<E> {
    type EffectContext<'t> = E::Tx;
    type EffectError = TxError;

    /// The fence is checked before the effect runs, so an attempt that lost
    /// its lease runs nothing. When an earlier try of this call committed
    /// with an unknown result, the retry loop's next try finds the record
    /// completed by this token and answers
    /// [`Completion::AlreadyCompleted`] without running the effect again.
    fn complete_with<'a, T, F>(&'a self, lease: &'a HeldLease, effect: F) -> CompleteWithFuture<'a, T, TxError>
    where
        T: Send + 'a,
        F: for<'t> Fn(EffectScope<'t, 'a, E::Tx>) -> EffectFuture<'t, T, TxError> + Send + Sync + 'a,
    {
        Box::pin(async move {
            let slot = &self.layout().slot(&lease.caller, lease.key.digest());
            let effect = &effect;
            // An effect's own abort ends the retry loop like any abort (nothing
            // commits); it is kept here so that it reaches the caller as the
            // effect's error, not as the store's.
            let effect_failure: &Mutex<Option<TxError>> = &Mutex::new(None);
            let outcome = self
                .engine()
                .run(self.run_options(), |tx, _maybe_committed: MaybeCommitted| async move {
                    let now = self.clock().now_ms();
                    let existing = self.read_existing(&tx, slot, now).await?;
                    match machine::completion_fence(existing.found(), lease.token, now) {
                        CompletionFence::CompletedByThisToken(saved) => {
                            return Ok(Completion::AlreadyCompleted {
                                response: saved.clone(),
                            });
                        }
                        CompletionFence::Lost => return Ok(Completion::LeaseLost),
                        CompletionFence::Held => {}
                    }
                    let (response, value) = match effect(EffectScope::new(tx.clone())).await {
                        Ok(done) => done,
                        Err(TxError::Engine(error)) => return Err(TxError::Engine(error)),
                        Err(own @ TxError::Abort(_)) => {
                            keep_effect_failure(effect_failure, own);
                            return Err(TxError::Abort(effect_failed()));
                        }
                    };
                    let step = machine::complete(existing.found(), lease.token, response.clone(), now, self.policy());
                    if !matches!(step.write, Write::Put(_)) {
                        return Err(TxError::Abort(machine_disagreed()));
                    }
                    self.apply(&tx, slot, &existing, step.write).await?;
                    Ok(Completion::Committed { response, value })
                })
                .await;
            // Only a lost lease certainly wrote nothing (see `announce_end`).
            if !matches!(outcome, Ok(Completion::LeaseLost)) {
                self.announce_change(lease);
            }
            match (outcome, take_effect_failure(effect_failure)) {
                (Err(_), Some(own)) => Err(CompleteWithError::Effect(own)),
                (outcome, _) => outcome.map_err(CompleteWithError::Store),
            }
        })
    }
}

fn keep_effect_failure(slot: &Mutex<Option<TxError>>, failure: TxError) {
    // A poisoned lock only means another try panicked; the slot is still usable.
    *slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(failure);
}

fn take_effect_failure(slot: &Mutex<Option<TxError>>) -> Option<TxError> {
    slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take()
}

/// What the retry loop is told when the effect aborted: it ends the loop,
/// and the caller gets the effect's own error instead.
fn effect_failed() -> StoreError {
    StoreError::Refused {
        detail: "the effect failed".to_owned(),
        source: None,
    }
}

fn machine_disagreed() -> StoreError {
    StoreError::Refused {
        detail: "the state machine refused a completion whose fence it had found held".to_owned(),
        source: None,
    }
}

/// What an effect's error means to a caller that reports it as a store
/// error: an abort carries the reason the effect gave.
impl From<TxError> for StoreError {
    fn from(error: TxError) -> Self {
        match error {
            TxError::Engine(error) => error.into_store_error(),
            TxError::Abort(error) => error,
        }
    }
}
