//! The bulk-load behaviours ([`BulkLoad`](crate::BulkLoad)), run by each
//! backend that has it, on its own stores: loaded records read back exactly
//! as written and replay through a claim like records a completion saved,
//! and a batch over the backend's limit writes nothing.
//!
//! Each behaviour takes the time the store decides expiry by (`now_ms`: the
//! manual clock's reading, or the wall clock for a store whose server keeps
//! the time), so the records it loads are live for that store.

use super::{fingerprint, key, response, unique_caller};
use crate::bulk::{BulkLoad, CompletedRecord};
use crate::outcome::{ClaimOutcome, ClaimRequest};
use crate::types::{CallerId, LeaseToken};
use crate::{IdempotencyStore, StoreError};

/// Records each behaviour loads (in two batches).
pub const BULK_TEST_RECORDS: usize = 40;
/// How long before `now_ms` the loaded records were created.
pub const BULK_TEST_AGE_MS: u64 = 60_000;
/// How long after `now_ms` the first loaded record expires; each next one a
/// millisecond later.
pub const BULK_TEST_REMAINING_MS: u64 = 3_600_000;

/// `count` completed records of fresh keys under `caller`, each with its
/// own request, response and token.
pub fn completed_records(caller: &CallerId, count: usize, now_ms: u64) -> Vec<CompletedRecord> {
    (0..count)
        .map(|index| {
            CompletedRecord::new(
                caller.clone(),
                key(&format!("bulk-{index}")),
                fingerprint(&format!("{{\"parcel_no\":{index}}}")),
                response(u8::try_from(index % 256).unwrap_or(0)),
                LeaseToken::random(),
                now_ms - BULK_TEST_AGE_MS,
                now_ms + BULK_TEST_REMAINING_MS + index as u64,
            )
            .expect("a test record expires after it was created")
        })
        .collect()
}

/// Loaded records read back as written, replay their response to a claim
/// with their request, and answer a mismatch to another request.
pub async fn bulk_loaded_records_read_back_and_replay<S: IdempotencyStore + BulkLoad>(store: &S, now_ms: u64) {
    let caller = unique_caller();
    let records = completed_records(&caller, BULK_TEST_RECORDS, now_ms);
    let (first, second) = records.split_at(BULK_TEST_RECORDS / 2);
    for batch in [first, second] {
        let written = store.load_completed_records(batch).await.expect("bulk load");
        assert_eq!(written, batch.len() as u64);
    }
    for loaded in &records {
        let stored = store.inspect(&caller, loaded.key()).await.expect("inspect");
        assert_eq!(stored.as_ref(), Some(&loaded.record()), "{:?}", loaded.key());
        let request = ClaimRequest::new(caller.clone(), loaded.key().clone(), *loaded.fingerprint());
        match store.claim(&request).await.expect("claim") {
            ClaimOutcome::Replay(replayed) => assert_eq!(&replayed, loaded.response()),
            other => panic!("a loaded record must replay, not answer {}", other.kind()),
        }
    }
    let other_request = ClaimRequest::new(caller.clone(), records[0].key().clone(), fingerprint("another body"));
    assert_eq!(store.claim(&other_request).await.expect("claim").kind(), "mismatch");
    assert_eq!(store.load_completed_records(&[]).await.expect("empty batch"), 0);
}

/// A batch one record over the backend's limit is refused as too large and
/// writes none of its records.
pub async fn a_bulk_batch_over_the_limit_writes_nothing<S: IdempotencyStore + BulkLoad>(store: &S, now_ms: u64) {
    let caller = unique_caller();
    let records = completed_records(&caller, store.bulk_load_batch_records_max() + 1, now_ms);
    let refused = store.load_completed_records(&records).await;
    assert!(matches!(refused, Err(StoreError::TooLarge(_))), "{refused:?}");
    for loaded in [&records[0], &records[records.len() - 1]] {
        assert_eq!(store.inspect(&caller, loaded.key()).await.expect("inspect"), None);
    }
}
