//! [`PostgresStore`]: the specification's two short transactions, with every
//! decision made by store-core's pure state machine.
//!
//! Each call first tries its common case as one autocommit statement
//! (`one_statement.rs`: one round trip, the machine run on what the
//! statement read). Where that statement's guard does not hold, the call is
//! one transaction that reads the clock (`now()`, the transaction's start, so
//! every comparison inside it sees one instant), locks the record, asks
//! [`store_core::machine`] what to do, writes that one step and commits. No
//! transaction or lock outlives a call, so nothing is held while the handler
//! talks to the carrier.

use crate::claim_batch::{BatchedClaim, CLAIM_BATCH_QUEUED_ITEMS_MAX, ClaimBatchRunner, ClaimBatcher, ClaimItem};
use crate::completion_batch::{
    BatchedCompletion, COMPLETION_BATCH_QUEUED_ITEMS_MAX, CompletionBatchRunner, CompletionBatcher, CompletionEffect,
    CompletionItem,
};
use crate::config::{ConfigError, PostgresConfig};
use crate::effect::completion_batch_error;
use crate::error::{Attempt, RETRY_BACKOFF_MS_MAX, TRANSACTION_ATTEMPTS_MAX};
use crate::notify::ChangeListener;
use crate::one_statement::{self, FencedWrite};
use crate::row::{RecordColumns, Slot, guard_of, record_columns, record_columns_written, record_from_row, time_column};
use async_trait::async_trait;
use deadpool_postgres::{GenericClient, Pool};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use store_core::machine::{self, Found, Write};
use store_core::{
    BatchError, BatchLimits, Batcher, CallerId, ChangeHub, ClaimOutcome, ClaimRequest, Fenced, ForgetOutcome,
    HeldLease, IdempotencyKey, IdempotencyStore, KeyDigest, PURGE_BATCH_MAX, Policy, PurgeReport, Record, RecordId,
    RecoveryPoint, SavedResponse, StoreError,
};

const SELECT_CLOCK: &str = "SELECT now() AS now";

const SELECT_CLOCK_AND_TOMBSTONE: &str = "SELECT now() AS now, EXISTS (\
     SELECT 1 FROM idempotency_tombstones \
      WHERE caller_id = $1 AND idem_key = $2 AND expires_at > now()) AS tombstoned";

pub(crate) const SELECT_FOR_UPDATE: &str = concat!(
    "SELECT ",
    record_columns!(),
    ", now() AS now FROM idempotency_keys WHERE caller_id = $1 AND idem_key = $2 FOR UPDATE"
);

const SELECT_RECORD: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM idempotency_keys WHERE caller_id = $1 AND idem_key = $2"
);

const INSERT_RECORD: &str = concat!(
    "INSERT INTO idempotency_keys (caller_id, idem_key, ",
    record_columns_written!(),
    ") VALUES ($1, $2, $3, $4::text::idempotency_state, $5, $6, $7, $8, $9, $10, $11) \
     ON CONFLICT (caller_id, idem_key) DO NOTHING"
);

/// The SET list of a write of the whole record, from `$3`. The four
/// columns a row written before migration 0005 keeps its response in are
/// cleared: the record's response, if any, is in `response` now.
macro_rules! whole_record {
    () => {
        "request_hash = $3, state = $4::text::idempotency_state, locked_until = $5, lease_token = $6, \
         recovery_point = $7, response = $8, completed_by = $9, created_at = $10, expires_at = $11, \
         response_status = NULL, response_header_names = NULL, response_header_values = NULL, response_body = NULL"
    };
}

/// Its guard: the state and token the record was read with, in `$12`, `$13`.
macro_rules! as_read {
    () => {
        " WHERE caller_id = $1 AND idem_key = $2 \
           AND state = $12::text::idempotency_state AND lease_token IS NOT DISTINCT FROM $13"
    };
}

/// Replaces the whole record, guarded by the state and token it was read
/// with: under the row lock the guard always holds, and if it ever did not,
/// the write would change nothing and be reported instead of overwriting.
const UPDATE_RECORD: &str = concat!("UPDATE idempotency_keys SET ", whole_record!(), as_read!());

/// [`UPDATE_RECORD`] that fails (division by zero) unless it replaced exactly
/// one row: pipelined before `COMMIT`, a miss must abort the transaction.
pub(crate) const UPDATE_RECORD_OR_FAIL: &str = concat!(
    "WITH updated AS (UPDATE idempotency_keys SET ",
    whole_record!(),
    as_read!(),
    " RETURNING 1) SELECT 1 / (SELECT count(*)::int FROM updated) AS replaced"
);

const DELETE_RECORD: &str = "DELETE FROM idempotency_keys WHERE caller_id = $1 AND idem_key = $2 \
       AND state = $3::text::idempotency_state AND lease_token IS NOT DISTINCT FROM $4";

/// Deletes the row forget found unreadable; it holds the row's lock.
const DELETE_UNREADABLE_RECORD: &str = "DELETE FROM idempotency_keys WHERE caller_id = $1 AND idem_key = $2";

/// One batch of the sweeper, in one statement so a purged record and its
/// tombstone commit together. The predicate `expires_at <= now()` is
/// [`machine::is_purgeable`]; `SKIP LOCKED` lets concurrent sweepers take
/// disjoint batches, and leaves alone a row that a claim has locked.
const PURGE_RECORDS: &str = "WITH due AS (\
         SELECT caller_id, idem_key FROM idempotency_keys \
          WHERE expires_at <= now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED), \
     purged AS (\
         DELETE FROM idempotency_keys AS keys USING due \
          WHERE keys.caller_id = due.caller_id AND keys.idem_key = due.idem_key \
         RETURNING keys.caller_id, keys.idem_key, keys.expires_at), \
     tombstoned AS (\
         INSERT INTO idempotency_tombstones AS tombstones (caller_id, idem_key, expires_at) \
         SELECT caller_id, idem_key, expires_at + $2::bigint * interval '1 millisecond' FROM purged \
         ON CONFLICT (caller_id, idem_key) \
         DO UPDATE SET expires_at = greatest(tombstones.expires_at, excluded.expires_at)) \
     SELECT count(*) AS purged FROM purged";

const PURGE_TOMBSTONES: &str = "WITH due AS (\
         SELECT caller_id, idem_key FROM idempotency_tombstones \
          WHERE expires_at <= now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED), \
     purged AS (\
         DELETE FROM idempotency_tombstones AS tombstones USING due \
          WHERE tombstones.caller_id = due.caller_id AND tombstones.idem_key = due.idem_key \
         RETURNING 1) \
     SELECT count(*) AS purged FROM purged";

/// The idempotency store on PostgreSQL. Cheap to clone: clones share the pool.
#[derive(Clone)]
pub struct PostgresStore {
    pub(crate) pool: Pool,
    pub(crate) policy: Policy,
    pub(crate) operation_timeout: Duration,
    /// Waiters on this instance, woken by its change listener (`notify.rs`).
    changes: ChangeHub,
    /// Claims batched across calls (`claim_batch.rs`); `None` when the config's
    /// `batch_items_max` is 1, and every claim goes alone.
    claims: Option<ClaimBatcher>,
    /// Completions with one effect row batched across calls
    /// (`completion_batch.rs`); `None` as `claims`.
    pub(crate) completions: Option<CompletionBatcher>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("pool", &self.pool.status())
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Builds the store and its pool. No connection is made here: a database
    /// that is down shows up as retryable errors from the calls. Run
    /// [`PostgresStore::migrate`] once before serving.
    pub fn new(config: &PostgresConfig, policy: Policy) -> Result<Self, ConfigError> {
        let pool = config.build_pool()?;
        let listener = {
            let (driver_config, tls) = config.listener_config()?;
            ChangeListener::new(driver_config, tls, pool.clone(), config.operation_timeout())
        };
        let claims = Self::claim_batcher(config, &pool)?;
        let completions = Self::completion_batcher(config, &pool)?;
        Ok(Self {
            pool,
            policy,
            operation_timeout: config.operation_timeout(),
            changes: ChangeHub::with_source(Arc::new(listener)),
            claims,
            completions,
        })
    }

    fn completion_batcher(config: &PostgresConfig, pool: &Pool) -> Result<Option<CompletionBatcher>, ConfigError> {
        if config.batch_items_max == 1 {
            return Ok(None);
        }
        let limits = BatchLimits::new(
            config.batch_items_max,
            COMPLETION_BATCH_QUEUED_ITEMS_MAX,
            config.batches_in_flight_max,
        )
        .map_err(|_| ConfigError::BatchesInFlight(config.batches_in_flight_max))?;
        let runner = CompletionBatchRunner {
            pool: pool.clone(),
            operation_timeout: config.operation_timeout(),
        };
        Ok(Some(Batcher::new(runner, limits)))
    }

    fn claim_batcher(config: &PostgresConfig, pool: &Pool) -> Result<Option<ClaimBatcher>, ConfigError> {
        if config.batch_items_max == 1 {
            return Ok(None);
        }
        let limits = BatchLimits::new(
            config.batch_items_max,
            CLAIM_BATCH_QUEUED_ITEMS_MAX,
            config.batches_in_flight_max,
        )
        .map_err(|_| ConfigError::BatchesInFlight(config.batches_in_flight_max))?;
        let runner = ClaimBatchRunner {
            pool: pool.clone(),
            operation_timeout: config.operation_timeout(),
        };
        Ok(Some(Batcher::new(runner, limits)))
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The pool, for the server's own queries on the same database.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Wakes this instance's waiters at once after its own write that may
    /// have ended a started state; other instances hear of it through the
    /// trigger's notification (docs/design.md#waiting). Only a lost lease
    /// certainly wrote nothing.
    fn announce_end(&self, lease: &HeldLease, result: &Result<Fenced, StoreError>) {
        if !matches!(result, Ok(Fenced::LeaseLost)) {
            self.changes.notify(&RecordId::new(&lease.caller, &lease.key));
        }
    }

    /// Runs `attempt` until it succeeds, fails for good, or has met
    /// [`TRANSACTION_ATTEMPTS_MAX`] conflicts. Each attempt is bounded by the
    /// operation timeout, so a database that stopped answering gives a
    /// retryable error instead of a hang.
    pub(crate) async fn with_retries<O, E, F, Fut>(&self, mut attempt: F) -> Result<O, E>
    where
        E: From<StoreError>,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<O, Attempt<E>>>,
    {
        let mut last_conflict = String::new();
        for attempt_number in 1..=TRANSACTION_ATTEMPTS_MAX {
            match tokio::time::timeout(self.operation_timeout, attempt()).await {
                Ok(Ok(output)) => return Ok(output),
                Ok(Err(Attempt::Fail(error))) => return Err(error),
                Ok(Err(Attempt::Conflict(detail))) => {
                    tracing::debug!(attempt_number, %detail, "postgresql transaction conflicted; retrying");
                    last_conflict = detail;
                }
                Err(_elapsed) => {
                    let detail = format!(
                        "the postgresql transaction did not finish within {:?}",
                        self.operation_timeout
                    );
                    return Err(StoreError::Unavailable { detail, source: None }.into());
                }
            }
            if attempt_number < TRANSACTION_ATTEMPTS_MAX {
                pause_before_retry(attempt_number).await;
            }
        }
        Err(StoreError::RetriesExhausted {
            attempts: TRANSACTION_ATTEMPTS_MAX,
            detail: last_conflict,
        }
        .into())
    }

    /// The claim's batch, or [`BatchedClaim::Alone`] without batching or
    /// when the batch's lane ended without an answer.
    pub(crate) async fn claim_in_batch(&self, request: &ClaimRequest) -> Result<BatchedClaim, StoreError> {
        let Some(claims) = &self.claims else {
            return Ok(BatchedClaim::Alone);
        };
        let item = ClaimItem {
            slot: Slot::new(&request.caller, &request.key),
            request: request.clone(),
            policy: self.policy,
        };
        match claims.submit(item).await {
            Ok(batched) => Ok(batched),
            Err(BatchError::Lost) => Ok(BatchedClaim::Alone),
            Err(refused @ BatchError::QueueFull { .. }) => Err(StoreError::unavailable(
                "postgresql claims are queued past their bound",
                refused,
            )),
        }
    }

    /// A claim the batch did not decide, on the path the batch chose.
    pub(crate) async fn finish_claim(
        &self,
        request: &ClaimRequest,
        batched: BatchedClaim,
    ) -> Result<ClaimOutcome, StoreError> {
        match batched {
            BatchedClaim::Decided(outcome) => Ok(outcome),
            BatchedClaim::Locked => {
                let slot = Slot::new(&request.caller, &request.key);
                self.with_retries(|| async {
                    let mut connection = self.pool.get().await?;
                    self.claim_locked(&mut connection, &slot, request).await
                })
                .await
            }
            BatchedClaim::Alone => self.with_retries(|| self.claim_once(request)).await,
            BatchedClaim::Unavailable(detail) => Err(StoreError::Unavailable { detail, source: None }),
        }
    }

    /// Transaction 1 of the specification: one statement when the key is
    /// new or its record needs no write (see `one_statement.rs`); otherwise
    /// the locked path.
    async fn claim_once(&self, request: &ClaimRequest) -> Result<ClaimOutcome, Attempt<StoreError>> {
        let slot = Slot::new(&request.caller, &request.key);
        let mut connection = self.pool.get().await?;
        if let Some(outcome) = one_statement::claim(&connection, &slot, request, &self.policy).await? {
            return Ok(outcome);
        }
        self.claim_locked(&mut connection, &slot, request).await
    }

    /// A claim in a transaction: insert, or lock and inspect the row that is
    /// already there, let the machine decide, and commit at once.
    async fn claim_locked(
        &self,
        connection: &mut deadpool_postgres::Object,
        slot: &Slot,
        request: &ClaimRequest,
    ) -> Result<ClaimOutcome, Attempt<StoreError>> {
        let transaction = connection.transaction().await?;
        let (now_ms, tombstoned) = read_clock_and_tombstone(&transaction, slot).await?;
        let absent = if tombstoned { Found::Tombstone } else { Found::Nothing };
        let first_run = machine::claim(absent, request, now_ms, &self.policy);
        if let Write::Put(record) = &first_run.write
            && insert_record(&transaction, slot, record).await?
        {
            transaction.commit().await?;
            return Ok(first_run.outcome);
        }
        // The key exists as a committed row (ON CONFLICT waited for any
        // insert in flight): lock it and let the machine decide.
        let (existing, now_ms) = lock_record(&transaction, slot).await?;
        let Some(existing) = existing else {
            return Err(Attempt::Conflict(
                "the row was deleted between the insert and the lock".into(),
            ));
        };
        let step = machine::claim(Found::Record(&existing), request, now_ms, &self.policy);
        write_step(&transaction, slot, Some(&existing), &step.write).await?;
        transaction.commit().await?;
        Ok(step.outcome)
    }

    /// A fenced write (transaction 2 without an effect): one statement
    /// while the token holds the record, otherwise the locked path.
    async fn fenced(&self, lease: &HeldLease, write: FencedWrite<'_>) -> Result<Fenced, StoreError> {
        self.with_retries(|| self.fenced_once(lease, write)).await
    }

    async fn fenced_once(&self, lease: &HeldLease, write: FencedWrite<'_>) -> Result<Fenced, Attempt<StoreError>> {
        let slot = Slot::new(&lease.caller, &lease.key);
        let mut connection = self.pool.get().await?;
        if let Some(outcome) = one_statement::fenced_write(&connection, &slot, lease, write, &self.policy).await? {
            return Ok(outcome);
        }
        self.fenced_locked(&mut connection, &slot, lease, write).await
    }

    /// A completion in a batch with the completions that arrive while the
    /// previous batch is in flight (`completion_batch.rs`); what the batch
    /// does not decide takes the locked path, or the whole unbatched path.
    async fn complete_in_batch(&self, lease: &HeldLease, response: &SavedResponse) -> Result<Fenced, StoreError> {
        let write = FencedWrite::Complete(response);
        let Some(completions) = &self.completions else {
            return self.fenced(lease, write).await;
        };
        let item = CompletionItem::new(lease, response.clone(), self.policy, CompletionEffect::Nothing);
        let batched = match completions.submit(item).await {
            // Safe to send again: a completion already saved by this token
            // is applied, not saved twice.
            Err(BatchError::Lost) => return self.fenced(lease, write).await,
            other => other.map_err(completion_batch_error)?,
        };
        self.finish_complete(lease, response, batched).await
    }

    /// A plain completion on the path its batch chose.
    pub(crate) async fn finish_complete(
        &self,
        lease: &HeldLease,
        response: &SavedResponse,
        batched: BatchedCompletion,
    ) -> Result<Fenced, StoreError> {
        let write = FencedWrite::Complete(response);
        match batched {
            BatchedCompletion::Committed => Ok(Fenced::Applied(())),
            BatchedCompletion::Undecided => {
                let slot = Slot::new(&lease.caller, &lease.key);
                self.with_retries(|| async {
                    let mut connection = self.pool.get().await?;
                    self.fenced_locked(&mut connection, &slot, lease, write).await
                })
                .await
            }
            BatchedCompletion::Alone(_) => self.fenced(lease, write).await,
            BatchedCompletion::Unavailable(detail) => Err(StoreError::Unavailable { detail, source: None }),
            BatchedCompletion::Refused(detail) => Err(StoreError::Refused { detail, source: None }),
        }
    }

    /// A fenced write in a transaction: lock the row, let the machine check
    /// the token and make the step.
    async fn fenced_locked(
        &self,
        connection: &mut deadpool_postgres::Object,
        slot: &Slot,
        lease: &HeldLease,
        write: FencedWrite<'_>,
    ) -> Result<Fenced, Attempt<StoreError>> {
        let transaction = connection.transaction().await?;
        let (record, now_ms) = lock_record(&transaction, slot).await?;
        let step = write.step(Found::from_record(record.as_ref()), lease, now_ms, &self.policy);
        write_step(&transaction, slot, record.as_ref(), &step.write).await?;
        transaction.commit().await?;
        Ok(step.outcome)
    }

    async fn purge_once(&self, batch: usize) -> Result<PurgeReport, Attempt<StoreError>> {
        // Both values are bounded far below i64::MAX: the batch by
        // PURGE_BATCH_MAX and the tombstone window by RETENTION_MS_MAX.
        let limit = i64::try_from(batch).unwrap_or(i64::MAX);
        let tombstone_ms = i64::try_from(self.policy.tombstone_ms()).unwrap_or(i64::MAX);
        let connection = self.pool.get().await?;
        let records = connection.prepare_cached(PURGE_RECORDS).await?;
        let records: i64 = connection
            .query_one(&records, &[&limit, &tombstone_ms])
            .await?
            .get("purged");
        let tombstones = connection.prepare_cached(PURGE_TOMBSTONES).await?;
        let tombstones: i64 = connection.query_one(&tombstones, &[&limit]).await?.get("purged");
        Ok(PurgeReport {
            records_purged: records.unsigned_abs(),
            tombstones_purged: tombstones.unsigned_abs(),
            records_quarantined: 0,
            more: batch > 0 && (records >= limit || tombstones >= limit),
        })
    }

    /// Locks the row, decodes it as every call does, and deletes it in the
    /// same transaction only if that fails: the lock keeps any other
    /// transaction from changing the row between the check and the delete.
    async fn forget_once(&self, slot: &Slot) -> Result<ForgetOutcome, Attempt<StoreError>> {
        let mut connection = self.pool.get().await?;
        let transaction = connection.transaction().await?;
        let statement = transaction.prepare_cached(SELECT_FOR_UPDATE).await?;
        let rows = transaction.query(&statement, &[&slot.caller, &slot.key_digest]).await?;
        let Some(row) = rows.first() else {
            return Ok(ForgetOutcome::NotFound);
        };
        match record_from_row(row) {
            Ok(_) => return Ok(ForgetOutcome::Readable),
            Err(StoreError::Corrupt(_)) => {}
            Err(other) => return Err(Attempt::Fail(other)),
        }
        let statement = transaction.prepare_cached(DELETE_UNREADABLE_RECORD).await?;
        let deleted = transaction
            .execute(&statement, &[&slot.caller, &slot.key_digest])
            .await?;
        if deleted != 1 {
            return Err(Attempt::Fail(StoreError::Refused {
                detail: format!("deleting a locked unreadable row changed {deleted} rows instead of 1"),
                source: None,
            }));
        }
        transaction.commit().await?;
        Ok(ForgetOutcome::Deleted)
    }

    async fn inspect_once(&self, slot: &Slot) -> Result<Option<Record>, Attempt<StoreError>> {
        let connection = self.pool.get().await?;
        let statement = connection.prepare_cached(SELECT_RECORD).await?;
        let rows = connection.query(&statement, &[&slot.caller, &slot.key_digest]).await?;
        Ok(rows.first().map(record_from_row).transpose()?)
    }
}

/// A short jittered pause that grows with the attempt number.
async fn pause_before_retry(attempt_number: u32) {
    let ceiling_ms = RETRY_BACKOFF_MS_MAX * u64::from(attempt_number) / u64::from(TRANSACTION_ATTEMPTS_MAX);
    let pause_ms = rand::random_range(0..=ceiling_ms.max(1));
    tokio::time::sleep(Duration::from_millis(pause_ms)).await;
}

pub(crate) async fn read_clock<C, E>(client: &C) -> Result<u64, Attempt<E>>
where
    C: GenericClient,
    E: From<StoreError>,
{
    let statement = client.prepare_cached(SELECT_CLOCK).await?;
    let row = client.query_one(&statement, &[]).await?;
    Ok(time_column(&row, "now")?)
}

async fn read_clock_and_tombstone<C: GenericClient>(
    client: &C,
    slot: &Slot,
) -> Result<(u64, bool), Attempt<StoreError>> {
    let statement = client.prepare_cached(SELECT_CLOCK_AND_TOMBSTONE).await?;
    let row = client.query_one(&statement, &[&slot.caller, &slot.key_digest]).await?;
    Ok((time_column(&row, "now")?, row.try_get("tombstoned")?))
}

/// Locks the record `FOR UPDATE` and reads the transaction's clock. The lock
/// is what makes the machine's decision safe: no other transaction can
/// change the row until this one ends.
pub(crate) async fn lock_record<C, E>(client: &C, slot: &Slot) -> Result<(Option<Record>, u64), Attempt<E>>
where
    C: GenericClient,
    E: From<StoreError>,
{
    let statement = client.prepare_cached(SELECT_FOR_UPDATE).await?;
    let rows = client.query(&statement, &[&slot.caller, &slot.key_digest]).await?;
    match rows.first() {
        Some(row) => Ok((Some(record_from_row(row)?), time_column(row, "now")?)),
        None => Ok((None, read_clock(client).await?)),
    }
}

/// Inserts a new record; false when a row for the key already exists.
async fn insert_record<C, E>(client: &C, slot: &Slot, record: &Record) -> Result<bool, Attempt<E>>
where
    C: GenericClient,
    E: From<StoreError>,
{
    let columns = RecordColumns::of(record);
    let statement = client.prepare_cached(INSERT_RECORD).await?;
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&slot.caller, &slot.key_digest];
    params.extend(columns.params());
    Ok(client.execute(&statement, &params).await? == 1)
}

/// Commits the machine's one write. `previous` is the record as it was read
/// under the lock, and guards the UPDATE or DELETE.
pub(crate) async fn write_step<C, E>(
    client: &C,
    slot: &Slot,
    previous: Option<&Record>,
    write: &Write,
) -> Result<(), Attempt<E>>
where
    C: GenericClient,
    E: From<StoreError>,
{
    let changed = match (write, previous) {
        (Write::Nothing, _) | (Write::Delete, None) => return Ok(()),
        (Write::Put(record), None) => {
            if insert_record(client, slot, record).await? {
                return Ok(());
            }
            return Err(Attempt::Conflict(
                "a row for the key appeared during the transaction".into(),
            ));
        }
        (Write::Put(record), Some(previous)) => {
            let columns = RecordColumns::of(record);
            let (state, token) = guard_of(previous);
            let statement = client.prepare_cached(UPDATE_RECORD).await?;
            let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&slot.caller, &slot.key_digest];
            params.extend(columns.params());
            params.extend([&state as &(dyn tokio_postgres::types::ToSql + Sync), &token]);
            client.execute(&statement, &params).await?
        }
        (Write::Delete, Some(previous)) => {
            let (state, token) = guard_of(previous);
            let statement = client.prepare_cached(DELETE_RECORD).await?;
            client
                .execute(&statement, &[&slot.caller, &slot.key_digest, &state, &token])
                .await?
        }
    };
    if changed == 1 {
        return Ok(());
    }
    // The row is locked, so its state cannot have moved since it was read:
    // if the guard missed, locking is broken and writing on would be unsafe.
    tracing::error!(changed, caller = %slot.caller, "a guarded write missed the row it had locked");
    Err(Attempt::Fail(
        StoreError::Refused {
            detail: format!("a guarded write changed {changed} rows instead of 1"),
            source: None,
        }
        .into(),
    ))
}

#[async_trait]
impl IdempotencyStore for PostgresStore {
    fn backend_name(&self) -> &'static str {
        "postgres"
    }

    /// In a batch with the claims that arrive while the previous batch is
    /// in flight (`claim_batch.rs`); what the batch does not decide takes the
    /// locked path, or the whole unbatched path.
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let batched = self.claim_in_batch(request).await?;
        self.finish_claim(request, batched).await
    }

    async fn checkpoint(&self, lease: &HeldLease, point: RecoveryPoint) -> Result<Fenced, StoreError> {
        self.fenced(lease, FencedWrite::Checkpoint(&point)).await
    }

    /// In a batch with the completions that arrive while the previous
    /// batch is in flight (`completion_batch.rs`).
    async fn complete(&self, lease: &HeldLease, response: SavedResponse) -> Result<Fenced, StoreError> {
        let result = self.complete_in_batch(lease, &response).await;
        self.announce_end(lease, &result);
        result
    }

    async fn release(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        let result = self.fenced(lease, FencedWrite::Release).await;
        self.announce_end(lease, &result);
        result
    }

    async fn abandon(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        let result = self.fenced(lease, FencedWrite::Abandon).await;
        self.announce_end(lease, &result);
        result
    }

    fn record_changes(&self) -> Option<&ChangeHub> {
        Some(&self.changes)
    }

    async fn purge_expired(&self, limit: usize) -> Result<PurgeReport, StoreError> {
        let batch = limit.min(PURGE_BATCH_MAX);
        self.with_retries(|| self.purge_once(batch)).await
    }

    async fn inspect(&self, caller: &CallerId, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        let slot = Slot::new(caller, key);
        self.with_retries(|| self.inspect_once(&slot)).await
    }

    async fn forget_unreadable_record(&self, caller: &CallerId, key: KeyDigest) -> Result<ForgetOutcome, StoreError> {
        let slot = Slot::of_digest(caller, key);
        let outcome = self.with_retries(|| self.forget_once(&slot)).await?;
        if outcome == ForgetOutcome::Deleted {
            tracing::warn!(%caller, key_sha256 = %key, "deleted an unreadable record: its key may be claimed again");
        }
        Ok(outcome)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.with_retries(|| async {
            let connection = self.pool.get().await?;
            connection.simple_query("SELECT 1").await?;
            Ok::<(), Attempt<StoreError>>(())
        })
        .await
    }
}
