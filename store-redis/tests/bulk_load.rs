//! Bulk loading by pipelines: records read back and replay as the scripts'
//! do, on a standalone server and on Cluster; their keys expire exactly
//! when the scripts would have them expire; a batch over the limit writes
//! nothing.

mod common;

use store_core::testkit::bulk::{
    a_bulk_batch_over_the_limit_writes_nothing, bulk_loaded_records_read_back_and_replay, completed_records,
};
use store_core::testkit::unique_caller;
use store_core::{BulkLoad, SystemClock};
use store_redis::RedisStore;
use store_redis::testkit::{shared_cluster, shared_server};

fn now_ms() -> u64 {
    SystemClock::shared().now_ms()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_records_read_back_and_replay_on_a_standalone_server() {
    let server = shared_server().expect("redis-server starts");
    let store = common::connect(server.config()).await;
    bulk_loaded_records_read_back_and_replay(&store, now_ms()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_records_read_back_and_replay_on_cluster() {
    let cluster = shared_cluster().expect("redis cluster starts");
    let store = RedisStore::connect(cluster.config(), common::policy())
        .await
        .expect("store connects");
    bulk_loaded_records_read_back_and_replay(&store, now_ms()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_over_the_limit_writes_nothing() {
    let server = shared_server().expect("redis-server starts");
    let store = common::connect(server.config()).await;
    a_bulk_batch_over_the_limit_writes_nothing(&store, now_ms()).await;
}

/// The record's key expires at the record's expiry, its tombstone a
/// tombstone window later and holding that time, as `expire_record` and
/// `mark_tombstone` in the scripts' prelude set them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loaded_keys_expire_as_the_scripts_set_them() {
    let server = shared_server().expect("redis-server starts");
    let store = common::connect(server.config()).await;
    let caller = unique_caller();
    let records = completed_records(&caller, 3, now_ms());
    store.load_completed_records(&records).await.expect("bulk load");
    let mut connection = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let tombstone_ms = common::policy().tombstone_ms();
    for loaded in &records {
        let keys = store.keys(&caller, loaded.key());
        let expire_time = |key: String| {
            let mut connection = connection.clone();
            async move {
                redis::cmd("PEXPIRETIME")
                    .arg(key)
                    .query_async::<u64>(&mut connection)
                    .await
                    .unwrap()
            }
        };
        assert_eq!(expire_time(keys.record.clone()).await, loaded.expires_at_ms());
        let tombstone_until = loaded.expires_at_ms() + tombstone_ms;
        assert_eq!(expire_time(keys.tombstone.clone()).await, tombstone_until);
        let stored: String = redis::cmd("GET")
            .arg(&keys.tombstone)
            .query_async(&mut connection)
            .await
            .unwrap();
        assert_eq!(stored, tombstone_until.to_string());
    }
}
