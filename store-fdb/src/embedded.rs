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
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant};
use store_core::StoreError;
use tokio::sync::oneshot;

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
    /// fjall's memory and journal sizes.
    pub sizes: EmbeddedSizes,
}

/// fjall's block cache: read blocks of flushed tables. Records live a day
/// and most reads are of keys written seconds ago (still in the memtable),
/// so a small cache serves them; fjall's own default is 32 MiB.
pub const CACHE_BYTES_DEFAULT: u64 = 16 * 1024 * 1024;
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// Shortest time between two openings of the database after failures, so
/// that a disk that stays full is not hammered by every request; it doubles
/// with each opening that fails in a row, up to [`REOPEN_INTERVAL_MS_MAX`].
const REOPEN_INTERVAL_MS: u64 = 250;
/// Longest time between two openings while they keep failing.
const REOPEN_INTERVAL_MS_MAX: u64 = 4_000;

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
}

struct Shared {
    config: EmbeddedConfig,
    faults: FaultSwitch,
    current: Mutex<Current>,
    reopens: AtomicU64,
    /// [`REOPEN_INTERVAL_MS`], shorter or longer in tests.
    reopen_interval: Duration,
}

/// What transactions begin on.
enum Current {
    Open(Arc<OpenDatabase>),
    /// One task is opening the directory again; the others fail fast.
    Reopening,
    /// `failures` openings in a row failed, the last because of `detail`;
    /// no new one before `retry_at`.
    Failed {
        detail: String,
        retry_at: Instant,
        failures: u32,
    },
}

/// One opening of the directory. Transactions hold it until they finish, so
/// a failed opening is closed (and its directory lock released) only when
/// the last of them is gone.
struct OpenDatabase {
    database: OptimisticTxDatabase,
    keyspace: OptimisticTxKeyspace,
    committer: Committer,
    opened_at: Instant,
    /// Openings that had failed in a row before this one.
    failures_before: u32,
}

/// What the committer thread answers: `Ok(true)` committed (and durable,
/// when the durability asks for it), `Ok(false)` a conflict (nothing was
/// written), `Err` an I/O failure during the commit or the sync (unknown).
type CommitAnswer = Result<bool, String>;

/// One request to the committer thread.
struct CommitRequest {
    /// `None` for a read-only transaction: nothing to commit, but what it
    /// read must be durable before it is acknowledged.
    transaction: Option<WriteTransaction>,
    answer: oneshot::Sender<CommitAnswer>,
}

/// Group commit on one thread of its own. Every commit is handed to it; it
/// takes all the requests that are waiting, commits them one after another
/// into the journal's OS buffers, runs one fdatasync for all of them (when
/// the durability asks for it), and only then answers each. Commits that
/// arrive during a sync wait for the next one, so under load many commits
/// share one sync, and a commit costs one hand-off instead of a blocking
/// thread of its own. (fjall syncs a journal before rotating it, so a sync
/// never misses a commit that landed in the previous journal.)
struct Committer {
    /// `None` once the engine is being dropped, which ends the thread.
    requests: Option<mpsc::Sender<CommitRequest>>,
    thread: Option<std::thread::JoinHandle<()>>,
    watermarks: Arc<Watermarks>,
    durable_commits: bool,
}

/// Counts of write commits, so a read-only transaction can tell whether
/// anything it may have read is not durable yet. Only the committer thread
/// moves them.
#[derive(Default)]
struct Watermarks {
    /// Write commits started, counted before each becomes visible.
    started: AtomicU64,
    /// Every write commit counted up to here is durable.
    durable: AtomicU64,
    /// Syncs run, for tests.
    syncs: AtomicU64,
    /// Set when a commit or a sync failed: fjall takes no more writes on
    /// this opening of the database.
    failed: AtomicBool,
}

impl Committer {
    fn start(database: OptimisticTxDatabase, durability: Durability) -> std::io::Result<Self> {
        let (requests, queue) = mpsc::channel();
        let watermarks = Arc::new(Watermarks::default());
        let sync_mode = durability.sync_mode();
        let thread_watermarks = watermarks.clone();
        let thread = std::thread::Builder::new()
            .name("idem-embedded-commit".to_owned())
            .spawn(move || {
                let sync = sync_mode.map(|mode| move || database.persist(mode));
                run_committer(&queue, &thread_watermarks, sync);
            })?;
        Ok(Self {
            requests: Some(requests),
            thread: Some(thread),
            watermarks,
            durable_commits: sync_mode.is_some(),
        })
    }

    /// Hands a request to the thread and waits for its answer.
    async fn submit(&self, transaction: Option<WriteTransaction>) -> CommitAnswer {
        let (answer, answered) = oneshot::channel();
        let request = CommitRequest { transaction, answer };
        let sent = match &self.requests {
            Some(requests) => requests.send(request).is_ok(),
            None => false,
        };
        if !sent {
            return Err("the committer thread has stopped".to_owned());
        }
        answered
            .await
            .unwrap_or_else(|_| Err("the committer thread dropped a commit".to_owned()))
    }

    /// True when every write commit that a read could have seen is durable
    /// already (always, without durable commits): a read-only transaction
    /// then needs no sync. Called after the transaction's reads: a commit
    /// they saw was counted in `started` before it became visible.
    fn reads_are_durable(&self) -> bool {
        let started = self.watermarks.started.load(Ordering::SeqCst);
        !self.durable_commits || self.watermarks.durable.load(Ordering::SeqCst) >= started
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        // Closing the channel ends the thread once it has answered every
        // request; joining it releases its handle on the database, so the
        // directory can be opened again at once.
        self.requests = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The committer thread: batches until the channel closes. `sync` is `None`
/// when commits need no sync (`Durability::Buffer`).
fn run_committer(
    queue: &mpsc::Receiver<CommitRequest>,
    watermarks: &Watermarks,
    sync: Option<impl Fn() -> Result<(), fjall::Error>>,
) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        batch.extend(queue.try_iter());
        let mut answers: Vec<_> = batch
            .into_iter()
            .map(|request| {
                let answer = commit_one(request.transaction, watermarks);
                (request.answer, answer)
            })
            .collect();
        let started = watermarks.started.load(Ordering::SeqCst);
        // Only commits since the last sync need one; a batch of read-only
        // requests whose reads are covered already goes without.
        let synced = match &sync {
            Some(sync) if watermarks.durable.load(Ordering::SeqCst) < started => {
                watermarks.syncs.fetch_add(1, Ordering::Relaxed);
                sync()
            }
            _ => Ok(()),
        };
        match synced {
            Ok(()) => watermarks.durable.store(started, Ordering::SeqCst),
            // A failed sync leaves every commit of the batch, and every read
            // waiting on it, unknown.
            Err(error) => {
                watermarks.failed.store(true, Ordering::SeqCst);
                for (_, answer) in &mut answers {
                    if !matches!(answer, Ok(false)) {
                        *answer = Err(format!("sync failed: {error}"));
                    }
                }
            }
        }
        for (sender, answer) in answers {
            // A caller that stopped waiting has nothing to be told.
            let _ = sender.send(answer);
        }
    }
}

/// Commits one transaction into the journal's OS buffers, counting it as
/// started before it can become visible.
fn commit_one(transaction: Option<WriteTransaction>, watermarks: &Watermarks) -> CommitAnswer {
    let Some(transaction) = transaction else {
        return Ok(true);
    };
    watermarks.started.fetch_add(1, Ordering::SeqCst);
    match transaction.commit() {
        Ok(Ok(())) => Ok(true),
        Ok(Err(_conflict)) => Ok(false),
        Err(error) => {
            watermarks.failed.store(true, Ordering::SeqCst);
            Err(error.to_string())
        }
    }
}

fn io_error(error: impl std::fmt::Display) -> EngineError {
    EngineError::new(EngineErrorKind::Io, error.to_string())
}

impl OpenDatabase {
    /// Opens the directory (replaying fjall's journal) and starts its
    /// committer thread. Blocking.
    fn open(config: &EmbeddedConfig, failures_before: u32) -> Result<Self, StoreError> {
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
            opened_at: Instant::now(),
            failures_before,
        })
    }

    fn has_failed(&self) -> bool {
        self.committer.watermarks.failed.load(Ordering::SeqCst)
    }
}

impl Shared {
    fn current(&self) -> MutexGuard<'_, Current> {
        // Every write to it is a single assignment, so a poisoned lock still
        // holds a whole value.
        self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The open database, unless it failed; a failed one is taken out of
    /// service here and handed back, to be closed off the async workers.
    fn healthy(&self) -> Result<Arc<OpenDatabase>, Option<Arc<OpenDatabase>>> {
        let mut current = self.current();
        let Current::Open(database) = &*current else {
            return Err(None);
        };
        if !database.has_failed() {
            return Ok(database.clone());
        }
        let failed = database.clone();
        // An opening that worked for a while starts the count again.
        let lived = failed.opened_at.elapsed() > Duration::from_millis(REOPEN_INTERVAL_MS_MAX);
        let failures = if lived { 1 } else { failed.failures_before + 1 };
        *current = Current::Failed {
            detail: "a commit or sync failed".to_owned(),
            retry_at: failed.opened_at + self.reopen_backoff(failures),
            failures,
        };
        tracing::error!(path = %self.config.path.display(), "embedded store failed a write; reopening it");
        Err(Some(failed))
    }

    /// Takes the reopening on, if one is due and no one else has.
    fn start_reopening(&self) -> Result<u32, EngineError> {
        let mut current = self.current();
        match &*current {
            Current::Failed { retry_at, failures, .. } if Instant::now() >= *retry_at => {
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
        let opened = OpenDatabase::open(&self.config, failures);
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
                    retry_at: Instant::now() + self.reopen_backoff(failures + 1),
                    failures: failures + 1,
                };
                Err(io_error(detail))
            }
        }
    }

    /// The wait before the next opening after `failures` failed in a row.
    fn reopen_backoff(&self, failures: u32) -> Duration {
        let doubled = self
            .reopen_interval
            .saturating_mul(1 << failures.saturating_sub(1).min(16));
        doubled.min(Duration::from_millis(REOPEN_INTERVAL_MS_MAX).max(self.reopen_interval))
    }
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
        Self::open_with_reopen_interval(config, Duration::from_millis(REOPEN_INTERVAL_MS))
    }

    fn open_with_reopen_interval(config: &EmbeddedConfig, reopen_interval: Duration) -> Result<Self, StoreError> {
        let database = OpenDatabase::open(config, 0)?;
        let faults = FaultSwitch {
            plan: config.faults,
            sequence: AtomicU64::new(0),
            counters: FaultCounters::default(),
        };
        Ok(Self {
            shared: Arc::new(Shared {
                config: config.clone(),
                faults,
                current: Mutex::new(Current::Open(Arc::new(database))),
                reopens: AtomicU64::new(0),
                reopen_interval,
            }),
        })
    }

    pub fn fault_counters(&self) -> &FaultCounters {
        &self.shared.faults.counters
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

    /// Bytes on disk, for metrics.
    pub fn disk_space_bytes(&self) -> u64 {
        match self.shared.healthy() {
            Ok(database) => database.database.disk_space().unwrap_or(0),
            Err(_) => 0,
        }
    }

    /// The database to begin on: the open one, or a fresh opening of the
    /// directory when the last one failed. A reopening is due at most once
    /// per interval and taken on by one task; every other caller gets an
    /// `Io` error at once (not retried: the store answers `Unavailable`).
    /// fjall refuses to open a directory while an earlier opening still
    /// holds it, so a reopening succeeds only once the transactions of the
    /// failed opening have all finished.
    async fn database(&self) -> Result<Arc<OpenDatabase>, EngineError> {
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

    async fn begin(&self) -> Result<EmbeddedTx, EngineError> {
        let database = self.database().await?;
        let inner = database
            .database
            .write_tx()
            .map_err(io_error)?
            .durability(Some(PersistMode::Buffer));
        Ok(EmbeddedTx(Arc::new(TxState {
            inner: Mutex::new(Some(inner)),
            database,
            started: Instant::now(),
            written_bytes: AtomicUsize::new(0),
        })))
    }

    /// Commits through the committer thread: with durable commits each one
    /// waits for an fdatasync, which must not stall the async workers.
    async fn commit(&self, transaction: EmbeddedTx) -> Result<(), EngineError> {
        transaction.0.check_age()?;
        // Taking the transaction out makes any clone the body kept unusable.
        let inner = transaction.0.take()?;
        let committer = &transaction.0.database.committer;
        // A transaction that wrote nothing has nothing to commit, on
        // FoundationDB as here, so it cannot fail at commit. What it read
        // must still be durable before it answers: with durable commits, a
        // read may have seen a commit whose sync is still running.
        let wrote = transaction.0.written_bytes.load(Ordering::Relaxed) > 0;
        if !wrote {
            drop(inner);
            if committer.reads_are_durable() {
                return Ok(());
            }
            return match committer.submit(None).await {
                Ok(_) => Ok(()),
                Err(detail) => Err(EngineError::new(EngineErrorKind::CommitUnknownResult, detail)),
            };
        }
        let fault = self.shared.faults.next();
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
        match committer.submit(Some(inner)).await {
            Ok(true) => {}
            Ok(false) => return Err(EngineError::new(EngineErrorKind::NotCommitted, "conflict")),
            // An I/O error during commit or sync leaves the outcome unknown.
            Err(detail) => return Err(EngineError::new(EngineErrorKind::CommitUnknownResult, detail)),
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

fn not_open() -> StoreError {
    StoreError::unavailable("embedded store is not open", io_error("reopening after a failed write"))
}

/// One fjall write transaction with FoundationDB's limits.
#[derive(Clone)]
pub struct EmbeddedTx(Arc<TxState>);

struct TxState {
    /// `None` once committed. A mutex because the engine interface shares the
    /// transaction by reference, while fjall writes need `&mut`; it is never
    /// held across an await.
    inner: Mutex<Option<WriteTransaction>>,
    /// The opening this transaction began on; it commits there too.
    database: Arc<OpenDatabase>,
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
            for guard in inner.range(&self.database.keyspace, begin..end).take(limit) {
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
                .get(&state.database.keyspace, key)
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
            inner.insert(&state.database.keyspace, key, value);
            Ok(())
        })
    }

    fn clear(&self, key: &[u8]) -> Result<(), EngineError> {
        check_key(key)?;
        let state = &self.0;
        state.count_written(key.len())?;
        state.with(|inner| {
            inner.remove(&state.database.keyspace, key);
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
                inner.remove(&state.database.keyspace, key);
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
        let transaction = self.begin().await?;
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

    /// A fresh fjall database with one written, uncommitted transaction per
    /// request, queued for the committer.
    fn queued_writes(
        count: usize,
    ) -> (
        OptimisticTxDatabase,
        mpsc::Receiver<CommitRequest>,
        Vec<oneshot::Receiver<CommitAnswer>>,
    ) {
        let database = OptimisticTxDatabase::builder(EmbeddedConfig::temporary().path)
            .temporary(true)
            .open()
            .unwrap();
        let keyspace = database
            .keyspace(KEYSPACE_NAME, KeyspaceCreateOptions::default)
            .unwrap();
        let (requests, queue) = mpsc::channel();
        let mut answers = Vec::new();
        for n in 0..count {
            let mut transaction = database.write_tx().unwrap();
            transaction.insert(&keyspace, format!("key-{n}"), "value");
            let (answer, answered) = oneshot::channel();
            requests
                .send(CommitRequest {
                    transaction: Some(transaction),
                    answer,
                })
                .unwrap();
            answers.push(answered);
        }
        (database, queue, answers)
    }

    #[test]
    fn waiting_commits_share_one_sync_and_none_is_answered_before_it() {
        const COMMITS: usize = 20;
        let (database, queue, answers) = queued_writes(COMMITS);
        let answers = Mutex::new(answers);
        let watermarks = Watermarks::default();
        let sync = || {
            for answered in answers.lock().unwrap().iter_mut() {
                assert!(answered.try_recv().is_err(), "a commit was answered before its sync");
            }
            database.persist(PersistMode::SyncData)
        };
        // The channel closes when the queue is drained: the thread's loop ends.
        run_committer(&queue, &watermarks, Some(sync));
        for mut answered in answers.into_inner().unwrap() {
            assert_eq!(answered.try_recv().unwrap(), Ok(true));
        }
        assert_eq!(watermarks.syncs.load(Ordering::SeqCst), 1);
        assert_eq!(watermarks.started.load(Ordering::SeqCst), COMMITS as u64);
        assert_eq!(watermarks.durable.load(Ordering::SeqCst), COMMITS as u64);
    }

    #[test]
    fn a_failed_sync_leaves_every_commit_of_its_batch_unknown_and_nothing_durable() {
        let (_database, queue, answers) = queued_writes(3);
        let watermarks = Watermarks::default();
        run_committer(&queue, &watermarks, Some(|| Err(fjall::Error::Poisoned)));
        for mut answered in answers {
            assert!(answered.try_recv().unwrap().is_err());
        }
        assert_eq!(watermarks.durable.load(Ordering::SeqCst), 0);
        assert!(
            watermarks.failed.load(Ordering::SeqCst),
            "the opening is marked for reopening"
        );
    }

    #[tokio::test]
    async fn reads_wait_only_for_commits_not_yet_durable() {
        let engine = EmbeddedEngine::open(&EmbeddedConfig::temporary()).unwrap();
        let database = open_database(&engine);
        let committer = &database.committer;
        assert!(committer.reads_are_durable(), "nothing written yet");
        let watermarks = &committer.watermarks;
        // A commit counted as started but not yet synced: a read may have seen it.
        watermarks.started.fetch_add(1, Ordering::SeqCst);
        assert!(!committer.reads_are_durable());
        // The read's barrier makes the committer sync what was started.
        committer.submit(None).await.unwrap();
        assert!(committer.reads_are_durable());
        assert_eq!(watermarks.syncs.load(Ordering::SeqCst), 1);
        // A barrier with nothing new to cover runs no sync.
        committer.submit(None).await.unwrap();
        assert_eq!(watermarks.syncs.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn dropping_the_committer_ends_its_thread_and_releases_the_database() {
        let database = OptimisticTxDatabase::builder(EmbeddedConfig::temporary().path)
            .temporary(true)
            .open()
            .unwrap();
        let committer = Committer::start(database, Durability::SyncData).unwrap();
        let watermarks = committer.watermarks.clone();
        assert_eq!(
            Arc::strong_count(&watermarks),
            3,
            "the committer, its thread and this test"
        );
        drop(committer);
        assert_eq!(
            Arc::strong_count(&watermarks),
            1,
            "the thread still runs after the drop"
        );
    }

    fn open_database(engine: &EmbeddedEngine) -> Arc<OpenDatabase> {
        engine.shared.healthy().ok().expect("an open database")
    }

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

    /// An engine that reopens as soon as it may (no interval), or never
    /// within a test (an hour).
    fn engine_reopening_after(interval: Duration) -> EmbeddedEngine {
        EmbeddedEngine::open_with_reopen_interval(&EmbeddedConfig::temporary(), interval).unwrap()
    }

    const AT_ONCE: Duration = Duration::ZERO;
    const NOT_WITHIN_A_TEST: Duration = Duration::from_secs(3_600);

    #[tokio::test]
    async fn after_a_failed_write_the_directory_is_reopened_with_its_commits() {
        let engine = engine_reopening_after(AT_ONCE);
        write(&engine, b"before").await.unwrap();
        fail_writes(&engine);
        assert_eq!(read(&engine, b"before").await.unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(engine.reopens(), 1);
        write(&engine, b"after").await.unwrap();
        assert_eq!(engine.reopens(), 1, "the fresh opening is healthy");
    }

    #[tokio::test]
    async fn no_reopening_before_the_interval_and_the_refusal_is_not_retried() {
        let engine = engine_reopening_after(NOT_WITHIN_A_TEST);
        fail_writes(&engine);
        let started = Instant::now();
        let refused = read(&engine, b"key").await.unwrap_err();
        assert!(matches!(refused, StoreError::Unavailable { .. }), "{refused:?}");
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        assert_eq!(engine.reopens(), 0);
    }

    #[tokio::test]
    async fn while_the_failed_opening_is_still_held_reopening_fails_then_succeeds_once_it_is_gone() {
        let engine = engine_reopening_after(AT_ONCE);
        let straggler = engine.begin().await.unwrap();
        fail_writes(&engine);
        // fjall keeps the directory locked while the straggler holds it.
        let refused = write(&engine, b"key").await.unwrap_err();
        assert!(matches!(refused, StoreError::Unavailable { .. }), "{refused:?}");
        assert_eq!(engine.reopens(), 0);
        drop(straggler);
        write(&engine, b"key").await.unwrap();
        assert_eq!(engine.reopens(), 1);
    }

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

    #[test]
    fn the_wait_between_failed_openings_doubles_up_to_its_most() {
        let engine = EmbeddedEngine::open(&EmbeddedConfig::temporary()).unwrap();
        let waits: Vec<u128> = (1..=7)
            .map(|failures| engine.shared.reopen_backoff(failures).as_millis())
            .collect();
        assert_eq!(waits, [250, 500, 1_000, 2_000, 4_000, 4_000, 4_000]);
    }

    #[tokio::test]
    async fn a_temporary_engine_deletes_its_directory_once_dropped_even_after_a_reopen() {
        let config = EmbeddedConfig::temporary();
        let engine = EmbeddedEngine::open_with_reopen_interval(&config, AT_ONCE).unwrap();
        fail_writes(&engine);
        write(&engine, b"key").await.unwrap();
        assert_eq!(engine.reopens(), 1);
        assert!(config.path.exists());
        drop(engine);
        assert!(!config.path.exists());
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
