//! Bulk loading ([`store_core::BulkLoad`]): completed records streamed into
//! `idempotency_keys` with one `COPY ... FROM STDIN (FORMAT binary)` per
//! batch, PostgreSQL's fastest way in (no statement per row, no plan, one
//! commit per batch).
//!
//! Each row is the record's slot and `row.rs`'s `RecordColumns` of the
//! completed record, the same mapping every write of the store uses, so a
//! loaded row is exactly the row a completion leaves (`watched` at its
//! default). The times are the records' own, not the database's `now()`: a
//! bulk load brings them, as the state machine is given them. A key already
//! in the table fails the whole `COPY` (its primary key), which writes
//! nothing.

use crate::error::{pool_error, store_error};
use crate::row::{RecordColumns, Slot, record_columns_written};
use crate::store::PostgresStore;
use async_trait::async_trait;
use futures::pin_mut;
use store_core::{BulkLoad, CompletedRecord, StoreError, check_bulk_batch};
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};

/// Most records one bulk-load `COPY` writes: one statement must end within
/// the connections' `statement_timeout` (5 s by default) even when the
/// table's two indexes no longer fit in memory and each row costs index
/// page reads; 5,000 rows are about 2.5 MB of data.
pub const BULK_LOAD_ROWS_PER_COPY_MAX: usize = 5_000;

/// The slot's two columns, then the record's (`row.rs`'s
/// `record_columns_written!`).
const COPY_COMPLETED_RECORDS: &str = concat!(
    "COPY idempotency_keys (caller_id, idem_key, ",
    record_columns_written!(),
    ") FROM STDIN (FORMAT binary)"
);

/// The binary form each column is sent in. The state is an enum, whose
/// binary form is its label's text (PostgreSQL's `enum_recv`), so it is
/// encoded as text.
const COPY_COLUMN_TYPES: [Type; 11] = [
    Type::TEXT,
    Type::BYTEA,
    Type::BYTEA,
    Type::TEXT,
    Type::TIMESTAMPTZ,
    Type::UUID,
    Type::BYTEA,
    Type::BYTEA,
    Type::UUID,
    Type::TIMESTAMPTZ,
    Type::TIMESTAMPTZ,
];

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
            let slot = Slot::new(loaded.caller(), loaded.key());
            let record = loaded.record();
            let columns = RecordColumns::of(&record);
            let mut values: Vec<&(dyn ToSql + Sync)> = vec![&slot.caller, &slot.key_digest];
            values.extend(columns.params());
            writer.as_mut().write(&values).await.map_err(store_error)?;
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
