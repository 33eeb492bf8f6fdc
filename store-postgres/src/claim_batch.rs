//! Claims batched across requests: the claims that arrive while a batch is
//! in flight go to the database together, as one autocommit statement, so a
//! batch pays one round trip and one commit (one WAL flush) instead of one
//! per claim (store-core's [`Batcher`], docs/design.md#backend-postgres).
//!
//! The statement is `one_statement.rs`'s claim over arrays: every key that
//! has neither a record nor a live tombstone gets the first run's record
//! (`INSERT ... SELECT ... FROM unnest(...) ON CONFLICT DO NOTHING`), and
//! every key's row as the statement's snapshot held it comes back, with the
//! database's clock, for the machine to judge exactly as the one-key
//! statement's row is judged (`one_statement::claim_decision`). What the
//! row does not decide (a takeover, a late key, a row committed after the
//! snapshot) takes the locked path of `store.rs`, as an unbatched claim
//! does.
//!
//! - **The same key twice in one batch.** Only a key's first claim goes into
//!   the statement; its later claims are answered [`BatchedClaim::Alone`]
//!   once the statement has committed, and take the whole unbatched path
//!   then, so they see the first claim's record exactly as if they had
//!   come one after the other.
//! - **Lock order.** The statement inserts in the order of (caller, key
//!   digest), so two batches in flight (or two processes) that insert
//!   overlapping keys wait for each other in one order and never deadlock.
//! - **A failed batch fails no claim.** If the database refuses the
//!   statement as a whole (a deadlock, a value it will not take), every
//!   claim of the batch takes the unbatched path on its own, where only a
//!   claim that fails alone fails. A database that did not answer (no
//!   connection, a lost one, the operation timeout) fails the batch's
//!   claims as it would have failed each of them alone: unavailable,
//!   retryable. Both are safe even if the statement committed: a claim
//!   re-sent with its own token finds its record and gets its lease back.

use crate::error::store_error;
use crate::one_statement::{bigint_ms, claim_decision};
use crate::row::{Slot, record_columns, token_to_uuid};
use async_trait::async_trait;
use deadpool_postgres::Pool;
use std::time::Duration;
use store_core::batch::first_item_of_each_key;
use store_core::{BatchRunner, Batcher, ClaimOutcome, ClaimRequest, Policy, StoreError};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

/// Claims waiting for a batch at most; past it a claim is refused as
/// unavailable at once (the database is not keeping up).
pub const CLAIM_BATCH_QUEUED_ITEMS_MAX: usize = 4_096;

/// The batched claim. Its items' columns are named `batch_*` so that the
/// record's columns (`record_columns!`) stay unambiguous. The main SELECT
/// does not see the CTE's inserts, so `found` is about a record that was
/// there before, as in the one-key statement.
///
/// Each item reads its record and its tombstone through a `LATERAL`
/// subquery with `LIMIT 1`, which the planner cannot flatten into a join:
/// every lookup is a probe of the table's primary key. As a plain join, the
/// prepared statement's generic plan (planned for an array of unknown
/// length, on statistics of a table that was small when the plan was made)
/// was a hash join over a sequential scan of the whole table, once per
/// batch, and its cost grew with every record the store kept.
pub(crate) const CLAIM_BATCH: &str = concat!(
    "WITH clock AS (SELECT date_trunc('milliseconds', now()) AS now), \
     items AS (SELECT * FROM unnest($1::text[], $2::bytea[], $3::bytea[], $4::uuid[], $5::bigint[], $6::bigint[]) \
         WITH ORDINALITY AS item(batch_caller, batch_key, batch_hash, batch_token, batch_lease_ms, \
             batch_retention_ms, batch_position)), \
     inserted AS (\
         INSERT INTO idempotency_keys (caller_id, idem_key, request_hash, state, locked_until, lease_token, \
             created_at, expires_at) \
         SELECT item.batch_caller, item.batch_key, item.batch_hash, 'started', \
             clock.now + item.batch_lease_ms * interval '1 millisecond', item.batch_token, clock.now, \
             clock.now + item.batch_retention_ms * interval '1 millisecond' \
           FROM items AS item CROSS JOIN clock \
           LEFT JOIN LATERAL (SELECT true AS live FROM idempotency_tombstones AS tombstones \
               WHERE tombstones.caller_id = item.batch_caller AND tombstones.idem_key = item.batch_key \
                 AND tombstones.expires_at > clock.now LIMIT 1) AS tombstone ON true \
          WHERE tombstone.live IS NULL \
          ORDER BY item.batch_position \
         ON CONFLICT (caller_id, idem_key) DO NOTHING RETURNING caller_id AS inserted_caller, \
             idem_key AS inserted_key) \
     SELECT item.batch_position AS position, clock.now AS now, \
         inserted.inserted_key IS NOT NULL AS inserted, \
         keys.request_hash IS NOT NULL AS found, ",
    record_columns!(),
    " FROM items AS item CROSS JOIN clock \
       LEFT JOIN LATERAL (SELECT * FROM idempotency_keys AS stored \
           WHERE stored.caller_id = item.batch_caller AND stored.idem_key = item.batch_key LIMIT 1) AS keys ON true \
       LEFT JOIN inserted ON inserted.inserted_caller = item.batch_caller AND inserted.inserted_key = item.batch_key \
      ORDER BY item.batch_position"
);

/// One claim of a batch, owned: it travels to the batch's task.
#[derive(Debug, Clone)]
pub(crate) struct ClaimItem {
    pub slot: Slot,
    pub request: ClaimRequest,
    pub policy: Policy,
}

/// What the batch decided for one claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchedClaim {
    /// The statement decided; the machine agrees.
    Decided(ClaimOutcome),
    /// The statement saw a record the machine must write over, a
    /// tombstone, or a row committed after its snapshot: the locked path
    /// decides.
    Locked,
    /// Not decided by the statement: a later claim of a key already in the
    /// batch, or a batch whose statement the database refused. The whole
    /// unbatched path decides (one statement, then the locked path).
    Alone,
    /// The database did not answer (no connection, a lost connection, the
    /// operation timeout): the claim fails as an unbatched claim would,
    /// rather than wait for the same database once more on its own.
    Unavailable(String),
}

/// Runs claim batches on the store's pool.
pub(crate) struct ClaimBatchRunner {
    pub pool: Pool,
    /// Bounds the statement, as every call of the store is bounded.
    pub operation_timeout: Duration,
}

pub(crate) type ClaimBatcher = Batcher<ClaimBatchRunner>;

#[async_trait]
impl BatchRunner for ClaimBatchRunner {
    type Item = ClaimItem;
    type Outcome = BatchedClaim;

    async fn run(&self, items: Vec<ClaimItem>) -> Vec<BatchedClaim> {
        let mut outcomes = vec![BatchedClaim::Alone; items.len()];
        let slots: Vec<&Slot> = items.iter().map(|item| &item.slot).collect();
        let statement_items = first_of_each_key_in_lock_order(&slots);
        let run = self.run_statement(&items, &statement_items);
        match tokio::time::timeout(self.operation_timeout, run).await {
            Ok(Ok(decided)) => {
                for (index, outcome) in statement_items.into_iter().zip(decided) {
                    outcomes[index] = outcome;
                }
            }
            Ok(Err(error @ StoreError::Unavailable { .. })) => {
                outcomes.fill(BatchedClaim::Unavailable(error.to_string()));
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, claims = items.len(), "a claim batch failed; each claim goes alone");
            }
            Err(_elapsed) => {
                let detail = format!(
                    "the postgresql claim batch did not finish within {:?}",
                    self.operation_timeout
                );
                outcomes.fill(BatchedClaim::Unavailable(detail));
            }
        }
        outcomes
    }
}

/// The indices of the items that go into a batch's statements: each key's
/// first item, sorted by (caller, key digest), the order the statements
/// lock rows in. Later items of a key stay out (they go alone, after the
/// batch).
pub(crate) fn first_of_each_key_in_lock_order(slots: &[&Slot]) -> Vec<usize> {
    let mut first = first_item_of_each_key(slots.iter().map(|slot| (&slot.caller, &slot.key_digest)));
    first.sort_by(|&a, &b| {
        let (a, b) = (slots[a], slots[b]);
        (&a.caller, &a.key_digest).cmp(&(&b.caller, &b.key_digest))
    });
    first
}

impl ClaimBatchRunner {
    /// The statement over `chosen` (indices into `items`), and its outcome
    /// for each, in `chosen`'s order.
    async fn run_statement(&self, items: &[ClaimItem], chosen: &[usize]) -> Result<Vec<BatchedClaim>, StoreError> {
        let columns = ClaimColumns::of(chosen.iter().map(|&index| &items[index]));
        let connection = self.pool.get().await.map_err(crate::error::pool_error)?;
        let statement = connection.prepare_cached(CLAIM_BATCH).await.map_err(store_error)?;
        let rows = connection
            .query(&statement, &columns.params())
            .await
            .map_err(store_error)?;
        if rows.len() != chosen.len() {
            return Err(StoreError::Refused {
                detail: format!("a claim batch of {} answered {} rows", chosen.len(), rows.len()),
                source: None,
            });
        }
        Ok(rows
            .iter()
            .zip(1_i64..)
            .zip(chosen)
            .map(|((row, position), &index)| decide(row, position, &items[index]))
            .collect())
    }
}

/// One row of the batch, which must be the item's own (its position), as
/// the machine judges it. A row that does not decode (an unreadable record)
/// is this claim's alone: it goes alone, and its own path reports it.
fn decide(row: &Row, position: i64, item: &ClaimItem) -> BatchedClaim {
    let answered: Result<i64, _> = row.try_get("position");
    assert_eq!(
        answered.ok(),
        Some(position),
        "the claim batch answers its items in order"
    );
    match claim_decision(row, &item.request, &item.policy) {
        Ok(Some(outcome)) => BatchedClaim::Decided(outcome),
        Ok(None) => BatchedClaim::Locked,
        Err(error) => {
            tracing::debug!(%error, "a claim batch row was not decided; the claim goes alone");
            BatchedClaim::Alone
        }
    }
}

/// The statement's array parameters, one element per claim.
struct ClaimColumns {
    callers: Vec<String>,
    keys: Vec<Vec<u8>>,
    hashes: Vec<Vec<u8>>,
    tokens: Vec<uuid::Uuid>,
    lease_ms: Vec<i64>,
    retention_ms: Vec<i64>,
}

impl ClaimColumns {
    fn of<'a>(items: impl Iterator<Item = &'a ClaimItem>) -> Self {
        let mut columns = Self {
            callers: Vec::new(),
            keys: Vec::new(),
            hashes: Vec::new(),
            tokens: Vec::new(),
            lease_ms: Vec::new(),
            retention_ms: Vec::new(),
        };
        for item in items {
            columns.callers.push(item.slot.caller.clone());
            columns.keys.push(item.slot.key_digest.clone());
            columns.hashes.push(item.request.fingerprint.0.to_vec());
            columns.tokens.push(token_to_uuid(item.request.token));
            columns.lease_ms.push(bigint_ms(item.policy.lease_ms()));
            columns.retention_ms.push(bigint_ms(item.policy.retention_ms()));
        }
        columns
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 6] {
        [
            &self.callers,
            &self.keys,
            &self.hashes,
            &self.tokens,
            &self.lease_ms,
            &self.retention_ms,
        ]
    }
}
