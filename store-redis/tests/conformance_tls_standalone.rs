//! The store-core conformance suite against a real standalone redis-server
//! that speaks TLS only (`--port 0 --tls-port P`) and requires a client
//! certificate: `rediss://` with a CA file and a client certificate.

use std::sync::Arc;
use store_core::Policy;
use store_core::testkit::SharedStore;
use store_redis::RedisStore;
use store_redis::testkit::{StoreWithServer, shared_tls_server, two_instances};

async fn make(policy: Policy) -> SharedStore {
    let server = shared_tls_server().expect("redis-server starts with TLS");
    let config = server.config();
    assert!(config.uses_tls(), "{:?}", config.urls);
    let store = RedisStore::connect(config, policy)
        .await
        .expect("store connects over TLS");
    Arc::new(StoreWithServer::new(store, server))
}

store_core::conformance_tests!(make);

/// Two instances over the TLS-only server: each one's subscriber connection
/// must speak TLS too, or a waiter is never woken by the other's write.
async fn pair(policy: Policy) -> (SharedStore, SharedStore) {
    let server = shared_tls_server().expect("redis-server starts with TLS");
    two_instances(server.clone(), server.config(), policy).await
}

mod waiting {
    store_core::waiting_tests!(super::pair);
}
