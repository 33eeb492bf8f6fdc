//! idem's FDB-style transactional store.
//!
//! The store ([`FdbStore`]) is written once against FoundationDB's
//! transaction model ([`engine`]): point and range reads, set, clear,
//! clear_range, and a retry loop that knows a commit may have happened even
//! when it reported an error. It runs on the embedded engine ([`embedded`],
//! fjall, zero set-up) and on a FoundationDB cluster. The key record and the
//! business effect commit in one transaction (store-core's
//! [`store_core::AtomicCompletion`], implemented in `effect.rs`). Bulk
//! loading of completed records ([`store_core::BulkLoad`], `bulk.rs`)
//! writes many records per transaction, and claims that arrive together
//! share one transaction (`claim_batch.rs`).

mod bulk;
mod claim_batch;
mod effect;
pub mod embedded;
pub mod engine;
#[cfg(feature = "foundationdb")]
pub mod foundationdb;
pub mod foundationdb_config;
#[cfg(feature = "foundationdb")]
pub mod foundationdb_watches;
pub mod keys;
pub mod store;
#[cfg(feature = "testkit")]
pub mod testkit;

#[cfg(feature = "foundationdb")]
pub use self::foundationdb::{FoundationDbEngine, FoundationDbNetwork, FoundationDbStore};
pub use self::foundationdb_config::{FoundationDbConfig, KeyPrefix};
/// FoundationDB's network options, for [`FoundationDbNetwork::start_with_options`].
#[cfg(feature = "foundationdb")]
pub use ::foundationdb::options::NetworkOption;
pub use bulk::BULK_LOAD_RECORDS_PER_TRANSACTION_MAX;
pub use claim_batch::{
    BatchedClaim, CLAIM_BATCH_ITEMS_MAX, CLAIM_BATCH_ITEMS_MAX_DEFAULT_EMBEDDED,
    CLAIM_BATCH_ITEMS_MAX_DEFAULT_FOUNDATIONDB, CLAIM_BATCH_QUEUED_ITEMS_MAX, CLAIM_BATCHES_IN_FLIGHT_DEFAULT,
    CLAIM_BATCHES_IN_FLIGHT_MAX, ClaimBatchingError, claim_batch_limits,
};
pub use embedded::{
    CACHE_BYTES_DEFAULT, CACHE_BYTES_MIN, DATA_DIR_DEFAULT, Durability, EMBEDDED_SIZE_BYTES_LIMIT, EmbeddedConfig,
    EmbeddedEngine, EmbeddedSizes, FaultPlan, JOURNAL_BYTES_MAX_DEFAULT, JOURNAL_BYTES_MAX_MIN, MEMTABLE_BYTES_DEFAULT,
    MEMTABLE_BYTES_MIN, WriteBacklog,
};
pub use engine::{Engine, EngineError, EngineErrorKind, MaybeCommitted, RunOptions, Transaction, TxError};
pub use keys::KeyLayout;
pub use store::FdbStore;

/// The FDB-style store on the embedded engine.
pub type EmbeddedStore = FdbStore<EmbeddedEngine>;

/// Key prefix used when the configuration names none.
pub const KEY_PREFIX_DEFAULT: &[u8] = b"idem";

impl EmbeddedStore {
    /// Opens (or creates) an embedded store in `config.path`, on the
    /// system's clock.
    pub fn open_embedded(config: &EmbeddedConfig, policy: store_core::Policy) -> Result<Self, store_core::StoreError> {
        Self::open_embedded_with_clock(config, policy, store_core::SystemClock::shared())
    }

    /// Opens an embedded store whose store and engine both read `clock`:
    /// leases, retention, purges and transaction ages are timed by it, so a
    /// test holding a `ManualClock` makes them pass by moving it.
    pub fn open_embedded_with_clock(
        config: &EmbeddedConfig,
        policy: store_core::Policy,
        clock: store_core::SharedClock,
    ) -> Result<Self, store_core::StoreError> {
        let engine = EmbeddedEngine::open_with_clock(config, clock.clone())?;
        Ok(FdbStore::new(engine, KEY_PREFIX_DEFAULT, policy).with_clock(clock))
    }
}
