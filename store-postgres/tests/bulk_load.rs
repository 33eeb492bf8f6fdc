//! Bulk loading by binary `COPY`: records read back and replay as a
//! completion's do, a batch over the limit or with a key already in the
//! table writes nothing.

mod common;

use store_core::testkit::bulk::{
    a_bulk_batch_over_the_limit_writes_nothing, bulk_loaded_records_read_back_and_replay, completed_records,
};
use store_core::testkit::unique_caller;
use store_core::{BulkLoad, StoreError, SystemClock};

fn now_ms() -> u64 {
    SystemClock::shared().now_ms()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copied_records_read_back_and_replay() {
    let store = common::fresh_store(store_core::testkit::policy()).await;
    bulk_loaded_records_read_back_and_replay(&store, now_ms()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_over_the_limit_writes_nothing() {
    let store = common::fresh_store(store_core::testkit::policy()).await;
    a_bulk_batch_over_the_limit_writes_nothing(&store, now_ms()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_with_a_key_already_stored_is_refused_whole() {
    let database = common::fresh_database().await;
    let store = database
        .migrated_store(store_core::testkit::policy(), &[])
        .await
        .expect("migrated store");
    let records = completed_records(&unique_caller(), 10, now_ms());
    store.load_completed_records(&records[..1]).await.expect("first record");
    let refused = store.load_completed_records(&records).await;
    assert!(matches!(refused, Err(StoreError::Refused { .. })), "{refused:?}");
    let client = common::raw_client(&database.url).await;
    assert_eq!(common::count(&client, "idempotency_keys").await, 1);
}
