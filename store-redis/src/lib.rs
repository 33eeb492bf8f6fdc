//! idem's Redis backend: store-core's [`IdempotencyStore`](store_core::IdempotencyStore)
//! on Redis 7, standalone or Redis Cluster.
//!
//! - One record is one hash; its tombstone is a small string beside it, in
//!   the same cluster slot ([`keys`]). Keys hold the caller id and the SHA-256
//!   of the idempotency key, never the key itself.
//! - Every transition is one Lua script ([`scripts`]) that mirrors
//!   `store_core::machine` and reads the clock with `TIME`.
//! - Retention and tombstones are Redis TTLs, so `purge_expired` has nothing
//!   to do.
//! - Bulk loading ([`store_core::BulkLoad`], `bulk.rs`) writes completed
//!   records as the scripts leave them, many per pipeline.
//! - [`RedisStore::connect`] refuses servers that may evict records and
//!   reports missing persistence ([`checks`]).
//!
//! Redis is a separate store from the effect it guards, and it can forget
//! records: LIMITS.md beside this crate lists every way, what the store does
//! about each, and the test that shows it.

mod batch;
mod bulk;
pub mod checks;
pub mod config;
mod connection;
mod errors;
pub mod keys;
pub mod notify;
mod record;
mod reply;
pub mod scripts;
mod store;
mod tls;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use batch::{CLAIM_BATCH_QUEUED_ITEMS_MAX, CLAIM_BATCHES_IN_FLIGHT_MAX};
pub use bulk::BULK_LOAD_RECORDS_PER_PIPELINE_MAX;
pub use checks::{NodeFacts, ServerRefusal, ServerReport, ServerWarning};
pub use config::{
    BATCH_ITEMS_MAX, BATCH_ITEMS_MAX_DEFAULT, ConfigError, RedisConfig, RedisTls, TLS_SCHEME, WaitConfig,
};
pub use connection::{CLUSTER_RETRIES_MAX, RECONNECT_DELAY_MS_MAX, RECONNECT_DELAY_MS_MIN, RECONNECT_RETRIES_MAX};
pub use errors::CORRUPT_RECORD_CODE;
pub use keys::RecordKeys;
pub use store::{FORGET_READS_MAX, RedisStore};
/// The saved-response format the `response` field holds: store-core's.
pub use store_core::codec::RESPONSE_FORMAT_VERSION;
pub use tls::TLS_ERROR_PREFIX;
