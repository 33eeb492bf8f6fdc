//! Reopening after a failed write or sync: fjall refuses every write on an
//! opening of the database that failed one ("poisoned"), so the engine takes
//! that opening out of service and opens the directory again, replaying the
//! journal, once the failed opening's last transaction is gone.

use super::committer::Committer;
use super::config::EmbeddedConfig;
use super::{EmbeddedEngine, KEYSPACE_NAME, Shared, io_error};
use crate::engine::EngineError;
use fjall::{KeyspaceCreateOptions, OptimisticTxDatabase, OptimisticTxKeyspace};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use store_core::StoreError;

/// Shortest time between two openings of the database after failures, so
/// that a disk that stays full is not hammered by every request; it doubles
/// with each opening that fails in a row, up to [`REOPEN_INTERVAL_MS_MAX`].
const REOPEN_INTERVAL_MS: u64 = 250;

/// Longest time between two openings while they keep failing.
const REOPEN_INTERVAL_MS_MAX: u64 = 4_000;

/// What transactions begin on.
pub(super) enum Current {
    Open(Arc<OpenDatabase>),
    /// One task is opening the directory again; the others fail fast.
    Reopening,
    /// `failures` openings in a row failed, the last because of `detail`;
    /// no new one before `retry_at_ms` (the clock's monotonic reading).
    Failed {
        detail: String,
        retry_at_ms: u64,
        failures: u32,
    },
}

/// One opening of the directory. Transactions hold it until they finish, so
/// a failed opening is closed (and its directory lock released) only when
/// the last of them is gone.
pub(super) struct OpenDatabase {
    pub(super) database: OptimisticTxDatabase,
    pub(super) keyspace: OptimisticTxKeyspace,
    pub(super) committer: Committer,
    /// When it was opened, by the engine clock's monotonic reading.
    opened_at_ms: u64,
    /// Openings that had failed in a row before this one.
    failures_before: u32,
}

impl OpenDatabase {
    /// Opens the directory (replaying fjall's journal) and starts its
    /// committer thread. Blocking. `opened_at_ms` is the engine clock's
    /// monotonic reading.
    pub(super) fn open(config: &EmbeddedConfig, failures_before: u32, opened_at_ms: u64) -> Result<Self, StoreError> {
        let unavailable = |error: fjall::Error| {
            // The lock is the usual reason on a second process: say so, the
            // embedded store is one process's directory.
            let why = match error {
                fjall::Error::Locked => ": it is locked by another process (the embedded store serves one process)",
                _ => "",
            };
            StoreError::unavailable(
                format!("cannot open embedded store at {}{why}", config.path.display()),
                error,
            )
        };
        let sizes = config.sizes;
        if let Some((name, min, max)) = sizes.out_of_range() {
            return Err(StoreError::Refused {
                detail: format!("embedded store: {name} must be {min} to {max} bytes"),
                source: None,
            });
        }
        // Not fjall's `temporary`: it would delete the directory when a
        // failed opening closes, before the engine reopens it.
        let database = OptimisticTxDatabase::builder(&config.path)
            .cache_size(sizes.cache_bytes)
            .max_journaling_size(sizes.journal_bytes_max)
            .open()
            .map_err(unavailable)?;
        let keyspace = database
            .keyspace(KEYSPACE_NAME, || {
                KeyspaceCreateOptions::default().max_memtable_size(sizes.memtable_bytes)
            })
            .map_err(unavailable)?;
        let committer = Committer::start(database.clone(), config.durability)
            .map_err(|error| StoreError::unavailable("cannot start the embedded store's committer thread", error))?;
        Ok(Self {
            database,
            keyspace,
            committer,
            opened_at_ms,
            failures_before,
        })
    }

    fn has_failed(&self) -> bool {
        self.committer.watermarks.failed.load(Ordering::SeqCst)
    }
}

impl Shared {
    pub(super) fn current(&self) -> MutexGuard<'_, Current> {
        // Every write to it is a single assignment, so a poisoned lock still
        // holds a whole value.
        self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The open database, unless it failed; a failed one is taken out of
    /// service here and handed back, to be closed off the async workers.
    pub(super) fn healthy(&self) -> Result<Arc<OpenDatabase>, Option<Arc<OpenDatabase>>> {
        let mut current = self.current();
        let Current::Open(database) = &*current else {
            return Err(None);
        };
        if !database.has_failed() {
            return Ok(database.clone());
        }
        let failed = database.clone();
        // An opening that worked for a while starts the count again.
        let now_ms = self.clock.monotonic_ms();
        let lived = now_ms.saturating_sub(failed.opened_at_ms) > REOPEN_INTERVAL_MS_MAX;
        let failures = if lived { 1 } else { failed.failures_before + 1 };
        *current = Current::Failed {
            detail: "a commit or sync failed".to_owned(),
            retry_at_ms: failed.opened_at_ms + self.reopen_backoff_ms(failures),
            failures,
        };
        tracing::error!(path = %self.config.path.display(), "embedded store failed a write; reopening it");
        Err(Some(failed))
    }

    /// Takes the reopening on, if one is due and no one else has.
    fn start_reopening(&self) -> Result<u32, EngineError> {
        let mut current = self.current();
        match &*current {
            Current::Failed {
                retry_at_ms, failures, ..
            } if self.clock.monotonic_ms() >= *retry_at_ms => {
                let failures = *failures;
                *current = Current::Reopening;
                Ok(failures)
            }
            Current::Failed { detail, .. } => Err(io_error(format!("embedded store is unavailable: {detail}"))),
            Current::Reopening => Err(io_error("embedded store is reopening after a failed write")),
            Current::Open(_) => Err(io_error("embedded store was reopened meanwhile")),
        }
    }

    /// Blocking: opens the directory again and puts the result in service.
    fn reopen(&self, failures: u32) -> Result<Arc<OpenDatabase>, EngineError> {
        let opened = OpenDatabase::open(&self.config, failures, self.clock.monotonic_ms());
        let mut current = self.current();
        match opened {
            Ok(database) => {
                let database = Arc::new(database);
                *current = Current::Open(database.clone());
                self.reopens.fetch_add(1, Ordering::SeqCst);
                tracing::warn!(path = %self.config.path.display(), "embedded store reopened");
                Ok(database)
            }
            Err(error) => {
                let detail = format!("reopening failed: {error}");
                *current = Current::Failed {
                    detail: detail.clone(),
                    retry_at_ms: self.clock.monotonic_ms() + self.reopen_backoff_ms(failures + 1),
                    failures: failures + 1,
                };
                Err(io_error(detail))
            }
        }
    }

    /// The wait before the next opening after `failures` failed in a row.
    fn reopen_backoff_ms(&self, failures: u32) -> u64 {
        let doubled = REOPEN_INTERVAL_MS.saturating_mul(1 << failures.saturating_sub(1).min(16));
        doubled.min(REOPEN_INTERVAL_MS_MAX)
    }
}

impl EmbeddedEngine {
    /// The database to begin on: the open one, or a fresh opening of the
    /// directory when the last one failed. A reopening is due at most once
    /// per interval and taken on by one task; every other caller gets an
    /// `Io` error at once (not retried: the store answers `Unavailable`).
    /// fjall refuses to open a directory while an earlier opening still
    /// holds it, so a reopening succeeds only once the transactions of the
    /// failed opening have all finished.
    pub(super) async fn database(&self) -> Result<Arc<OpenDatabase>, EngineError> {
        let failed = match self.shared.healthy() {
            Ok(database) => return Ok(database),
            Err(failed) => failed,
        };
        let (due, failed) = match (self.shared.start_reopening(), failed) {
            // Nothing to open and nothing to close.
            (Err(refused), None) => return Err(refused),
            pair => pair,
        };
        let shared = self.shared.clone();
        // Blocking, and not cancelled with this future: closing the failed
        // opening joins its threads, opening replays the journal, and the
        // result is put in service even if no one waits for it any more.
        let reopened = tokio::task::spawn_blocking(move || {
            drop(failed);
            shared.reopen(due?)
        });
        reopened.await.map_err(io_error)?
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::open_database;
    use super::*;
    use crate::embedded::config::EmbeddedConfig;
    use crate::engine::{Engine, RunOptions, Transaction};
    use std::time::{Duration, Instant};
    use store_core::ManualClock;

    /// What fjall's poisoning does to the committer: every later write fails.
    fn fail_writes(engine: &EmbeddedEngine) {
        open_database(engine)
            .committer
            .watermarks
            .failed
            .store(true, Ordering::SeqCst);
    }

    async fn write(engine: &EmbeddedEngine, key: &'static [u8]) -> Result<(), StoreError> {
        engine
            .run(RunOptions::default(), |tx, _| async move { Ok(tx.set(key, b"1")?) })
            .await
    }

    async fn read(engine: &EmbeddedEngine, key: &'static [u8]) -> Result<Option<Vec<u8>>, StoreError> {
        engine
            .run(RunOptions::default(), |tx, _| async move { Ok(tx.get(key).await?) })
            .await
    }

    /// An engine in a temporary directory on a manual clock, and the clock.
    fn engine_on_a_manual_clock() -> (EmbeddedEngine, Arc<ManualClock>) {
        let clock = ManualClock::starting_now();
        let engine = EmbeddedEngine::open_with_clock(&EmbeddedConfig::temporary(), clock.clone()).unwrap();
        (engine, clock)
    }

    #[tokio::test]
    async fn after_a_failed_write_the_directory_is_reopened_with_its_commits() {
        let (engine, clock) = engine_on_a_manual_clock();
        write(&engine, b"before").await.unwrap();
        fail_writes(&engine);
        clock.advance_ms(REOPEN_INTERVAL_MS);
        assert_eq!(read(&engine, b"before").await.unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(engine.reopens(), 1);
        write(&engine, b"after").await.unwrap();
        assert_eq!(engine.reopens(), 1, "the fresh opening is healthy");
    }

    #[tokio::test]
    async fn no_reopening_before_the_interval_and_the_refusal_is_not_retried() {
        let (engine, clock) = engine_on_a_manual_clock();
        fail_writes(&engine);
        clock.advance_ms(REOPEN_INTERVAL_MS - 1);
        let started = Instant::now();
        let refused = read(&engine, b"key").await.unwrap_err();
        assert!(matches!(refused, StoreError::Unavailable { .. }), "{refused:?}");
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        assert_eq!(engine.reopens(), 0, "reopened before the interval");
        clock.advance_ms(1);
        read(&engine, b"key").await.expect("reopened once the interval passed");
        assert_eq!(engine.reopens(), 1);
    }

    #[tokio::test]
    async fn while_the_failed_opening_is_still_held_reopening_fails_then_succeeds_once_it_is_gone() {
        let (engine, clock) = engine_on_a_manual_clock();
        let straggler = engine.begin().await.unwrap();
        fail_writes(&engine);
        clock.advance_ms(REOPEN_INTERVAL_MS);
        // fjall keeps the directory locked while the straggler holds it.
        let refused = write(&engine, b"key").await.unwrap_err();
        assert!(matches!(refused, StoreError::Unavailable { .. }), "{refused:?}");
        assert_eq!(engine.reopens(), 0);
        drop(straggler);
        // The failed reopening doubled the wait.
        clock.advance_ms(2 * REOPEN_INTERVAL_MS);
        write(&engine, b"key").await.unwrap();
        assert_eq!(engine.reopens(), 1);
    }

    #[test]
    fn the_wait_between_failed_openings_doubles_up_to_its_most() {
        let engine = EmbeddedEngine::open(&EmbeddedConfig::temporary()).unwrap();
        let waits: Vec<u64> = (1..=7)
            .map(|failures| engine.shared.reopen_backoff_ms(failures))
            .collect();
        assert_eq!(waits, [250, 500, 1_000, 2_000, 4_000, 4_000, 4_000]);
    }

    #[tokio::test]
    async fn a_temporary_engine_deletes_its_directory_once_dropped_even_after_a_reopen() {
        let config = EmbeddedConfig::temporary();
        let clock = ManualClock::starting_now();
        let engine = EmbeddedEngine::open_with_clock(&config, clock.clone()).unwrap();
        fail_writes(&engine);
        clock.advance_ms(REOPEN_INTERVAL_MS);
        write(&engine, b"key").await.unwrap();
        assert_eq!(engine.reopens(), 1);
        assert!(config.path.exists());
        drop(engine);
        assert!(!config.path.exists());
    }
}
