//! Bulk loading ([`store_core::BulkLoad`]): completed records written as
//! the claim and complete scripts leave them, many per pipeline.
//!
//! A completed record's hash holds what `claim.lua` wrote and
//! `complete.lua` kept or added: the fingerprint and the times, the state
//! `completed`, the completing token, the response in store-core's format
//! and `tomb_until_before_ms` (0: the key had no tombstone before). Its key
//! expires at the record's expiry (`PEXPIREAT`, the prelude's
//! `expire_record`) and its tombstone a tombstone window later (`SET ...
//! PXAT`, `mark_tombstone`), exactly as the scripts time them. The hash is
//! deleted first, as a first claim does, so no field of an earlier record
//! survives.
//!
//! Plain commands, not the scripts: a script decides by the server's clock
//! and would stamp every record "now", while a bulk load brings its own
//! times. On a standalone server a batch is one pipeline; on Cluster a
//! pipeline must stay in one slot, so each record's commands are a pipeline
//! of their own (its two keys share a hash tag), all sent at once. Redis
//! runs a pipeline's commands one after the other and refuses writes one by
//! one (out of memory): a failed batch may have written some of its
//! records, and loading it again writes the same ones again.

use crate::connection::Connection;
use crate::errors::store_error;
use crate::keys::RecordKeys;
use crate::record::{fingerprint_hex, token_hex};
use crate::store::RedisStore;
use async_trait::async_trait;
use redis::Pipeline;
use store_core::{BulkLoad, CompletedRecord, StoreError, check_bulk_batch, encode_response};

/// Most records one bulk-load call writes: 2,000 records are 10,000
/// commands and about 1 MB sent at once, which a local server answers in
/// tens of milliseconds, far inside the store's response timeout (2 s by
/// default), while the next batch is still being prepared.
pub const BULK_LOAD_RECORDS_PER_PIPELINE_MAX: usize = 2_000;

#[async_trait]
impl BulkLoad for RedisStore {
    fn bulk_load_batch_records_max(&self) -> usize {
        BULK_LOAD_RECORDS_PER_PIPELINE_MAX
    }

    async fn load_completed_records(&self, batch: &[CompletedRecord]) -> Result<u64, StoreError> {
        check_bulk_batch(batch, BULK_LOAD_RECORDS_PER_PIPELINE_MAX)?;
        let Some(last) = batch.last() else {
            return Ok(0);
        };
        match &self.connection {
            Connection::Standalone(..) => {
                let mut pipeline = redis::pipe();
                for loaded in batch {
                    self.add_record_commands(&mut pipeline, loaded);
                }
                run_pipeline(self.connection.clone(), pipeline).await?;
                self.wait_for_replicas("bulk load", &self.keys(last.caller(), last.key()))
                    .await?;
            }
            Connection::Cluster(_) => self.load_one_pipeline_per_record(batch).await?,
        }
        Ok(batch.len() as u64)
    }
}

impl RedisStore {
    /// The commands that leave `loaded` as the scripts leave a completed
    /// record, replies ignored (an error still fails the pipeline).
    fn add_record_commands(&self, pipeline: &mut Pipeline, loaded: &CompletedRecord) {
        let keys = self.keys(loaded.caller(), loaded.key());
        let expires_at_ms = loaded.expires_at_ms();
        pipeline.cmd("DEL").arg(&keys.record).ignore();
        pipeline
            .cmd("HSET")
            .arg(&keys.record)
            .arg("fingerprint")
            .arg(fingerprint_hex(loaded.fingerprint()))
            .arg("state")
            .arg("completed")
            .arg("completed_by")
            .arg(token_hex(loaded.completed_by()))
            .arg("response")
            .arg(encode_response(loaded.response()))
            .arg("created_at_ms")
            .arg(loaded.created_at_ms())
            .arg("expires_at_ms")
            .arg(expires_at_ms)
            .arg("tomb_until_before_ms")
            .arg(0_u64)
            .ignore();
        pipeline.cmd("PEXPIREAT").arg(&keys.record).arg(expires_at_ms).ignore();
        let tombstone_ms = self.policy.tombstone_ms();
        if tombstone_ms > 0 {
            let until_ms = expires_at_ms.saturating_add(tombstone_ms);
            pipeline
                .cmd("SET")
                .arg(&keys.tombstone)
                .arg(until_ms)
                .arg("PXAT")
                .arg(until_ms)
                .ignore();
        }
    }

    /// Redis Cluster: one pipeline per record, all in flight at once over
    /// the cluster connection, then `WAIT` (if configured) per record.
    async fn load_one_pipeline_per_record(&self, batch: &[CompletedRecord]) -> Result<(), StoreError> {
        let mut pipelines = tokio::task::JoinSet::new();
        for loaded in batch {
            let mut pipeline = redis::pipe();
            self.add_record_commands(&mut pipeline, loaded);
            pipelines.spawn(run_pipeline(self.connection.clone(), pipeline));
        }
        while let Some(joined) = pipelines.join_next().await {
            joined.map_err(|error| StoreError::unavailable("redis bulk load: a pipeline's task failed", error))??;
        }
        for loaded in batch {
            let keys: RecordKeys = self.keys(loaded.caller(), loaded.key());
            self.wait_for_replicas("bulk load", &keys).await?;
        }
        Ok(())
    }
}

async fn run_pipeline(mut connection: Connection, pipeline: Pipeline) -> Result<(), StoreError> {
    pipeline
        .query_async::<()>(&mut connection)
        .await
        .map_err(|error| store_error("bulk load", error))
}
