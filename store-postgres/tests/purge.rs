//! The sweeper: bounded batches, tombstones, and concurrent sweepers that
//! neither fight nor delete a row twice.

mod common;

use common::{count, fresh_database, raw_client};
use futures::StreamExt;
use std::time::Duration;
use store_core::testkit::{claim_request, response, unique_caller};
use store_core::{Acquired, ClaimOutcome, IdempotencyStore, Policy, PurgeReport};
use store_postgres::PostgresStore;
use store_postgres::testkit::TestDatabase;

/// Lease and retention of the records these tests write: long enough for a
/// claim and its completion to land under load, short enough to wait out.
const RETENTION_MS: u64 = 1_000;

/// Records expire a second after they are written, tombstones a minute later.
fn short_retention() -> Policy {
    Policy::new(RETENTION_MS, RETENTION_MS, 60_000).expect("valid policy")
}

/// Writes `records` completed records under one caller and waits until they
/// have all expired.
async fn expired_records(store: &PostgresStore, records: usize) -> store_core::CallerId {
    let caller = unique_caller();
    let writes = (0..records).map(|index| {
        let caller = caller.clone();
        async move {
            let request = claim_request(&caller, &format!("k{index}"), "a");
            let ClaimOutcome::Acquired(Acquired { lease, .. }) = store.claim(&request).await.expect("claim") else {
                panic!("fresh key not acquired")
            };
            assert!(
                store
                    .complete(&lease, response(1))
                    .await
                    .expect("complete")
                    .is_applied()
            );
        }
    });
    // As many at once as the pool has connections, so each completion
    // follows its claim closely instead of queueing behind every other claim.
    futures::stream::iter(writes)
        .buffer_unordered(store_postgres::POOL_SIZE_DEFAULT)
        .collect::<Vec<()>>()
        .await;
    tokio::time::sleep(Duration::from_millis(RETENTION_MS + 100)).await;
    caller
}

async fn sweep_until_done(store: &PostgresStore, batch: usize) -> PurgeReport {
    let mut total = PurgeReport::default();
    loop {
        let report = store.purge_expired(batch).await.expect("purge");
        total.records_purged += report.records_purged;
        total.tombstones_purged += report.tombstones_purged;
        if !report.more {
            return total;
        }
    }
}

async fn fixture(policy: Policy) -> (TestDatabase, PostgresStore, tokio_postgres::Client) {
    let database = fresh_database().await;
    let store = database.migrated_store(policy, &[]).await.expect("store");
    let client = raw_client(&database.url).await;
    (database, store, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_concurrent_sweepers_purge_every_row_exactly_once() {
    const RECORDS: usize = 300;
    let (_database, store, client) = fixture(short_retention()).await;
    expired_records(&store, RECORDS).await;
    let (first, second) = tokio::join!(sweep_until_done(&store, 20), sweep_until_done(&store, 20));
    assert_eq!(
        first.records_purged + second.records_purged,
        RECORDS as u64,
        "first {first:?}, second {second:?}"
    );
    assert_eq!(count(&client, "idempotency_keys").await, 0);
    assert_eq!(count(&client, "idempotency_tombstones").await, RECORDS as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sweeper_skips_a_row_another_transaction_holds_instead_of_waiting() {
    let (_database, store, mut client) = fixture(short_retention()).await;
    expired_records(&store, 10).await;
    let holder = client.transaction().await.expect("begin");
    let locked = holder
        .query("SELECT idem_key FROM idempotency_keys LIMIT 1 FOR UPDATE", &[])
        .await
        .expect("lock one row");
    assert_eq!(locked.len(), 1);
    // Far below the statement timeout: a sweeper that waited for the lock
    // would not finish in time.
    let report = tokio::time::timeout(Duration::from_secs(2), store.purge_expired(100))
        .await
        .expect("the sweeper waited for a locked row")
        .expect("purge");
    assert_eq!(report.records_purged, 9);
    holder.commit().await.expect("release the lock");
    assert_eq!(store.purge_expired(100).await.expect("purge").records_purged, 1);
}

#[tokio::test]
async fn a_full_batch_reports_more_and_tombstones_expire_in_their_turn() {
    let quick_tombstones = Policy::new(RETENTION_MS, RETENTION_MS, 20).expect("valid policy");
    let (_database, store, client) = fixture(quick_tombstones).await;
    let caller = expired_records(&store, 5).await;
    let first = store.purge_expired(2).await.expect("purge");
    assert_eq!((first.records_purged, first.more), (2, true));
    let rest = sweep_until_done(&store, 2).await;
    assert_eq!(rest.records_purged, 3);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let tombstones = sweep_until_done(&store, 2).await.tombstones_purged + rest.tombstones_purged;
    assert_eq!(tombstones + first.tombstones_purged, 5);
    assert_eq!(count(&client, "idempotency_tombstones").await, 0);
    // With its tombstone gone too, the key is simply new.
    let ClaimOutcome::Acquired(acquired) = store.claim(&claim_request(&caller, "k0", "a")).await.unwrap() else {
        panic!("expected acquired")
    };
    assert!(!acquired.late_key && !acquired.takeover);
}

#[tokio::test]
async fn a_late_key_is_recognised_from_the_unswept_record_and_from_its_tombstone() {
    let (_database, store, _client) = fixture(short_retention()).await;
    let caller = expired_records(&store, 2).await;
    // k0 is expired but not swept yet: the claim replaces the row in place.
    let before_sweep = store.claim(&claim_request(&caller, "k0", "a")).await.unwrap();
    assert!(
        matches!(
            before_sweep,
            ClaimOutcome::Acquired(Acquired {
                late_key: true,
                takeover: false,
                ..
            })
        ),
        "{before_sweep:?}"
    );
    sweep_until_done(&store, 100).await;
    let after_sweep = store.claim(&claim_request(&caller, "k1", "a")).await.unwrap();
    assert!(
        matches!(
            after_sweep,
            ClaimOutcome::Acquired(Acquired {
                late_key: true,
                takeover: false,
                ..
            })
        ),
        "{after_sweep:?}"
    );
}
