//! Bulk loading: a store filled with completed records at its backend's
//! fastest write path, so that it can be measured at the size the design
//! plans for (docs/design.md#sizing: a day of keys at 400/s is 34.56M
//! records), which no load test reaches by claiming keys one at a time.
//!
//! The trait is here, the writing is in each store crate: only the backend
//! knows its stored form (the FDB-style store's chunks and expiry index,
//! Redis's hash and tombstone, PostgreSQL's columns), and a loaded record
//! must read back and replay exactly like one a claim and a completion
//! wrote. The service never calls it; benchmarks and capacity tests do.

use crate::store::StoreError;
use crate::types::{
    CallerId, Fingerprint, IdempotencyKey, InvalidInput, LeaseToken, Record, RecordState, SavedResponse,
};
use async_trait::async_trait;

/// One completed record to load: what a first run of `key` for `caller`
/// leaves once its response is saved.
///
/// Valid by construction: it expires after it was created, so it is a
/// record the state machine could have written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompletedRecord {
    caller: CallerId,
    key: IdempotencyKey,
    fingerprint: Fingerprint,
    response: SavedResponse,
    completed_by: LeaseToken,
    created_at_ms: u64,
    expires_at_ms: u64,
}

impl CompletedRecord {
    /// `completed_by` is the token of the attempt that completed it, as a
    /// completion records it; any fresh token will do for a loaded record.
    pub fn new(
        caller: CallerId,
        key: IdempotencyKey,
        fingerprint: Fingerprint,
        response: SavedResponse,
        completed_by: LeaseToken,
        created_at_ms: u64,
        expires_at_ms: u64,
    ) -> Result<Self, InvalidInput> {
        if expires_at_ms <= created_at_ms {
            return Err(InvalidInput::RecordTimes {
                created_at_ms,
                expires_at_ms,
            });
        }
        Ok(Self {
            caller,
            key,
            fingerprint,
            response,
            completed_by,
            created_at_ms,
            expires_at_ms,
        })
    }

    pub fn caller(&self) -> &CallerId {
        &self.caller
    }

    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    pub fn response(&self) -> &SavedResponse {
        &self.response
    }

    pub fn completed_by(&self) -> LeaseToken {
        self.completed_by
    }

    pub fn created_at_ms(&self) -> u64 {
        self.created_at_ms
    }

    pub fn expires_at_ms(&self) -> u64 {
        self.expires_at_ms
    }

    /// The record as every backend's `inspect` reads it back.
    pub fn record(&self) -> Record {
        Record {
            fingerprint: self.fingerprint,
            state: RecordState::Completed {
                response: self.response.clone(),
                completed_by: self.completed_by,
            },
            created_at_ms: self.created_at_ms,
            expires_at_ms: self.expires_at_ms,
        }
    }
}

/// Writes completed records in batches, each batch in one go of the
/// backend's bulk path (one transaction, one pipeline, one `COPY`).
///
/// The keys must be new to the store. A bulk load reads nothing before it
/// writes (that is what makes it fast), so what it does to a key that holds
/// a record is the backend's: PostgreSQL refuses the whole batch (a primary
/// key violation), the others overwrite the record without cleaning up
/// after it. Loaded records are complete from the start, so no waiter is
/// woken and no tombstone of an earlier record is consulted.
#[async_trait]
pub trait BulkLoad: Send + Sync {
    /// Most records one [`BulkLoad::load_completed_records`] call takes
    /// (the backend's named limit: what fits its transaction, pipeline or
    /// statement comfortably).
    fn bulk_load_batch_records_max(&self) -> usize;

    /// Writes every record of `batch`, and answers how many it wrote, once
    /// they are as durable as the backend makes any completion. A batch
    /// over [`BulkLoad::bulk_load_batch_records_max`] is refused with
    /// [`StoreError::TooLarge`] and writes nothing; an empty one writes
    /// nothing.
    async fn load_completed_records(&self, batch: &[CompletedRecord]) -> Result<u64, StoreError>;
}

/// The refusal of a batch longer than a backend's `records_max`.
pub fn check_bulk_batch(batch: &[CompletedRecord], records_max: usize) -> Result<(), StoreError> {
    if batch.len() > records_max {
        return Err(StoreError::TooLarge(format!(
            "a bulk load batch of {} records, more than this backend's {records_max}",
            batch.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completed(created_at_ms: u64, expires_at_ms: u64) -> Result<CompletedRecord, InvalidInput> {
        CompletedRecord::new(
            CallerId::new("bulk").unwrap(),
            IdempotencyKey::new("label:1:1:v1").unwrap(),
            Fingerprint::of_request("POST", "/v1/labels", b"{}"),
            SavedResponse::new(201, Vec::new(), b"{}".to_vec()).unwrap(),
            LeaseToken(7),
            created_at_ms,
            expires_at_ms,
        )
    }

    #[test]
    fn a_record_that_expires_before_it_is_created_is_refused() {
        assert_eq!(
            completed(2_000, 2_000),
            Err(InvalidInput::RecordTimes {
                created_at_ms: 2_000,
                expires_at_ms: 2_000
            })
        );
        let record = completed(1_000, 2_000).unwrap().record();
        assert_eq!((record.created_at_ms, record.expires_at_ms), (1_000, 2_000));
        assert!(matches!(
            record.state,
            RecordState::Completed {
                completed_by: LeaseToken(7),
                ..
            }
        ));
    }

    #[test]
    fn a_batch_over_the_limit_is_too_large() {
        let batch = vec![completed(1, 2).unwrap(); 3];
        assert!(check_bulk_batch(&batch, 3).is_ok());
        assert!(matches!(check_bulk_batch(&batch, 2), Err(StoreError::TooLarge(_))));
    }
}
