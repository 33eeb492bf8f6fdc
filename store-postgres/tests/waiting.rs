//! Waiting on PostgreSQL (docs/design.md#waiting): store-core's waiting
//! suite on two store instances over one database (each with its own pool
//! and its own listening connection), and what happens when the listening
//! connection is lost.

mod common;

use std::sync::Arc;
use std::time::Duration;
use store_core::testkit::waiting::{WAIT_TEST_POLL_INTERVAL_MS, waiting_policy};
use store_core::testkit::{SharedStore, claim_request, response, unique_caller};
use store_core::{ClaimOutcome, Fenced, IdempotencyStore, Policy, WaitLimits, Woken};
use store_postgres::{LISTENER_APPLICATION_NAME, PostgresStore};
use tokio::time::Instant;

async fn pair(policy: Policy) -> (SharedStore, SharedStore) {
    let database = common::fresh_database().await;
    let first = database.migrated_store(policy, &[]).await.expect("migrated store");
    let second = PostgresStore::new(&database.config(), policy).expect("second store");
    (Arc::new(first), Arc::new(second))
}

store_core::waiting_tests!(pair);

/// The poll interval of the lost-listener test: short, so the test is.
const LOST_LISTENER_POLL_MS: u64 = 400;

async fn listener_pids(client: &tokio_postgres::Client) -> Vec<i32> {
    client
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database() \
               AND query ILIKE 'LISTEN%'",
            &[&LISTENER_APPLICATION_NAME],
        )
        .await
        .expect("pg_stat_activity")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

async fn until_listening(client: &tokio_postgres::Client) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids = listener_pids(client).await;
        if !pids.is_empty() {
            return pids;
        }
        assert!(Instant::now() < deadline, "the change listener never listened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_notification_lost_with_the_listening_connection_is_covered_and_the_listener_comes_back() {
    let database = common::fresh_database().await;
    let policy = waiting_policy();
    let waiting = database.migrated_store(policy, &[]).await.expect("migrated store");
    let writing = PostgresStore::new(&database.config(), policy).expect("second store");
    let hub = waiting.record_changes().expect("waiting").clone();
    hub.set_limits(WaitLimits::new(8, 8, LOST_LISTENER_POLL_MS).unwrap());
    let raw = common::raw_client(&database.config().url).await;
    let caller = unique_caller();

    let lease = acquired(&writing, &caller, "k").await;
    let request = claim_request(&caller, "k", "body");
    let mut watch = hub.subscribe(&caller, &request.key).expect("subscribe");
    watch.expect_end().await.expect("mark the record waited");
    let pids = until_listening(&raw).await;
    while watch.changed(Instant::now() + Duration::from_millis(100)).await == Woken::Notified {}

    // The listening connection dies; the completion's notification is sent
    // while (or just after) nobody listens.
    for pid in &pids {
        raw.execute("SELECT pg_terminate_backend($1)", &[pid])
            .await
            .expect("terminate");
    }
    assert_eq!(
        writing.complete(&lease, response(4)).await.unwrap(),
        Fenced::Applied(())
    );
    let completed_at = Instant::now();
    let woken = watch.changed(completed_at + Duration::from_secs(10)).await;
    let delay = completed_at.elapsed();
    assert_ne!(woken, Woken::DeadlinePassed);
    assert!(
        delay <= Duration::from_millis(LOST_LISTENER_POLL_MS + 500),
        "the waiter woke {delay:?} after a completion whose notification was lost"
    );
    assert_eq!(
        waiting.claim(&request).await.unwrap(),
        ClaimOutcome::Replay(response(4))
    );
    drop(watch);

    // The listener listens again, on a new connection: the next completion
    // wakes its waiter by notification, before any poll.
    hub.set_limits(WaitLimits::new(8, 8, WAIT_TEST_POLL_INTERVAL_MS).unwrap());
    let again = acquired(&writing, &caller, "k2").await;
    let key = claim_request(&caller, "k2", "body").key;
    let mut watch = hub.subscribe(&caller, &key).expect("subscribe");
    watch.expect_end().await.expect("mark the record waited");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now_listening = listener_pids(&raw).await;
        if !now_listening.is_empty() && now_listening != pids {
            break;
        }
        assert!(Instant::now() < deadline, "the change listener did not come back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while watch.changed(Instant::now() + Duration::from_millis(100)).await == Woken::Notified {}
    assert_eq!(
        writing.complete(&again, response(5)).await.unwrap(),
        Fenced::Applied(())
    );
    let completed_at = Instant::now();
    assert_eq!(
        watch.changed(completed_at + Duration::from_secs(10)).await,
        Woken::Notified
    );
    assert!(completed_at.elapsed() < Duration::from_millis(750));
}

/// Takes the key for a new attempt.
async fn acquired(store: &PostgresStore, caller: &store_core::CallerId, key: &str) -> store_core::HeldLease {
    match store.claim(&claim_request(caller, key, "body")).await.unwrap() {
        ClaimOutcome::Acquired(acquired) => acquired.lease,
        other => panic!("expected acquired, got {other:?}"),
    }
}

/// A `NOTIFY` serialises the commits of every transaction that sent one
/// (migration 0003), so only the end of a record a waiter marked is
/// notified: the first notification a listener gets names the marked
/// record, although an unmarked record was completed before it
/// (notifications arrive in commit order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_end_of_a_record_a_waiter_marked_is_notified() {
    let database = common::fresh_database().await;
    let store = database
        .migrated_store(Policy::default(), &[])
        .await
        .expect("migrated store");
    let (listener, mut connection) = tokio_postgres::connect(&database.config().url, tokio_postgres::NoTls)
        .await
        .expect("listening connection");
    let (sender, mut payloads) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|context| connection.poll_message(context)).await {
            if let tokio_postgres::AsyncMessage::Notification(notification) = message {
                let _ = sender.send(notification.payload().to_owned());
            }
        }
    });
    listener
        .batch_execute(&format!("LISTEN {}", store_postgres::CHANGES_CHANNEL))
        .await
        .expect("LISTEN");
    let caller = unique_caller();

    let unmarked = acquired(&store, &caller, "unmarked").await;
    assert_eq!(
        store.complete(&unmarked, response(1)).await.unwrap(),
        Fenced::Applied(())
    );
    let marked = acquired(&store, &caller, "marked").await;
    let hub = store.record_changes().expect("waiting");
    let watch = hub.subscribe(&caller, &marked.key).expect("subscribe");
    watch.expect_end().await.expect("mark the record waited");
    assert_eq!(store.complete(&marked, response(2)).await.unwrap(), Fenced::Applied(()));

    let first = tokio::time::timeout(Duration::from_secs(10), payloads.recv())
        .await
        .expect("a notification within 10 s")
        .expect("the listening connection is open");
    assert_eq!(first, store_core::RecordId::new(&caller, &marked.key).tag());
}
