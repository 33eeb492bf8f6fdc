//! The handler-level atomic API (store-core's [`AtomicCompletion`]): the
//! effect's rows and the completed record commit in one PostgreSQL
//! transaction, or neither does (docs/design.md#transaction-2).

use crate::completion_batch::{BatchedCompletion, CompletionEffect, CompletionItem, OwnedRowEffect};
use crate::error::{Attempt, EffectError, effect_attempt};
use crate::one_statement;
use crate::row::Slot;
use crate::row::{RecordColumns, guard_of, record_from_row, time_column};
use crate::store::{PostgresStore, SELECT_FOR_UPDATE, UPDATE_RECORD_OR_FAIL, read_clock};
use store_core::machine::{self, CompletionFence, Found, Write};
use store_core::{
    AtomicCompletion, BatchError, CompleteWithError, CompleteWithFuture, Completion, EffectFuture, EffectScope,
    HeldLease, Record, SavedResponse, StoreError,
};
// A pooled connection inside the open transaction: effects use its statement
// cache (`prepare_cached`); it dereferences to tokio-postgres's `Client`.
use deadpool_postgres::Client;
use tokio_postgres::types::ToSql;

impl AtomicCompletion for PostgresStore {
    /// A pooled connection inside the open transaction; it dereferences to
    /// tokio-postgres's `Client`, and its statement cache
    /// (`prepare_cached`) is the connection's.
    type EffectContext<'t> = &'t Client;
    type EffectError = EffectError;

    /// The row is locked `FOR UPDATE` and the fence checked before the
    /// effect runs, so a lost lease runs nothing, and no takeover can happen
    /// between the check and the commit. If the effect fails, everything
    /// rolls back and the lease is still held.
    ///
    /// The effect is called again, in a fresh transaction, when PostgreSQL
    /// reports a serialization failure or a deadlock (at most
    /// [`crate::TRANSACTION_ATTEMPTS_MAX`] times in all). The whole attempt,
    /// effect included, is bounded by the config's `operation_timeout_ms`.
    ///
    /// ```no_run
    /// # use store_core::{AtomicCompletion, CompleteWithError, Completion, HeldLease, SavedResponse};
    /// # use store_postgres::{EffectError, PostgresStore};
    /// # async fn label_route(store: &PostgresStore, lease: &HeldLease, label_id: &str) -> Result<(), CompleteWithError<EffectError>> {
    /// let outcome = store
    ///     .complete_with(lease, |transaction| {
    ///         Box::pin(async move {
    ///             transaction
    ///                 .execute("INSERT INTO labels (label_id) VALUES ($1)", &[&label_id])
    ///                 .await?;
    ///             let body = format!("{{\"label_id\":\"{label_id}\"}}").into_bytes();
    ///             let response =
    ///                 SavedResponse::new(201, Vec::new(), body).map_err(|error| EffectError::Handler(error.into()))?;
    ///             Ok((response, label_id.len()))
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
    fn complete_with<'a, T, F>(&'a self, lease: &'a HeldLease, effect: F) -> CompleteWithFuture<'a, T, EffectError>
    where
        T: Send + 'a,
        F: for<'t> Fn(EffectScope<'t, 'a, &'t Client>) -> EffectFuture<'t, T, EffectError> + Send + Sync + 'a,
    {
        Box::pin(async move { self.with_retries(|| self.complete_with_once(lease, &effect)).await })
    }
}

/// An effect of one inserted row, which [`PostgresStore::complete_with_row`]
/// commits with the completion in one statement.
#[derive(Clone, Copy)]
pub struct RowEffect<'a> {
    /// The table and its columns, as after `INSERT INTO`:
    /// `"labels (label_id, caller_id)"`. A unique constraint on the table
    /// decides whether the row is new (`ON CONFLICT DO NOTHING`).
    pub into: &'a str,
    /// The row's values as a select list, each cast to its column's type,
    /// numbered from [`ROW_EFFECT_FIRST_PARAMETER`]: `"$6::text, $7::text"`.
    pub values: &'a str,
    /// The values of `$6` onwards.
    pub params: &'a [&'a (dyn ToSql + Sync)],
}

/// The first parameter number a [`RowEffect`]'s values use (`$1` to `$5`
/// are the completion's own).
pub const ROW_EFFECT_FIRST_PARAMETER: usize = one_statement::ROW_EFFECT_FIRST_PARAMETER;

/// What [`PostgresStore::complete_with_row`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowCompletion {
    /// The row and the completed record (with the given response) committed.
    Committed,
    /// Nothing was written: this lease no longer holds a live started record
    /// (lost, or completed already), the row was already there, or the
    /// database refused the row. [`AtomicCompletion::complete_with`] decides
    /// these under a lock, with an effect that can read what is there.
    Undecided,
}

impl PostgresStore {
    /// The common case of `complete_with` when the effect is one new row
    /// and the response does not depend on it: the fence, the row and the
    /// completed record in one autocommit statement, one round trip, instead
    /// of a transaction of four (docs/design.md#transaction-2). The machine
    /// runs on the record the statement replaced and must agree, as with
    /// every one-statement transition (`tests/differential.rs`).
    ///
    /// Bounded by the operation timeout and retried on a deadlock like every
    /// call; an error with no answer (the database gone) is reported, and
    /// may have committed, as a `COMMIT` whose reply was lost.
    pub async fn complete_with_row(
        &self,
        lease: &HeldLease,
        response: &SavedResponse,
        row: RowEffect<'_>,
    ) -> Result<RowCompletion, StoreError> {
        let slot = Slot::new(&lease.caller, &lease.key);
        let completed = self
            .with_retries(|| async {
                let connection = self.pool.get().await?;
                let row = (row.into, row.values, row.params);
                one_statement::complete_with_row(&connection, &slot, lease, response, &self.policy, row).await
            })
            .await?;
        Ok(match completed {
            Some(_) => RowCompletion::Committed,
            None => RowCompletion::Undecided,
        })
    }

    /// [`PostgresStore::complete_with_row`] batched with the completions
    /// that arrive while the previous batch is in flight: one transaction
    /// and one commit per batch, each completion fenced by its own lease
    /// token (`completion_batch.rs`). The answer is the one
    /// `complete_with_row` would give: `Undecided` (nothing written) for
    /// everything `complete_with` must decide, for this completion alone.
    /// Without batching (`batch_items_max = 1`) it is `complete_with_row`.
    pub async fn complete_with_row_in_batch(
        &self,
        lease: &HeldLease,
        response: &SavedResponse,
        row: OwnedRowEffect,
    ) -> Result<RowCompletion, StoreError> {
        let batched = self.completion_in_batch(lease, response, row).await?;
        self.finish_completion(lease, response, batched).await
    }

    /// The completion's batch, or [`BatchedCompletion::Alone`] without
    /// batching.
    pub(crate) async fn completion_in_batch(
        &self,
        lease: &HeldLease,
        response: &SavedResponse,
        row: OwnedRowEffect,
    ) -> Result<BatchedCompletion, StoreError> {
        let Some(completions) = &self.completions else {
            return Ok(BatchedCompletion::Alone(CompletionEffect::Row(row)));
        };
        let item = CompletionItem::new(lease, response.clone(), self.policy, CompletionEffect::Row(row));
        completions.submit(item).await.map_err(completion_batch_error)
    }

    /// A completion on the path its batch chose.
    pub(crate) async fn finish_completion(
        &self,
        lease: &HeldLease,
        response: &SavedResponse,
        batched: BatchedCompletion,
    ) -> Result<RowCompletion, StoreError> {
        match batched {
            BatchedCompletion::Committed => Ok(RowCompletion::Committed),
            BatchedCompletion::Undecided => Ok(RowCompletion::Undecided),
            BatchedCompletion::Alone(CompletionEffect::Nothing) => Err(StoreError::Refused {
                detail: "a completion with a row came back from its batch without it".to_owned(),
                source: None,
            }),
            BatchedCompletion::Alone(CompletionEffect::Row(row)) => {
                let params = row.borrowed_params();
                let row = RowEffect {
                    into: row.into,
                    values: row.values,
                    params: &params,
                };
                self.complete_with_row(lease, response, row).await
            }
            BatchedCompletion::Unavailable(detail) => Err(StoreError::Unavailable { detail, source: None }),
            BatchedCompletion::Refused(detail) => Err(StoreError::Refused { detail, source: None }),
        }
    }

    async fn complete_with_once<'a, T, F>(
        &self,
        lease: &HeldLease,
        effect: &F,
    ) -> Result<Completion<T>, Attempt<CompleteWithError<EffectError>>>
    where
        T: Send,
        F: for<'t> Fn(EffectScope<'t, 'a, &'t Client>) -> EffectFuture<'t, T, EffectError> + Send + Sync,
    {
        let slot = Slot::new(&lease.caller, &lease.key);
        let open = OpenTransaction::begin_and_lock(self.pool.get().await?, &slot).await?;
        let (record, now_ms) = (open.record.clone(), open.now_ms);
        let found = Found::from_record(record.as_ref());
        match machine::completion_fence(found, lease.token, now_ms) {
            CompletionFence::Held => {}
            CompletionFence::CompletedByThisToken(response) => {
                let response = response.clone();
                open.rollback().await?;
                return Ok(Completion::AlreadyCompleted { response });
            }
            CompletionFence::Lost => {
                open.rollback().await?;
                return Ok(Completion::LeaseLost);
            }
        }
        let (response, value) = match effect(EffectScope::new(open.client())).await {
            Ok(done) => done,
            Err(error) => {
                open.rollback().await?;
                return Err(effect_attempt(error));
            }
        };
        let step = machine::complete(found, lease.token, response.clone(), now_ms, &self.policy);
        let (Write::Put(completed), Some(previous)) = (&step.write, record.as_ref()) else {
            return Err(Attempt::Fail(machine_disagreed().into()));
        };
        open.complete_and_commit(&slot, previous, completed).await?;
        Ok(Completion::Committed { response, value })
    }
}

/// Why a completion's batch gave no answer, as the store's error.
pub(crate) fn completion_batch_error(error: BatchError) -> StoreError {
    match error {
        BatchError::Lost => StoreError::Unavailable {
            detail: "the completion's batch ended without an answer; it may have committed".to_owned(),
            source: None,
        },
        refused @ BatchError::QueueFull { .. } => {
            StoreError::unavailable("postgresql completions are queued past their bound", refused)
        }
    }
}

/// One transaction of `complete_with`, opened on a pooled connection with
/// `BEGIN` (not tokio-postgres's `Transaction`, so statements can be
/// pipelined: `BEGIN` with the locking read, the completing `UPDATE` with
/// `COMMIT`, one round trip each). If it is dropped while still open (an
/// error, a timeout, a cancelled caller), the connection is taken out of the
/// pool and closed, which rolls the transaction back on the server: a
/// connection never goes back to the pool inside a transaction.
struct OpenTransaction {
    connection: Option<Client>,
    record: Option<Record>,
    now_ms: u64,
}

impl OpenTransaction {
    /// `BEGIN` and `SELECT ... FOR UPDATE`, pipelined.
    async fn begin_and_lock(connection: Client, slot: &Slot) -> Result<Self, Attempt<CompleteWithError<EffectError>>> {
        let lock = connection.prepare_cached(SELECT_FOR_UPDATE).await?;
        let mut open = Self {
            connection: Some(connection),
            record: None,
            now_ms: 0,
        };
        let client = open.client();
        let params: [&(dyn ToSql + Sync); 2] = [&slot.caller, &slot.key_digest];
        let (begun, rows) = tokio::join!(client.batch_execute("BEGIN"), client.query(&lock, &params));
        begun?;
        let rows = rows?;
        match rows.first() {
            Some(row) => {
                open.record = Some(record_from_row(row)?);
                open.now_ms = time_column(row, "now")?;
            }
            None => open.now_ms = read_clock(open.client()).await?,
        }
        Ok(open)
    }

    fn client(&self) -> &Client {
        self.connection
            .as_ref()
            .expect("an open transaction holds its connection until it ends")
    }

    /// Ends the transaction without writing; the connection goes back to the pool.
    async fn rollback(mut self) -> Result<(), Attempt<CompleteWithError<EffectError>>> {
        self.client().batch_execute("ROLLBACK").await?;
        self.connection = None;
        Ok(())
    }

    /// The guarded `UPDATE` and `COMMIT`, pipelined. The `UPDATE` raises
    /// an error (a division by zero) unless it replaced exactly the row it
    /// locked, so the transaction is aborted and the `COMMIT` that follows
    /// it in the pipeline rolls back: an effect never commits without its
    /// completed record.
    async fn complete_and_commit(
        mut self,
        slot: &Slot,
        previous: &Record,
        completed: &Record,
    ) -> Result<(), Attempt<CompleteWithError<EffectError>>> {
        let client = self.client();
        let statement = client.prepare_cached(UPDATE_RECORD_OR_FAIL).await?;
        let columns = RecordColumns::of(completed);
        let (state, token) = guard_of(previous);
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&slot.caller, &slot.key_digest];
        params.extend(columns.params());
        params.extend([&state as &(dyn ToSql + Sync), &token]);
        let (updated, committed) = tokio::join!(client.query_one(&statement, &params), client.batch_execute("COMMIT"));
        // Checked first: after a failed UPDATE the server answers the COMMIT
        // with a rollback, which is not an error.
        updated?;
        committed?;
        self.connection = None;
        Ok(())
    }
}

impl Drop for OpenTransaction {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take() {
            // Still inside the transaction: close the connection instead of
            // returning it to the pool; the server rolls back.
            drop(deadpool_postgres::Object::take(connection));
        }
    }
}

fn machine_disagreed() -> StoreError {
    StoreError::Refused {
        detail: "the state machine refused a completion it had allowed under the same lock".to_owned(),
        source: None,
    }
}
