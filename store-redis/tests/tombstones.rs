//! Retention and tombstones through Redis TTLs, looked at from behind the
//! store's back.

mod common;

use common::{connect, run_once};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use store_core::testkit::{claim_request, unique_caller};
use store_core::{ClaimOutcome, IdempotencyStore, Policy, RecordState};
use store_redis::RedisStore;
use store_redis::testkit::RedisServer;

const LEASE_MS: u64 = 100;
const RETENTION_MS: u64 = 200;
const TOMBSTONE_MS: u64 = 60_000;
/// Slack for the time between the script's clock reading and the test's.
const SLACK_MS: i64 = 1_000;

async fn short_lived(server: &RedisServer, tombstone_ms: u64) -> RedisStore {
    let policy = Policy::new(LEASE_MS, RETENTION_MS, tombstone_ms).unwrap();
    RedisStore::connect(server.config(), policy).await.unwrap()
}

fn late(outcome: &ClaimOutcome) -> Option<bool> {
    match outcome {
        ClaimOutcome::Acquired(acquired) if !acquired.takeover => Some(acquired.late_key),
        _ => None,
    }
}

#[tokio::test]
async fn the_record_expires_with_retention_and_its_tombstone_a_window_later() {
    let server = RedisServer::start().unwrap();
    let store = connect(server.config()).await;
    let caller = unique_caller();
    let request = run_once(&store, &caller, "k", 1).await;
    let keys = store.keys(&caller, &request.key);
    let record_ttl: i64 = server.query(&["PTTL", &keys.record]).unwrap();
    let tombstone_ttl: i64 = server.query(&["PTTL", &keys.tombstone]).unwrap();
    let policy = common::policy();
    let retention = policy.retention_ms() as i64;
    assert!((retention - SLACK_MS..=retention).contains(&record_ttl), "{record_ttl}");
    let window = policy.tombstone_ms() as i64;
    assert!((record_ttl + window - SLACK_MS..=record_ttl + window + SLACK_MS).contains(&tombstone_ttl));
    let record = store.inspect(&caller, &request.key).await.unwrap().unwrap();
    assert!(matches!(record.state, RecordState::Completed { .. }));
}

#[tokio::test]
async fn a_key_that_returns_after_its_record_expired_is_late_and_runs_again() {
    let server = RedisServer::start().unwrap();
    let store = short_lived(&server, TOMBSTONE_MS).await;
    let caller = unique_caller();
    run_once(&store, &caller, "k", 1).await;
    tokio::time::sleep(Duration::from_millis(RETENTION_MS + 100)).await;
    assert_eq!(
        store
            .inspect(&caller, &claim_request(&caller, "k", "body").key)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        late(&store.claim(&claim_request(&caller, "k", "body")).await.unwrap()),
        Some(true)
    );
}

#[tokio::test]
async fn a_late_key_stays_late_after_its_new_claim_is_abandoned() {
    let server = RedisServer::start().unwrap();
    let store = short_lived(&server, TOMBSTONE_MS).await;
    let caller = unique_caller();
    run_once(&store, &caller, "k", 1).await;
    tokio::time::sleep(Duration::from_millis(RETENTION_MS + 100)).await;
    let ClaimOutcome::Acquired(second) = store.claim(&claim_request(&caller, "k", "body")).await.unwrap() else {
        panic!("not acquired")
    };
    assert!(second.late_key);
    assert!(store.abandon(&second.lease).await.unwrap().is_applied());
    // The abandoned claim never happened; the first record's tombstone is back.
    assert_eq!(
        late(&store.claim(&claim_request(&caller, "k", "body")).await.unwrap()),
        Some(true)
    );
}

#[tokio::test]
async fn without_a_tombstone_window_no_tombstone_is_written() {
    let server = RedisServer::start().unwrap();
    let store = short_lived(&server, 0).await;
    let caller = unique_caller();
    let request = run_once(&store, &caller, "k", 1).await;
    let keys = store.keys(&caller, &request.key);
    assert_eq!(server.query::<u32>(&["EXISTS", &keys.tombstone]).unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(RETENTION_MS + 100)).await;
    assert_eq!(
        late(&store.claim(&claim_request(&caller, "k", "body")).await.unwrap()),
        Some(false)
    );
}

#[tokio::test]
async fn an_expired_record_redis_has_not_deleted_counts_as_absent_and_late() {
    let server = RedisServer::start().unwrap();
    let store = short_lived(&server, 0).await;
    let caller = unique_caller();
    let request = run_once(&store, &caller, "k", 1).await;
    let keys = store.keys(&caller, &request.key);
    // Keep the key past its logical expiry, as a lagging expiry could.
    server.query::<()>(&["PERSIST", &keys.record]).unwrap();
    tokio::time::sleep(Duration::from_millis(RETENTION_MS + 100)).await;
    let record = store
        .inspect(&caller, &request.key)
        .await
        .unwrap()
        .expect("still stored");
    // The server's clock is this machine's clock.
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    assert!(record.is_expired(now_ms));

    let ClaimOutcome::Acquired(acquired) = store.claim(&request).await.unwrap() else {
        panic!("an expired record was not treated as absent")
    };
    assert!(acquired.late_key && !acquired.takeover);
    let fields: Vec<String> = server.query(&["HKEYS", &keys.record]).unwrap();
    assert!(
        !fields.iter().any(|field| field == "response"),
        "the old response survived: {fields:?}"
    );
}
