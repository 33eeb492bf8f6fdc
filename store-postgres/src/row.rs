//! One [`Record`] as a row of `idempotency_keys`, and back.
//!
//! A row read from the database is outside input like any other: every value
//! is checked on the way in, and a row that does not make a valid record is
//! reported as [`StoreError::Corrupt`], never unwrapped.

use std::time::{Duration, SystemTime, UNIX_EPOCH};
use store_core::{
    CallerId, CodecError, Fingerprint, IdempotencyKey, KeyDigest, Lease, LeaseToken, Record, RecordState,
    RecoveryPoint, SavedResponse, StoreError, decode_response_deflated, encode_response_deflated,
};
use tokio_postgres::Row;
use tokio_postgres::types::{FromSql, ToSql};
use uuid::Uuid;

/// The columns a record is read from. The state is read as text because
/// the driver has no Rust type for the enum. The last four held a completed
/// row's response before migration 0005 (now `response`): a row written
/// before it is read from them until it expires.
macro_rules! record_columns {
    () => {
        "request_hash, state::text AS state, locked_until, lease_token, recovery_point, response, completed_by, \
         created_at, expires_at, response_status, response_header_names, response_header_values, response_body"
    };
}
pub(crate) use record_columns;

/// The columns a record is written to, in the order of
/// [`RecordColumns::params`].
macro_rules! record_columns_written {
    () => {
        "request_hash, state, locked_until, lease_token, recovery_point, response, completed_by, created_at, expires_at"
    };
}
pub(crate) use record_columns_written;

pub(crate) const STATE_STARTED: &str = "started";
pub(crate) const STATE_COMPLETED: &str = "completed";

/// Where one record lives: the caller and the SHA-256 of the key. The raw
/// key is never sent to the database.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    pub caller: String,
    /// The key's SHA-256, as the bytes of the `idem_key` column.
    pub key_digest: Vec<u8>,
}

impl Slot {
    pub fn new(caller: &CallerId, key: &IdempotencyKey) -> Self {
        Self::of_digest(caller, key.digest())
    }

    /// The slot from the key's SHA-256 alone, which is all the table holds.
    pub fn of_digest(caller: &CallerId, digest: KeyDigest) -> Self {
        Self {
            caller: caller.as_str().to_owned(),
            key_digest: digest.0.to_vec(),
        }
    }
}

pub(crate) fn ms_to_time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// Milliseconds since the epoch, rounded down; `None` before 1970 or past
/// what fits a u64.
pub(crate) fn time_to_ms(time: SystemTime) -> Option<u64> {
    let since_epoch = time.duration_since(UNIX_EPOCH).ok()?;
    u64::try_from(since_epoch.as_millis()).ok()
}

pub(crate) fn token_to_uuid(token: LeaseToken) -> Uuid {
    Uuid::from_u128(token.0)
}

fn uuid_to_token(uuid: Uuid) -> LeaseToken {
    LeaseToken(uuid.as_u128())
}

/// A record spread over the table's columns, borrowing the large values.
pub(crate) struct RecordColumns<'a> {
    request_hash: &'a [u8],
    state: &'static str,
    locked_until: Option<SystemTime>,
    lease_token: Option<Uuid>,
    recovery_point: Option<&'a [u8]>,
    /// [`store_core::encode_response_deflated`] of the saved response.
    response: Option<Vec<u8>>,
    completed_by: Option<Uuid>,
    created_at: SystemTime,
    expires_at: SystemTime,
}

impl<'a> RecordColumns<'a> {
    pub fn of(record: &'a Record) -> Self {
        let mut columns = Self {
            request_hash: &record.fingerprint.0,
            state: STATE_STARTED,
            locked_until: None,
            lease_token: None,
            recovery_point: None,
            response: None,
            completed_by: None,
            created_at: ms_to_time(record.created_at_ms),
            expires_at: ms_to_time(record.expires_at_ms),
        };
        match &record.state {
            RecordState::Started { lease, recovery_point } => {
                columns.locked_until = Some(ms_to_time(lease.locked_until_ms));
                columns.lease_token = Some(token_to_uuid(lease.token));
                columns.recovery_point = recovery_point.as_ref().map(RecoveryPoint::as_bytes);
            }
            RecordState::Completed { response, completed_by } => {
                columns.state = STATE_COMPLETED;
                columns.response = Some(encode_response_deflated(response));
                columns.completed_by = Some(token_to_uuid(*completed_by));
            }
        }
        columns
    }

    /// The nine record columns as statement parameters, in the order of
    /// [`record_columns_written!`].
    pub fn params(&self) -> [&(dyn ToSql + Sync); 9] {
        [
            &self.request_hash,
            &self.state,
            &self.locked_until,
            &self.lease_token,
            &self.recovery_point,
            &self.response,
            &self.completed_by,
            &self.created_at,
            &self.expires_at,
        ]
    }
}

/// The state and lease token of a record as stored, which an UPDATE or
/// DELETE of that record checks again as its guard.
pub(crate) fn guard_of(record: &Record) -> (&'static str, Option<Uuid>) {
    match &record.state {
        RecordState::Started { lease, .. } => (STATE_STARTED, Some(token_to_uuid(lease.token))),
        RecordState::Completed { .. } => (STATE_COMPLETED, None),
    }
}

fn corrupt(detail: impl Into<String>) -> StoreError {
    StoreError::Corrupt(CodecError::Malformed(detail.into()))
}

fn column<'r, T: FromSql<'r>>(row: &'r Row, name: &str) -> Result<T, StoreError> {
    row.try_get(name)
        .map_err(|error| corrupt(format!("column {name}: {error}")))
}

fn required<T>(value: Option<T>, name: &str) -> Result<T, StoreError> {
    value.ok_or_else(|| corrupt(format!("column {name} is null")))
}

pub(crate) fn time_column(row: &Row, name: &str) -> Result<u64, StoreError> {
    let time: SystemTime = column(row, name)?;
    time_to_ms(time).ok_or_else(|| corrupt(format!("column {name} is before 1970")))
}

fn optional_time_column(row: &Row, name: &str) -> Result<Option<u64>, StoreError> {
    let time: Option<SystemTime> = column(row, name)?;
    time.map(|time| time_to_ms(time).ok_or_else(|| corrupt(format!("column {name} is before 1970"))))
        .transpose()
}

/// Reads a record from a row selected with [`record_columns!`].
pub(crate) fn record_from_row(row: &Row) -> Result<Record, StoreError> {
    let hash: Vec<u8> = column(row, "request_hash")?;
    let fingerprint = Fingerprint(
        hash.try_into()
            .map_err(|hash: Vec<u8>| corrupt(format!("request_hash is {} bytes, not 32", hash.len())))?,
    );
    let state: String = column(row, "state")?;
    let state = match state.as_str() {
        STATE_STARTED => started_state(row)?,
        STATE_COMPLETED => completed_state(row)?,
        other => return Err(corrupt(format!("unknown state {other:?}"))),
    };
    Ok(Record {
        fingerprint,
        state,
        created_at_ms: time_column(row, "created_at")?,
        expires_at_ms: time_column(row, "expires_at")?,
    })
}

fn started_state(row: &Row) -> Result<RecordState, StoreError> {
    let locked_until_ms = required(optional_time_column(row, "locked_until")?, "locked_until")?;
    let token: Option<Uuid> = column(row, "lease_token")?;
    let point: Option<Vec<u8>> = column(row, "recovery_point")?;
    let recovery_point = point
        .map(RecoveryPoint::new)
        .transpose()
        .map_err(|error| StoreError::Corrupt(CodecError::Invalid(error)))?;
    Ok(RecordState::Started {
        lease: Lease {
            token: uuid_to_token(required(token, "lease_token")?),
            locked_until_ms,
        },
        recovery_point,
    })
}

fn completed_state(row: &Row) -> Result<RecordState, StoreError> {
    let deflated: Option<Vec<u8>> = column(row, "response")?;
    let response = match deflated {
        Some(deflated) => decode_response_deflated(&deflated).map_err(StoreError::Corrupt)?,
        None => response_in_earlier_columns(row)?,
    };
    let completed_by: Uuid = required(column(row, "completed_by")?, "completed_by")?;
    Ok(RecordState::Completed {
        response,
        completed_by: uuid_to_token(completed_by),
    })
}

/// The response of a row written before migration 0005, in four columns.
fn response_in_earlier_columns(row: &Row) -> Result<SavedResponse, StoreError> {
    let status: i32 = required(column(row, "response_status")?, "response_status")?;
    let names: Vec<String> = required(column(row, "response_header_names")?, "response_header_names")?;
    let values: Vec<String> = required(column(row, "response_header_values")?, "response_header_values")?;
    let body: Vec<u8> = required(column(row, "response_body")?, "response_body")?;
    if names.len() != values.len() {
        return Err(corrupt("response header names and values differ in number"));
    }
    let status = u16::try_from(status).map_err(|_| corrupt(format!("response_status {status} is out of range")))?;
    let headers = names.into_iter().zip(values).collect();
    SavedResponse::new(status, headers, body).map_err(|error| StoreError::Corrupt(CodecError::Invalid(error)))
}
