//! Failures of the database surface quickly as retryable errors, and bad
//! rows as typed ones; nothing hangs and nothing panics.

mod common;

use common::{fresh_database, raw_client};
use std::net::TcpListener;
use std::time::{Duration, Instant};
use store_core::testkit::{claim_request, policy, response, unique_caller};
use store_core::{AtomicCompletion, ClaimOutcome, Completion, IdempotencyStore, StoreError};
use store_postgres::{PostgresConfig, PostgresStore};

/// The timeouts these tests configure, and the most a failing call may take.
const TIMEOUT_MS: u64 = 300;
const FAILURE_BOUND: Duration = Duration::from_secs(3);

fn quick_config(url: String) -> PostgresConfig {
    PostgresConfig {
        connect_timeout_ms: TIMEOUT_MS,
        pool_wait_timeout_ms: TIMEOUT_MS,
        statement_timeout_ms: TIMEOUT_MS,
        ..PostgresConfig::new(url)
    }
}

fn assert_unavailable<T: std::fmt::Debug>(result: Result<T, StoreError>, started: Instant) {
    let elapsed = started.elapsed();
    match result {
        Err(error @ StoreError::Unavailable { .. }) => assert!(error.is_retryable()),
        other => panic!("expected unavailable, got {other:?}"),
    }
    assert!(elapsed < FAILURE_BOUND, "took {elapsed:?}");
}

#[tokio::test]
async fn a_port_with_no_server_gives_a_retryable_error_at_once() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let store = PostgresStore::new(
        &quick_config(format!("postgres://idem@127.0.0.1:{port}/idem")),
        policy(),
    )
    .expect("valid config");
    let started = Instant::now();
    assert_unavailable(store.claim(&claim_request(&unique_caller(), "k", "a")).await, started);
    let started = Instant::now();
    assert_unavailable(store.ping().await, started);
}

#[tokio::test]
async fn a_server_that_accepts_but_never_answers_gives_a_retryable_error_within_the_timeouts() {
    // The kernel completes the TCP handshake for the listener's backlog,
    // but nothing ever reads or answers: a hung server.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let store = PostgresStore::new(
        &quick_config(format!("postgres://idem@127.0.0.1:{port}/idem")),
        policy(),
    )
    .expect("valid config");
    let started = Instant::now();
    assert_unavailable(store.claim(&claim_request(&unique_caller(), "k", "a")).await, started);
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_call_waiting_for_a_pooled_connection_gives_up_after_the_wait_bound() {
    let database = fresh_database().await;
    let config = PostgresConfig {
        pool_size: 1,
        ..quick_config(database.url.clone())
    };
    let store = PostgresStore::new(&config, policy()).expect("valid config");
    store.migrate(&[]).await.expect("migrate");
    let caller = unique_caller();
    let lease = match store.claim(&claim_request(&caller, "k", "a")).await.unwrap() {
        ClaimOutcome::Acquired(acquired) => acquired.lease,
        other => panic!("{other:?}"),
    };
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let release_rx = std::sync::Mutex::new(Some(release_rx));
    // The effect holds the pool's only connection until told to finish.
    let holder = store.complete_with(&lease, move |_transaction| {
        let release = release_rx.lock().ok().and_then(|mut slot| slot.take());
        Box::pin(async move {
            if let Some(release) = release {
                let _ = release.await;
            }
            Ok((response(1), ()))
        })
    });
    let waiter = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let started = Instant::now();
        let result = store.claim(&claim_request(&caller, "other", "a")).await;
        let _ = release_tx.send(());
        (result, started)
    };
    let (held, (waited, started)) = tokio::join!(holder, waiter);
    assert_unavailable(waited, started);
    assert!(matches!(held, Ok(Completion::Committed { .. })), "{held:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lock_held_past_the_statement_timeout_gives_a_retryable_error_and_changes_nothing() {
    let database = fresh_database().await;
    let store = PostgresStore::new(&quick_config(database.url.clone()), policy()).expect("valid config");
    store.migrate(&[]).await.expect("migrate");
    let caller = unique_caller();
    let lease = match store.claim(&claim_request(&caller, "k", "a")).await.unwrap() {
        ClaimOutcome::Acquired(acquired) => acquired.lease,
        other => panic!("{other:?}"),
    };
    let mut client = raw_client(&database.url).await;
    let holder = client.transaction().await.expect("begin");
    holder
        .query("SELECT 1 FROM idempotency_keys FOR UPDATE", &[])
        .await
        .expect("lock the row");
    let started = Instant::now();
    assert_unavailable(store.complete(&lease, response(1)).await, started);
    holder.rollback().await.expect("release the lock");
    // The timed-out call wrote nothing, and the same call now succeeds.
    let record = store.inspect(&caller, &lease.key).await.unwrap().expect("record");
    assert!(record.lease().is_some(), "{record:?}");
    assert!(store.complete(&lease, response(1)).await.unwrap().is_applied());
}

#[tokio::test]
async fn a_corrupt_row_is_a_typed_error_not_a_panic() {
    let database = fresh_database().await;
    let store = database.migrated_store(policy(), &[]).await.expect("store");
    let caller = unique_caller();
    let request = claim_request(&caller, "k", "a");
    let lease = match store.claim(&request).await.unwrap() {
        ClaimOutcome::Acquired(acquired) => acquired.lease,
        other => panic!("{other:?}"),
    };
    assert!(store.complete(&lease, response(1)).await.unwrap().is_applied());
    let client = raw_client(&database.url).await;
    client
        .execute("UPDATE idempotency_keys SET response = '\\xdeadbeef'", &[])
        .await
        .expect("corrupt the row");
    assert!(matches!(store.claim(&request).await, Err(StoreError::Corrupt(_))));
    assert!(matches!(
        store.inspect(&caller, &request.key).await,
        Err(StoreError::Corrupt(_))
    ));
}

#[tokio::test]
async fn the_key_is_stored_only_as_its_sha256() {
    let database = fresh_database().await;
    let store = database.migrated_store(policy(), &[]).await.expect("store");
    let caller = unique_caller();
    let request = claim_request(&caller, "customer-jane@example.com", "a");
    assert_eq!(store.claim(&request).await.unwrap().kind(), "acquired");
    let client = raw_client(&database.url).await;
    let row = client
        .query_one(
            "SELECT idem_key, strpos(k::text, 'jane') AS raw_key_at FROM idempotency_keys AS k",
            &[],
        )
        .await
        .expect("the row");
    let stored: Vec<u8> = row.get("idem_key");
    assert_eq!(stored, request.key.digest().0.to_vec());
    assert_eq!(row.get::<_, i32>("raw_key_at"), 0, "the raw key is in the row");
}
