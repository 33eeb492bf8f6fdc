//! What the embedded engine is opened with: the directory, when a commit
//! counts as done, the fault plan, fjall's memory and journal sizes
//! (checked here: fjall panics on some), and how claims are batched.

use super::faults::FaultPlan;
use crate::claim_batch::{
    CLAIM_BATCH_ITEMS_MAX_DEFAULT_EMBEDDED, CLAIM_BATCHES_IN_FLIGHT_DEFAULT, ClaimBatchingError, claim_batch_limits,
};
use fjall::PersistMode;
use serde::Deserialize;
use std::path::PathBuf;
use store_core::BatchLimits;

/// The directory of a store opened without one named (the server's
/// `store.embedded.path` default), relative to the working directory.
pub const DATA_DIR_DEFAULT: &str = "./data";

/// When a commit counts as done. In a config file: `sync_data`, `sync_all`,
/// `buffer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// fdatasync the journal before acknowledging: survives power loss.
    #[default]
    SyncData,
    /// fsync data and metadata.
    SyncAll,
    /// Hand the journal to the OS only: survives a process crash, not a
    /// power loss. For benchmarks and tests that say so.
    Buffer,
}

impl Durability {
    /// What the committer makes of each batch's journal writes before it
    /// acknowledges them: synced, or handed to the OS (`Buffer`).
    pub(super) fn persist_mode(self) -> PersistMode {
        match self {
            Durability::SyncData => PersistMode::SyncData,
            Durability::SyncAll => PersistMode::SyncAll,
            Durability::Buffer => PersistMode::Buffer,
        }
    }
}

/// What the engine is opened with. The server reads it from its config's
/// `[store.embedded]` section (`path`, `durability`, the sizes and the
/// batch settings, flat); the fault plan and `temporary` are for code only.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddedConfig {
    pub path: PathBuf,
    pub durability: Durability,
    #[serde(skip)]
    pub faults: FaultPlan,
    /// Delete the directory when the engine is dropped (tests, benchmarks).
    #[serde(skip)]
    pub temporary: bool,
    /// fjall's memory and journal sizes, written beside `path` in a config
    /// file. serde's `flatten` with `deny_unknown_fields` works for one
    /// flattened struct of plain fields, as here (the config tests refuse a
    /// misspelt size).
    #[serde(flatten)]
    pub sizes: EmbeddedSizes,
    /// Claims that share one transaction at most: those that arrive while
    /// a claim batch is in flight go in the next one (`claim_batch.rs`).
    /// 1, the default, turns batching off: the committer already shares
    /// one fdatasync among the commits waiting for it.
    pub batch_items_max: usize,
    /// Claim batches running at once at most.
    pub batches_in_flight_max: usize,
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        Self::new(DATA_DIR_DEFAULT)
    }
}

/// fjall's block cache: read blocks of flushed tables. Records live a day
/// and most reads are of keys written seconds ago (still in the memtable),
/// so the cache stays nearly empty on a young store; fjall's own default is
/// 32 MiB. It must still admit the largest block a point read loads: the
/// cache is split into four shards per CPU and never admits a block over
/// four fifths of a shard, so 16 MiB on two cores refused anything over
/// 1.6 MiB, which the whole index block of a level-2 table outgrows at a
/// few million records; every point read reaching such a table then read
/// and checksummed it from the file again (BENCHMARKS.md, "A day of keys":
/// at 3M records a third of the service's CPU, 64 MiB took it to 1 %, with
/// the same peak RSS on an empty store). The shards are per CPU, so this
/// default is sized for the design's two cores: a machine with more wants
/// about 32 MiB per CPU. A store holding a day of keys wants more still:
/// the sweeper reads day-old records.
pub const CACHE_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;

/// The memtable a keyspace fills before it is sealed and flushed. Up to two
/// are in memory at once (the active one and the one being flushed), and a
/// flush writes one whole: a smaller memtable means less memory and shorter
/// flushes, more often (BENCHMARKS.md, the stalls). fjall's default is 64 MiB.
pub const MEMTABLE_BYTES_DEFAULT: u64 = 16 * 1024 * 1024;

/// Journal bytes kept before fjall forces the oldest memtables to flush.
pub const JOURNAL_BYTES_MAX_DEFAULT: u64 = 512 * 1024 * 1024;

/// The smallest and largest sizes accepted (fjall itself refuses a memtable
/// under 1 MiB and a journal limit under 64 MiB, by panicking: checked here).
pub const CACHE_BYTES_MIN: u64 = 1024 * 1024;

pub const MEMTABLE_BYTES_MIN: u64 = 1024 * 1024;

pub const JOURNAL_BYTES_MAX_MIN: u64 = 64 * 1024 * 1024;

pub const EMBEDDED_SIZE_BYTES_LIMIT: u64 = 64 * 1024 * 1024 * 1024;

/// The embedded engine's memory and journal sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct EmbeddedSizes {
    pub cache_bytes: u64,
    pub memtable_bytes: u64,
    pub journal_bytes_max: u64,
}

impl Default for EmbeddedSizes {
    fn default() -> Self {
        Self {
            cache_bytes: CACHE_BYTES_DEFAULT,
            memtable_bytes: MEMTABLE_BYTES_DEFAULT,
            journal_bytes_max: JOURNAL_BYTES_MAX_DEFAULT,
        }
    }
}

impl EmbeddedSizes {
    /// The first size out of range, by name, with its range.
    pub fn out_of_range(&self) -> Option<(&'static str, u64, u64)> {
        [
            ("cache_bytes", self.cache_bytes, CACHE_BYTES_MIN),
            ("memtable_bytes", self.memtable_bytes, MEMTABLE_BYTES_MIN),
            ("journal_bytes_max", self.journal_bytes_max, JOURNAL_BYTES_MAX_MIN),
        ]
        .into_iter()
        .find(|(_, value, min)| !(*min..=EMBEDDED_SIZE_BYTES_LIMIT).contains(value))
        .map(|(name, _, min)| (name, min, EMBEDDED_SIZE_BYTES_LIMIT))
    }
}

impl EmbeddedConfig {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            durability: Durability::default(),
            faults: FaultPlan::default(),
            temporary: false,
            sizes: EmbeddedSizes::default(),
            batch_items_max: CLAIM_BATCH_ITEMS_MAX_DEFAULT_EMBEDDED,
            batches_in_flight_max: CLAIM_BATCHES_IN_FLIGHT_DEFAULT,
        }
    }

    /// How the stores over the engine batch their claims, the settings
    /// checked; `None` when every claim goes alone.
    pub fn claim_batch_limits(&self) -> Result<Option<BatchLimits>, ClaimBatchingError> {
        claim_batch_limits(self.batch_items_max, self.batches_in_flight_max)
    }

    /// A fresh directory under the system's temporary directory, deleted
    /// when the engine is dropped.
    pub fn temporary() -> Self {
        let name = format!("idem-embedded-{}-{:016x}", std::process::id(), rand::random::<u64>());
        Self {
            temporary: true,
            ..Self::new(std::env::temp_dir().join(name))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::EmbeddedEngine;
    use super::*;
    use store_core::StoreError;

    #[test]
    fn sizes_fjall_would_panic_on_are_refused_with_an_error() {
        for sizes in [
            EmbeddedSizes {
                memtable_bytes: 1_000,
                ..EmbeddedSizes::default()
            },
            EmbeddedSizes {
                journal_bytes_max: MEMTABLE_BYTES_MIN,
                ..EmbeddedSizes::default()
            },
            EmbeddedSizes {
                cache_bytes: EMBEDDED_SIZE_BYTES_LIMIT + 1,
                ..EmbeddedSizes::default()
            },
        ] {
            let config = EmbeddedConfig {
                sizes,
                ..EmbeddedConfig::temporary()
            };
            let opened = EmbeddedEngine::open(&config).err();
            assert!(
                matches!(opened, Some(StoreError::Refused { .. })),
                "{sizes:?} was not refused: {opened:?}"
            );
        }
        let sized = EmbeddedConfig {
            sizes: EmbeddedSizes {
                cache_bytes: CACHE_BYTES_MIN,
                memtable_bytes: MEMTABLE_BYTES_MIN,
                journal_bytes_max: JOURNAL_BYTES_MAX_MIN,
            },
            ..EmbeddedConfig::temporary()
        };
        assert!(EmbeddedEngine::open(&sized).is_ok(), "the smallest sizes open");
    }

    #[test]
    fn batch_settings_out_of_range_are_refused_and_claims_go_alone_by_default() {
        use crate::engine::Engine;
        for (batch_items_max, batches_in_flight_max) in [(0, 2), (crate::CLAIM_BATCH_ITEMS_MAX + 1, 2), (1, 0)] {
            let config = EmbeddedConfig {
                batch_items_max,
                batches_in_flight_max,
                ..EmbeddedConfig::temporary()
            };
            let opened = EmbeddedEngine::open(&config).err();
            assert!(
                matches!(&opened, Some(StoreError::Refused { detail, .. }) if detail.contains("batch")),
                "({batch_items_max}, {batches_in_flight_max}) was not refused: {opened:?}"
            );
        }
        let unbatched = EmbeddedEngine::open(&EmbeddedConfig::temporary()).expect("open");
        assert_eq!(unbatched.claim_batch_limits(), None, "no batching by default");
        let config = EmbeddedConfig {
            batch_items_max: 8,
            batches_in_flight_max: 3,
            ..EmbeddedConfig::temporary()
        };
        let limits = EmbeddedEngine::open(&config)
            .expect("open")
            .claim_batch_limits()
            .expect("batched");
        assert_eq!((limits.items_max(), limits.in_flight_max()), (8, 3));
    }
}
