//! The FDB-style store's own test suite, written once and run on every
//! engine (feature `testkit`): purge in bounded transactions, effects
//! committed with their completion, FoundationDB's limits, conflicts, and a
//! fault audit. store-core's conformance suite checks the store API; this
//! checks what is particular to the store written against FoundationDB's
//! transaction model.
//!
//! One function per behaviour, each taking a [`TestEngine`] (an engine and
//! the key prefix it may use); [`store_tests!`](crate::store_tests) expands
//! them into tests for a factory `async fn() -> TestEngine<E>`.
//! [`ObservedEngine`] wraps any engine to count runs, attempts and
//! attempts after an unknown commit result, and to slow its reads down.
//!
//! Time passes by moving a manual clock: every test's store reads one, so
//! records expire when a behaviour moves it. The engine's own limit (a
//! transaction may live 5 s) runs on that clock too on the embedded engine,
//! and on real time on FoundationDB, where the cluster keeps it: the two
//! behaviours about it ([`TestEngine::engine_time`]) are the suite's only
//! real waits there.

pub mod claim_batch;

pub use self::claim_batch::*;

use crate::engine::{
    Engine, EngineError, KEY_BYTES_MAX, KeyValue, MaybeCommitted, RunOptions, TRANSACTION_BYTES_MAX,
    TRANSACTION_MS_MAX, Transaction, TxError, VALUE_BYTES_MAX,
};
use crate::keys::{EXPIRY_SHARDS, KIND_RECORD};
use crate::store::{FdbStore, PURGE_CURSOR_SKEW_MS_MAX, PURGE_TRANSACTION_MS_MAX};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use store_core::testkit::TestTime;
use store_core::testkit::atomic::EffectHarness;
use store_core::{
    AtomicCompletion, CallerId, ClaimOutcome, ClaimRequest, Clock, Completion, Fingerprint, ForgetOutcome,
    IdempotencyKey, IdempotencyStore, KeyDigest, ManualClock, Policy, RecordState, SavedResponse, StoreError,
    SystemClock,
};

/// Lease of the purge behaviours' policy.
pub const PURGE_LEASE_MS: u64 = 100;
/// Retention of the purge behaviours' policy: short, so records expire in
/// the test's time.
pub const PURGE_RETENTION_MS: u64 = 300;
/// Tombstone window of the purge behaviours' policy.
pub const PURGE_TOMBSTONE_MS: u64 = 400;
/// Intents the fault audit drives by default; raise with IDEM_FAULT_INTENTS.
pub const FAULT_INTENTS_DEFAULT: usize = 300;
/// Tries a client of the fault audit makes per intent before giving up.
pub const FAULT_INTENT_TRIES_MAX: usize = 20;
/// Added to every read of the slow-purge behaviour: with
/// `SLOW_PURGE_RECORDS` records in one shard, one transaction handling them
/// all would live past FoundationDB's 5 s.
pub const SLOW_PURGE_READ_DELAY_MS: u64 = 90;
pub const SLOW_PURGE_RECORDS: usize = 60;

/// An engine for one test, the key prefix the test may write under (fresh
/// per test on a shared cluster, so tests never see each other), and the
/// manual clock its stores read.
pub struct TestEngine<E: Engine> {
    pub engine: E,
    pub prefix: Vec<u8>,
    pub clock: Arc<ManualClock>,
    /// Whether the engine's own time limits run on `clock` too.
    pub engine_time: EngineTime,
}

/// What an engine's own time limits (a transaction's 5 s) run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineTime {
    /// The test's manual clock (the embedded engine reads it).
    Clock,
    /// Real time: the FoundationDB cluster keeps it.
    Wall,
}

impl<E: Engine> TestEngine<E> {
    /// A store reading the test's manual clock.
    pub fn store(self, policy: Policy) -> FdbStore<E> {
        let clock = self.clock.clone();
        FdbStore::new(self.engine, &self.prefix, policy).with_clock(clock)
    }

    /// A store reading the clock the engine's limits run on: the manual
    /// clock, or on FoundationDB the system's, for behaviours about those
    /// limits (a purge that must stop before the cluster's 5 s).
    pub fn store_on_engine_time(self, policy: Policy) -> FdbStore<E> {
        match self.engine_time {
            EngineTime::Clock => self.store(policy),
            EngineTime::Wall => FdbStore::new(self.engine, &self.prefix, policy).with_clock(SystemClock::shared()),
        }
    }

    /// Time as the test's stores see it: the manual clock.
    pub fn time(&self) -> TestTime {
        TestTime::Manual(self.clock.clone())
    }

    /// Time as the engine's own limits see it: the manual clock on the
    /// embedded engine, real time (sleeping) on FoundationDB.
    pub fn engine_time(&self) -> TestTime {
        match self.engine_time {
            EngineTime::Clock => self.time(),
            EngineTime::Wall => TestTime::Wall,
        }
    }

    /// The engine wrapped to count its runs; its read delays pass on the
    /// engine's time.
    pub fn observed(self) -> TestEngine<ObservedEngine<E>> {
        let delays = self.engine_time();
        TestEngine {
            engine: ObservedEngine::new(self.engine, delays),
            prefix: self.prefix,
            clock: self.clock,
            engine_time: self.engine_time,
        }
    }

    /// A raw key under this test's prefix.
    pub fn key(&self, name: &[u8]) -> Vec<u8> {
        [self.prefix.as_slice(), b"/raw/", name].concat()
    }
}

/// The policy of the purge behaviours.
pub fn purge_policy() -> Policy {
    Policy::new(PURGE_LEASE_MS, PURGE_RETENTION_MS, PURGE_TOMBSTONE_MS).expect("purge policy is valid")
}

/// The purge policy with tombstones that outlive the test, for behaviours
/// that count transactions: a tombstone falling due during the purge that
/// wrote it would add entries to handle.
pub fn purge_policy_lasting_tombstones() -> Policy {
    Policy::new(PURGE_LEASE_MS, PURGE_RETENTION_MS, 60_000).expect("purge policy is valid")
}

// ---- An engine that counts and slows down -------------------------------------

/// What an [`ObservedEngine`] counted.
#[derive(Debug, Default)]
pub struct RunCounters {
    /// Calls of `run`.
    pub runs: AtomicU64,
    /// Attempts (bodies started), retries included.
    pub attempts: AtomicU64,
    /// Attempts told that an earlier attempt of their run may have committed.
    pub attempts_after_unknown_result: AtomicU64,
}

/// Any engine, counting what its runs do, optionally delaying every read
/// and optionally failing the commits of transactions that write under a
/// given prefix. Clones share the counters and the switches.
#[derive(Clone)]
pub struct ObservedEngine<E> {
    inner: E,
    counters: Arc<RunCounters>,
    read_delay_ms: Arc<AtomicU64>,
    /// What a read delay passes: a manual clock moved, or a real sleep.
    delays: TestTime,
    fail_commits_writing: Arc<Mutex<Option<Vec<u8>>>>,
    /// Attempts still to fail with an injected conflict.
    conflicts_to_inject: Arc<AtomicU32>,
}

impl<E: Engine> ObservedEngine<E> {
    pub fn new(inner: E, delays: TestTime) -> Self {
        Self {
            inner,
            counters: Arc::default(),
            read_delay_ms: Arc::default(),
            delays,
            fail_commits_writing: Arc::default(),
            conflicts_to_inject: Arc::default(),
        }
    }

    /// The next `attempts` attempts, of whichever runs, fail after their
    /// body ran with a conflict (`not_committed`), committing nothing, as
    /// if another transaction had written what they read; the retry loop
    /// runs them again.
    pub fn inject_conflicts(&self, attempts: u32) {
        self.conflicts_to_inject.store(attempts, Ordering::SeqCst);
    }

    /// While `prefix` is set, every transaction that writes a key under it
    /// fails after its body ran, just before its commit, and commits
    /// nothing: a crash or an error between its last write and its commit.
    /// Transactions that write elsewhere commit as usual.
    pub fn fail_commits_writing(&self, prefix: Option<Vec<u8>>) {
        *self
            .fail_commits_writing
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = prefix;
    }

    pub fn counters(&self) -> &RunCounters {
        &self.counters
    }

    /// Delays every later read (point or range) by `delay_ms`.
    pub fn delay_reads(&self, delay_ms: u64) {
        self.read_delay_ms.store(delay_ms, Ordering::Relaxed);
    }
}

/// A transaction of an [`ObservedEngine`].
#[derive(Clone)]
pub struct ObservedTx<T> {
    inner: T,
    read_delay_ms: u64,
    delays: TestTime,
    watch: Option<Arc<WriteWatch>>,
}

/// Whether one attempt wrote a key under the prefix whose commits fail.
struct WriteWatch {
    prefix: Vec<u8>,
    hit: AtomicBool,
}

impl<T: Transaction> ObservedTx<T> {
    async fn delay(&self) {
        if self.read_delay_ms > 0 {
            self.delays.pass(self.read_delay_ms).await;
        }
    }
}

impl<T: Transaction> Transaction for ObservedTx<T> {
    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        self.delay().await;
        self.inner.get(key).await
    }

    async fn get_range(&self, begin: &[u8], end: &[u8], limit: usize) -> Result<Vec<KeyValue>, EngineError> {
        self.delay().await;
        self.inner.get_range(begin, end, limit).await
    }

    fn set(&self, key: &[u8], value: &[u8]) -> Result<(), EngineError> {
        if let Some(watch) = &self.watch
            && key.starts_with(&watch.prefix)
        {
            watch.hit.store(true, Ordering::SeqCst);
        }
        self.inner.set(key, value)
    }

    fn clear(&self, key: &[u8]) -> Result<(), EngineError> {
        self.inner.clear(key)
    }

    async fn clear_range(&self, begin: &[u8], end: &[u8]) -> Result<(), EngineError> {
        self.inner.clear_range(begin, end).await
    }
}

impl<E: Engine> Engine for ObservedEngine<E> {
    type Tx = ObservedTx<E::Tx>;

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn change_hub(&self) -> &store_core::ChangeHub {
        self.inner.change_hub()
    }

    fn claim_batch_limits(&self) -> Option<store_core::BatchLimits> {
        self.inner.claim_batch_limits()
    }

    fn record_watches(&self, layout: &crate::keys::KeyLayout) -> Option<std::sync::Arc<dyn store_core::ChangeSource>> {
        self.inner.record_watches(layout)
    }

    async fn run<T, F, Fut>(&self, options: RunOptions, body: F) -> Result<T, StoreError>
    where
        T: Send,
        F: Fn(Self::Tx, MaybeCommitted) -> Fut + Send + Sync,
        Fut: Future<Output = Result<T, TxError>> + Send,
    {
        self.counters.runs.fetch_add(1, Ordering::Relaxed);
        let (counters, body) = (&self.counters, &body);
        let read_delay_ms = self.read_delay_ms.load(Ordering::Relaxed);
        let delays = &self.delays;
        let fail_prefix = self
            .fail_commits_writing
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        let fail_prefix = &fail_prefix;
        let conflicts_to_inject = &self.conflicts_to_inject;
        self.inner
            .run(options, move |tx, maybe_committed| {
                counters.attempts.fetch_add(1, Ordering::Relaxed);
                if maybe_committed == MaybeCommitted::Maybe {
                    counters.attempts_after_unknown_result.fetch_add(1, Ordering::Relaxed);
                }
                let watch = fail_prefix.as_ref().map(|prefix| {
                    Arc::new(WriteWatch {
                        prefix: prefix.clone(),
                        hit: AtomicBool::new(false),
                    })
                });
                let body = body(
                    ObservedTx {
                        inner: tx,
                        read_delay_ms,
                        delays: delays.clone(),
                        watch: watch.clone(),
                    },
                    maybe_committed,
                );
                async move {
                    let output = body.await?;
                    let take_one = |left: u32| left.checked_sub(1);
                    if conflicts_to_inject
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, take_one)
                        .is_ok()
                    {
                        return Err(TxError::Engine(EngineError::new(
                            crate::engine::EngineErrorKind::NotCommitted,
                            "injected conflict",
                        )));
                    }
                    if watch.is_some_and(|watch| watch.hit.load(Ordering::SeqCst)) {
                        return Err(TxError::Abort(StoreError::Unavailable {
                            detail: "injected: the commit failed after the transaction's body ran".to_owned(),
                            source: None,
                        }));
                    }
                    Ok(output)
                }
            })
            .await
    }
}

// ---- Helpers ------------------------------------------------------------------

fn caller(name: &str) -> CallerId {
    CallerId::new(format!("{name}-{:08x}", rand::random::<u32>())).expect("test caller id is valid")
}

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::new(text).expect("test key is valid")
}

async fn acquire<E: Engine>(store: &FdbStore<E>, request: &ClaimRequest) -> store_core::Acquired {
    match store.claim(request).await.expect("claim") {
        ClaimOutcome::Acquired(acquired) => acquired,
        other => panic!("expected acquired, got {other:?}"),
    }
}

/// Claims and completes `key` with `response`.
async fn completed<E: Engine>(store: &FdbStore<E>, caller: &CallerId, key: &IdempotencyKey, response: SavedResponse) {
    let request = ClaimRequest::new(caller.clone(), key.clone(), Fingerprint([3; 32]));
    let acquired = acquire(store, &request).await;
    let fenced = store.complete(&acquired.lease, response).await.expect("complete");
    assert!(fenced.is_applied(), "completion of {key:?} did not apply");
}

fn done() -> SavedResponse {
    SavedResponse::new(200, vec![], b"done".to_vec()).expect("small response")
}

/// `count` keys named `{stem}{i}` whose records share one expiry shard.
fn keys_in_one_shard<E: Engine>(
    store: &FdbStore<E>,
    caller: &CallerId,
    stem: &str,
    count: usize,
) -> Vec<IdempotencyKey> {
    let shard_of = |key: &IdempotencyKey| store.layout().slot(caller, key.digest()).shard;
    let wanted = shard_of(&key(&format!("{stem}0")));
    (0..)
        .map(|i| key(&format!("{stem}{i}")))
        .filter(|key| shard_of(key) == wanted)
        .take(count)
        .collect()
}

/// Bytes no version of the record codec reads (format version 255).
pub const UNREADABLE_RECORD_BYTES: &[u8] = b"\xffnot a record";

/// Overwrites the first chunk of the record of (`caller`, `digest`) with
/// [`UNREADABLE_RECORD_BYTES`], as a torn write, a bad disk or a foreign
/// writer would: the record then decodes no more, while its index entry
/// and tombstone stay as they were.
pub async fn overwrite_with_unreadable_bytes<E: Engine>(store: &FdbStore<E>, caller: &CallerId, digest: KeyDigest) {
    let slot = store.layout().slot(caller, digest);
    let chunk = &store.layout().record_chunk_key(&slot, 0);
    store
        .engine()
        .run(RunOptions::default(), |tx, _| async move {
            tx.set(chunk, UNREADABLE_RECORD_BYTES)?;
            Ok(())
        })
        .await
        .expect("write the unreadable record");
}

// ---- Purge --------------------------------------------------------------------

pub async fn purge_works_in_bounded_batches_and_tombstones_expire_in_turn<E: Engine>(test: TestEngine<E>) {
    let time = test.time();
    let store = test.store(purge_policy());
    let caller = caller("purge");
    for i in 0..10 {
        completed(&store, &caller, &key(&format!("k{i}")), done()).await;
    }
    time.pass(PURGE_RETENTION_MS + 50).await;

    let first = store.purge_expired(4).await.unwrap();
    assert_eq!((first.records_purged, first.more), (4, true));
    let rest = store.purge_expired(100).await.unwrap();
    assert_eq!((rest.records_purged, rest.more), (6, false));
    assert_eq!(
        store.purge_expired(100).await.unwrap().records_purged,
        0,
        "nothing left to purge"
    );

    // Inside the tombstone window a repeat is reported late. Abandoned, it
    // leaves the tombstone in place.
    let late = ClaimRequest::new(caller.clone(), key("k0"), Fingerprint([3; 32]));
    let acquired = acquire(&store, &late).await;
    assert!(acquired.late_key);
    assert!(store.abandon(&acquired.lease).await.unwrap().is_applied());

    // After the window the tombstones are swept and a new key is just new.
    time.pass(PURGE_TOMBSTONE_MS + 50).await;
    let swept = store.purge_expired(100).await.unwrap();
    assert_eq!((swept.records_purged, swept.tombstones_purged), (0, 10));
    let again = ClaimRequest::new(caller.clone(), key("k1"), Fingerprint([3; 32]));
    assert!(!acquire(&store, &again).await.late_key);
}

/// A purge that drained a shard lets the next one start that shard's scan
/// a skew margin before the time it drained, not at the shard's first key
/// (every purge drains every shard here, so the keys' shards do not matter):
/// nothing due since is missed, an index entry planted far before the
/// margin is not even read, and a restarted store (no cursor yet) finds it.
pub async fn a_purge_resumes_each_shard_where_the_last_drained_scan_ended<E: Engine>(test: TestEngine<E>) {
    let time = test.time();
    let (engine, prefix, clock) = (test.engine.clone(), test.prefix.clone(), test.clock.clone());
    let store = test.store(purge_policy_lasting_tombstones());
    let caller = caller("resume");
    let first: Vec<IdempotencyKey> = (0..3).map(|i| key(&format!("first{i}"))).collect();
    for key in &first {
        completed(&store, &caller, key, done()).await;
    }
    time.pass(PURGE_RETENTION_MS + 50).await;
    assert_eq!(store.purge_expired(100).await.unwrap().records_purged, 3);

    // An entry due long before the drained scan, written behind the
    // store's back: the cursor is past it.
    time.pass(PURGE_CURSOR_SKEW_MS_MAX * 2).await;
    let planted_slot = store.layout().slot(&caller, key("planted").digest());
    let planted = store.layout().expiry_key(
        &planted_slot,
        clock.now_ms() - PURGE_CURSOR_SKEW_MS_MAX * 4,
        KIND_RECORD,
    );
    let planted = &planted;
    let planted_end = [planted.as_slice(), &[0]].concat();
    store
        .engine()
        .run(RunOptions::default(), |tx, _| async move { Ok(tx.set(planted, &[])?) })
        .await
        .unwrap();
    let second: Vec<IdempotencyKey> = (0..3).map(|i| key(&format!("second{i}"))).collect();
    for key in &second {
        completed(&store, &caller, key, done()).await;
    }
    time.pass(PURGE_RETENTION_MS + 50).await;
    assert_eq!(store.purge_expired(100).await.unwrap().records_purged, 3);
    for key in first.iter().chain(&second) {
        assert_eq!(store.inspect(&caller, key).await.unwrap(), None);
    }
    assert_eq!(
        keys_in_range(&store, planted, &planted_end).await,
        1,
        "the scan started after the planted entry"
    );

    let restarted = FdbStore::new(engine, &prefix, purge_policy_lasting_tombstones()).with_clock(clock);
    restarted.purge_expired(100).await.unwrap();
    assert_eq!(
        keys_in_range(&restarted, planted, &planted_end).await,
        0,
        "a new store scans from the shard's start"
    );
}

pub async fn a_record_whose_retention_was_extended_is_not_purged_by_its_old_index_entry<E: Engine>(
    test: TestEngine<E>,
) {
    let time = test.time();
    let store = test.store(purge_policy());
    let caller = caller("purge");
    let request = ClaimRequest::new(caller.clone(), key("slow"), Fingerprint([4; 32]));
    let acquired = acquire(&store, &request).await;
    // Complete just before the claim's expiry: retention restarts from now.
    time.pass(PURGE_RETENTION_MS - 100).await;
    let response = SavedResponse::new(200, vec![], b"late".to_vec()).unwrap();
    let fenced = store.complete(&acquired.lease, response.clone()).await.unwrap();
    assert!(fenced.is_applied());
    time.pass(150).await;
    assert_eq!(store.purge_expired(100).await.unwrap().records_purged, 0);
    assert_eq!(store.claim(&request).await.unwrap(), ClaimOutcome::Replay(response));
}

/// One unreadable record must not stop the sweeper for good: the purge
/// sets it aside (reported once), purges the others, and later runs do not
/// meet it again; its key answers `Corrupt` (HTTP: 500 `record_unreadable`).
pub async fn an_unreadable_record_is_quarantined_and_the_purge_goes_on<E: Engine>(test: TestEngine<E>) {
    let time = test.time();
    let store = test.store(purge_policy());
    let caller = caller("purge");
    for i in 0..5 {
        completed(&store, &caller, &key(&format!("q{i}")), done()).await;
    }
    overwrite_with_unreadable_bytes(&store, &caller, key("q2").digest()).await;
    time.pass(PURGE_RETENTION_MS + 50).await;

    let first = store
        .purge_expired(100)
        .await
        .expect("the purge goes on past an unreadable record");
    assert_eq!(
        (first.records_purged, first.records_quarantined, first.more),
        (4, 1, false)
    );
    let second = store.purge_expired(100).await.expect("a second purge");
    assert_eq!(
        (second.records_purged, second.records_quarantined),
        (0, 0),
        "the quarantined record is reported once, not met again"
    );
    let request = ClaimRequest::new(caller.clone(), key("q2"), Fingerprint([3; 32]));
    assert!(matches!(store.claim(&request).await, Err(StoreError::Corrupt(_))));
    // The others are gone, and their keys are late, not unreadable.
    let other = ClaimRequest::new(caller.clone(), key("q1"), Fingerprint([3; 32]));
    assert!(acquire(&store, &other).await.late_key);
}

/// The operator's way out of a quarantine: the sweeper sets an unreadable
/// record aside, forget deletes it (and only it), and its key may be
/// claimed again. A record of more chunks than any record has is unreadable
/// as a whole and is deleted whole; its expiry index entry, which forget
/// cannot find, is cleared by a later purge without harm.
pub async fn forget_deletes_a_quarantined_record_and_only_an_unreadable_one<E: Engine>(test: TestEngine<E>) {
    let time = test.time();
    let store = test.store(purge_policy_lasting_tombstones());
    let caller = caller("forget");
    for name in ["bad", "good"] {
        completed(&store, &caller, &key(name), done()).await;
    }
    overwrite_with_unreadable_bytes(&store, &caller, key("bad").digest()).await;
    time.pass(PURGE_RETENTION_MS + 50).await;
    let purged = store.purge_expired(100).await.expect("purge");
    assert_eq!((purged.records_purged, purged.records_quarantined), (1, 1));
    // The purged key's record is gone: nothing to forget.
    let good = store.forget_unreadable_record(&caller, key("good").digest()).await;
    assert_eq!(good.unwrap(), ForgetOutcome::NotFound);
    store_core::testkit::forget_deletes_an_unreadable_record_and_frees_its_key(&store, &caller, "bad", "a").await;

    // A live record grown to seventeen chunks, before any purge saw it.
    completed(&store, &caller, &key("chunky"), done()).await;
    let slot = store.layout().slot(&caller, key("chunky").digest());
    let chunks: Vec<Vec<u8>> = (0..=crate::keys::RECORD_CHUNKS_MAX)
        .map(|index| store.layout().record_chunk_key(&slot, index))
        .collect();
    let chunks = &chunks;
    store
        .engine()
        .run(RunOptions::default(), |tx, _| async move {
            for chunk in chunks {
                tx.set(chunk, b"x")?;
            }
            Ok(())
        })
        .await
        .expect("write too many chunks");
    store_core::testkit::forget_deletes_an_unreadable_record_and_frees_its_key(&store, &caller, "chunky", "a").await;
    assert_eq!(
        stored_chunks(&store, &caller, key("chunky").digest()).await,
        1,
        "only the new record's one chunk is left"
    );

    // The new records of both keys expire and are purged; the old index
    // entry of "chunky" finds a record with another expiry and is dropped.
    time.pass(PURGE_RETENTION_MS + 50).await;
    let later = store.purge_expired(100).await.expect("purge after forget");
    assert_eq!((later.records_purged, later.records_quarantined), (2, 0));
    assert_eq!(store.inspect(&caller, &key("chunky")).await.unwrap(), None);
}

/// A rolling upgrade that changes the record format: a record written by
/// the newer build (here, a readable record under the next version byte)
/// is not corruption, and forget keeps it however often it is asked; the
/// readable record next to it is kept too, and a record no build wrote is
/// still deleted.
pub async fn forget_keeps_a_record_in_a_newer_format<E: Engine>(test: TestEngine<E>) {
    let store = test.store(purge_policy_lasting_tombstones());
    let caller = caller("forget-newer");
    for name in ["next", "current", "garbage"] {
        completed(&store, &caller, &key(name), done()).await;
    }
    let slot = store.layout().slot(&caller, key("next").digest());
    let chunk = &store.layout().record_chunk_key(&slot, 0);
    store
        .engine()
        .run(RunOptions::default(), |tx, _| async move {
            let mut bytes = tx.get(chunk).await?.expect("the record's first chunk");
            assert_eq!(bytes[0], store_core::codec::RECORD_FORMAT_VERSION);
            bytes[0] = store_core::codec::RECORD_FORMAT_VERSION + 1;
            tx.set(chunk, &bytes)?;
            Ok(())
        })
        .await
        .expect("write the record in the next format");
    for _ in 0..2 {
        let newer = store.forget_unreadable_record(&caller, key("next").digest()).await;
        assert_eq!(newer.expect("forget"), ForgetOutcome::NewerFormat);
    }
    let claimed = store
        .claim(&ClaimRequest::new(caller.clone(), key("next"), Fingerprint([3; 32])))
        .await;
    assert!(
        matches!(&claimed, Err(StoreError::Corrupt(codec)) if codec.is_newer_format()),
        "this build cannot serve it, and says why: {claimed:?}"
    );
    let current = store.forget_unreadable_record(&caller, key("current").digest()).await;
    assert_eq!(current.expect("forget"), ForgetOutcome::Readable);
    overwrite_with_unreadable_bytes(&store, &caller, key("garbage").digest()).await;
    let garbage = store.forget_unreadable_record(&caller, key("garbage").digest()).await;
    assert_eq!(garbage.expect("forget"), ForgetOutcome::Deleted);
}

/// Four records of 600 KB in one shard: a purge transaction stops reading
/// once it has read 1 MB, so that shard takes two transactions.
pub async fn large_records_are_purged_across_several_byte_bounded_transactions<E: Engine>(test: TestEngine<E>) {
    let time = test.time();
    let store = test.observed().store(purge_policy_lasting_tombstones());
    let caller = caller("purge-large");
    let keys = keys_in_one_shard(&store, &caller, "big", 4);
    let body = vec![7; 600_000];
    for key in &keys {
        completed(
            &store,
            &caller,
            key,
            SavedResponse::new(200, vec![], body.clone()).unwrap(),
        )
        .await;
    }
    time.pass(PURGE_RETENTION_MS + 50).await;
    let runs_before = store.engine().counters().runs.load(Ordering::Relaxed);
    let report = store.purge_expired(100).await.unwrap();
    let runs = store.engine().counters().runs.load(Ordering::Relaxed) - runs_before;
    assert_eq!((report.records_purged, report.more), (4, false));
    assert_eq!(
        runs,
        u64::from(EXPIRY_SHARDS) + 1,
        "one transaction per shard, and one more for the shard of the large records"
    );
    for key in &keys {
        assert_eq!(store.inspect(&caller, key).await.unwrap(), None);
        // Every chunk, not only the first that says whether a record exists.
        assert_eq!(stored_chunks(&store, &caller, key.digest()).await, 0);
    }
}

/// How many chunks are stored under the record of (`caller`, `digest`).
async fn stored_chunks<E: Engine>(store: &FdbStore<E>, caller: &CallerId, digest: KeyDigest) -> usize {
    let (begin, end) = store.layout().slot(caller, digest).record.range();
    keys_in_range(store, &begin, &end).await
}

/// How many keys `[begin, end)` holds (at most 100).
async fn keys_in_range<E: Engine>(store: &FdbStore<E>, begin: &[u8], end: &[u8]) -> usize {
    store
        .engine()
        .run(RunOptions::default(), |tx, _| async move {
            Ok(tx.get_range(begin, end, 100).await?.len())
        })
        .await
        .unwrap()
}

/// Reads slowed down so that one transaction over all the shard's records
/// would pass FoundationDB's 5 s: the purge splits the batch by age and
/// succeeds, instead of failing `transaction_too_old` on every retry.
pub async fn a_slow_purge_is_split_before_five_seconds<E: Engine>(test: TestEngine<E>) {
    let records_ms = SLOW_PURGE_READ_DELAY_MS * SLOW_PURGE_RECORDS as u64;
    assert!(
        records_ms > TRANSACTION_MS_MAX,
        "the behaviour needs a batch that would pass 5 s"
    );
    // On FoundationDB the cluster's 5 s is real: the store then times its
    // purge by the system's clock, and the reads really wait.
    let time = test.engine_time();
    let store = test.observed().store_on_engine_time(purge_policy_lasting_tombstones());
    let caller = caller("purge-slow");
    for key in keys_in_one_shard(&store, &caller, "slow", SLOW_PURGE_RECORDS) {
        completed(&store, &caller, &key, done()).await;
    }
    time.pass(PURGE_RETENTION_MS + 50).await;
    store.engine().delay_reads(SLOW_PURGE_READ_DELAY_MS);
    let runs_before = store.engine().counters().runs.load(Ordering::Relaxed);
    let report = store
        .purge_expired(100)
        .await
        .expect("a slow purge is split, not failed");
    let runs = store.engine().counters().runs.load(Ordering::Relaxed) - runs_before;
    assert_eq!((report.records_purged, report.more), (SLOW_PURGE_RECORDS as u64, false));
    let batches_min = records_ms.div_ceil(PURGE_TRANSACTION_MS_MAX);
    assert!(
        runs >= u64::from(EXPIRY_SHARDS) - 1 + batches_min,
        "{runs} transactions: the slow shard took fewer than {batches_min}"
    );
}

// ---- Effects committed with their completion ----------------------------------

/// The effect of the audits: increments a counter in the completing
/// transaction. A duplicated effect shows as a count above one.
async fn count_effect<T: Transaction>(tx: T, counter_key: &[u8]) -> Result<(SavedResponse, ()), TxError> {
    let current = read_count(&tx, counter_key).await?;
    tx.set(counter_key, &(current + 1).to_be_bytes())?;
    Ok((counted(counter_key), ()))
}

/// The response [`count_effect`] saves.
fn counted(counter_key: &[u8]) -> SavedResponse {
    SavedResponse::new(201, vec![], counter_key.to_vec()).expect("small response")
}

async fn read_count<T: Transaction>(tx: &T, counter_key: &[u8]) -> Result<u64, TxError> {
    let Some(bytes) = tx.get(counter_key).await? else {
        return Ok(0);
    };
    let bytes: [u8; 8] = bytes.as_slice().try_into().expect("a counter is 8 bytes");
    Ok(u64::from_be_bytes(bytes))
}

fn counter_key<E: Engine>(store: &FdbStore<E>, intent: usize) -> Vec<u8> {
    store.layout().effects().pack(&("count", intent as u64))
}

async fn effect_count<E: Engine>(store: &FdbStore<E>, intent: usize) -> u64 {
    let key = &counter_key(store, intent);
    let read = || {
        store
            .engine()
            .run(RunOptions::default(), |tx, _| async move { read_count(&tx, key).await })
    };
    retrying("read counter", read).await
}

/// A read of the audit, made again on retryable errors as a client would:
/// injected faults hit the audit's own reads too.
async fn retrying<T, Fut>(what: &str, read: impl Fn() -> Fut) -> T
where
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match read().await {
            Ok(value) => return value,
            Err(error) if error.is_retryable() && tries < FAULT_INTENT_TRIES_MAX => continue,
            Err(error) => panic!("{what}: {error}"),
        }
    }
}

pub async fn complete_with_runs_the_effect_once_and_never_for_a_lost_lease<E: Engine>(test: TestEngine<E>) {
    let store = test.store(store_core::testkit::policy());
    let caller = caller("effects");
    let attempt = || ClaimRequest::new(caller.clone(), key("k"), Fingerprint([6; 32]));
    let first = acquire(&store, &attempt()).await;
    assert!(store.release(&first.lease).await.unwrap().is_applied());
    let second = acquire(&store, &attempt()).await;
    assert!(second.takeover && second.lease.token != first.lease.token);
    let (lost_key, held_key) = (counter_key(&store, 1), counter_key(&store, 2));
    let ran = AtomicU32::new(0);
    let lost = store
        .complete_with(&first.lease, |tx| {
            ran.fetch_add(1, Ordering::SeqCst);
            Box::pin(count_effect(tx.into_context(), &lost_key))
        })
        .await
        .unwrap();
    assert_eq!(lost, Completion::LeaseLost);
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "the effect ran for a lease that was lost"
    );
    assert_eq!(effect_count(&store, 1).await, 0, "a lost lease wrote its effect");
    let committed = store
        .complete_with(&second.lease, |tx| Box::pin(count_effect(tx.into_context(), &held_key)))
        .await
        .unwrap();
    assert_eq!(
        committed,
        Completion::Committed {
            response: counted(&held_key),
            value: ()
        }
    );
    // A retry of a call that committed returns the saved response without
    // running the effect again.
    let again = store
        .complete_with(&second.lease, |tx| Box::pin(count_effect(tx.into_context(), &held_key)))
        .await
        .unwrap();
    assert_eq!(
        again,
        Completion::AlreadyCompleted {
            response: counted(&held_key)
        }
    );
    assert_eq!(effect_count(&store, 2).await, 1, "effects of the held lease");
    let record = store.inspect(&caller, &key("k")).await.unwrap().expect("record");
    assert!(
        matches!(record.state, RecordState::Completed { completed_by, .. } if completed_by == second.lease.token),
        "the record is completed by the lease that held it: {record:?}"
    );
}

/// Claims and completes one intent with [`count_effect`], retrying the
/// whole call on retryable errors as a client would.
async fn run_intent<E: Engine>(store: &FdbStore<E>, caller: &CallerId, intent: usize) {
    let request = ClaimRequest::new(caller.clone(), key(&format!("intent-{intent}")), Fingerprint([8; 32]));
    let counter_key = &counter_key(store, intent);
    for _ in 0..FAULT_INTENT_TRIES_MAX {
        let lease = match store.claim(&request).await {
            Ok(ClaimOutcome::Acquired(acquired)) => acquired.lease,
            Ok(ClaimOutcome::Replay(_)) => return,
            Ok(other) => panic!("intent {intent}: unexpected {other:?}"),
            Err(error) if error.is_retryable() => continue,
            Err(error) => panic!("intent {intent}: {error}"),
        };
        match store
            .complete_with(&lease, |tx| Box::pin(count_effect(tx.into_context(), counter_key)))
            .await
        {
            Ok(Completion::Committed { .. } | Completion::AlreadyCompleted { .. }) => return,
            Ok(Completion::LeaseLost) => panic!("intent {intent}: lease lost without a competitor"),
            Err(error) if error.is_retryable() => continue,
            Err(error) => panic!("intent {intent}: {error}"),
        }
    }
    panic!("intent {intent} did not complete in {FAULT_INTENT_TRIES_MAX} tries");
}

/// Intents the fault audits drive: `IDEM_FAULT_INTENTS` or the default.
pub fn fault_intents() -> usize {
    std::env::var("IDEM_FAULT_INTENTS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(FAULT_INTENTS_DEFAULT)
}

/// Drives `count` intents concurrently through `store` (whatever faults its
/// engine injects), then checks that every intent's effect ran exactly once
/// and every record is completed: no duplicated effect, no lost completion.
pub async fn audit_intents<E: Engine>(store: Arc<FdbStore<E>>, count: usize) {
    let caller = caller("faults");
    let tasks: Vec<_> = (0..count)
        .map(|intent| {
            let (store, caller) = (store.clone(), caller.clone());
            tokio::spawn(async move { run_intent(&store, &caller, intent).await })
        })
        .collect();
    for task in tasks {
        task.await.expect("intent task");
    }
    let mut effects_per_intent: HashMap<u64, usize> = HashMap::new();
    for intent in 0..count {
        *effects_per_intent
            .entry(effect_count(&store, intent).await)
            .or_default() += 1;
        let intent_key = key(&format!("intent-{intent}"));
        let record = retrying("inspect", || store.inspect(&caller, &intent_key))
            .await
            .expect("record");
        assert!(
            matches!(record.state, RecordState::Completed { .. }),
            "intent {intent} not completed"
        );
    }
    assert_eq!(
        effects_per_intent,
        HashMap::from([(1, count)]),
        "effects per intent (count -> intents)"
    );
}

// ---- store-core's atomic completion behaviours -------------------------------

/// store-core's [`EffectHarness`] on the FDB-style store: marker rows under
/// the effects subspace, and completions failed by the [`ObservedEngine`]:
/// while armed, a transaction that writes a record fails before its commit.
pub struct FdbEffects<E: Engine> {
    store: FdbStore<ObservedEngine<E>>,
    time: TestTime,
}

impl<E: Engine> FdbEffects<E> {
    pub fn new(test: TestEngine<E>, policy: Policy) -> Self {
        Self {
            time: test.time(),
            store: test.observed().store(policy),
        }
    }

    fn marker_key(&self, name: &str) -> Vec<u8> {
        self.store.layout().effects().pack(&("marker", name))
    }
}

impl<E: Engine> EffectHarness for FdbEffects<E> {
    type Store = FdbStore<ObservedEngine<E>>;

    fn store(&self) -> &Self::Store {
        &self.store
    }

    fn time(&self) -> TestTime {
        self.time.clone()
    }

    fn write_marker<'c>(
        &'c self,
        context: &'c ObservedTx<E::Tx>,
        name: &'c str,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<(), TxError>> + Send + 'c>> {
        Box::pin(async move { Ok(context.set(&self.marker_key(name), b"")?) })
    }

    async fn marker_exists(&self, name: &str) -> bool {
        let key = &self.marker_key(name);
        let read = || {
            self.store
                .engine()
                .run(RunOptions::default(), |tx, _| async move { Ok(tx.get(key).await?) })
        };
        retrying("read marker", read).await.is_some()
    }

    fn effect_failure(&self, detail: &str) -> TxError {
        TxError::Abort(StoreError::Refused {
            detail: detail.to_owned(),
            source: None,
        })
    }

    async fn fail_completions(&self, fail: bool) {
        let records = fail.then(|| self.store.layout().records().bytes().to_vec());
        self.store.engine().fail_commits_writing(records);
    }
}

/// An [`FdbEffects`] on a fresh embedded engine.
pub async fn embedded_effects(policy: Policy) -> FdbEffects<crate::EmbeddedEngine> {
    FdbEffects::new(embedded().await, policy)
}

// ---- FoundationDB's limits and conflicts --------------------------------------

async fn run_error<E: Engine, T: Send>(engine: &E, body: impl Fn(E::Tx) -> Result<T, TxError> + Send + Sync) -> String {
    let body = &body;
    match engine.run(RunOptions::default(), |tx, _| async move { body(tx) }).await {
        Ok(_) => "committed".to_owned(),
        Err(error) => error.to_string(),
    }
}

pub async fn foundationdb_limits_are_enforced_with_its_error_kinds<E: Engine>(test: TestEngine<E>) {
    let key_of_length = |length: usize| {
        let mut key = test.key(b"long-");
        key.resize(length, b'k');
        key
    };
    let (long_key, limit_key, small_key) = (
        key_of_length(KEY_BYTES_MAX + 1),
        key_of_length(KEY_BYTES_MAX),
        test.key(b"v"),
    );
    let engine = &test.engine;
    let big_value = vec![0; VALUE_BYTES_MAX + 1];
    let too_long = run_error(engine, |tx| Ok(tx.set(&long_key, b"v")?)).await;
    assert!(too_long.contains("KeyTooLarge (2102)"), "{too_long}");
    let too_big = run_error(engine, |tx| Ok(tx.set(&small_key, &big_value)?)).await;
    assert!(too_big.contains("ValueTooLarge (2103)"), "{too_big}");
    let chunk = vec![0; VALUE_BYTES_MAX];
    let too_much = run_error(engine, |tx| {
        for i in 0..=(TRANSACTION_BYTES_MAX / VALUE_BYTES_MAX) {
            tx.set(&test.key(format!("k{i}").as_bytes()), &chunk)?;
        }
        Ok(())
    })
    .await;
    assert!(too_much.contains("TransactionTooLarge (2101)"), "{too_much}");
    // At the limits exactly, everything commits.
    assert_eq!(
        run_error(engine, |tx| Ok(tx.set(&limit_key, &chunk)?)).await,
        "committed"
    );
}

pub async fn a_transaction_older_than_five_seconds_is_too_old<E: Engine>(test: TestEngine<E>) {
    let key = &test.key(b"old");
    let time = &test.engine_time();
    let options = RunOptions {
        retry_limit: 1,
        timeout_ms: 10_000,
    };
    let result = test
        .engine
        .run(options, |tx, _| async move {
            tx.get(key).await?;
            time.pass(TRANSACTION_MS_MAX + 100).await;
            tx.set(key, b"v")?;
            Ok(())
        })
        .await;
    let error = result.expect_err("a 5.1 s transaction must fail");
    assert!(error.to_string().contains("TransactionTooOld (1007)"), "{error}");
}

pub async fn two_transactions_that_read_the_same_absent_key_and_insert_conflict<E: Engine>(test: TestEngine<E>) {
    let slot = &test.key(b"slot");
    let barrier = &tokio::sync::Barrier::new(2);
    let attempts = &AtomicU32::new(0);
    let options = RunOptions {
        retry_limit: 2,
        timeout_ms: 5_000,
    };
    let insert_if_absent = |value: &'static [u8]| {
        test.engine.run(options, move |tx, _| async move {
            let first_attempt = attempts.fetch_add(1, Ordering::SeqCst) < 2;
            let existing = tx.get(slot).await?;
            if first_attempt {
                // Both first attempts read before either commits.
                barrier.wait().await;
            }
            if existing.is_none() {
                tx.set(slot, value)?;
            }
            Ok(existing.is_none())
        })
    };
    let (a, b) = tokio::join!(insert_if_absent(b"a"), insert_if_absent(b"b"));
    let inserted = [a.unwrap(), b.unwrap()];
    assert_eq!(
        inserted.iter().filter(|&&won| won).count(),
        1,
        "exactly one insert wins: {inserted:?}"
    );
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        3,
        "the loser retried once and found the key"
    );
}

/// Bulk-loaded records read back and replay (store-core's behaviour), and
/// their expiry index entries are written too: once the clock passes their
/// expiry, the purge deletes every one of them.
pub async fn bulk_loaded_records_read_back_replay_and_are_purged_when_due<E: Engine>(test: TestEngine<E>) {
    use store_core::Clock as _;
    use store_core::testkit::bulk::{BULK_TEST_RECORDS, BULK_TEST_REMAINING_MS};
    let clock = test.clock.clone();
    let store = test.store(purge_policy_lasting_tombstones());
    store_core::testkit::bulk::bulk_loaded_records_read_back_and_replay(&store, clock.now_ms()).await;
    let report = store.purge_expired(store_core::PURGE_BATCH_MAX).await.expect("purge");
    assert_eq!(report.records_purged, 0, "nothing is due yet");
    clock.advance_ms(BULK_TEST_REMAINING_MS + BULK_TEST_RECORDS as u64);
    let report = store.purge_expired(store_core::PURGE_BATCH_MAX).await.expect("purge");
    assert_eq!(report.records_purged, BULK_TEST_RECORDS as u64);
}

/// A bulk-load batch over the limit is refused whole (store-core's behaviour).
pub async fn a_bulk_batch_over_the_limit_writes_nothing<E: Engine>(test: TestEngine<E>) {
    use store_core::Clock as _;
    let clock = test.clock.clone();
    let store = test.store(purge_policy_lasting_tombstones());
    store_core::testkit::bulk::a_bulk_batch_over_the_limit_writes_nothing(&store, clock.now_ms()).await;
}

/// Expands to one `#[tokio::test]` per behaviour of this suite. `$open` is
/// an async fn returning a [`TestEngine`].
#[macro_export]
macro_rules! store_tests {
    ($open:path) => {
        $crate::store_tests!(@each $open;
            purge_works_in_bounded_batches_and_tombstones_expire_in_turn,
            a_record_whose_retention_was_extended_is_not_purged_by_its_old_index_entry,
            a_purge_resumes_each_shard_where_the_last_drained_scan_ended,
            large_records_are_purged_across_several_byte_bounded_transactions,
            an_unreadable_record_is_quarantined_and_the_purge_goes_on,
            forget_deletes_a_quarantined_record_and_only_an_unreadable_one,
            forget_keeps_a_record_in_a_newer_format,
            a_slow_purge_is_split_before_five_seconds,
            complete_with_runs_the_effect_once_and_never_for_a_lost_lease,
            foundationdb_limits_are_enforced_with_its_error_kinds,
            a_transaction_older_than_five_seconds_is_too_old,
            two_transactions_that_read_the_same_absent_key_and_insert_conflict,
            bulk_loaded_records_read_back_replay_and_are_purged_when_due,
            a_bulk_batch_over_the_limit_writes_nothing,
            claims_of_distinct_keys_in_one_batch_commit_in_one_transaction,
            concurrent_claims_share_transactions_and_acquire_each_key_once,
            the_same_key_twice_in_one_batch_answers_as_two_claims_one_after_the_other,
            a_batch_decides_each_claim_on_its_own_record,
            an_unreadable_record_fails_only_its_own_claim_in_a_batch,
            a_conflict_runs_the_batch_again_and_a_failed_batch_sends_each_claim_alone,
            a_batch_the_engine_does_not_answer_fails_each_claim_as_unavailable,
            a_full_batch_of_the_largest_claims_commits_in_one_transaction,
            claim_batches_agree_with_the_machine_claim_by_claim
        );
    };
    (@each $open:path; $($behaviour:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $behaviour() {
                $crate::testkit::$behaviour($open().await).await;
            }
        )*
    };
}

// ---- Factories ----------------------------------------------------------------

/// A fresh temporary embedded directory whose claims are batched (the
/// engine's default is not to batch them): the suites run on the batched
/// path, as on FoundationDB by default, and a claim that goes alone takes
/// the unbatched one.
pub fn batched_embedded_config() -> crate::EmbeddedConfig {
    crate::EmbeddedConfig {
        batch_items_max: crate::CLAIM_BATCH_ITEMS_MAX,
        ..crate::EmbeddedConfig::temporary()
    }
}

/// An embedded engine in a fresh temporary directory
/// ([`batched_embedded_config`]), on a manual clock that its transaction
/// ages are measured on too.
pub async fn embedded() -> TestEngine<crate::EmbeddedEngine> {
    let clock = ManualClock::starting_now();
    let engine = crate::EmbeddedEngine::open_with_clock(&batched_embedded_config(), clock.clone())
        .expect("open embedded engine");
    TestEngine {
        engine,
        prefix: crate::KEY_PREFIX_DEFAULT.to_vec(),
        clock,
        engine_time: EngineTime::Clock,
    }
}

#[cfg(feature = "foundationdb")]
pub use self::foundationdb::{
    TEST_PREFIX_START, foundationdb, foundationdb_effects, foundationdb_store, foundationdb_store_pair,
};

#[cfg(feature = "foundationdb")]
mod foundationdb {
    use super::{EngineTime, TestEngine};
    use crate::engine::{Engine, RunOptions, Transaction, TxError};
    use crate::{FoundationDbEngine, FoundationDbNetwork, FoundationDbStore};
    use std::time::Duration;
    use store_core::{ManualClock, Policy, SharedClock};

    /// How long the first ping of a test may take before the cluster counts
    /// as unreachable.
    const CLUSTER_REACHABLE_MS_MAX: u64 = 5_000;
    /// Start of every key prefix the tests write under, so leftovers can be
    /// cleared with one `clearrange` (see FOUNDATIONDB.md).
    pub const TEST_PREFIX_START: &str = "idem-test-";

    const HOW_TO_RUN: &str = "\
this test needs a running FoundationDB cluster and its client library. Either
  scripts/test-foundationdb        (starts a throw-away fdbserver on loopback and runs every FoundationDB suite)
or, with a cluster of your own:
  1. install foundationdb-clients and foundationdb-server 7.3.x (.deb from FoundationDB's GitHub releases);
  2. fdbcli --exec \"configure new single ssd\"   (once, on a new cluster);
  3. fdbcli --exec status                          (must say the database is available);
  4. FDB_CLUSTER_FILE=/etc/foundationdb/fdb.cluster cargo test -p store-fdb --features foundationdb
see store-fdb/FOUNDATIONDB.md";

    fn cluster_unavailable(what: &str, error: impl std::fmt::Display) -> ! {
        panic!("FoundationDB {what}: {error}\n{HOW_TO_RUN}");
    }

    /// The engine on the cluster FoundationDB's default cluster file (or
    /// `FDB_CLUSTER_FILE`) names, checked reachable, with a fresh prefix so
    /// that one test's purge sees only its own records. Fails with
    /// instructions when there is no cluster; never passes silently.
    pub async fn foundationdb() -> TestEngine<FoundationDbEngine> {
        let network = FoundationDbNetwork::start().unwrap_or_else(|error| cluster_unavailable("network", error));
        let engine = FoundationDbEngine::open(network, None).unwrap_or_else(|error| cluster_unavailable("open", error));
        let prefix = format!("{TEST_PREFIX_START}{:016x}", rand::random::<u64>()).into_bytes();
        let test = TestEngine {
            engine,
            prefix,
            clock: ManualClock::starting_now(),
            engine_time: EngineTime::Wall,
        };
        let probe = &test.key(b"ping");
        // Retryable errors are tried again within the time limit: a test
        // binary with FoundationDB's client fault injection on gets them.
        let ping = async {
            loop {
                let pinged = test
                    .engine
                    .run(RunOptions::default(), |tx, _| async move {
                        tx.get(probe).await.map(|_| ()).map_err(TxError::from)
                    })
                    .await;
                match pinged {
                    Err(error) if error.is_retryable() => continue,
                    other => return other,
                }
            }
        };
        match tokio::time::timeout(Duration::from_millis(CLUSTER_REACHABLE_MS_MAX), ping).await {
            Ok(Ok(())) => test,
            Ok(Err(error)) => cluster_unavailable("ping", error),
            Err(_) => cluster_unavailable("ping", format!("no answer within {CLUSTER_REACHABLE_MS_MAX} ms")),
        }
    }

    /// An [`super::FdbEffects`] for store-core's atomic completion
    /// behaviours, under a fresh prefix.
    pub async fn foundationdb_effects(policy: Policy) -> super::FdbEffects<FoundationDbEngine> {
        super::FdbEffects::new(foundationdb().await, policy)
    }

    /// Two stores for store-core's waiting suite, under one fresh prefix,
    /// each over a `Database` handle of its own: two instances, whose
    /// waiters only hear of each other's writes through FoundationDB's
    /// watches (each handle has its own hub).
    pub async fn foundationdb_store_pair(
        policy: Policy,
    ) -> (store_core::testkit::SharedStore, store_core::testkit::SharedStore) {
        let first = foundationdb().await;
        let network = FoundationDbNetwork::start().unwrap_or_else(|error| cluster_unavailable("network", error));
        let engine = FoundationDbEngine::open(network, None).unwrap_or_else(|error| cluster_unavailable("open", error));
        let second = TestEngine {
            engine,
            prefix: first.prefix.clone(),
            clock: first.clock.clone(),
            engine_time: EngineTime::Wall,
        };
        // The waiting suite's deadlines are real time: both stores read the
        // system clock, as FoundationDB's own limits do.
        let (first, second): (FoundationDbStore, FoundationDbStore) =
            (first.store_on_engine_time(policy), second.store_on_engine_time(policy));
        (std::sync::Arc::new(first), std::sync::Arc::new(second))
    }

    /// A store for store-core's conformance suite, under a fresh prefix,
    /// reading the suite's clock (FoundationDB has none of its own).
    pub async fn foundationdb_store(policy: Policy, clock: SharedClock) -> store_core::testkit::SharedStore {
        let test = foundationdb().await;
        let store: FoundationDbStore = test.store(policy).with_clock(clock);
        std::sync::Arc::new(store)
    }
}
