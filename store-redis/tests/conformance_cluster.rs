//! The store-core conformance suite against a real three-master Redis Cluster.

use std::sync::Arc;
use store_core::testkit::SharedStore;
use store_core::{IdempotencyStore, Policy, StoreError};
use store_redis::testkit::{StoreWithServer, shared_cluster};
use store_redis::{RedisStore, ServerRefusal};

async fn make(policy: Policy) -> SharedStore {
    let cluster = shared_cluster().expect("redis cluster starts");
    let store = RedisStore::connect(cluster.config(), policy)
        .await
        .expect("store connects to the cluster");
    Arc::new(StoreWithServer::new(store, cluster))
}

store_core::conformance_tests!(make);

/// The startup checks ask every node, not just the one the client met first,
/// and WAIT is sent to the node that owns the record.
#[tokio::test]
async fn startup_checks_and_wait_reach_the_right_cluster_nodes() {
    let cluster = store_redis::testkit::RedisCluster::start().expect("redis cluster starts");
    let store = RedisStore::connect(cluster.config(), store_core::testkit::policy())
        .await
        .unwrap();
    let report = store.server_report();
    assert_eq!(report.nodes.len(), store_redis::testkit::CLUSTER_MASTERS);
    assert_eq!(
        report
            .warnings
            .iter()
            .filter(|warning| warning.kind() == "no_persistence")
            .count(),
        3
    );

    // WAIT goes to the node that ran the write; with no replicas it falls short.
    let waiting = store_redis::RedisConfig {
        wait: Some(store_redis::WaitConfig {
            replicas: 1,
            timeout_ms: 50,
        }),
        ..cluster.config()
    };
    let waiting = RedisStore::connect(waiting, store_core::testkit::policy())
        .await
        .unwrap();
    let caller = store_core::testkit::unique_caller();
    let request = store_core::testkit::claim_request(&caller, "k", "body");
    let unreplicated = waiting.claim(&request).await;
    assert!(
        matches!(&unreplicated, Err(StoreError::Unavailable { detail, .. }) if detail.contains("0 of 1")),
        "{unreplicated:?}"
    );
    assert!(
        store.inspect(&caller, &request.key).await.unwrap().is_some(),
        "WAIT does not undo the write"
    );

    let last = cluster.nodes().last().expect("three nodes");
    last.query::<()>(&["CONFIG", "SET", "maxmemory-policy", "volatile-lru"])
        .unwrap();
    let Err(refused) = RedisStore::connect(cluster.config(), store_core::testkit::policy()).await else {
        panic!("a cluster with an evicting node was accepted");
    };
    let reason = std::error::Error::source(&refused).and_then(|source| source.downcast_ref::<ServerRefusal>());
    let node = format!("127.0.0.1:{}", last.port());
    assert!(
        matches!(reason, Some(ServerRefusal::Eviction { node: named, .. }) if *named == node),
        "{refused}"
    );
}
