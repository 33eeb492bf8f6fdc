//! The handler-level atomic API: a label row and the completed record commit
//! in one transaction, only while the lease holds, or not at all.

mod common;

use common::{LABELS_MIGRATION, count, fresh_database, raw_client};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use store_core::testkit::{TEST_LEASE_MS, claim_request, policy, response, unique_caller};
use store_core::{
    AtomicCompletion, ClaimOutcome, ClaimRequest, CompleteWithError, Completion, EffectFuture, EffectScope, HeldLease,
    IdempotencyStore, RecordState, SavedResponse, StoreError,
};
use store_postgres::deadpool_postgres::Client;
use store_postgres::testkit::TestDatabase;
use store_postgres::{EffectError, PostgresStore, TRANSACTION_ATTEMPTS_MAX};
use tokio_postgres::error::SqlState;

struct Fixture {
    database: TestDatabase,
    store: PostgresStore,
    client: tokio_postgres::Client,
}

async fn fixture() -> Fixture {
    let database = fresh_database().await;
    let store = database
        .migrated_store(policy(), &[LABELS_MIGRATION])
        .await
        .expect("store with labels");
    let client = raw_client(&database.url).await;
    Fixture {
        database,
        store,
        client,
    }
}

async fn acquire(store: &PostgresStore, request: &ClaimRequest) -> HeldLease {
    match store.claim(request).await.expect("claim") {
        ClaimOutcome::Acquired(acquired) => acquired.lease,
        other => panic!("expected acquired, got {other:?}"),
    }
}

/// Inserts the label of parcel 1 of `order_id`, as the server's label route will.
async fn insert_label(client: &Client, label_id: &str, order_id: i64) -> Result<(), EffectError> {
    client
        .execute(
            "INSERT INTO labels (label_id, order_id, parcel_no, label_version, tracking_no, created_by_key) \
             VALUES ($1, $2, 1, 1, 'GRD000918273', '\\x00')",
            &[&label_id, &order_id],
        )
        .await?;
    Ok(())
}

/// An effect that counts its calls, inserts a label and answers `response(tag)`.
fn label_effect<'a>(
    calls: &Arc<AtomicU32>,
    label_id: &'static str,
    order_id: i64,
    tag: u8,
) -> impl for<'t> Fn(EffectScope<'t, 'a, &'t Client>) -> EffectFuture<'t, &'static str, EffectError> + Send + Sync + 'a
{
    let calls = calls.clone();
    move |transaction| {
        calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            insert_label(&transaction, label_id, order_id).await?;
            Ok((response(tag), label_id))
        })
    }
}

#[tokio::test]
async fn the_label_and_the_completed_record_commit_together() {
    let Fixture { store, client, .. } = fixture().await;
    let caller = unique_caller();
    let request = claim_request(&caller, "label:918273:1:v1", "a");
    let lease = acquire(&store, &request).await;
    let calls = Arc::new(AtomicU32::new(0));
    let outcome = store
        .complete_with(&lease, label_effect(&calls, "L-1", 918273, 1))
        .await
        .expect("complete with label");
    assert_eq!(
        outcome,
        Completion::Committed {
            response: response(1),
            value: "L-1"
        }
    );
    assert_eq!(count(&client, "labels").await, 1);
    let record = store.inspect(&caller, &request.key).await.unwrap().expect("record");
    assert!(matches!(record.state, RecordState::Completed { .. }), "{record:?}");
    assert_eq!(
        store
            .claim(&claim_request(&caller, "label:918273:1:v1", "a"))
            .await
            .unwrap(),
        ClaimOutcome::Replay(response(1))
    );
}

#[tokio::test]
async fn a_repeat_after_a_lost_reply_answers_from_the_record_without_running_the_effect() {
    let Fixture { store, client, .. } = fixture().await;
    let lease = acquire(&store, &claim_request(&unique_caller(), "k", "a")).await;
    let calls = Arc::new(AtomicU32::new(0));
    let first = store.complete_with(&lease, label_effect(&calls, "L-1", 1, 1)).await;
    assert!(matches!(first, Ok(Completion::Committed { .. })), "{first:?}");
    let again = store.complete_with(&lease, label_effect(&calls, "L-1", 1, 1)).await;
    assert_eq!(
        again.expect("repeat"),
        Completion::AlreadyCompleted { response: response(1) }
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the effect ran twice");
    assert_eq!(count(&client, "labels").await, 1);
}

#[tokio::test]
async fn a_lost_lease_runs_no_effect_and_writes_nothing() {
    let Fixture { store, client, .. } = fixture().await;
    let caller = unique_caller();
    let first = acquire(&store, &claim_request(&caller, "k", "a")).await;
    assert!(store.release(&first).await.unwrap().is_applied());
    let second = acquire(&store, &claim_request(&caller, "k", "a")).await;
    let before = store.inspect(&caller, &first.key).await.unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let outcome = store
        .complete_with(&first, label_effect(&calls, "L-stale", 1, 1))
        .await
        .expect("fenced");
    assert_eq!(outcome, Completion::LeaseLost);
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the effect ran without the lease");
    assert_eq!(count(&client, "labels").await, 0);
    assert_eq!(store.inspect(&caller, &first.key).await.unwrap(), before);
    let outcome = store.complete_with(&second, label_effect(&calls, "L-2", 1, 2)).await;
    assert!(matches!(outcome, Ok(Completion::Committed { .. })), "{outcome:?}");
}

#[tokio::test]
async fn an_effect_error_rolls_back_the_effect_and_the_record() {
    let Fixture { store, client, .. } = fixture().await;
    let caller = unique_caller();
    let lease = acquire(&store, &claim_request(&caller, "k", "a")).await;
    let before = store.inspect(&caller, &lease.key).await.unwrap();
    let outcome = store
        .complete_with(&lease, |transaction| {
            Box::pin(async move {
                insert_label(&transaction, "L-1", 1).await?;
                Err::<(SavedResponse, ()), _>(EffectError::Handler("carrier refused the parcel".into()))
            })
        })
        .await;
    assert!(
        matches!(outcome, Err(CompleteWithError::Effect(EffectError::Handler(_)))),
        "{outcome:?}"
    );
    assert_eq!(count(&client, "labels").await, 0, "the effect's row survived its error");
    assert_eq!(store.inspect(&caller, &lease.key).await.unwrap(), before);
    // The lease is still held, so the attempt can still complete.
    let calls = Arc::new(AtomicU32::new(0));
    let outcome = store.complete_with(&lease, label_effect(&calls, "L-1", 1, 1)).await;
    assert!(matches!(outcome, Ok(Completion::Committed { .. })), "{outcome:?}");
}

#[tokio::test]
async fn a_second_label_for_the_same_parcel_is_refused_with_its_sqlstate() {
    let Fixture { store, client, .. } = fixture().await;
    let caller = unique_caller();
    let calls = Arc::new(AtomicU32::new(0));
    let first = acquire(&store, &claim_request(&caller, "label:7:1:v1", "a")).await;
    let committed = store.complete_with(&first, label_effect(&calls, "L-1", 7, 1)).await;
    assert!(matches!(committed, Ok(Completion::Committed { .. })), "{committed:?}");
    // A buggy client mints a new key for the same parcel: the unique
    // constraint is the second line of defence.
    let second = acquire(&store, &claim_request(&caller, "label:7:1:v1-retry", "a")).await;
    let refused = store
        .complete_with(&second, label_effect(&calls, "L-2", 7, 2))
        .await
        .expect_err("duplicate parcel");
    let CompleteWithError::Effect(effect) = &refused else {
        panic!("expected the effect's error, got {refused:?}")
    };
    assert_eq!(effect.code(), Some(&SqlState::UNIQUE_VIOLATION));
    assert!(!refused.is_retryable());
    assert_eq!(count(&client, "labels").await, 1);
    let record = store.inspect(&caller, &second.key).await.unwrap().expect("record");
    assert!(matches!(record.state, RecordState::Started { .. }), "{record:?}");
}

/// An effect that fails with a serialization failure on its first
/// `failures` calls, the way a conflicting concurrent transaction would.
fn conflicting_effect<'a>(
    calls: &Arc<AtomicU32>,
    failures: u32,
) -> impl for<'t> Fn(EffectScope<'t, 'a, &'t Client>) -> EffectFuture<'t, (), EffectError> + Send + Sync + 'a {
    let calls = calls.clone();
    move |transaction| {
        let call = calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            insert_label(&transaction, "L-1", 1).await?;
            if call < failures {
                transaction
                    .batch_execute("DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$")
                    .await?;
            }
            Ok((response(1), ()))
        })
    }
}

#[tokio::test]
async fn serialization_failures_are_retried_with_a_fresh_transaction_then_given_up() {
    let Fixture { store, client, .. } = fixture().await;
    let caller = unique_caller();
    let lease = acquire(&store, &claim_request(&caller, "k", "a")).await;
    let calls = Arc::new(AtomicU32::new(0));
    let endless = store
        .complete_with(&lease, conflicting_effect(&calls, u32::MAX))
        .await
        .expect_err("always conflicting");
    assert!(
        matches!(
            endless,
            CompleteWithError::Store(StoreError::RetriesExhausted {
                attempts: TRANSACTION_ATTEMPTS_MAX,
                ..
            })
        ),
        "{endless:?}"
    );
    assert!(endless.is_retryable());
    assert_eq!(calls.load(Ordering::SeqCst), TRANSACTION_ATTEMPTS_MAX);
    assert_eq!(count(&client, "labels").await, 0);
    let calls = Arc::new(AtomicU32::new(0));
    let outcome = store.complete_with(&lease, conflicting_effect(&calls, 1)).await;
    assert!(matches!(outcome, Ok(Completion::Committed { .. })), "{outcome:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(count(&client, "labels").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_effect_keeps_the_row_locked_so_no_takeover_slips_in() {
    let Fixture { store, database, .. } = fixture().await;
    let caller = unique_caller();
    let lease = acquire(&store, &claim_request(&caller, "k", "a")).await;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let started_tx = std::sync::Mutex::new(Some(started_tx));
    let slow = store.complete_with(&lease, move |transaction| {
        if let Some(signal) = started_tx.lock().ok().and_then(|mut slot| slot.take()) {
            let _ = signal.send(());
        }
        Box::pin(async move {
            insert_label(&transaction, "L-1", 1).await?;
            // Outlive the lease while holding the row lock.
            tokio::time::sleep(Duration::from_millis(TEST_LEASE_MS * 3)).await;
            Ok((response(1), ()))
        })
    });
    let retry = async {
        started_rx.await.expect("effect started");
        // The lease has expired when this claim starts, but the row stays
        // locked until the completion has committed, so it finds that.
        tokio::time::sleep(Duration::from_millis(TEST_LEASE_MS + 100)).await;
        store.claim(&claim_request(&caller, "k", "a")).await
    };
    let (slow, retry) = tokio::join!(slow, retry);
    assert!(matches!(slow, Ok(Completion::Committed { .. })), "{slow:?}");
    assert_eq!(retry.expect("retry"), ClaimOutcome::Replay(response(1)));
    let client = raw_client(&database.url).await;
    assert_eq!(count(&client, "labels").await, 1);
}
