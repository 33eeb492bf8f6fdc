//! The embedded engine: fjall's `OptimisticTxDatabase` in one directory.
//!
//! fjall checks, at commit, this transaction's point and range reads against
//! the writes of transactions committed since its snapshot: FoundationDB's
//! resolver rule, phantoms included. On top of it this module adds
//! FoundationDB's limits and error kinds, durable commits (fdatasync before a
//! commit is acknowledged, by default), and a seeded fault switch for tests.
//!
//! One file per concern: `config` (what it is opened with), `faults`
//! (the seeded fault switch), `committer` (group commit on a thread of its
//! own), `reopen` (taking a failed opening out of service and opening the
//! directory again), `transaction` (one transaction with FoundationDB's
//! limits, begun and committed) and `retry` (the retry loop).

mod committer;
mod config;
mod faults;
mod reopen;
mod retry;
mod transaction;

pub use config::{
    CACHE_BYTES_DEFAULT, CACHE_BYTES_MIN, DATA_DIR_DEFAULT, Durability, EMBEDDED_SIZE_BYTES_LIMIT, EmbeddedConfig,
    EmbeddedSizes, JOURNAL_BYTES_MAX_DEFAULT, JOURNAL_BYTES_MAX_MIN, MEMTABLE_BYTES_DEFAULT, MEMTABLE_BYTES_MIN,
};
pub use faults::{FaultCounters, FaultPlan};
pub use transaction::EmbeddedTx;

use crate::engine::{EngineError, EngineErrorKind};
use faults::FaultSwitch;
use fjall::PersistMode;
use reopen::{Current, OpenDatabase};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use store_core::{BatchLimits, SharedClock, StoreError, SystemClock};

/// Name of the single keyspace holding every key; the tuple layer gives the
/// structure, as on FoundationDB.
const KEYSPACE_NAME: &str = "idem";

/// The embedded engine. Cheap to clone; one per process and directory.
///
/// fjall refuses every write after a failed journal write or sync
/// ("poisoned": it can no longer tell what reached the disk). The engine
/// then stops using that opening of the database at once, answers
/// `Unavailable` without retrying, and reopens the directory (fjall replays
/// its journal) on the next transaction once every handle on the failed
/// opening is gone: the service recovers by itself when the disk does.
#[derive(Clone)]
pub struct EmbeddedEngine {
    shared: Arc<Shared>,
    /// Waiters of the stores over this engine: notified in process only,
    /// since no other process can open the database.
    changes: store_core::ChangeHub,
}

/// fjall's write backlog at one moment ([`EmbeddedEngine::write_backlog`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteBacklog {
    /// Tables in level 0, not yet compacted into the levels below.
    pub level_zero_tables: usize,
    /// Memtables sealed and waiting for their flush to a table.
    pub sealed_memtables: usize,
    /// Compactions running now: merging level 0 into level 1, or a level
    /// into the next one, which keeps level 0 from being merged meanwhile.
    pub compactions_running: usize,
}

struct Shared {
    config: EmbeddedConfig,
    /// The config's claim batching, checked when the engine opened.
    claim_batch_limits: Option<BatchLimits>,
    faults: FaultSwitch,
    current: Mutex<Current>,
    reopens: AtomicU64,
    /// What transaction ages and the waits between reopenings are measured
    /// on (its monotonic reading): the system's, or a test's manual clock.
    clock: SharedClock,
}

fn io_error(error: impl std::fmt::Display) -> EngineError {
    EngineError::new(EngineErrorKind::Io, error.to_string())
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.config.temporary {
            // Close the database (joining its threads) before deleting it;
            // any state but `Open` will do, nothing begins here any more.
            *self.current() = Current::Reopening;
            let _ = std::fs::remove_dir_all(&self.config.path);
        }
    }
}

impl EmbeddedEngine {
    pub fn open(config: &EmbeddedConfig) -> Result<Self, StoreError> {
        Self::open_with_clock(config, SystemClock::shared())
    }

    /// Opens with the clock that transaction ages and reopening waits are
    /// measured on: tests pass a [`store_core::ManualClock`] and move it.
    pub fn open_with_clock(config: &EmbeddedConfig, clock: SharedClock) -> Result<Self, StoreError> {
        let claim_batch_limits = config.claim_batch_limits().map_err(|error| StoreError::Refused {
            detail: format!("embedded store: {error}"),
            source: None,
        })?;
        let database = OpenDatabase::open(config, 0, clock.monotonic_ms())?;
        let faults = FaultSwitch {
            plan: config.faults,
            sequence: AtomicU64::new(0),
            counters: FaultCounters::default(),
        };
        Ok(Self {
            shared: Arc::new(Shared {
                config: config.clone(),
                claim_batch_limits,
                faults,
                current: Mutex::new(Current::Open(Arc::new(database))),
                reopens: AtomicU64::new(0),
                clock,
            }),
            changes: store_core::ChangeHub::new(),
        })
    }

    pub fn fault_counters(&self) -> &FaultCounters {
        &self.shared.faults.counters
    }

    /// The clock this engine measures ages and waits on.
    pub fn clock(&self) -> &SharedClock {
        &self.shared.clock
    }

    /// Times the database was reopened after a failed write.
    pub fn reopens(&self) -> u64 {
        self.shared.reopens.load(Ordering::SeqCst)
    }

    /// Makes everything committed so far durable, whatever the durability
    /// setting; called at shutdown.
    pub fn flush(&self) -> Result<(), StoreError> {
        let database = self.shared.healthy().map_err(|_| not_open())?;
        database
            .database
            .persist(PersistMode::SyncAll)
            .map_err(|error| StoreError::unavailable("flush failed", error))
    }

    /// Bytes on disk, for metrics.
    pub fn disk_space_bytes(&self) -> u64 {
        match self.shared.healthy() {
            Ok(database) => database.database.disk_space().unwrap_or(0),
            Err(_) => 0,
        }
    }

    /// fjall's write backlog, for metrics: tables in level 0, sealed
    /// memtables waiting for their flush, compactions running. fjall slows
    /// every write when level 0 holds 20 runs and halts writes at 30, and
    /// halts them while 4 memtables wait for a flush
    /// (`vendor/fjall/src/keyspace/mod.rs`, `local_backpressure`): the
    /// gauges show an operator a stall coming. Zero when the store is not
    /// open. (fjall marks these counts experimental, `doc(hidden)`: read
    /// here only, so a change of fjall's is mended in one place.)
    pub fn write_backlog(&self) -> WriteBacklog {
        match self.shared.healthy() {
            Ok(database) => {
                let keyspace = database.keyspace.inner();
                WriteBacklog {
                    level_zero_tables: keyspace.l0_table_count(),
                    sealed_memtables: keyspace.sealed_memtable_count(),
                    compactions_running: database.database.inner().active_compactions(),
                }
            }
            Err(_) => WriteBacklog::default(),
        }
    }

    /// True when `error` is [`EmbeddedEngine::open`]'s refusal of a
    /// directory that another opening holds (a running server): the
    /// embedded store serves one process, so an operator's command must
    /// wait until the server has stopped.
    pub fn is_directory_locked(error: &StoreError) -> bool {
        let StoreError::Unavailable {
            source: Some(source), ..
        } = error
        else {
            return false;
        };
        matches!(source.downcast_ref::<fjall::Error>(), Some(fjall::Error::Locked))
    }
}

fn not_open() -> StoreError {
    StoreError::unavailable("embedded store is not open", io_error("reopening after a failed write"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Engine, RunOptions, Transaction};

    #[test]
    fn a_directory_held_by_another_opening_is_refused_as_locked() {
        let first = EmbeddedEngine::open(&EmbeddedConfig::temporary()).unwrap();
        let second = EmbeddedEngine::open(&EmbeddedConfig::new(&first.shared.config.path));
        let refused = second.err().expect("a held directory is refused");
        assert!(EmbeddedEngine::is_directory_locked(&refused), "{refused:?}");
        assert!(refused.to_string().contains("locked by another process"), "{refused}");
        let other = StoreError::unavailable("connection refused", std::io::Error::other("refused"));
        assert!(!EmbeddedEngine::is_directory_locked(&other));
    }

    pub(super) fn open_database(engine: &EmbeddedEngine) -> Arc<OpenDatabase> {
        engine.shared.healthy().ok().expect("an open database")
    }

    #[tokio::test]
    async fn commits_acknowledged_before_a_drop_are_there_after_reopening() {
        let directory = EmbeddedConfig::temporary().path;
        let config = EmbeddedConfig::new(&directory);
        let key = b"written-before-the-drop";
        let engine = EmbeddedEngine::open(&config).unwrap();
        engine
            .run(RunOptions::default(), |tx, _| async move { Ok(tx.set(key, b"1")?) })
            .await
            .unwrap();
        drop(engine);
        let reopened = EmbeddedEngine::open(&config).unwrap();
        let value = reopened
            .run(RunOptions::default(), |tx, _| async move { Ok(tx.get(key).await?) })
            .await
            .unwrap();
        assert_eq!(value.as_deref(), Some(&b"1"[..]));
        drop(reopened);
        std::fs::remove_dir_all(&directory).unwrap();
    }
}
