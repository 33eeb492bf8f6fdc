//! idem's PostgreSQL store: the design's own backend (docs/design.md#backend-postgres).
//!
//! - Records live in `idempotency_keys`, keyed by (caller, SHA-256 of the
//!   key), created by versioned migrations ([`PostgresStore::migrate`]).
//! - Transaction 1 claims with `INSERT ... ON CONFLICT DO NOTHING`, then
//!   `SELECT ... FOR UPDATE` to inspect, and commits at once. Nothing is held
//!   while the handler works. Claims are batched across calls: those that
//!   arrive while a batch is in flight go together as one statement and one
//!   commit (`claim_batch.rs`, at most [`PostgresConfig::batch_items_max`]; 1
//!   turns batching off).
//! - Transaction 2 completes only while the lease token holds (batched
//!   like claims: one transaction and one commit per batch,
//!   `completion_batch.rs`), and with
//!   store-core's [`store_core::AtomicCompletion::complete_with`] commits
//!   the handler's own rows (a label) in the same transaction.
//! - Every decision is store-core's pure state machine, run on the locked
//!   row with the database's clock (`now()`), never the application's.
//! - Bulk loading ([`store_core::BulkLoad`], `bulk.rs`) streams completed
//!   records in with one binary `COPY` per batch.
//! - The sweeper deletes expired rows in bounded batches on the `expires_at`
//!   index with `FOR UPDATE SKIP LOCKED`, leaving tombstones so late retries
//!   are noticed.

mod bulk;
mod claim_batch;
mod completion_batch;
mod config;
mod effect;
mod error;
mod migrate;
mod notify;
mod one_statement;
mod row;
mod store;
#[cfg(feature = "testkit")]
pub mod testkit;
mod tls;

pub use bulk::BULK_LOAD_ROWS_PER_COPY_MAX;
pub use claim_batch::{BatchedClaim, CLAIM_BATCH_QUEUED_ITEMS_MAX};
pub use completion_batch::{BatchedCompletion, COMPLETION_BATCH_QUEUED_ITEMS_MAX, OwnedRowEffect};
pub use config::{
    BATCH_ITEMS_MAX, BATCH_ITEMS_MAX_DEFAULT, BATCHES_IN_FLIGHT_DEFAULT, BATCHES_IN_FLIGHT_MAX,
    CONNECT_TIMEOUT_MS_DEFAULT, ConfigError, IDLE_IN_TRANSACTION_TIMEOUT_MS_DEFAULT, OPERATION_TIMEOUT_MS_DEFAULT,
    POOL_SIZE_DEFAULT, POOL_SIZE_MAX, POOL_WAIT_TIMEOUT_MS_DEFAULT, PostgresConfig, STATEMENT_TIMEOUT_MS_DEFAULT,
    SslMode, TIMEOUT_MS_MAX,
};
/// The driver and its pool, so callers write effects against the same versions
/// (an effect gets a `deadpool_postgres::Client` inside the open transaction).
pub use deadpool_postgres;
pub use effect::{ROW_EFFECT_FIRST_PARAMETER, RowCompletion, RowEffect};
pub use error::{EffectError, RETRY_BACKOFF_MS_MAX, TRANSACTION_ATTEMPTS_MAX};
pub use migrate::{
    MIGRATION_LOCK_KEY, MIGRATION_NAMESPACE_BYTES_MAX, MIGRATION_STATEMENT_TIMEOUT_MS, MigrateError, Migration,
    MigrationReport, STORE_MIGRATION_NAMESPACE, STORE_MIGRATIONS,
};
pub use notify::{
    CHANGES_CHANNEL, LISTENER_APPLICATION_NAME, LISTENER_KEEPALIVE_IDLE_MS, LISTENER_RETRY_DELAY_MS_MAX,
    LISTENER_RETRY_DELAY_MS_MIN,
};
pub use store::PostgresStore;
pub use tls::{TLS_ERROR_PREFIX, TlsError};
pub use tokio_postgres;
