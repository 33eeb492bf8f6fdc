//! Fault injection on the embedded engine: conflicts and "commit unknown
//! result" before and after real commits (the engine's seeded fault switch),
//! with claims batched (`batched_embedded_config`), and durability across a
//! reopen. The audit itself is store-fdb's
//! `testkit::audit_intents`, which `faults_foundationdb.rs` runs on
//! FoundationDB with FoundationDB's own client fault injection.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use store_core::{ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, IdempotencyStore, Policy, SavedResponse};
use store_fdb::testkit::{audit_intents, batched_embedded_config, fault_intents};
use store_fdb::{
    EmbeddedConfig, EmbeddedEngine, EmbeddedStore, Engine, FaultPlan, MaybeCommitted, RunOptions, Transaction,
};

fn faulty_store(plan: FaultPlan) -> EmbeddedStore {
    let config = EmbeddedConfig {
        faults: plan,
        ..batched_embedded_config()
    };
    EmbeddedStore::open_embedded(&config, Policy::default()).expect("open")
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
    audit_intents(store.clone(), fault_intents()).await;
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

#[tokio::test]
async fn commits_survive_a_reopen() {
    let directory = tempfile::tempdir().unwrap();
    let config = EmbeddedConfig::new(directory.path());
    let caller = store_core::CallerId::new("durable").unwrap();
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
