//! The FDB-style store's own suite (store-fdb's `testkit`: purge, effects
//! with their completion, FoundationDB's limits, conflicts) on a real
//! FoundationDB cluster: the same functions `store_embedded.rs` runs.
//!
//! Compiled only with the `foundationdb` feature. Running needs a cluster
//! (FoundationDB's default cluster file, or `FDB_CLUSTER_FILE`); without one
//! every test fails with instructions. `scripts/test-foundationdb` starts one.
#![cfg(feature = "foundationdb")]

store_fdb::store_tests!(store_fdb::testkit::foundationdb);

use store_core::testkit::{acquire, claim_request, policy, response, unique_caller};
use store_core::{ClaimOutcome, Fenced, IdempotencyStore};
use store_fdb::testkit::{TEST_PREFIX_START, foundationdb};
use store_fdb::{FoundationDbConfig, FoundationDbNetwork, FoundationDbStore, KeyPrefix};

/// FoundationDB only: a directory-layer prefix resolves to the same bytes on
/// every open, so a second store sees the first one's records. (The
/// directory stays behind, under `idem-test-directories`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_directory_prefix_resolves_to_the_same_bytes_on_every_open() {
    // Fails with instructions when no cluster answers.
    drop(foundationdb().await);
    let network = FoundationDbNetwork::start().expect("network");
    let path = vec![
        format!("{TEST_PREFIX_START}directories"),
        format!("{:016x}", rand::random::<u64>()),
    ];
    let config = FoundationDbConfig {
        prefix: KeyPrefix::Directory(path),
        ..FoundationDbConfig::default()
    };
    let caller = unique_caller();
    let first = FoundationDbStore::open_foundationdb(network, &config, policy())
        .await
        .expect("open with a directory prefix");
    let first: store_core::testkit::SharedStore = std::sync::Arc::new(first);
    let acquired = acquire(&first, &claim_request(&caller, "k", "a")).await;
    let fenced = first.complete(&acquired.lease, response(9)).await.expect("complete");
    assert_eq!(fenced, Fenced::Applied(()));
    let second = FoundationDbStore::open_foundationdb(network, &config, policy())
        .await
        .expect("open the directory again");
    let replay = second.claim(&claim_request(&caller, "k", "a")).await.expect("claim");
    assert_eq!(replay, ClaimOutcome::Replay(response(9)));
}

/// FoundationDB only: claims are batched by default, as the config says;
/// `batch_items_max = 1` turns batching off; settings out of range are
/// refused when the store opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_config_batches_claims_by_default_and_one_turns_it_off() {
    use store_fdb::{CLAIM_BATCH_ITEMS_MAX_DEFAULT_FOUNDATIONDB, CLAIM_BATCHES_IN_FLIGHT_DEFAULT, Engine};
    drop(foundationdb().await);
    let network = FoundationDbNetwork::start().expect("network");
    let prefix = format!("{TEST_PREFIX_START}{:016x}", rand::random::<u64>());
    let config = FoundationDbConfig {
        prefix: KeyPrefix::Bytes(prefix.into_bytes()),
        ..FoundationDbConfig::default()
    };
    let batched = FoundationDbStore::open_foundationdb(network, &config, policy())
        .await
        .expect("open");
    let limits = batched.engine().claim_batch_limits().expect("batched by default");
    assert_eq!(
        (limits.items_max(), limits.in_flight_max()),
        (
            CLAIM_BATCH_ITEMS_MAX_DEFAULT_FOUNDATIONDB,
            CLAIM_BATCHES_IN_FLIGHT_DEFAULT
        )
    );
    let unbatched_config = FoundationDbConfig {
        batch_items_max: 1,
        ..config.clone()
    };
    let unbatched = FoundationDbStore::open_foundationdb(network, &unbatched_config, policy())
        .await
        .expect("open");
    assert_eq!(unbatched.engine().claim_batch_limits(), None);
    for (batch_items_max, batches_in_flight_max) in [(0, 2), (1_000, 2), (8, 0)] {
        let refused_config = FoundationDbConfig {
            batch_items_max,
            batches_in_flight_max,
            ..config.clone()
        };
        let refused = FoundationDbStore::open_foundationdb(network, &refused_config, policy()).await;
        assert!(
            matches!(&refused, Err(store_core::StoreError::Refused { detail, .. }) if detail.contains("batch")),
            "({batch_items_max}, {batches_in_flight_max}) was not refused"
        );
    }
}
