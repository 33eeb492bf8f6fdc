//! The embedded engine: fjall's `OptimisticTxDatabase` in one directory.
//!
//! fjall checks, at commit, this transaction's point and range reads against
//! the writes of transactions committed since its snapshot: FoundationDB's
//! resolver rule, phantoms included. On top of it this module adds
//! FoundationDB's limits and error kinds, durable commits (fdatasync before a
//! commit is acknowledged, by default), and a seeded fault switch for tests.

use crate::engine::{
    Engine, EngineError, EngineErrorKind, KEY_BYTES_MAX, KeyValue, MaybeCommitted, RunOptions, TRANSACTION_BYTES_MAX,
    TRANSACTION_MS_MAX, Transaction, TxError, VALUE_BYTES_MAX,
};
use fjall::OptimisticWriteTx as WriteTransaction;
use fjall::{KeyspaceCreateOptions, OptimisticTxDatabase, OptimisticTxKeyspace, PersistMode, Readable};
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use store_core::StoreError;

/// Name of the single keyspace holding every key; the tuple layer gives the
/// structure, as on FoundationDB.
const KEYSPACE_NAME: &str = "idem";
/// First backoff between attempts; doubles up to the cap, with jitter.
const BACKOFF_MS_MIN: u64 = 2;
const BACKOFF_MS_MAX: u64 = 200;

/// When a commit counts as done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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
    /// The sync a commit waits for, if any.
    fn sync_mode(self) -> Option<PersistMode> {
        match self {
            Durability::SyncData => Some(PersistMode::SyncData),
            Durability::SyncAll => Some(PersistMode::SyncAll),
            Durability::Buffer => None,
        }
    }
}

/// Faults to inject at commit, in parts per million of commits. For tests:
/// production configs leave it at the default (no faults).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultPlan {
    /// Fail the commit with `not_committed` without committing.
    pub conflict_ppm: u32,
    /// Fail with `commit_unknown_result` without committing.
    pub unknown_before_commit_ppm: u32,
    /// Commit for real, then report `commit_unknown_result`.
    pub unknown_after_commit_ppm: u32,
    /// Seed of the fault sequence, so a failing run can be replayed.
    pub seed: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddedConfig {
    pub path: PathBuf,
    pub durability: Durability,
    pub faults: FaultPlan,
    /// Delete the directory when the engine is dropped (tests, benchmarks).
    pub temporary: bool,
}

impl EmbeddedConfig {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            durability: Durability::default(),
            faults: FaultPlan::default(),
            temporary: false,
        }
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

/// Counts of what the fault switch did, for tests to assert on.
#[derive(Debug, Default)]
pub struct FaultCounters {
    pub conflicts: AtomicU64,
    pub unknown_before_commit: AtomicU64,
    pub unknown_after_commit: AtomicU64,
}

struct FaultSwitch {
    plan: FaultPlan,
    sequence: AtomicU64,
    counters: FaultCounters,
}

enum Fault {
    None,
    Conflict,
    UnknownBeforeCommit,
    UnknownAfterCommit,
}

impl FaultSwitch {
    /// Deterministic per commit number: splitmix64 of seed and sequence.
    fn next(&self) -> Fault {
        let plan = &self.plan;
        if plan.conflict_ppm == 0 && plan.unknown_before_commit_ppm == 0 && plan.unknown_after_commit_ppm == 0 {
            return Fault::None;
        }
        let n = self.sequence.fetch_add(1, Ordering::Relaxed);
        let roll = (splitmix64(plan.seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)) % 1_000_000) as u32;
        let (a, b, c) = (
            plan.conflict_ppm,
            plan.unknown_before_commit_ppm,
            plan.unknown_after_commit_ppm,
        );
        let (fault, counter) = if roll < a {
            (Fault::Conflict, &self.counters.conflicts)
        } else if roll < a + b {
            (Fault::UnknownBeforeCommit, &self.counters.unknown_before_commit)
        } else if roll < a + b + c {
            (Fault::UnknownAfterCommit, &self.counters.unknown_after_commit)
        } else {
            return Fault::None;
        };
        counter.fetch_add(1, Ordering::Relaxed);
        fault
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The embedded engine. Cheap to clone; one per process and directory.
#[derive(Clone)]
pub struct EmbeddedEngine {
    database: OptimisticTxDatabase,
    keyspace: OptimisticTxKeyspace,
    durability: Durability,
    group_sync: Arc<GroupSync>,
    faults: Arc<FaultSwitch>,
}

/// Group commit: a transaction commits into the journal's OS buffers, then
/// waits until an fdatasync that started after its commit has finished. One
/// waiter at a time runs the sync for everyone committed so far, so under
/// load many transactions share one sync instead of queueing for one each.
/// (fjall syncs a journal before rotating it, so a sync never misses a
/// commit that landed in the previous journal.)
#[derive(Default)]
struct GroupSync {
    state: Mutex<GroupSyncState>,
    synced: Condvar,
}

#[derive(Default)]
struct GroupSyncState {
    /// Commits that have reached the journal, numbered from 1.
    committed: u64,
    /// Every commit numbered up to here is durable.
    synced: u64,
    sync_running: bool,
}

impl GroupSync {
    /// Called after a commit reached the journal; returns once `sync` has
    /// completed a run that began after that commit.
    fn wait_until_durable(&self, sync: impl Fn() -> Result<(), fjall::Error>) -> Result<(), fjall::Error> {
        let poisoned = || fjall::Error::Poisoned;
        let mut state = self.state.lock().map_err(|_| poisoned())?;
        state.committed += 1;
        let mine = state.committed;
        while state.synced < mine {
            if state.sync_running {
                state = self.synced.wait(state).map_err(|_| poisoned())?;
                continue;
            }
            state.sync_running = true;
            let target = state.committed;
            drop(state);
            let result = sync();
            state = self.state.lock().map_err(|_| poisoned())?;
            state.sync_running = false;
            if result.is_ok() {
                assert!(target >= state.synced, "the durable watermark never moves back");
                state.synced = target;
            }
            self.synced.notify_all();
            result?;
        }
        Ok(())
    }
}

fn io_error(error: impl std::fmt::Display) -> EngineError {
    EngineError::new(EngineErrorKind::Io, error.to_string())
}

impl EmbeddedEngine {
    pub fn open(config: &EmbeddedConfig) -> Result<Self, StoreError> {
        let open = || -> Result<_, fjall::Error> {
            let database = OptimisticTxDatabase::builder(&config.path)
                .temporary(config.temporary)
                .open()?;
            let keyspace = database.keyspace(KEYSPACE_NAME, KeyspaceCreateOptions::default)?;
            Ok((database, keyspace))
        };
        let (database, keyspace) = open().map_err(|error| {
            StoreError::unavailable(
                format!("cannot open embedded store at {}", config.path.display()),
                error,
            )
        })?;
        let faults = FaultSwitch {
            plan: config.faults,
            sequence: AtomicU64::new(0),
            counters: FaultCounters::default(),
        };
        Ok(Self {
            database,
            keyspace,
            durability: config.durability,
            group_sync: Arc::default(),
            faults: Arc::new(faults),
        })
    }

    pub fn fault_counters(&self) -> &FaultCounters {
        &self.faults.counters
    }

    /// Makes everything committed so far durable, whatever the durability
    /// setting; called at shutdown.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.database
            .persist(PersistMode::SyncAll)
            .map_err(|error| StoreError::unavailable("flush failed", error))
    }

    /// Bytes on disk, for metrics.
    pub fn disk_space_bytes(&self) -> u64 {
        self.database.disk_space().unwrap_or(0)
    }

    fn begin(&self) -> Result<EmbeddedTx, EngineError> {
        let inner = self
            .database
            .write_tx()
            .map_err(io_error)?
            .durability(Some(PersistMode::Buffer));
        Ok(EmbeddedTx(Arc::new(TxState {
            inner: Mutex::new(Some(inner)),
            keyspace: self.keyspace.clone(),
            started: Instant::now(),
            written_bytes: AtomicUsize::new(0),
        })))
    }

    /// Commits on a blocking thread: with durable commits each one waits for
    /// an fdatasync, which must not stall the async workers.
    async fn commit(&self, transaction: EmbeddedTx) -> Result<(), EngineError> {
        transaction.0.check_age()?;
        // Taking the transaction out makes any clone the body kept unusable.
        let inner = transaction.0.take()?;
        // A transaction that wrote nothing has nothing to commit, on
        // FoundationDB as here, so it cannot fail at commit.
        let wrote = transaction.0.written_bytes.load(Ordering::Relaxed) > 0;
        let fault = if wrote { self.faults.next() } else { Fault::None };
        match fault {
            Fault::Conflict => return Err(EngineError::new(EngineErrorKind::NotCommitted, "injected conflict")),
            Fault::UnknownBeforeCommit => {
                return Err(EngineError::new(
                    EngineErrorKind::CommitUnknownResult,
                    "injected before commit",
                ));
            }
            Fault::None | Fault::UnknownAfterCommit => {}
        }
        let (database, group_sync, sync_mode) = (
            self.database.clone(),
            self.group_sync.clone(),
            self.durability.sync_mode(),
        );
        // Ok(false) is a conflict: nothing was written.
        let committed = tokio::task::spawn_blocking(move || -> Result<bool, fjall::Error> {
            if inner.commit()?.is_err() {
                return Ok(false);
            }
            if let Some(mode) = sync_mode {
                group_sync.wait_until_durable(|| database.persist(mode))?;
            }
            Ok(true)
        })
        .await;
        match committed {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => return Err(EngineError::new(EngineErrorKind::NotCommitted, "conflict")),
            // An I/O error during commit or sync leaves the outcome unknown.
            Ok(Err(error)) => {
                return Err(EngineError::new(
                    EngineErrorKind::CommitUnknownResult,
                    error.to_string(),
                ));
            }
            Err(error) => {
                return Err(EngineError::new(
                    EngineErrorKind::CommitUnknownResult,
                    error.to_string(),
                ));
            }
        }
        if let Fault::UnknownAfterCommit = fault {
            return Err(EngineError::new(
                EngineErrorKind::CommitUnknownResult,
                "injected after commit",
            ));
        }
        Ok(())
    }
}

/// One fjall write transaction with FoundationDB's limits.
#[derive(Clone)]
pub struct EmbeddedTx(Arc<TxState>);

struct TxState {
    /// `None` once committed. A mutex because the engine interface shares the
    /// transaction by reference, while fjall writes need `&mut`; it is never
    /// held across an await.
    inner: Mutex<Option<WriteTransaction>>,
    keyspace: OptimisticTxKeyspace,
    started: Instant,
    written_bytes: AtomicUsize,
}

impl TxState {
    fn check_age(&self) -> Result<(), EngineError> {
        if self.started.elapsed() > Duration::from_millis(TRANSACTION_MS_MAX) {
            return Err(EngineError::new(
                EngineErrorKind::TransactionTooOld,
                "transaction older than 5 s",
            ));
        }
        Ok(())
    }

    fn lock(&self) -> Result<MutexGuard<'_, Option<WriteTransaction>>, EngineError> {
        self.check_age()?;
        self.inner.lock().map_err(|_| io_error("transaction lock poisoned"))
    }

    fn take(&self) -> Result<WriteTransaction, EngineError> {
        let mut guard = self.inner.lock().map_err(|_| io_error("transaction lock poisoned"))?;
        guard.take().ok_or_else(|| io_error("transaction already finished"))
    }

    fn with<R>(&self, f: impl FnOnce(&mut WriteTransaction) -> Result<R, EngineError>) -> Result<R, EngineError> {
        let mut guard = self.lock()?;
        let inner = guard.as_mut().ok_or_else(|| io_error("transaction already finished"))?;
        f(inner)
    }

    fn count_written(&self, bytes: usize) -> Result<(), EngineError> {
        let total = self.written_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if total > TRANSACTION_BYTES_MAX {
            return Err(EngineError::new(
                EngineErrorKind::TransactionTooLarge,
                format!("{total} bytes"),
            ));
        }
        Ok(())
    }

    fn range_now(&self, begin: &[u8], end: &[u8], limit: usize) -> Result<Vec<KeyValue>, EngineError> {
        self.with(|inner| {
            let mut pairs = Vec::new();
            for guard in inner.range(&self.keyspace, begin..end).take(limit) {
                let (key, value) = guard.into_inner().map_err(io_error)?;
                pairs.push((key.to_vec(), value.to_vec()));
            }
            Ok(pairs)
        })
    }
}

fn check_key(key: &[u8]) -> Result<(), EngineError> {
    if key.len() > KEY_BYTES_MAX {
        return Err(EngineError::new(
            EngineErrorKind::KeyTooLarge,
            format!("{} bytes", key.len()),
        ));
    }
    Ok(())
}

impl Transaction for EmbeddedTx {
    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        check_key(key)?;
        let state = &self.0;
        state.with(|inner| {
            Ok(inner
                .get(&state.keyspace, key)
                .map_err(io_error)?
                .map(|value| value.to_vec()))
        })
    }

    async fn get_range(&self, begin: &[u8], end: &[u8], limit: usize) -> Result<Vec<KeyValue>, EngineError> {
        self.0.range_now(begin, end, limit)
    }

    fn set(&self, key: &[u8], value: &[u8]) -> Result<(), EngineError> {
        check_key(key)?;
        if value.len() > VALUE_BYTES_MAX {
            return Err(EngineError::new(
                EngineErrorKind::ValueTooLarge,
                format!("{} bytes", value.len()),
            ));
        }
        let state = &self.0;
        state.count_written(key.len() + value.len())?;
        state.with(|inner| {
            inner.insert(&state.keyspace, key, value);
            Ok(())
        })
    }

    fn clear(&self, key: &[u8]) -> Result<(), EngineError> {
        check_key(key)?;
        let state = &self.0;
        state.count_written(key.len())?;
        state.with(|inner| {
            inner.remove(&state.keyspace, key);
            Ok(())
        })
    }

    /// fjall has no range delete: read the keys and remove each. The read adds
    /// a read conflict FoundationDB would not, which is stricter, never looser.
    async fn clear_range(&self, begin: &[u8], end: &[u8]) -> Result<(), EngineError> {
        let state = &self.0;
        state.count_written(begin.len() + end.len())?;
        let keys: Vec<Vec<u8>> = state
            .range_now(begin, end, usize::MAX)?
            .into_iter()
            .map(|(key, _)| key)
            .collect();
        state.with(|inner| {
            for key in keys {
                inner.remove(&state.keyspace, key);
            }
            Ok(())
        })
    }
}

impl Engine for EmbeddedEngine {
    type Tx = EmbeddedTx;

    fn name(&self) -> &'static str {
        "embedded"
    }

    async fn run<T, F, Fut>(&self, options: RunOptions, body: F) -> Result<T, StoreError>
    where
        T: Send,
        F: Fn(Self::Tx, MaybeCommitted) -> Fut + Send + Sync,
        Fut: Future<Output = Result<T, TxError>> + Send,
    {
        let deadline = Instant::now() + Duration::from_millis(options.timeout_ms);
        let mut maybe_committed = MaybeCommitted::No;
        let mut last_error = None;
        for attempt in 0..options.retry_limit {
            let error = match self.attempt(&body, maybe_committed).await {
                Ok(value) => return Ok(value),
                Err(TxError::Abort(error)) => return Err(error),
                Err(TxError::Engine(error)) => error,
            };
            if !error.is_retryable() {
                return Err(error.into_store_error());
            }
            if error.maybe_committed() {
                maybe_committed = MaybeCommitted::Maybe;
            }
            last_error = Some(error);
            let pause = backoff(attempt);
            if Instant::now() + pause >= deadline {
                break;
            }
            tokio::time::sleep(pause).await;
        }
        let detail = last_error.map(|error| error.to_string()).unwrap_or_default();
        Err(StoreError::RetriesExhausted {
            attempts: options.retry_limit,
            detail,
        })
    }
}

impl EmbeddedEngine {
    async fn attempt<T, F, Fut>(&self, body: &F, maybe_committed: MaybeCommitted) -> Result<T, TxError>
    where
        F: Fn(EmbeddedTx, MaybeCommitted) -> Fut,
        Fut: Future<Output = Result<T, TxError>>,
    {
        let transaction = self.begin()?;
        let value = body(transaction.clone(), maybe_committed).await?;
        self.commit(transaction).await?;
        Ok(value)
    }
}

/// Capped exponential backoff with full jitter.
fn backoff(attempt: u32) -> Duration {
    let cap = BACKOFF_MS_MIN.saturating_mul(1 << attempt.min(16)).min(BACKOFF_MS_MAX);
    Duration::from_millis(rand::random_range(1..=cap))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn group_sync_shares_one_sync_among_concurrent_commits_and_never_returns_early() {
        const THREADS: u64 = 8;
        const COMMITS_PER_THREAD: u64 = 50;
        let group = GroupSync::default();
        let syncs = AtomicU64::new(0);
        // What the last finished sync covered, as seen by the sync itself.
        let durable = AtomicU64::new(0);
        std::thread::scope(|scope| {
            for _ in 0..THREADS {
                scope.spawn(|| {
                    for _ in 0..COMMITS_PER_THREAD {
                        group
                            .wait_until_durable(|| {
                                let covered = group.state.lock().unwrap().committed;
                                std::thread::sleep(Duration::from_millis(2));
                                syncs.fetch_add(1, Ordering::SeqCst);
                                durable.fetch_max(covered, Ordering::SeqCst);
                                Ok(())
                            })
                            .unwrap();
                        let mine_at_most = group.state.lock().unwrap().committed;
                        assert!(durable.load(Ordering::SeqCst) >= 1 && mine_at_most >= 1);
                    }
                });
            }
        });
        let total = THREADS * COMMITS_PER_THREAD;
        assert_eq!(group.state.lock().unwrap().synced, total, "every commit ended durable");
        let syncs = syncs.load(Ordering::SeqCst);
        assert!(syncs < total / 2, "{syncs} syncs for {total} commits: no grouping");
    }
}
