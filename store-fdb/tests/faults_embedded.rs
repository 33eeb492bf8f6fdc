//! Fault injection on the embedded engine: conflicts and "commit unknown
//! result" before and after real commits, and FoundationDB's limits.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use store_core::{
    CallerId, ClaimOutcome, ClaimRequest, Fenced, Fingerprint, IdempotencyKey, IdempotencyStore, Policy, RecordState,
    SavedResponse,
};
use store_fdb::engine::{KEY_BYTES_MAX, TRANSACTION_BYTES_MAX, VALUE_BYTES_MAX};
use store_fdb::{
    EmbeddedConfig, EmbeddedEngine, EmbeddedStore, Engine, EngineErrorKind, FaultPlan, MaybeCommitted, RunOptions,
    Transaction, TxError,
};

/// Intents driven through the faulty engine; raise with IDEM_FAULT_INTENTS.
const FAULT_INTENTS_DEFAULT: usize = 300;

fn faulty_store(plan: FaultPlan) -> EmbeddedStore {
    let config = EmbeddedConfig {
        faults: plan,
        ..EmbeddedConfig::temporary()
    };
    EmbeddedStore::open_embedded(&config, Policy::default()).expect("open")
}

fn intents() -> usize {
    std::env::var("IDEM_FAULT_INTENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(FAULT_INTENTS_DEFAULT)
}

/// The effect: increment a per-intent counter in the same transaction as
/// the completion. A duplicated effect shows as a count above one.
async fn count_effect(tx: store_fdb::embedded::EmbeddedTx, counter_key: Vec<u8>) -> Result<SavedResponse, TxError> {
    let current = tx
        .get(&counter_key)
        .await?
        .map(|v| u64::from_be_bytes(v.try_into().unwrap()))
        .unwrap_or(0);
    tx.set(&counter_key, &(current + 1).to_be_bytes())?;
    Ok(SavedResponse::new(201, vec![], counter_key).unwrap())
}

/// Claims and completes one intent, retrying the whole call on retryable
/// errors as a client would.
async fn run_intent(store: &EmbeddedStore, caller: &CallerId, intent: usize) {
    let key = IdempotencyKey::new(&format!("intent-{intent}")).unwrap();
    let request = ClaimRequest::new(caller.clone(), key, Fingerprint::of_request("POST", "/x", b"{}"));
    let counter_key = store.layout().effects().pack(&("count", intent as u64));
    for _ in 0..20 {
        let lease = match store.claim(&request).await {
            Ok(ClaimOutcome::Acquired(acquired)) => acquired.lease,
            Ok(ClaimOutcome::Replay(_)) => return,
            Ok(other) => panic!("intent {intent}: unexpected {other:?}"),
            Err(error) if error.is_retryable() => continue,
            Err(error) => panic!("intent {intent}: {error}"),
        };
        let counter_key = &counter_key;
        match store
            .complete_with(&lease, |tx| count_effect(tx, counter_key.clone()))
            .await
        {
            Ok(Fenced::Applied(_)) => return,
            Ok(Fenced::LeaseLost) => panic!("intent {intent}: lease lost without a competitor"),
            Err(error) if error.is_retryable() => continue,
            Err(error) => panic!("intent {intent}: {error}"),
        }
    }
    panic!("intent {intent} did not complete in 20 tries");
}

async fn effect_count(store: &EmbeddedStore, intent: usize) -> u64 {
    let key = store.layout().effects().pack(&("count", intent as u64));
    let key = &key;
    let value = store
        .engine()
        .run(RunOptions::default(), |tx, _| async move { Ok(tx.get(key).await?) })
        .await
        .expect("read counter");
    value.map(|v| u64::from_be_bytes(v.try_into().unwrap())).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unknown_results_and_conflicts_give_no_duplicate_effects_and_no_lost_completions() {
    let plan = FaultPlan {
        conflict_ppm: 100_000,
        unknown_before_commit_ppm: 100_000,
        unknown_after_commit_ppm: 100_000,
        seed: 0x1de_a5eed,
    };
    let store = Arc::new(faulty_store(plan));
    let caller = CallerId::new("faults").unwrap();
    let count = intents();
    let tasks: Vec<_> = (0..count)
        .map(|intent| {
            let (store, caller) = (store.clone(), caller.clone());
            tokio::spawn(async move { run_intent(&store, &caller, intent).await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let mut histogram: HashMap<u64, usize> = HashMap::new();
    for intent in 0..count {
        *histogram.entry(effect_count(&store, intent).await).or_default() += 1;
        let key = IdempotencyKey::new(&format!("intent-{intent}")).unwrap();
        let record = store.inspect(&caller, &key).await.unwrap().expect("record");
        assert!(
            matches!(record.state, RecordState::Completed { .. }),
            "intent {intent} not completed"
        );
    }
    assert_eq!(
        histogram,
        HashMap::from([(1, count)]),
        "effects per intent (count -> intents)"
    );
    let counters = store.engine().fault_counters();
    assert!(
        counters.unknown_after_commit.load(Ordering::Relaxed) > 10,
        "faults were not injected"
    );
    assert!(counters.unknown_before_commit.load(Ordering::Relaxed) > 10);
    assert!(counters.conflicts.load(Ordering::Relaxed) > 10);
}

#[tokio::test]
async fn the_retry_loop_tells_the_body_an_earlier_attempt_may_have_committed() {
    let plan = FaultPlan {
        unknown_after_commit_ppm: 1_000_000,
        ..FaultPlan::default()
    };
    let engine = EmbeddedEngine::open(&EmbeddedConfig {
        faults: plan,
        ..EmbeddedConfig::temporary()
    })
    .unwrap();
    let seen = std::sync::Mutex::new(Vec::new());
    let seen_ref = &seen;
    let result = engine
        .run(
            RunOptions {
                retry_limit: 3,
                timeout_ms: 5_000,
            },
            |tx, maybe| async move {
                seen_ref.lock().unwrap().push(maybe);
                tx.set(b"k", b"v")?;
                Ok(())
            },
        )
        .await;
    assert!(
        matches!(
            result,
            Err(store_core::StoreError::RetriesExhausted { attempts: 3, .. })
        ),
        "{result:?}"
    );
    assert_eq!(
        *seen.lock().unwrap(),
        vec![MaybeCommitted::No, MaybeCommitted::Maybe, MaybeCommitted::Maybe]
    );
}

async fn engine_error<T: Send>(
    engine: &EmbeddedEngine,
    body: impl Fn(store_fdb::embedded::EmbeddedTx) -> Result<T, TxError> + Send + Sync,
) -> String {
    let body = &body;
    let result = engine.run(RunOptions::default(), |tx, _| async move { body(tx) }).await;
    match result {
        Ok(_) => "committed".to_owned(),
        Err(error) => error.to_string(),
    }
}

#[tokio::test]
async fn foundationdb_limits_are_enforced_with_its_error_kinds() {
    let engine = EmbeddedEngine::open(&EmbeddedConfig::temporary()).unwrap();
    let long_key = vec![b'k'; KEY_BYTES_MAX + 1];
    let big_value = vec![0; VALUE_BYTES_MAX + 1];
    assert!(
        engine_error(&engine, |tx| Ok(tx.set(&long_key, b"v")?))
            .await
            .contains("KeyTooLarge (2102)")
    );
    assert!(
        engine_error(&engine, |tx| Ok(tx.set(b"k", &big_value)?))
            .await
            .contains("ValueTooLarge (2103)")
    );
    let chunk = vec![0; VALUE_BYTES_MAX];
    let too_much = engine_error(&engine, |tx| {
        for i in 0..=(TRANSACTION_BYTES_MAX / VALUE_BYTES_MAX) {
            tx.set(format!("k{i}").as_bytes(), &chunk)?;
        }
        Ok(())
    })
    .await;
    assert!(too_much.contains("TransactionTooLarge (2101)"), "{too_much}");
    // At the limits exactly, everything commits.
    let key = vec![b'k'; KEY_BYTES_MAX];
    assert_eq!(engine_error(&engine, |tx| Ok(tx.set(&key, &chunk)?)).await, "committed");
}

#[tokio::test]
async fn a_transaction_older_than_five_seconds_is_too_old() {
    let engine = EmbeddedEngine::open(&EmbeddedConfig::temporary()).unwrap();
    let result = engine
        .run(
            RunOptions {
                retry_limit: 1,
                timeout_ms: 10_000,
            },
            |tx, _| async move {
                tokio::time::sleep(std::time::Duration::from_millis(
                    store_fdb::engine::TRANSACTION_MS_MAX + 100,
                ))
                .await;
                tx.set(b"k", b"v")?;
                Ok(())
            },
        )
        .await;
    let error = result.expect_err("a 5.1 s transaction must fail");
    assert!(error.to_string().contains("TransactionTooOld (1007)"), "{error}");
    assert_eq!(EngineErrorKind::TransactionTooOld.code(), 1007);
}

#[tokio::test]
async fn two_transactions_that_read_the_same_absent_key_and_insert_conflict() {
    let engine = EmbeddedEngine::open(&EmbeddedConfig::temporary()).unwrap();
    let barrier = tokio::sync::Barrier::new(2);
    let attempts = std::sync::atomic::AtomicU32::new(0);
    let (barrier, attempts_ref) = (&barrier, &attempts);
    let insert_if_absent = |value: &'static [u8]| {
        engine.run(
            RunOptions {
                retry_limit: 2,
                timeout_ms: 5_000,
            },
            move |tx, _| async move {
                let first_attempt = attempts_ref.fetch_add(1, Ordering::SeqCst) < 2;
                let existing = tx.get(b"slot").await?;
                if first_attempt {
                    // Both first attempts read before either commits.
                    barrier.wait().await;
                }
                if existing.is_none() {
                    tx.set(b"slot", value)?;
                }
                Ok(existing.is_none())
            },
        )
    };
    let (a, b) = tokio::join!(insert_if_absent(b"a"), insert_if_absent(b"b"));
    let inserted = [a.unwrap(), b.unwrap()];
    assert_eq!(
        inserted.iter().filter(|&&won| won).count(),
        1,
        "exactly one insert wins: {inserted:?}"
    );
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        3,
        "the loser retried once and found the key"
    );
}

#[tokio::test]
async fn commits_survive_a_reopen() {
    let directory = tempfile::tempdir().unwrap();
    let config = EmbeddedConfig::new(directory.path());
    let caller = CallerId::new("durable").unwrap();
    let request = ClaimRequest::new(caller.clone(), IdempotencyKey::new("k").unwrap(), Fingerprint([1; 32]));
    {
        let store = EmbeddedStore::open_embedded(&config, Policy::default()).unwrap();
        let ClaimOutcome::Acquired(acquired) = store.claim(&request).await.unwrap() else {
            panic!()
        };
        let response = SavedResponse::new(201, vec![], b"saved".to_vec()).unwrap();
        assert!(store.complete(&acquired.lease, response).await.unwrap().is_applied());
    }
    let reopened = EmbeddedStore::open_embedded(&config, Policy::default()).unwrap();
    let replay = reopened.claim(&request).await.unwrap();
    assert_eq!(
        replay,
        ClaimOutcome::Replay(SavedResponse::new(201, vec![], b"saved".to_vec()).unwrap())
    );
}
