//! Bulk loading ([`store_core::BulkLoad`]) on either engine: many completed
//! records per transaction, so the embedded engine makes one journal write
//! and one fdatasync per batch, and FoundationDB one commit.
//!
//! Each record is written as a completion writes it (`store.rs`): its
//! encoded bytes in chunks under its slot, and its entry in the expiry
//! index, so the sweeper finds it when it falls due. Nothing is read first:
//! the transactions are blind writes that conflict with nothing, and
//! writing the same bytes again after an unknown commit result changes
//! nothing, so the retry loop may run them again.

use crate::engine::{Engine, MaybeCommitted, RunOptions, TRANSACTION_BYTES_MAX, Transaction, TxError};
use crate::keys::KIND_RECORD;
use crate::store::{FdbStore, record_chunks};
use async_trait::async_trait;
use store_core::{BulkLoad, CompletedRecord, StoreError, check_bulk_batch, encode_record};

/// Most records one bulk-load transaction writes. A record of the design's
/// size (a ~300-byte response) is about 400 encoded bytes plus two keys of
/// about 60, so a full batch affects about 5 MB: half of FoundationDB's
/// `TRANSACTION_BYTES_MAX`, leaving room for larger responses (a batch of
/// records too large for it is refused whole, as `TooLarge`). On the
/// embedded engine it is one fdatasync per 10,000 records.
pub const BULK_LOAD_RECORDS_PER_TRANSACTION_MAX: usize = 10_000;

/// The time budget of one bulk-load batch, all attempts included. The
/// store's own budget (`RunOptions::timeout_ms`, 10 s) is for a request's
/// small transactions; a batch is 5 MB, and once a single FoundationDB
/// storage process falls behind a load of millions of records, its
/// ratekeeper throttles commits for longer than that (a preload of 10M
/// records failed at 4.71M with the 10 s budget, BENCHMARKS.md "A day of
/// keys"). A batch is a blind, repeatable write, so waiting longer is safe.
/// The embedded engine gets the same budget: there it only lets a batch's
/// retryable failures (a batch older than 5 s, an unknown commit result)
/// be retried for longer before the preload stops, which a bench tool can
/// afford.
pub const BULK_LOAD_RUN_TIMEOUT_MS: u64 = 120_000;

#[async_trait]
impl<E: Engine> BulkLoad for FdbStore<E> {
    fn bulk_load_batch_records_max(&self) -> usize {
        BULK_LOAD_RECORDS_PER_TRANSACTION_MAX
    }

    async fn load_completed_records(&self, batch: &[CompletedRecord]) -> Result<u64, StoreError> {
        check_bulk_batch(batch, BULK_LOAD_RECORDS_PER_TRANSACTION_MAX)?;
        if batch.is_empty() {
            return Ok(0);
        }
        let encoded = encode_batch(self, batch)?;
        let encoded = &encoded;
        let options = RunOptions {
            timeout_ms: self.run_options().timeout_ms.max(BULK_LOAD_RUN_TIMEOUT_MS),
            ..self.run_options()
        };
        self.engine()
            .run(options, |tx, _maybe_committed: MaybeCommitted| async move {
                for (chunks, expiry_key) in encoded {
                    for (chunk_key, chunk) in chunks {
                        tx.set(chunk_key, chunk)?;
                    }
                    tx.set(expiry_key, &[])?;
                }
                Ok::<_, TxError>(())
            })
            .await?;
        Ok(batch.len() as u64)
    }
}

/// One record's writes: its chunks (key, bytes) and its expiry index key.
type EncodedRecord = (Vec<(Vec<u8>, Vec<u8>)>, Vec<u8>);

impl<E: Engine> FdbStore<E> {
    /// The keys and values of one record, as `write_record` lays them out.
    fn encode_loaded(&self, loaded: &CompletedRecord) -> Result<EncodedRecord, StoreError> {
        let layout = self.layout();
        let slot = layout.slot(loaded.caller(), loaded.key().digest());
        let bytes = encode_record(&loaded.record());
        let chunks: Vec<(Vec<u8>, Vec<u8>)> = record_chunks(&bytes)?
            .into_iter()
            .enumerate()
            .map(|(index, chunk)| (layout.record_chunk_key(&slot, index), chunk.to_vec()))
            .collect();
        let expiry_key = layout.expiry_key(&slot, loaded.expires_at_ms(), KIND_RECORD);
        Ok((chunks, expiry_key))
    }
}

/// Every record's writes, encoded before the transaction begins (a retry
/// then repeats only the sets), and refused as a whole when they would
/// affect more bytes than a transaction may.
fn encode_batch<E: Engine>(store: &FdbStore<E>, batch: &[CompletedRecord]) -> Result<Vec<EncodedRecord>, StoreError> {
    let encoded: Vec<EncodedRecord> = batch
        .iter()
        .map(|loaded| store.encode_loaded(loaded))
        .collect::<Result<_, _>>()?;
    let bytes: usize = encoded
        .iter()
        .map(|(chunks, expiry_key)| {
            expiry_key.len() + chunks.iter().map(|(key, value)| key.len() + value.len()).sum::<usize>()
        })
        .sum();
    if bytes > TRANSACTION_BYTES_MAX {
        return Err(StoreError::TooLarge(format!(
            "a bulk load batch of {} records affects {bytes} bytes, more than a transaction's {TRANSACTION_BYTES_MAX}",
            batch.len()
        )));
    }
    Ok(encoded)
}
