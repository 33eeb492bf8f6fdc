//! The store-core conformance suite against a real three-master Redis
//! Cluster that speaks TLS only, clients and cluster bus
//! (`--tls-cluster yes`): `rediss://` seed URLs and a CA file.

use std::sync::Arc;
use store_core::Policy;
use store_core::testkit::SharedStore;
use store_redis::RedisStore;
use store_redis::testkit::{StoreWithServer, shared_tls_cluster};

async fn make(policy: Policy) -> SharedStore {
    let cluster = shared_tls_cluster().expect("redis cluster starts with TLS");
    let config = cluster.config();
    assert!(config.uses_tls(), "{:?}", config.urls);
    let store = RedisStore::connect(config, policy)
        .await
        .expect("store connects to the cluster over TLS");
    Arc::new(StoreWithServer::new(store, cluster))
}

store_core::conformance_tests!(make);
