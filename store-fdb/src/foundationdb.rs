//! The FoundationDB engine: the same store ([`FdbStore`]) on a FoundationDB
//! cluster, through the `foundationdb` crate (feature `foundationdb`).
//!
//! This module is a thin adapter. [`FoundationDbTx`] maps the engine
//! interface onto one FoundationDB transaction; [`FoundationDbEngine::run`]
//! is FoundationDB's own retry loop (`Database::run`, which calls `on_error`
//! for every FoundationDB error) with explicit, named transaction options.
//! Everything else (keys, chunking, purging, the state machine) is the code
//! the embedded engine runs too.
//!
//! FoundationDB-specific correctness, each handled here or in the shared
//! store:
//! - `commit_unknown_result` (1021) is retried, because every store
//!   transaction is idempotent (see `store.rs`); FoundationDB's experimental
//!   `automatic_idempotency` option is never set: its documentation calls it
//!   not recommended for production, and it does not cover
//!   `transaction_timed_out` or `cluster_version_changed` anyway.
//! - `transaction_timed_out` (1031) is never retried: it means the run's
//!   time budget ([`RunOptions::timeout_ms`]) is spent, and the commit may
//!   have happened; the caller gets [`StoreError::Unavailable`].
//! - Key and value sizes are checked before FoundationDB sees them, with the
//!   same error kinds as the embedded engine; records are split into chunks
//!   of at most 90,000 bytes (`keys.rs`); purges handle a bounded number of
//!   index entries per transaction (`store.rs`), far below 5 s and 10 MB.
//! - The expiry index is sharded (`keys.rs`), so fresh index entries do not
//!   all land on one hot range at the tail of the keyspace.
//!
//! FoundationDB's client network runs once per process: start it with
//! [`FoundationDbNetwork::start`] before opening an engine. It is stopped
//! when the process exits (or by [`FoundationDbNetwork::stop`]), which
//! FoundationDB's C API requires.

use crate::engine::{
    Engine, EngineError, EngineErrorKind, KEY_BYTES_MAX, KeyValue, MaybeCommitted, RunOptions, TRANSACTION_BYTES_MAX,
    Transaction, TxError, VALUE_BYTES_MAX,
};
use crate::foundationdb_config::{FoundationDbConfig, KeyPrefix};
use crate::store::FdbStore;
use ::foundationdb::api::{FdbApiBuilder, NetworkAutoStop};
use ::foundationdb::directory::{Directory, DirectoryError, DirectoryLayer};
use ::foundationdb::options::{NetworkOption, StreamingMode, TransactionOption};
use ::foundationdb::tuple::hca::HcaError;
use ::foundationdb::{Database, FdbBindingError, FdbError, KeySelector, RangeOption, RetryableTransaction};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use store_core::{BatchLimits, Policy, StoreError};

/// Transaction size limit set on every transaction: FoundationDB's
/// documented maximum, set explicitly so the limit is visible here. The
/// store's transactions stay far below it (one record of at most 16 chunks,
/// or one purge batch).
pub const TRANSACTION_SIZE_LIMIT_BYTES: i32 = TRANSACTION_BYTES_MAX as i32;
/// A run's timeout is never set below this: FoundationDB reads a timeout of
/// 0 as "no timeout at all".
pub const RUN_TIMEOUT_MS_MIN: u64 = 1;
/// First byte of FoundationDB's system keys (`\xff`), which a prefix must
/// not start with.
pub const SYSTEM_KEY_PREFIX_BYTE: u8 = 0xff;
/// First byte of the directory layer's own metadata (`\xfe`), which a fixed
/// prefix must not start with either.
pub const DIRECTORY_METADATA_PREFIX_BYTE: u8 = 0xfe;

// ---- The client network ----------------------------------------------------

/// FoundationDB's client network, one per process.
///
/// The C API allows selecting the API version and starting the network once
/// per process, never again after a stop, and requires the network to be
/// stopped before the process exits. So the network belongs to the process:
/// [`start`](Self::start) boots it on the first call, returns at once on
/// later ones, and registers a hook that stops it at exit, as FoundationDB's
/// Python and Ruby bindings do. This value is the proof that it was started,
/// which [`FoundationDbEngine::open`] asks for.
#[derive(Debug, Clone, Copy)]
pub struct FoundationDbNetwork {
    _started: (),
}

enum NetworkState {
    NotStarted,
    Running(NetworkAutoStop),
    Stopped,
    /// Booting failed; the API version is selected by then, so it cannot
    /// be tried again in this process.
    Failed(String),
}

static NETWORK: Mutex<NetworkState> = Mutex::new(NetworkState::NotStarted);
/// Whether NETWORK is `Running`, readable without the lock on every run:
/// after a stop, FoundationDB's futures would never resolve, so runs must
/// fail fast instead of hanging.
static NETWORK_RUNNING: AtomicBool = AtomicBool::new(false);

fn network_state() -> MutexGuard<'static, NetworkState> {
    // The state is a plain enum, always valid, so a poisoned lock is usable.
    NETWORK.lock().unwrap_or_else(PoisonError::into_inner)
}

impl FoundationDbNetwork {
    /// Starts the network if this process has not yet, with the API version
    /// chosen by the crate feature (7.3 by default). Fails if the installed
    /// `libfdb_c` does not support that version, or if the network was
    /// stopped or failed earlier in this process.
    pub fn start() -> Result<Self, StoreError> {
        Self::start_with_options(Vec::new())
    }

    /// [`start`](Self::start), with network options set before the network
    /// boots: for a process of its own that needs them, e.g. a test binary
    /// that turns on FoundationDB's client fault injection
    /// (`NetworkOption::ClientBuggifyEnable`). Options apply to the whole
    /// process and only at boot, so with options this refuses to answer for
    /// a network that is already running.
    pub fn start_with_options(options: Vec<NetworkOption>) -> Result<Self, StoreError> {
        let mut state = network_state();
        match &*state {
            NetworkState::Running(_) if !options.is_empty() => {
                return Err(network_refused("is already running; options apply only at boot"));
            }
            NetworkState::Running(_) => return Ok(Self { _started: () }),
            NetworkState::Stopped => return Err(network_refused("was stopped; it cannot restart in this process")),
            NetworkState::Failed(detail) => {
                return Err(network_refused(format!("failed to start earlier: {detail}")));
            }
            NetworkState::NotStarted => {}
        }
        match boot_network(options) {
            Ok(guard) => {
                *state = NetworkState::Running(guard);
                NETWORK_RUNNING.store(true, Ordering::Release);
                stop_network_at_exit();
                Ok(Self { _started: () })
            }
            Err(error) => {
                let detail = describe(error);
                *state = NetworkState::Failed(detail.clone());
                Err(network_refused(format!("failed to start: {detail}")))
            }
        }
    }

    /// Stops the network now and waits for its thread: for processes that
    /// shut down before they exit. Drop every engine first. Afterwards no
    /// engine works in this process again. Does nothing if not running.
    pub fn stop() {
        let guard = {
            let mut state = network_state();
            match std::mem::replace(&mut *state, NetworkState::Stopped) {
                NetworkState::Running(guard) => {
                    NETWORK_RUNNING.store(false, Ordering::Release);
                    Some(guard)
                }
                other => {
                    *state = other;
                    None
                }
            }
        };
        // Dropping the guard stops the network and joins its thread; this
        // happens outside the lock so a slow stop blocks no one else.
        drop(guard);
    }

    fn check_running() -> Result<(), StoreError> {
        if NETWORK_RUNNING.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(network_refused("is not running (stopped earlier in this process)"))
    }
}

fn network_refused(detail: impl Into<String>) -> StoreError {
    StoreError::Refused {
        detail: format!("FoundationDB client network {}", detail.into()),
        source: None,
    }
}

/// Selects the API version and starts the network thread. `start` calls it
/// at most once per process, under the state lock.
fn boot_network(options: Vec<NetworkOption>) -> Result<NetworkAutoStop, FdbError> {
    // `build` selects the API version (error 2203 if libfdb_c is older than
    // the version this build asks for); it panics only on a second call,
    // which the state lock rules out.
    let mut network = FdbApiBuilder::default().build()?;
    for option in options {
        network = network.set_option(option)?;
    }
    // SAFETY: `NetworkBuilder::boot` starts FoundationDB's network thread,
    // and its contract is that the returned guard is dropped (stopping and
    // joining the thread) before the process exits. The guard lives in
    // NETWORK until `FoundationDbNetwork::stop` drops it, and `start`
    // registers that function to run at exit. Booting happens once per
    // process, under NETWORK's lock. This call and the `atexit` declaration
    // below are the only unsafe code in the workspace.
    #[allow(unsafe_code)]
    let guard = unsafe { network.boot() }?;
    Ok(guard)
}

// SAFETY: atexit(3) from the C library only records a function pointer to
// call at exit; any `extern "C" fn()` is a valid argument and the call has
// no other precondition, so it is declared safe to call.
#[allow(unsafe_code)]
unsafe extern "C" {
    safe fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
}

/// Stops the network at exit, from a thread of its own: glibc's `exit`
/// destroys the exiting thread's thread-local storage before it runs the
/// `atexit` handlers, and libfdb_c's stop writes a trace event through a
/// thread-local random generator, so stopping on the exiting thread itself
/// crashed every test binary at exit (SIGSEGV in `deterministicRandom`,
/// seen with libfdb_c 7.3.79). A fresh thread has all its own.
extern "C" fn stop_network_on_exit() {
    let stopper = std::thread::Builder::new()
        .name("fdb-network-stop".into())
        .spawn(FoundationDbNetwork::stop);
    match stopper {
        Ok(stopper) => {
            if stopper.join().is_err() {
                tracing::warn!("stopping the FoundationDB network at exit panicked");
            }
        }
        // No thread to spare: stopping here may crash, but not stopping at
        // all breaks the C API's contract for certain.
        Err(_) => FoundationDbNetwork::stop(),
    }
}

/// Registers the stop to run at exit. C runs exit handlers in reverse order
/// of registration, so this runs before the destructors libfdb_c registered
/// when it was loaded, while the library is still whole.
fn stop_network_at_exit() {
    if atexit(stop_network_on_exit) != 0 {
        tracing::warn!("could not register the FoundationDB network stop at exit");
    }
}

/// Registers the stop at exit once more, when the first run of the process
/// ends (committed, failed, or dropped unfinished, e.g. by a caller's
/// timeout while no cluster answers): libfdb_c creates some of its statics
/// lazily while it works (e.g. its counter registry, which the network
/// thread reads on its way out), and C destroys each of them before every
/// exit handler registered earlier. Registered at start only, the stop ran
/// after those destructors and crashed the process at exit (SIGSEGV in
/// `simpleCounterReport`, libfdb_c 7.3.79). Stopping twice is harmless.
struct StopAtExitAfterFirstRun;

impl Drop for StopAtExitAfterFirstRun {
    fn drop(&mut self) {
        static REGISTERED: std::sync::Once = std::sync::Once::new();
        REGISTERED.call_once(stop_network_at_exit);
    }
}

// ---- Errors ------------------------------------------------------------------

/// FoundationDB's name and number for an error, for details and logs.
fn describe(error: FdbError) -> String {
    format!("{} (fdb {})", error.message(), error.code())
}

/// The engine error for a FoundationDB error. Codes the store names map to
/// their kind; any other code maps by FoundationDB's own predicates: "may
/// have committed" (e.g. 1039 cluster_version_changed) to
/// `CommitUnknownResult`, "retryable, not committed" (e.g. 1009
/// future_version, 1037 process_behind, 1213 tag_throttled) to
/// `NotCommitted`, and everything else (e.g. 2000 client_invalid_operation,
/// 1100 operation_cancelled) to `Io`, which the store reports as
/// unavailable.
fn engine_error(error: FdbError) -> EngineError {
    let kind = match error.code() {
        1007 => EngineErrorKind::TransactionTooOld,
        1020 => EngineErrorKind::NotCommitted,
        1021 => EngineErrorKind::CommitUnknownResult,
        1031 => EngineErrorKind::TransactionTimedOut,
        2101 => EngineErrorKind::TransactionTooLarge,
        2102 => EngineErrorKind::KeyTooLarge,
        2103 => EngineErrorKind::ValueTooLarge,
        _ if error.is_maybe_committed() => EngineErrorKind::CommitUnknownResult,
        _ if error.is_retryable() => EngineErrorKind::NotCommitted,
        _ => EngineErrorKind::Io,
    };
    EngineError::new(kind, describe(error))
}

/// The FoundationDB error an engine error stands for: the one it was made
/// from during this attempt if any (so `on_error` sees the exact code),
/// otherwise the code of its kind, which FoundationDB classifies the same
/// way (`is_retryable` of the kind equals FoundationDB's predicate).
fn fdb_error_for(error: &EngineError, last: Option<(EngineError, FdbError)>) -> FdbError {
    match last {
        Some((engine, fdb)) if engine == *error => fdb,
        _ => FdbError::from_code(error.kind.code() as i32),
    }
}

fn check_key(key: &[u8]) -> Result<(), EngineError> {
    if key.len() > KEY_BYTES_MAX {
        let detail = format!("{} bytes", key.len());
        return Err(EngineError::new(EngineErrorKind::KeyTooLarge, detail));
    }
    Ok(())
}

fn check_value(value: &[u8]) -> Result<(), EngineError> {
    if value.len() > VALUE_BYTES_MAX {
        let detail = format!("{} bytes", value.len());
        return Err(EngineError::new(EngineErrorKind::ValueTooLarge, detail));
    }
    Ok(())
}

// ---- Transactions --------------------------------------------------------------

/// One attempt's FoundationDB transaction. Cheap to clone; every clone must
/// be dropped when the body returns, or FoundationDB cannot commit it.
#[derive(Clone)]
pub struct FoundationDbTx {
    trx: RetryableTransaction,
    /// The last FoundationDB error this attempt turned into an engine
    /// error, so the retry loop can hand FoundationDB its exact code.
    last_error: Arc<Mutex<Option<(EngineError, FdbError)>>>,
}

impl FoundationDbTx {
    fn new(trx: RetryableTransaction) -> Self {
        Self {
            trx,
            last_error: Arc::new(Mutex::new(None)),
        }
    }

    fn failed(&self, error: FdbError) -> EngineError {
        let engine = engine_error(error);
        *lock(&self.last_error) = Some((engine.clone(), error));
        engine
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Only plain values live behind these locks, valid after any panic.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Transaction for FoundationDbTx {
    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        check_key(key)?;
        let value = self.trx.get(key, false).await.map_err(|error| self.failed(error))?;
        Ok(value.map(|bytes| bytes.to_vec()))
    }

    /// One `get_range` call returns at most FoundationDB's batch size, so
    /// this reads batch after batch until `limit` pairs or the range's end.
    async fn get_range(&self, begin: &[u8], end: &[u8], limit: usize) -> Result<Vec<KeyValue>, EngineError> {
        // FoundationDB reads a limit of 0 as "no limit".
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut option = RangeOption {
            begin: KeySelector::first_greater_or_equal(begin.to_vec()),
            end: KeySelector::first_greater_or_equal(end.to_vec()),
            limit: Some(limit),
            mode: StreamingMode::WantAll,
            ..RangeOption::default()
        };
        let mut pairs = Vec::new();
        let mut iteration = 1;
        loop {
            let batch = self
                .trx
                .get_range(&option, iteration, false)
                .await
                .map_err(|error| self.failed(error))?;
            pairs.extend(batch.iter().map(|pair| (pair.key().to_vec(), pair.value().to_vec())));
            match option.next_range(&batch) {
                Some(next) => option = next,
                None => return Ok(pairs),
            }
            iteration += 1;
        }
    }

    fn set(&self, key: &[u8], value: &[u8]) -> Result<(), EngineError> {
        check_key(key)?;
        check_value(value)?;
        self.trx.set(key, value);
        Ok(())
    }

    fn clear(&self, key: &[u8]) -> Result<(), EngineError> {
        check_key(key)?;
        self.trx.clear(key);
        Ok(())
    }

    /// A real range clear: one mutation, no reads, no read conflict.
    async fn clear_range(&self, begin: &[u8], end: &[u8]) -> Result<(), EngineError> {
        self.trx.clear_range(begin, end);
        Ok(())
    }
}

/// Sets the options of one attempt. FoundationDB keeps `timeout` and
/// `retry_limit` across `on_error` and measures the timeout from the
/// transaction's creation, so setting them on every attempt (which its
/// documentation calls safe) gives the whole run one budget; `size_limit`
/// is not kept, so it must be set on every attempt.
fn set_transaction_options(trx: &RetryableTransaction, options: RunOptions) -> Result<(), FdbError> {
    let timeout_ms = options.timeout_ms.max(RUN_TIMEOUT_MS_MIN);
    // FoundationDB counts retries after the first attempt; RunOptions counts
    // attempts, the first included.
    let retries = options.retry_limit.saturating_sub(1);
    trx.set_option(TransactionOption::Timeout(
        i32::try_from(timeout_ms).unwrap_or(i32::MAX),
    ))?;
    trx.set_option(TransactionOption::RetryLimit(
        i32::try_from(retries).unwrap_or(i32::MAX),
    ))?;
    trx.set_option(TransactionOption::SizeLimit(TRANSACTION_SIZE_LIMIT_BYTES))?;
    // `automatic_idempotency` is deliberately not set: see the module doc.
    Ok(())
}

// ---- The engine ------------------------------------------------------------------

/// FoundationDB's status document, in the special key space.
const STATUS_JSON_KEY: &[u8] = b"\xff\xff/status/json";

/// The FoundationDB engine: one `Database` handle, shared by clones.
#[derive(Clone)]
pub struct FoundationDbEngine {
    database: Arc<Database>,
    /// Waiters of the stores over this handle; other processes' writes
    /// reach them through watches (`foundationdb_watches.rs`).
    changes: store_core::ChangeHub,
    /// How the stores over this handle batch their claims.
    claim_batch_limits: Option<BatchLimits>,
}

/// What one [`FoundationDbEngine::run`] remembers across attempts.
#[derive(Default)]
struct RunState {
    /// Sticky: FoundationDB's loop reports only whether the previous
    /// attempt may have committed, our contract says whether any did.
    maybe_committed: AtomicBool,
    /// The last engine error a body returned, with the FoundationDB error
    /// handed to `on_error`, to report it with its own detail.
    last_failure: Mutex<Option<(EngineError, FdbError)>>,
}

impl RunState {
    async fn attempt<T, F, Fut>(
        &self,
        trx: RetryableTransaction,
        previous: ::foundationdb::MaybeCommitted,
        options: RunOptions,
        body: &F,
    ) -> Result<T, FdbBindingError>
    where
        F: Fn(FoundationDbTx, MaybeCommitted) -> Fut,
        Fut: Future<Output = Result<T, TxError>>,
    {
        if bool::from(previous) {
            self.maybe_committed.store(true, Ordering::Relaxed);
        }
        // A failure of an earlier attempt says nothing about this one's.
        lock(&self.last_failure).take();
        let maybe_committed = if self.maybe_committed.load(Ordering::Relaxed) {
            MaybeCommitted::Maybe
        } else {
            MaybeCommitted::No
        };
        set_transaction_options(&trx, options)?;
        let transaction = FoundationDbTx::new(trx);
        let last_error = Arc::clone(&transaction.last_error);
        match body(transaction, maybe_committed).await {
            Ok(value) => Ok(value),
            // Not an FdbError, so FoundationDB's loop stops without
            // committing; `store_error` unwraps it again.
            Err(TxError::Abort(error)) => Err(FdbBindingError::CustomError(Box::new(error))),
            // An FdbError: FoundationDB's `on_error` decides whether to
            // retry (with its backoff) or to stop.
            Err(TxError::Engine(error)) => {
                let fdb = fdb_error_for(&error, lock(&last_error).take());
                *lock(&self.last_failure) = Some((error, fdb));
                Err(FdbBindingError::from(fdb))
            }
        }
    }

    /// What the store reports when FoundationDB's loop gave up.
    fn store_error(&self, error: FdbBindingError, options: RunOptions) -> StoreError {
        let fdb = match error {
            FdbBindingError::CustomError(custom) => {
                return match custom.downcast::<StoreError>() {
                    Ok(aborted) => *aborted,
                    Err(other) => StoreError::unavailable("FoundationDB run failed", other),
                };
            }
            FdbBindingError::ReferenceToTransactionKept => {
                return StoreError::Refused {
                    detail: "a transaction body kept a clone of its transaction, so it cannot commit".into(),
                    source: None,
                };
            }
            other => match other.get_fdb_error() {
                Some(fdb) => fdb,
                None => return StoreError::unavailable("FoundationDB run failed", other),
            },
        };
        let error = match lock(&self.last_failure).take() {
            Some((engine, handed)) if handed.code() == fdb.code() => engine,
            _ => engine_error(fdb),
        };
        // `on_error` gives a retryable error back only once the retry limit
        // is reached; anything else it gives back is final by nature.
        if fdb.is_retryable() {
            return StoreError::RetriesExhausted {
                attempts: options.retry_limit,
                detail: error.to_string(),
            };
        }
        error.into_store_error()
    }
}

impl Engine for FoundationDbEngine {
    type Tx = FoundationDbTx;

    fn name(&self) -> &'static str {
        "foundationdb"
    }

    fn change_hub(&self) -> &store_core::ChangeHub {
        &self.changes
    }

    fn claim_batch_limits(&self) -> Option<BatchLimits> {
        self.claim_batch_limits
    }

    fn record_watches(&self, layout: &crate::keys::KeyLayout) -> Option<Arc<dyn store_core::ChangeSource>> {
        let watches = crate::foundationdb_watches::RecordWatches::new(Arc::clone(&self.database), layout.clone());
        Some(Arc::new(watches))
    }

    async fn run<T, F, Fut>(&self, options: RunOptions, body: F) -> Result<T, StoreError>
    where
        T: Send,
        F: Fn(Self::Tx, MaybeCommitted) -> Fut + Send + Sync,
        Fut: Future<Output = Result<T, TxError>> + Send,
    {
        FoundationDbNetwork::check_running()?;
        // The embedded engine makes no attempt at all with a limit of 0.
        if options.retry_limit == 0 {
            return Err(StoreError::RetriesExhausted {
                attempts: 0,
                detail: "retry limit is 0".into(),
            });
        }
        let state = RunState::default();
        let (state_ref, body_ref) = (&state, &body);
        let _stop_at_exit = StopAtExitAfterFirstRun;
        let result = self
            .database
            .run(|trx, previous| async move { state_ref.attempt(trx, previous, options, body_ref).await })
            .await;
        result.map_err(|error| state.store_error(error, options))
    }
}

impl FoundationDbEngine {
    /// Opens the database named by a cluster file (`None`: FoundationDB's
    /// default, `$FDB_CLUSTER_FILE` or `/etc/foundationdb/fdb.cluster` on
    /// Linux). This does not contact the cluster; the store's `ping` does.
    /// The network argument is the proof that it was started. Claims are
    /// batched as [`FoundationDbConfig`]'s defaults say, unless
    /// [`with_claim_batch_limits`](Self::with_claim_batch_limits) says
    /// otherwise.
    pub fn open(_network: FoundationDbNetwork, cluster_file: Option<&str>) -> Result<Self, StoreError> {
        FoundationDbNetwork::check_running()?;
        // The crate turns the path into a C string and panics on a NUL byte.
        if cluster_file.is_some_and(|path| path.contains('\0')) {
            return Err(StoreError::Refused {
                detail: "cluster file path contains a NUL byte".into(),
                source: None,
            });
        }
        let database = Database::new(cluster_file).map_err(|error| {
            let file = cluster_file.unwrap_or("(FoundationDB's default)");
            StoreError::unavailable(
                format!("cannot open FoundationDB with cluster file {file}"),
                engine_error(error),
            )
        })?;
        let claim_batch_limits = FoundationDbConfig::default()
            .claim_batch_limits()
            .expect("the default batch settings are valid");
        Ok(Self {
            database: Arc::new(database),
            changes: store_core::ChangeHub::new(),
            claim_batch_limits,
        })
    }

    /// The cluster's status document: FoundationDB's machine-readable
    /// status (what `fdbcli`'s `status json` prints), read from the special
    /// key `\xff\xff/status/json` in a transaction of its own. The bytes are
    /// JSON; interpreting them is the caller's business (the bench's
    /// preload reads the storage servers' queues from it).
    pub async fn status_json(&self) -> Result<Vec<u8>, StoreError> {
        let status = self
            .run(RunOptions::default(), |tx, _maybe_committed: MaybeCommitted| async move {
                tx.get(STATUS_JSON_KEY).await.map_err(TxError::from)
            })
            .await?;
        status.ok_or_else(|| StoreError::Unavailable {
            detail: "the cluster has no status document".into(),
            source: None,
        })
    }

    /// How the stores opened over this handle batch their claims (`None`:
    /// each claim alone); a setting of the handle, set before any store is
    /// opened over it.
    pub fn with_claim_batch_limits(mut self, limits: Option<BatchLimits>) -> Self {
        self.claim_batch_limits = limits;
        self
    }

    /// The bytes every key of a store starts with. A directory path is
    /// created or opened through FoundationDB's directory layer, in one
    /// transaction, and its allocated prefix returned; resolve it once at
    /// start-up and keep the bytes.
    pub async fn resolve_prefix(&self, prefix: &KeyPrefix, options: RunOptions) -> Result<Vec<u8>, StoreError> {
        match prefix {
            KeyPrefix::Bytes(bytes) => check_fixed_prefix(bytes).map(|()| bytes.clone()),
            KeyPrefix::Directory(path) if path.is_empty() => Err(StoreError::Refused {
                detail: "directory path is empty".into(),
                source: None,
            }),
            KeyPrefix::Directory(path) => {
                let path = path.as_slice();
                self.run(options, |tx, _maybe_committed| async move {
                    open_directory(&tx, path).await
                })
                .await
            }
        }
    }
}

fn check_fixed_prefix(prefix: &[u8]) -> Result<(), StoreError> {
    let reserved = [SYSTEM_KEY_PREFIX_BYTE, DIRECTORY_METADATA_PREFIX_BYTE];
    match prefix.first() {
        None => Err(StoreError::Refused {
            detail: "key prefix is empty; the store would share the keyspace's root".into(),
            source: None,
        }),
        Some(first) if reserved.contains(first) => Err(StoreError::Refused {
            detail: format!("key prefix starts with 0x{first:02x}, reserved by FoundationDB"),
            source: None,
        }),
        Some(_) => Ok(()),
    }
}

/// Creates or opens a directory and returns its prefix. Idempotent under
/// retry: a second attempt opens what a committed first attempt created.
async fn open_directory(tx: &FoundationDbTx, path: &[String]) -> Result<Vec<u8>, TxError> {
    let directory = DirectoryLayer::default()
        .create_or_open(&tx.trx, path, None, None)
        .await
        .map_err(|error| directory_error(tx, error))?;
    let prefix = directory.bytes().map_err(|error| directory_error(tx, error))?;
    Ok(prefix.to_vec())
}

fn directory_error(tx: &FoundationDbTx, error: DirectoryError) -> TxError {
    match error {
        DirectoryError::FdbError(fdb) | DirectoryError::HcaError(HcaError::FdbError(fdb)) => {
            TxError::Engine(tx.failed(fdb))
        }
        other => TxError::Abort(StoreError::Refused {
            detail: format!("FoundationDB directory layer: {other:?}"),
            source: None,
        }),
    }
}

// ---- The store ---------------------------------------------------------------------

/// The FDB-style store on a FoundationDB cluster.
pub type FoundationDbStore = FdbStore<FoundationDbEngine>;

impl FoundationDbStore {
    /// Opens the store on a cluster, resolving a directory prefix once.
    pub async fn open_foundationdb(
        network: FoundationDbNetwork,
        config: &FoundationDbConfig,
        policy: Policy,
    ) -> Result<Self, StoreError> {
        let claim_batch_limits = config.claim_batch_limits().map_err(|error| StoreError::Refused {
            detail: format!("foundationdb store: {error}"),
            source: None,
        })?;
        let engine = FoundationDbEngine::open(network, config.cluster_file.as_deref())?
            .with_claim_batch_limits(claim_batch_limits);
        let prefix = engine.resolve_prefix(&config.prefix, config.run_options).await?;
        Ok(FdbStore::new(engine, &prefix, policy).with_run_options(config.run_options))
    }
}
