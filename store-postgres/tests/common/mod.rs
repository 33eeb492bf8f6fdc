//! Shared by the integration tests: one throw-away PostgreSQL server per test
//! binary, and a fresh database per test.

#![allow(dead_code)] // Each test binary uses its own part of this module.

use store_core::Policy;
use store_postgres::PostgresStore;
use store_postgres::testkit::{PostgresServer, TestDatabase};

pub async fn fresh_database() -> TestDatabase {
    PostgresServer::shared()
        .create_database()
        .await
        .expect("create a test database")
}

/// A migrated store on a database of its own.
pub async fn fresh_store(policy: Policy) -> PostgresStore {
    fresh_database()
        .await
        .migrated_store(policy, &[])
        .await
        .expect("migrated store")
}

/// The server's labels table as the issue describes it, unique per parcel
/// and label version, added through the store's migration runner.
pub const LABELS_MIGRATION: store_postgres::Migration = store_postgres::Migration {
    namespace: "server",
    version: 1,
    name: "labels",
    sql: "CREATE TABLE labels (
        label_id       text    PRIMARY KEY,
        order_id       bigint  NOT NULL,
        parcel_no      integer NOT NULL,
        label_version  integer NOT NULL,
        tracking_no    text    NOT NULL,
        created_by_key bytea   NOT NULL,
        UNIQUE (order_id, parcel_no, label_version)
    )",
};

/// A plain connection beside the store's pool, for looking at and locking
/// rows the way another client would.
pub async fn raw_client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("raw connection");
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            eprintln!("raw connection ended: {error}");
        }
    });
    client
}

/// Rows in `table`.
pub async fn count(client: &tokio_postgres::Client, table: &str) -> i64 {
    client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .expect("count rows")
        .get(0)
}
