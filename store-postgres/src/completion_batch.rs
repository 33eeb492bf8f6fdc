//! Completions (with one effect row, a label, or plain), batched across
//! requests: the completions that arrive while a batch is in flight commit
//! together in one transaction, so a batch pays one round trip and one commit (one WAL
//! flush) instead of one per completion (store-core's [`Batcher`]).
//!
//! Each completion of the batch is `one_statement.rs`'s guarded statement
//! (lock and read the record; insert the row only if this completion's own
//! lease token holds it; complete the record only if the row went in; for
//! a plain completion, complete it only if the token holds it), with its
//! own parameters; `BEGIN`, the statements and `COMMIT` go out
//! pipelined on one connection. One statement over arrays is not possible
//! here: a row effect's values are the caller's, of types only the caller
//! knows. Each completion's row is judged by the machine exactly as the
//! unbatched statement's is (`one_statement::completion_with_row_decision`).
//!
//! - **Fenced one by one.** Every statement checks its own token against
//!   its own record; a completion whose lease was lost or taken over, whose
//!   record is completed already, or whose row is already there writes
//!   nothing and answers [`BatchedCompletion::Undecided`] alone: the caller
//!   takes `complete_with`'s transaction (a plain completion the locked
//!   path) for it, as unbatched.
//! - **The same key twice in one batch.** Only a key's first completion is
//!   in the transaction; its later ones go alone once it has committed, and
//!   see its completed record, as if they had come one after the other.
//! - **Lock order.** The statements lock records in (caller, key digest)
//!   order, so two batches never wait for each other's records in a cycle.
//!   (Two batches whose rows collide on the effect table's own unique key
//!   can still deadlock; PostgreSQL then aborts one, whose completions go
//!   alone.)
//! - **A failed batch fails no completion.** A statement the database
//!   refuses (a row it will not take, a deadlock) rolls the whole
//!   transaction back; every completion of the batch then goes alone, its
//!   own one-statement path, where only the refused one is refused. A
//!   database that did not answer fails the batch's completions as it
//!   would have failed each of them: unavailable, and possibly committed.

use crate::claim_batch::first_of_each_key_in_lock_order;
use crate::error::{Attempt, pool_error, store_error};
use crate::one_statement::{
    COMPLETE, CompletionParams, complete_decision, completion_with_row_decision, completion_with_row_statement,
};
use crate::row::Slot;
use async_trait::async_trait;
use deadpool_postgres::{Client, Pool};
use std::time::Duration;
use store_core::{BatchRunner, Batcher, HeldLease, Policy, SavedResponse, StoreError, encode_response_deflated};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

/// Completions waiting for a batch at most; past it a completion is
/// refused as unavailable at once.
pub const COMPLETION_BATCH_QUEUED_ITEMS_MAX: usize = 4_096;

/// An effect of one inserted row, like [`crate::RowEffect`], that owns its
/// values, so that it can wait in a batch for another task to send it. The
/// table and the select list are `'static`: each shape is one statement
/// prepared on every connection, so shapes must be few.
pub struct OwnedRowEffect {
    /// The table and its columns, as after `INSERT INTO`.
    pub into: &'static str,
    /// The row's values as a select list, numbered from
    /// [`crate::ROW_EFFECT_FIRST_PARAMETER`].
    pub values: &'static str,
    /// The values of `$6` onwards.
    pub params: Vec<Box<dyn ToSql + Send + Sync>>,
}

impl std::fmt::Debug for OwnedRowEffect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedRowEffect")
            .field("into", &self.into)
            .field("values", &self.values)
            .field("params", &self.params.len())
            .finish()
    }
}

impl OwnedRowEffect {
    pub(crate) fn borrowed_params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params
            .iter()
            .map(|param| param.as_ref() as &(dyn ToSql + Sync))
            .collect()
    }
}

/// What a completion of a batch commits with its record.
#[derive(Debug)]
pub enum CompletionEffect {
    /// One row ([`crate::PostgresStore::complete_with_row_in_batch`]).
    Row(OwnedRowEffect),
    /// Nothing: a plain `complete`.
    Nothing,
}

/// One completion of a batch, owned: it travels to the batch's task.
#[derive(Debug)]
pub(crate) struct CompletionItem {
    pub slot: Slot,
    pub lease: HeldLease,
    pub response: SavedResponse,
    /// [`encode_response_deflated`] of `response`, made by the task that
    /// submits the completion: the batch's one task would otherwise
    /// deflate every completion of the batch in turn (about 10 µs each).
    pub response_deflated: Vec<u8>,
    pub policy: Policy,
    pub effect: CompletionEffect,
}

impl CompletionItem {
    pub(crate) fn new(lease: &HeldLease, response: SavedResponse, policy: Policy, effect: CompletionEffect) -> Self {
        Self {
            slot: Slot::new(&lease.caller, &lease.key),
            lease: lease.clone(),
            response_deflated: encode_response_deflated(&response),
            response,
            policy,
            effect,
        }
    }
}

/// What the batch decided for one completion.
#[derive(Debug)]
pub enum BatchedCompletion {
    /// The row and the completed record committed with the batch.
    Committed,
    /// Nothing was written for this completion: its lease does not hold a
    /// live started record, or its row is already there.
    /// `complete_with`'s transaction decides.
    Undecided,
    /// Not in the batch's transaction (a later completion of a key already
    /// in it), or in one the database refused: the completion's own
    /// one-statement path decides, with its effect given back.
    Alone(CompletionEffect),
    /// The database did not answer; the completion may have committed.
    Unavailable(String),
    /// The batch committed, but this completion's row disagrees with the
    /// machine: a bug, reported as the unbatched statement reports it.
    Refused(String),
}

impl BatchedCompletion {
    /// A short name for the outcome, for logs and assertions.
    pub fn kind(&self) -> &'static str {
        match self {
            BatchedCompletion::Committed => "committed",
            BatchedCompletion::Undecided => "undecided",
            BatchedCompletion::Alone(_) => "alone",
            BatchedCompletion::Unavailable(_) => "unavailable",
            BatchedCompletion::Refused(_) => "refused",
        }
    }
}

/// Runs completion batches on the store's pool.
pub(crate) struct CompletionBatchRunner {
    pub pool: Pool,
    pub operation_timeout: Duration,
}

pub(crate) type CompletionBatcher = Batcher<CompletionBatchRunner>;

/// What the batch's transaction decided for one of its completions, before
/// the rows are given back.
enum Decided {
    Committed,
    Undecided,
    Refused(String),
}

#[async_trait]
impl BatchRunner for CompletionBatchRunner {
    type Item = CompletionItem;
    type Outcome = BatchedCompletion;

    async fn run(&self, items: Vec<CompletionItem>) -> Vec<BatchedCompletion> {
        let slots: Vec<&Slot> = items.iter().map(|item| &item.slot).collect();
        let chosen = first_of_each_key_in_lock_order(&slots);
        let mut decided: Vec<Option<Decided>> = (0..items.len()).map(|_| None).collect();
        let run = self.run_transaction(&items, &chosen);
        match tokio::time::timeout(self.operation_timeout, run).await {
            Ok(Ok(outcomes)) => {
                for (index, outcome) in chosen.into_iter().zip(outcomes) {
                    decided[index] = Some(outcome);
                }
            }
            Ok(Err(error @ StoreError::Unavailable { .. })) => {
                let detail = error.to_string();
                return items
                    .iter()
                    .map(|_| BatchedCompletion::Unavailable(detail.clone()))
                    .collect();
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, completions = items.len(), "a completion batch was refused; each goes alone");
            }
            Err(_elapsed) => {
                let detail = format!(
                    "the postgresql completion batch did not finish within {:?}",
                    self.operation_timeout
                );
                return items
                    .iter()
                    .map(|_| BatchedCompletion::Unavailable(detail.clone()))
                    .collect();
            }
        }
        items
            .into_iter()
            .zip(decided)
            .map(|(item, decided)| match decided {
                Some(Decided::Committed) => BatchedCompletion::Committed,
                Some(Decided::Undecided) => BatchedCompletion::Undecided,
                Some(Decided::Refused(detail)) => BatchedCompletion::Refused(detail),
                None => BatchedCompletion::Alone(item.effect),
            })
            .collect()
    }
}

impl CompletionBatchRunner {
    /// `BEGIN`, the statements of `chosen` (indices into `items`) and
    /// `COMMIT`, pipelined; each statement's outcome, in `chosen`'s order.
    async fn run_transaction(&self, items: &[CompletionItem], chosen: &[usize]) -> Result<Vec<Decided>, StoreError> {
        let connection = self.pool.get().await.map_err(pool_error)?;
        // Prepared (cached on the connection) before the transaction opens:
        // a failure here leaves the connection fit for the pool.
        let mut statements = Vec::with_capacity(chosen.len());
        for &index in chosen {
            let sql = match &items[index].effect {
                CompletionEffect::Row(row) => completion_with_row_statement(row.into, row.values),
                CompletionEffect::Nothing => COMPLETE.to_owned(),
            };
            statements.push(connection.prepare_cached(&sql).await.map_err(store_error)?);
        }
        let mut open = InTransaction {
            connection: Some(connection),
        };
        let client = open.client();
        let completions: Vec<CompletionParams<'_>> = chosen
            .iter()
            .map(|&index| {
                let item = &items[index];
                CompletionParams::new(&item.slot, &item.lease, &item.response_deflated, &item.policy)
            })
            .collect();
        let params: Vec<Vec<&(dyn ToSql + Sync)>> = chosen
            .iter()
            .zip(&completions)
            .map(|(&index, completion)| {
                let mut params = completion.params().to_vec();
                if let CompletionEffect::Row(row) = &items[index].effect {
                    params.extend(row.borrowed_params());
                }
                params
            })
            .collect();
        let statements_run = futures::future::join_all(
            statements
                .iter()
                .zip(&params)
                .map(|(statement, params)| client.query(statement, params)),
        );
        // Sent in this order on the connection (each future sends its
        // messages when first polled, and `join!` first polls in order).
        let (begun, rows, committed) = tokio::join!(
            client.batch_execute("BEGIN"),
            statements_run,
            client.batch_execute("COMMIT")
        );
        if committed.is_ok() {
            // Committed, or rolled back after a failed statement: either way
            // the connection is out of the transaction.
            open.connection = None;
        }
        begun.map_err(store_error)?;
        let rows: Vec<Vec<Row>> = rows.into_iter().collect::<Result<_, _>>().map_err(store_error)?;
        committed.map_err(store_error)?;
        Ok(rows
            .iter()
            .zip(chosen)
            .map(|(rows, &index)| decide(rows, &items[index]))
            .collect())
    }
}

/// One committed statement's rows, as the machine judges them: a
/// completion with a row answers one row (`completed` says whether it
/// wrote), a plain one a row only when it wrote.
fn decide(rows: &[Row], item: &CompletionItem) -> Decided {
    let (lease, response, policy) = (&item.lease, &item.response, &item.policy);
    let decision = match (&item.effect, rows) {
        (CompletionEffect::Row(_), [row]) => completion_with_row_decision(row, lease, response, policy),
        (CompletionEffect::Nothing, [] | [_]) => complete_decision(rows.first(), lease, response, policy),
        (_, rows) => Err(Attempt::Fail(StoreError::Refused {
            detail: format!("a batched completion answered {} rows", rows.len()),
            source: None,
        })),
    };
    match decision {
        Ok(Some(_)) => Decided::Committed,
        Ok(None) => Decided::Undecided,
        Err(Attempt::Fail(error)) => Decided::Refused(error.to_string()),
        Err(Attempt::Conflict(detail)) => Decided::Refused(detail),
    }
}

/// The batch's connection while its transaction may be open: dropped then
/// (an error, the operation timeout, a dying lane), the connection is
/// closed instead of going back to the pool, and the server rolls back.
struct InTransaction {
    connection: Option<deadpool_postgres::Object>,
}

impl InTransaction {
    fn client(&self) -> &Client {
        self.connection
            .as_ref()
            .expect("the batch holds its connection until its transaction ends")
    }
}

impl Drop for InTransaction {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take() {
            drop(deadpool_postgres::Object::take(connection));
        }
    }
}
