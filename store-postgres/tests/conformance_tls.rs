//! store-core's conformance suite against a real PostgreSQL server with
//! `ssl = on` that accepts TCP connections only over TLS, the store
//! connecting with `sslmode` verify-full and the test CA.

use std::sync::Arc;
use store_core::Policy;
use store_core::testkit::SharedStore;
use store_postgres::SslMode;
use store_postgres::testkit::PostgresServer;

async fn make(policy: Policy) -> SharedStore {
    let database = PostgresServer::shared_tls()
        .create_database()
        .await
        .expect("create a test database");
    assert_eq!(database.config().ssl_mode, SslMode::VerifyFull);
    Arc::new(
        database
            .migrated_store(policy, &[])
            .await
            .expect("migrated store over TLS"),
    )
}

store_core::conformance_tests!(make);

/// Two instances over the TLS-only server: each one's listening connection
/// must speak TLS too, or a waiter is never woken by the other's write.
async fn pair(policy: Policy) -> (SharedStore, SharedStore) {
    let database = PostgresServer::shared_tls()
        .create_database()
        .await
        .expect("create a test database");
    let first = database.migrated_store(policy, &[]).await.expect("migrated store");
    let second = store_postgres::PostgresStore::new(&database.config(), policy).expect("second store");
    (Arc::new(first), Arc::new(second))
}

mod waiting {
    store_core::waiting_tests!(super::pair);
}
