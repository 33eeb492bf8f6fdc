//! Purge on the FDB-style store: bounded batches, tombstones that expire in
//! their turn, and stale index entries that are repaired, not obeyed.

use std::time::Duration;
use store_core::{
    CallerId, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, IdempotencyStore, Policy, SavedResponse,
    StoreError,
};
use store_fdb::{EmbeddedConfig, EmbeddedStore, Engine, MaybeCommitted, RunOptions, Transaction};

const RETENTION_MS: u64 = 300;
const TOMBSTONE_MS: u64 = 400;

fn store() -> EmbeddedStore {
    let policy = Policy::new(100, RETENTION_MS, TOMBSTONE_MS).unwrap();
    EmbeddedStore::open_embedded(&EmbeddedConfig::temporary(), policy).unwrap()
}

async fn completed(store: &EmbeddedStore, caller: &CallerId, key: &str) -> ClaimRequest {
    let request = ClaimRequest::new(caller.clone(), IdempotencyKey::new(key).unwrap(), Fingerprint([3; 32]));
    let ClaimOutcome::Acquired(acquired) = store.claim(&request).await.unwrap() else {
        panic!("not acquired")
    };
    let response = SavedResponse::new(200, vec![], b"done".to_vec()).unwrap();
    assert!(store.complete(&acquired.lease, response).await.unwrap().is_applied());
    request
}

#[tokio::test]
async fn purge_works_in_bounded_batches_and_tombstones_expire_in_turn() {
    let store = store();
    let caller = CallerId::new("purge").unwrap();
    for i in 0..10 {
        completed(&store, &caller, &format!("k{i}")).await;
    }
    tokio::time::sleep(Duration::from_millis(RETENTION_MS + 50)).await;

    let first = store.purge_expired(4).await.unwrap();
    assert_eq!((first.records_purged, first.more), (4, true));
    let rest = store.purge_expired(100).await.unwrap();
    assert_eq!((rest.records_purged, rest.more), (6, false));
    assert_eq!(
        store.purge_expired(100).await.unwrap().records_purged,
        0,
        "nothing left to purge"
    );

    // Inside the tombstone window a repeat is reported late.
    let late = ClaimRequest::new(caller.clone(), IdempotencyKey::new("k0").unwrap(), Fingerprint([3; 32]));
    let ClaimOutcome::Acquired(acquired) = store.claim(&late).await.unwrap() else {
        panic!()
    };
    assert!(acquired.late_key);

    // After the window the tombstones are swept and a new key is just new.
    tokio::time::sleep(Duration::from_millis(TOMBSTONE_MS + 50)).await;
    let swept = store.purge_expired(100).await.unwrap();
    assert_eq!(
        swept.tombstones_purged, 9,
        "k0's tombstone went when k0 was claimed again"
    );
    let again = ClaimRequest::new(caller.clone(), IdempotencyKey::new("k1").unwrap(), Fingerprint([3; 32]));
    let ClaimOutcome::Acquired(acquired) = store.claim(&again).await.unwrap() else {
        panic!()
    };
    assert!(!acquired.late_key);
}

#[tokio::test]
async fn a_record_whose_retention_was_extended_is_not_purged_by_its_old_index_entry() {
    let store = store();
    let caller = CallerId::new("purge").unwrap();
    let request = ClaimRequest::new(
        caller.clone(),
        IdempotencyKey::new("slow").unwrap(),
        Fingerprint([4; 32]),
    );
    let ClaimOutcome::Acquired(acquired) = store.claim(&request).await.unwrap() else {
        panic!()
    };
    // Complete just before the claim's expiry: retention restarts from now.
    tokio::time::sleep(Duration::from_millis(RETENTION_MS - 100)).await;
    let response = SavedResponse::new(200, vec![], b"late".to_vec()).unwrap();
    assert!(
        store
            .complete(&acquired.lease, response.clone())
            .await
            .unwrap()
            .is_applied()
    );
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(store.purge_expired(100).await.unwrap().records_purged, 0);
    assert_eq!(store.claim(&request).await.unwrap(), ClaimOutcome::Replay(response));
}

#[tokio::test]
async fn large_records_are_purged_across_several_byte_bounded_transactions() {
    let store = store();
    let caller = CallerId::new("purge-large").unwrap();
    let body = vec![7; 600_000];
    // Four keys in one expiry shard, so that shard's batch must stop on bytes.
    let shard_of = |key: &IdempotencyKey| store.layout().slot(&caller, key.digest()).shard;
    let wanted_shard = shard_of(&IdempotencyKey::new("big0").unwrap());
    let keys: Vec<IdempotencyKey> = (0..)
        .map(|i| IdempotencyKey::new(&format!("big{i}")).unwrap())
        .filter(|key| shard_of(key) == wanted_shard)
        .take(4)
        .collect();
    for key in &keys {
        let request = ClaimRequest::new(caller.clone(), key.clone(), Fingerprint([5; 32]));
        let ClaimOutcome::Acquired(acquired) = store.claim(&request).await.unwrap() else {
            panic!()
        };
        let response = SavedResponse::new(200, vec![], body.clone()).unwrap();
        assert!(store.complete(&acquired.lease, response).await.unwrap().is_applied());
    }
    tokio::time::sleep(Duration::from_millis(RETENTION_MS + 50)).await;
    let report = store.purge_expired(100).await.unwrap();
    assert_eq!((report.records_purged, report.more), (4, false));
    for key in &keys {
        assert_eq!(store.inspect(&caller, key).await.unwrap(), None);
    }
}

/// Overwrites the record of (caller, key) with bytes no codec version reads.
async fn corrupt(store: &EmbeddedStore, caller: &CallerId, key: &str) {
    let slot = store.layout().slot(caller, IdempotencyKey::new(key).unwrap().digest());
    let chunk = store.layout().record_chunk_key(&slot, 0);
    let chunk = &chunk;
    store
        .engine()
        .run(
            RunOptions::default(),
            |tx, _maybe_committed: MaybeCommitted| async move {
                tx.set(chunk, b"\xffnot a record")?;
                Ok(())
            },
        )
        .await
        .unwrap();
}

/// One unreadable record must not stop the sweeper for good: the purge
/// sets it aside (reported once), purges the others, and later runs do not
/// meet it again; its key answers `Corrupt` (HTTP: 500 `record_unreadable`).
#[tokio::test]
async fn an_unreadable_record_is_quarantined_and_the_purge_goes_on() {
    let store = store();
    let caller = CallerId::new("purge").unwrap();
    for i in 0..5 {
        completed(&store, &caller, &format!("q{i}")).await;
    }
    corrupt(&store, &caller, "q2").await;
    tokio::time::sleep(Duration::from_millis(RETENTION_MS + 50)).await;

    let first = store
        .purge_expired(100)
        .await
        .expect("the purge goes on past an unreadable record");
    assert_eq!(
        (first.records_purged, first.records_quarantined, first.more),
        (4, 1, false)
    );
    let second = store.purge_expired(100).await.unwrap();
    assert_eq!(
        (second.records_purged, second.records_quarantined),
        (0, 0),
        "the quarantined record is reported once, not met again"
    );
    let request = ClaimRequest::new(caller.clone(), IdempotencyKey::new("q2").unwrap(), Fingerprint([3; 32]));
    assert!(matches!(store.claim(&request).await, Err(StoreError::Corrupt(_))));
    // The others are gone, and their keys are late, not unreadable.
    let other = ClaimRequest::new(caller.clone(), IdempotencyKey::new("q1").unwrap(), Fingerprint([3; 32]));
    assert!(matches!(store.claim(&other).await, Ok(ClaimOutcome::Acquired(acquired)) if acquired.late_key));
}
