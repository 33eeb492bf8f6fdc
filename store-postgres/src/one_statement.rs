//! The common case of each transition as one autocommit statement: one round
//! trip instead of four (BEGIN, a locked read, a write, COMMIT).
//!
//! Each statement covers the case that needs no decision beyond a guard a
//! single row check can make:
//!
//! - a claim of a key that has no record and no tombstone inserts the first
//!   run's record; a claim of a key whose record needs no write (replay,
//!   mismatch, in progress, a re-sent claim) reads it;
//! - a fenced write (checkpoint, complete, release, abandon) by the token
//!   that still holds a live started record makes its write.
//!
//! Every statement returns what it read (the record as it was, and the
//! database's clock, truncated to the millisecond the records keep), and the
//! store runs `store_core::machine` on exactly that: the outcome reported is
//! always the machine's. Where a statement's guard does not hold it writes
//! nothing and answers "not decided", and the store takes the locked path of
//! `store.rs`, where the machine decides under `SELECT ... FOR UPDATE` as
//! before. The guards here are the machine's own (`held_by`: a live record,
//! started, this token); `tests/differential.rs` runs these statements and
//! the machine on the same random records and compares every outcome and
//! every row written.

use crate::error::Attempt;
use crate::row::{Slot, record_columns, record_from_row, time_column, token_to_uuid};
use deadpool_postgres::GenericClient;
use store_core::machine::{self, Found, Step, Write};
use store_core::{
    ClaimOutcome, ClaimRequest, Fenced, HeldLease, Policy, RecoveryPoint, SavedResponse, StoreError,
    encode_response_deflated,
};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

/// The database's clock as the records keep it: whole milliseconds, so a
/// comparison in SQL and the machine's comparison of the same values agree.
macro_rules! clock {
    () => {
        "(SELECT date_trunc('milliseconds', now()) AS now) AS clock"
    };
}

/// Inserts the first run's record when the key has neither a record nor a
/// live tombstone; otherwise returns the record (if the statement's snapshot
/// holds one) for the machine to judge. The main SELECT does not see the
/// CTE's insert, so `found` is about a record that was there before.
const CLAIM: &str = concat!(
    "WITH clock AS (SELECT date_trunc('milliseconds', now()) AS now), \
     tombstone AS (SELECT EXISTS (SELECT 1 FROM idempotency_tombstones, clock \
         WHERE caller_id = $1 AND idem_key = $2 AND expires_at > clock.now) AS tombstoned), \
     inserted AS (\
         INSERT INTO idempotency_keys (caller_id, idem_key, request_hash, state, locked_until, lease_token, \
             created_at, expires_at) \
         SELECT $1, $2, $3, 'started', clock.now + $5::bigint * interval '1 millisecond', $4, clock.now, \
             clock.now + $6::bigint * interval '1 millisecond' \
           FROM clock, tombstone WHERE NOT tombstone.tombstoned \
         ON CONFLICT (caller_id, idem_key) DO NOTHING RETURNING 1) \
     SELECT clock.now AS now, EXISTS (SELECT 1 FROM inserted) AS inserted, \
         keys.request_hash IS NOT NULL AS found, ",
    record_columns!(),
    " FROM clock CROSS JOIN tombstone \
       LEFT JOIN idempotency_keys AS keys ON keys.caller_id = $1 AND keys.idem_key = $2"
);

/// The guard of every fenced statement on the row `keys` of `$1`, `$2`: the
/// record is live, started, and held by the token in `$3`. It is the
/// machine's `held_by`; the lease's own expiry does not matter while nobody
/// has taken the key over.
macro_rules! holder_guard {
    () => {
        "keys.state = 'started' AND keys.lease_token = $3 AND keys.expires_at > clock.now"
    };
}

macro_rules! held_by_token {
    () => {
        concat!(
            " WHERE keys.caller_id = $1 AND keys.idem_key = $2 AND ",
            holder_guard!()
        )
    };
}

/// What a completion writes (the machine's completed record), with the
/// deflated response in `$4`, the token in `$3` and the retention in `$5`.
/// The record it completes is started, so the response's columns from
/// before migration 0005 are null already.
macro_rules! completion_columns {
    () => {
        "state = 'completed', locked_until = NULL, lease_token = NULL, recovery_point = NULL, \
         response = $4, completed_by = $3, expires_at = clock.now + $5::bigint * interval '1 millisecond'"
    };
}

/// An UPDATE that also returns the record as it was before: the row is
/// locked by the subquery, so `previous` is the version the UPDATE replaces.
macro_rules! fenced_update {
    ($set:expr) => {
        concat!(
            "UPDATE idempotency_keys AS keys SET ",
            $set,
            " FROM ",
            clock!(),
            ", (SELECT ",
            record_columns!(),
            " FROM idempotency_keys WHERE caller_id = $1 AND idem_key = $2 FOR UPDATE) AS previous",
            held_by_token!(),
            " RETURNING previous.*, clock.now AS now"
        )
    };
}

const CHECKPOINT: &str = fenced_update!("recovery_point = $4");

pub(crate) const COMPLETE: &str = fenced_update!(completion_columns!());

const RELEASE: &str = fenced_update!("locked_until = least(keys.locked_until, clock.now)");

const ABANDON: &str = concat!(
    "DELETE FROM idempotency_keys AS keys USING ",
    clock!(),
    held_by_token!(),
    " RETURNING ",
    record_columns!(),
    ", clock.now AS now"
);

/// Milliseconds as a PostgreSQL bigint. Policy values are bounded far below
/// `i64::MAX` (`store_core::RETENTION_MS_MAX`), so this never saturates.
pub(crate) fn bigint_ms(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// A claim in one statement: the machine's outcome, or `None` when the
/// machine has a write to make over an existing record (a takeover, a late
/// key, an expired record) and the locked path must decide.
pub(crate) async fn claim<C: GenericClient>(
    client: &C,
    slot: &Slot,
    request: &ClaimRequest,
    policy: &Policy,
) -> Result<Option<ClaimOutcome>, Attempt<StoreError>> {
    let statement = client.prepare_cached(CLAIM).await?;
    let (token, lease_ms, retention_ms) = (
        token_to_uuid(request.token),
        bigint_ms(policy.lease_ms()),
        bigint_ms(policy.retention_ms()),
    );
    let fingerprint = request.fingerprint.0.as_slice();
    let params: [&(dyn ToSql + Sync); 6] = [
        &slot.caller,
        &slot.key_digest,
        &fingerprint,
        &token,
        &lease_ms,
        &retention_ms,
    ];
    let row = client.query_one(&statement, &params).await?;
    Ok(claim_decision(&row, request, policy)?)
}

/// What a claim statement's row decides (this one's, or one row of the
/// batched claim in `claim_batch.rs`, which has the same columns): the machine's
/// outcome, or `None` for the locked path. The row has `now`, `inserted`
/// (this statement inserted the key's first record), `found` (the
/// statement's snapshot held a record) and that record's columns.
pub(crate) fn claim_decision(
    row: &Row,
    request: &ClaimRequest,
    policy: &Policy,
) -> Result<Option<ClaimOutcome>, StoreError> {
    let now_ms = time_column(row, "now")?;
    if boolean_column(row, "inserted")? {
        let step = machine::claim(Found::Nothing, request, now_ms, policy);
        assert!(
            matches!((&step.write, &step.outcome), (Write::Put(_), ClaimOutcome::Acquired(_))),
            "the machine must acquire a key that has no record"
        );
        return Ok(Some(step.outcome));
    }
    if !boolean_column(row, "found")? {
        // A tombstone (a late key), or a record committed after this
        // statement's snapshot: the locked path sees both.
        return Ok(None);
    }
    let existing = record_from_row(row)?;
    let step = machine::claim(Found::Record(&existing), request, now_ms, policy);
    Ok(matches!(step.write, Write::Nothing).then_some(step.outcome))
}

/// A fenced write: which transition, with what it saves.
#[derive(Debug, Clone, Copy)]
pub(crate) enum FencedWrite<'a> {
    Checkpoint(&'a RecoveryPoint),
    Complete(&'a SavedResponse),
    Release,
    Abandon,
}

impl FencedWrite<'_> {
    /// The machine's step for this write: what both paths report.
    pub(crate) fn step(&self, found: Found<'_>, lease: &HeldLease, now_ms: u64, policy: &Policy) -> Step<Fenced> {
        match self {
            FencedWrite::Checkpoint(point) => machine::checkpoint(found, lease.token, (*point).clone(), now_ms),
            FencedWrite::Complete(response) => {
                machine::complete(found, lease.token, (*response).clone(), now_ms, policy)
            }
            FencedWrite::Release => machine::release(found, lease.token, now_ms),
            FencedWrite::Abandon => machine::abandon(found, lease.token, now_ms),
        }
    }
}

/// A fenced write in one statement: the machine's outcome when the token
/// holds a live started record, or `None` (nothing written) for the locked
/// path to decide: a lost lease, a completion already saved by this token,
/// an abandon of a record that is gone.
pub(crate) async fn fenced_write<C: GenericClient>(
    client: &C,
    slot: &Slot,
    lease: &HeldLease,
    write: FencedWrite<'_>,
    policy: &Policy,
) -> Result<Option<Fenced>, Attempt<StoreError>> {
    let token = token_to_uuid(lease.token);
    let step = |found: Found<'_>, now_ms: u64| write.step(found, lease, now_ms, policy);
    match write {
        FencedWrite::Checkpoint(point) => {
            let point_bytes = point.as_bytes();
            let params: [&(dyn ToSql + Sync); 4] = [&slot.caller, &slot.key_digest, &token, &point_bytes];
            fenced(client, CHECKPOINT, &params, step).await
        }
        FencedWrite::Complete(response) => {
            let deflated = encode_response_deflated(response);
            let completion = CompletionParams::new(slot, lease, &deflated, policy);
            fenced(client, COMPLETE, &completion.params(), step).await
        }
        FencedWrite::Release => {
            let params: [&(dyn ToSql + Sync); 3] = [&slot.caller, &slot.key_digest, &token];
            fenced(client, RELEASE, &params, step).await
        }
        FencedWrite::Abandon => {
            let params: [&(dyn ToSql + Sync); 3] = [&slot.caller, &slot.key_digest, &token];
            fenced(client, ABANDON, &params, step).await
        }
    }
}

/// The parameters `$1` to `$5` of a completion ([`completion_columns!`]).
pub(crate) struct CompletionParams<'a> {
    slot: &'a Slot,
    token: uuid::Uuid,
    /// [`encode_response_deflated`] of the response.
    response: &'a [u8],
    retention_ms: i64,
}

impl<'a> CompletionParams<'a> {
    pub(crate) fn new(slot: &'a Slot, lease: &HeldLease, response_deflated: &'a [u8], policy: &Policy) -> Self {
        Self {
            slot,
            token: token_to_uuid(lease.token),
            response: response_deflated,
            retention_ms: bigint_ms(policy.retention_ms()),
        }
    }

    pub(crate) fn params(&self) -> [&(dyn ToSql + Sync); 5] {
        [
            &self.slot.caller,
            &self.slot.key_digest,
            &self.token,
            &self.response,
            &self.retention_ms,
        ]
    }
}

/// The first parameter number a row effect's values use: `$1` to `$5` are
/// the completion's.
pub(crate) const ROW_EFFECT_FIRST_PARAMETER: usize = 6;

/// A completion and a one-row effect in one statement: the record is locked
/// and read (`previous`), the row is inserted only if this token holds the
/// record (`effect`), and the record is completed only if the row went in
/// (`completed`). So a lost lease writes nothing, and a row that is already
/// there (`ON CONFLICT DO NOTHING`: another key made it, or an earlier try
/// of this one) leaves the record started for the locked path, whose effect
/// reads what is there. The last column divides by zero, aborting the
/// statement, if the row went in without the completion: an effect never
/// commits alone, whatever the planner does.
pub(crate) fn completion_with_row_statement(into: &str, values: &str) -> String {
    format!(
        concat!(
            "WITH clock AS (SELECT date_trunc('milliseconds', now()) AS now), ",
            "previous AS (SELECT ",
            record_columns!(),
            " FROM idempotency_keys WHERE caller_id = $1 AND idem_key = $2 FOR UPDATE), ",
            "effect AS (INSERT INTO {into} SELECT {values} FROM previous AS keys, clock WHERE ",
            holder_guard!(),
            " ON CONFLICT DO NOTHING RETURNING 1), ",
            "completed AS (UPDATE idempotency_keys AS keys SET ",
            completion_columns!(),
            " FROM clock WHERE keys.caller_id = $1 AND keys.idem_key = $2 AND EXISTS (SELECT 1 FROM effect) \
             RETURNING 1) ",
            "SELECT previous.*, clock.now AS now, EXISTS (SELECT 1 FROM completed) AS completed, ",
            "1 / (EXISTS (SELECT 1 FROM effect) = EXISTS (SELECT 1 FROM completed))::int AS effect_with_completion ",
            "FROM clock LEFT JOIN previous ON true"
        ),
        into = into,
        values = values
    )
}

/// A completion whose effect is one row, in one statement: `Some(outcome)`
/// (`Applied`) when the row and the completed record committed, `None` when
/// nothing was written and the caller must take the transaction of
/// `complete_with` (a lost lease, a completion already saved, a row already
/// there, or a row the database refused: there the effect's own error is
/// told apart from the store's).
pub(crate) async fn complete_with_row<C: GenericClient>(
    client: &C,
    slot: &Slot,
    lease: &HeldLease,
    response: &SavedResponse,
    policy: &Policy,
    row: (&str, &str, &[&(dyn ToSql + Sync)]),
) -> Result<Option<Fenced>, Attempt<StoreError>> {
    let (into, values, row_params) = row;
    let statement = client
        .prepare_cached(&completion_with_row_statement(into, values))
        .await?;
    let deflated = encode_response_deflated(response);
    let completion = CompletionParams::new(slot, lease, &deflated, policy);
    let mut params: Vec<&(dyn ToSql + Sync)> = completion.params().to_vec();
    params.extend_from_slice(row_params);
    let row = match client.query_one(&statement, &params).await {
        Ok(row) => row,
        Err(error) if crate::error::classify(&error) == crate::error::ErrorClass::Refused => {
            tracing::debug!(%error, "the one-statement completion was refused; taking the transaction");
            return Ok(None);
        }
        Err(error) => return Err(error.into()),
    };
    completion_with_row_decision(&row, lease, response, policy)
}

/// What a completion-with-row statement's row says (this one's, or one of
/// a batch's in `completion_batch.rs`): `Some(Applied)` when it completed
/// the record, which the machine must agree with, `None` when it wrote
/// nothing.
pub(crate) fn completion_with_row_decision(
    row: &Row,
    lease: &HeldLease,
    response: &SavedResponse,
    policy: &Policy,
) -> Result<Option<Fenced>, Attempt<StoreError>> {
    if !boolean_column(row, "completed")? {
        return Ok(None);
    }
    let previous = record_from_row(row)?;
    let now_ms = time_column(row, "now")?;
    let step = machine::complete(Found::Record(&previous), lease.token, response.clone(), now_ms, policy);
    machine_agrees(step).map(Some)
}

/// What a [`COMPLETE`] statement's rows say (one of a batch's in
/// `completion_batch.rs`): `Some(Applied)` when it completed the record,
/// which the machine must agree with, `None` when its guard did not hold
/// and it wrote nothing.
pub(crate) fn complete_decision(
    row: Option<&Row>,
    lease: &HeldLease,
    response: &SavedResponse,
    policy: &Policy,
) -> Result<Option<Fenced>, Attempt<StoreError>> {
    let Some(row) = row else {
        return Ok(None);
    };
    let previous = record_from_row(row)?;
    let now_ms = time_column(row, "now")?;
    let step = machine::complete(Found::Record(&previous), lease.token, response.clone(), now_ms, policy);
    machine_agrees(step).map(Some)
}

/// Runs one fenced statement. No row back means the guard did not hold and
/// nothing was written; a row back is the record the write replaced, which
/// the machine must agree was held by this token.
async fn fenced<C, T>(
    client: &C,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    transition: T,
) -> Result<Option<Fenced>, Attempt<StoreError>>
where
    C: GenericClient,
    T: Fn(Found<'_>, u64) -> Step<Fenced>,
{
    let statement = client.prepare_cached(sql).await?;
    let Some(row) = client.query_opt(&statement, params).await? else {
        return Ok(None);
    };
    let previous = record_from_row(&row)?;
    let now_ms = time_column(&row, "now")?;
    machine_agrees(transition(Found::Record(&previous), now_ms)).map(Some)
}

/// The outcome of a one-statement write that committed, which the machine
/// must agree was applied by this token on the record it replaced.
fn machine_agrees(step: Step<Fenced>) -> Result<Fenced, Attempt<StoreError>> {
    if step.outcome != Fenced::Applied(()) || step.write == Write::Nothing {
        // The statement wrote (and committed) where the machine would not:
        // the guard above and the machine have drifted apart. Loud, because
        // it is a bug that the differential test exists to catch.
        tracing::error!(
            ?step,
            "a one-statement transition wrote where the state machine refuses"
        );
        return Err(Attempt::Fail(StoreError::Refused {
            detail: "a one-statement transition and the state machine disagree".to_owned(),
            source: None,
        }));
    }
    Ok(step.outcome)
}

pub(crate) fn boolean_column(row: &Row, name: &str) -> Result<bool, StoreError> {
    row.try_get(name)
        .map_err(|error| StoreError::Corrupt(store_core::CodecError::Malformed(format!("column {name}: {error}"))))
}
