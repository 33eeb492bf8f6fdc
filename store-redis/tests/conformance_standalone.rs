//! The store-core conformance suite against a real standalone redis-server.

use std::sync::Arc;
use store_core::Policy;
use store_core::testkit::SharedStore;
use store_redis::RedisStore;
use store_redis::testkit::{StoreWithServer, shared_server};

async fn make(policy: Policy) -> SharedStore {
    let server = shared_server().expect("redis-server starts");
    let store = RedisStore::connect(server.config(), policy)
        .await
        .expect("store connects");
    Arc::new(StoreWithServer::new(store, server))
}

store_core::conformance_tests!(make);
