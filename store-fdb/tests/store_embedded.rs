//! The FDB-style store's own suite (store-fdb's `testkit`: purge, effects
//! with their completion, FoundationDB's limits, conflicts) on the embedded
//! engine. `store_foundationdb.rs` runs the same functions on FoundationDB.

store_fdb::store_tests!(store_fdb::testkit::embedded);

use std::sync::Arc;
use std::sync::atomic::Ordering;
use store_core::testkit::{TestTime, claim_request, policy, unique_caller};
use store_core::{ClaimOutcome, IdempotencyStore, ManualClock};
use store_fdb::testkit::ObservedEngine;
use store_fdb::{EmbeddedConfig, EmbeddedEngine, FdbStore, KEY_PREFIX_DEFAULT};

/// Embedded only: with the engine's default `batch_items_max` of 1, claims
/// are not batched: every claim is a transaction of its own, however many
/// arrive at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn by_default_every_claim_on_the_embedded_engine_is_a_transaction_of_its_own() {
    const CLAIMS: usize = 16;
    let clock = ManualClock::starting_now();
    let engine = EmbeddedEngine::open_with_clock(&EmbeddedConfig::temporary(), clock.clone()).expect("open");
    let engine = ObservedEngine::new(engine, TestTime::Wall);
    // Slow reads, so that claims would queue behind one another if batched.
    engine.delay_reads(20);
    let store = Arc::new(FdbStore::new(engine, KEY_PREFIX_DEFAULT, policy()).with_clock(clock));
    let caller = unique_caller();
    let tasks: Vec<_> = (0..CLAIMS)
        .map(|index| {
            let (store, request) = (Arc::clone(&store), claim_request(&caller, &format!("k{index}"), "body"));
            tokio::spawn(async move { store.claim(&request).await })
        })
        .collect();
    for task in tasks {
        let outcome = task.await.expect("claim task").expect("claim");
        assert!(matches!(outcome, ClaimOutcome::Acquired(_)), "{outcome:?}");
    }
    assert_eq!(store.engine().counters().runs.load(Ordering::SeqCst), CLAIMS as u64);
}
