//! Bulk loading ([`store_core::BulkLoad`]): completed records streamed into
//! `idempotency_keys` with one `COPY ... FROM STDIN (FORMAT binary)` per
//! batch, PostgreSQL's fastest way in (no statement per row, no plan, one
//! commit per batch).
//!
//! Each row has the columns a completion leaves (`row.rs`'s
//! `RecordColumns` of a completed record): the lease columns and the
//! recovery point null, `watched` at its default. The times are the
//! records' own, not the database's `now()`: a bulk load brings them, as
//! the state machine is given them. A key already in the table fails the
//! whole `COPY` (its primary key), which writes nothing.

use crate::error::{pool_error, store_error};
use crate::row::{ms_to_time, token_to_uuid};
use crate::store::PostgresStore;
use async_trait::async_trait;
use futures::pin_mut;
use std::time::SystemTime;
use store_core::{BulkLoad, CompletedRecord, StoreError, check_bulk_batch};
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};
use uuid::Uuid;

/// Most records one bulk-load `COPY` writes: one statement must end within
/// the connections' `statement_timeout` (5 s by default) even when the
/// table's two indexes no longer fit in memory and each row costs index
/// page reads; 5,000 rows are about 2.5 MB of data.
pub const BULK_LOAD_ROWS_PER_COPY_MAX: usize = 5_000;

const COPY_COMPLETED_RECORDS: &str = "COPY idempotency_keys (caller_id, idem_key, request_hash, state, \
     response_status, response_header_names, response_header_values, response_body, completed_by, \
     created_at, expires_at) FROM STDIN (FORMAT binary)";

/// The binary form each column is sent in. The state is an enum, whose
/// binary form is its label's text (PostgreSQL's `enum_recv`), so it is
/// encoded as text.
const COPY_COLUMN_TYPES: [Type; 11] = [
    Type::TEXT,
    Type::BYTEA,
    Type::BYTEA,
    Type::TEXT,
    Type::INT4,
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::BYTEA,
    Type::UUID,
    Type::TIMESTAMPTZ,
    Type::TIMESTAMPTZ,
];

/// One completed record as the `COPY`'s columns.
struct CopiedRow<'a> {
    caller: &'a str,
    key_digest: Vec<u8>,
    request_hash: &'a [u8],
    state: &'static str,
    response_status: i32,
    response_header_names: Vec<&'a str>,
    response_header_values: Vec<&'a str>,
    response_body: &'a [u8],
    completed_by: Uuid,
    created_at: SystemTime,
    expires_at: SystemTime,
}

impl<'a> CopiedRow<'a> {
    fn of(loaded: &'a CompletedRecord) -> Self {
        let response = loaded.response();
        Self {
            caller: loaded.caller().as_str(),
            key_digest: loaded.key().digest().0.to_vec(),
            request_hash: &loaded.fingerprint().0,
            state: crate::row::STATE_COMPLETED,
            response_status: i32::from(response.status()),
            response_header_names: response.headers().iter().map(|(name, _)| name.as_str()).collect(),
            response_header_values: response.headers().iter().map(|(_, value)| value.as_str()).collect(),
            response_body: response.body(),
            completed_by: token_to_uuid(loaded.completed_by()),
            created_at: ms_to_time(loaded.created_at_ms()),
            expires_at: ms_to_time(loaded.expires_at_ms()),
        }
    }

    /// The values in [`COPY_COMPLETED_RECORDS`]'s column order.
    fn values(&self) -> [&(dyn ToSql + Sync); 11] {
        [
            &self.caller,
            &self.key_digest,
            &self.request_hash,
            &self.state,
            &self.response_status,
            &self.response_header_names,
            &self.response_header_values,
            &self.response_body,
            &self.completed_by,
            &self.created_at,
            &self.expires_at,
        ]
    }
}

#[async_trait]
impl BulkLoad for PostgresStore {
    fn bulk_load_batch_records_max(&self) -> usize {
        BULK_LOAD_ROWS_PER_COPY_MAX
    }

    async fn load_completed_records(&self, batch: &[CompletedRecord]) -> Result<u64, StoreError> {
        check_bulk_batch(batch, BULK_LOAD_ROWS_PER_COPY_MAX)?;
        if batch.is_empty() {
            return Ok(0);
        }
        let client = self.pool.get().await.map_err(pool_error)?;
        let sink = client.copy_in(COPY_COMPLETED_RECORDS).await.map_err(store_error)?;
        let writer = BinaryCopyInWriter::new(sink, &COPY_COLUMN_TYPES);
        pin_mut!(writer);
        for loaded in batch {
            let row = CopiedRow::of(loaded);
            writer.as_mut().write(&row.values()).await.map_err(store_error)?;
        }
        let written = writer.finish().await.map_err(store_error)?;
        assert_eq!(
            written,
            batch.len() as u64,
            "a COPY that succeeds writes every row it was sent"
        );
        Ok(written)
    }
}
