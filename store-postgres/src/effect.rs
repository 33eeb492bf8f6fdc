//! The handler-level atomic API: the effect's rows and the completed record
//! commit in one PostgreSQL transaction, or neither does (docs/design.md's
//! transaction 2).

use crate::error::{Attempt, CompleteWithError, EffectError, effect_attempt};
use crate::row::Slot;
use crate::store::{PostgresStore, lock_record, write_step};
use std::future::Future;
use std::pin::Pin;
use store_core::machine::{self, CompletionFence, Found, Write};
use store_core::{HeldLease, SavedResponse, StoreError};
// deadpool's transaction, so effects can use the connection's statement cache
// (`prepare_cached`); it dereferences to tokio-postgres's `Transaction`.
use deadpool_postgres::Transaction;

/// What an effect returns: the response to save under the key, and a value
/// of its own for the caller. It borrows the transaction it writes through.
pub type EffectFuture<'t, T> = Pin<Box<dyn Future<Output = Result<(SavedResponse, T), EffectError>> + Send + 't>>;

/// How [`PostgresStore::complete_with`] ended, when it did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion<T> {
    /// The effect ran, and its rows and the completed record committed together.
    Committed { response: SavedResponse, value: T },
    /// This lease's completion had already committed (an earlier call whose
    /// reply was lost), so the effect did not run again; here is what was saved.
    AlreadyCompleted { response: SavedResponse },
    /// The lease no longer holds the key: the effect did not run and nothing
    /// was written.
    LeaseLost,
}

impl PostgresStore {
    /// Completes the key and commits `effect`'s writes in the same
    /// transaction, only while `lease` still holds the key.
    ///
    /// The row is locked `FOR UPDATE` and the fence checked before the effect
    /// runs, so a lost lease runs nothing, and no takeover can happen between
    /// the check and the commit. If the effect fails, everything rolls back
    /// and the lease is still held.
    ///
    /// The effect must write only through the transaction it is given: it
    /// is called again, in a fresh transaction, when PostgreSQL reports a
    /// serialization failure or a deadlock (at most
    /// [`crate::TRANSACTION_ATTEMPTS_MAX`] times in all), which is why it is
    /// `Fn` and not `FnOnce`.
    ///
    /// The whole attempt, effect included, is bounded by the config's
    /// `operation_timeout_ms`.
    ///
    /// ```no_run
    /// # use store_core::{HeldLease, SavedResponse};
    /// # use store_postgres::{CompleteWithError, Completion, EffectError, PostgresStore};
    /// # async fn label_route(store: &PostgresStore, lease: &HeldLease, label_id: String) -> Result<(), CompleteWithError> {
    /// let outcome = store
    ///     .complete_with(lease, |transaction| {
    ///         let label_id = label_id.clone();
    ///         Box::pin(async move {
    ///             transaction
    ///                 .execute("INSERT INTO labels (label_id) VALUES ($1)", &[&label_id])
    ///                 .await?;
    ///             let body = format!("{{\"label_id\":\"{label_id}\"}}").into_bytes();
    ///             let response =
    ///                 SavedResponse::new(201, Vec::new(), body).map_err(|error| EffectError::Handler(error.into()))?;
    ///             Ok((response, label_id))
    ///         })
    ///     })
    ///     .await?;
    /// match outcome {
    ///     Completion::Committed { response, value } => { /* answer with response */ }
    ///     Completion::AlreadyCompleted { response } => { /* answer with response */ }
    ///     Completion::LeaseLost => { /* another attempt owns the key now */ }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn complete_with<T, F>(&self, lease: &HeldLease, effect: F) -> Result<Completion<T>, CompleteWithError>
    where
        T: Send,
        F: for<'t, 'c> Fn(&'t Transaction<'c>) -> EffectFuture<'t, T> + Send + Sync,
    {
        self.with_retries(|| self.complete_with_once(lease, &effect)).await
    }

    async fn complete_with_once<T, F>(
        &self,
        lease: &HeldLease,
        effect: &F,
    ) -> Result<Completion<T>, Attempt<CompleteWithError>>
    where
        T: Send,
        F: for<'t, 'c> Fn(&'t Transaction<'c>) -> EffectFuture<'t, T> + Send + Sync,
    {
        let slot = Slot::new(&lease.caller, &lease.key);
        let mut connection = self.pool.get().await?;
        let transaction = connection.transaction().await?;
        let (record, now_ms) = lock_record(&transaction, &slot).await?;
        let found = Found::from_record(record.as_ref());
        match machine::completion_fence(found, lease.token, now_ms) {
            CompletionFence::Held => {}
            CompletionFence::CompletedByThisToken(response) => {
                let response = response.clone();
                transaction.rollback().await?;
                return Ok(Completion::AlreadyCompleted { response });
            }
            CompletionFence::Lost => {
                transaction.rollback().await?;
                return Ok(Completion::LeaseLost);
            }
        }
        let (response, value) = effect(&transaction).await.map_err(effect_attempt)?;
        let step = machine::complete(found, lease.token, response.clone(), now_ms, &self.policy);
        if !matches!(step.write, Write::Put(_)) {
            return Err(Attempt::Fail(machine_disagreed().into()));
        }
        write_step(&transaction, &slot, record.as_ref(), &step.write).await?;
        transaction.commit().await?;
        Ok(Completion::Committed { response, value })
    }
}

fn machine_disagreed() -> StoreError {
    StoreError::Refused {
        detail: "the state machine refused a completion it had allowed under the same lock".to_owned(),
        source: None,
    }
}
