//! The store, written once against [`Engine`]: every transition is one
//! transaction that reads the record, runs store-core's pure state machine
//! and applies its single write. Claims may share one transaction with the
//! claims that arrive while an earlier one is in flight
//! (`claim_batch.rs`), when the engine's configuration batches them.
//!
//! Every transaction here is idempotent under retry, which is how
//! `commit_unknown_result` is handled without FoundationDB's experimental
//! `automatic_idempotency`: the lease token is made before the first attempt,
//! and a retry reads the record and recognises its own earlier write (a
//! re-sent claim finds its token and gets the same lease; a completion finds
//! the record completed by its token; an abandon finds nothing to delete).

use crate::claim_batch::{BatchedClaim, ClaimBatchRunner, ClaimBatcher, ClaimItem};
use crate::engine::{Engine, EngineError, MaybeCommitted, RunOptions, Transaction, TxError};
use crate::keys::{
    EXPIRY_SHARDS, KIND_RECORD, KIND_TOMBSTONE, KeyLayout, RECORD_CHUNK_BYTES_MAX, RECORD_CHUNKS_MAX, Slot,
};
use async_trait::async_trait;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use store_core::machine::{self, Found, Step, Write};
use store_core::{
    BatchError, Batcher, CallerId, ChangeHub, ClaimOutcome, ClaimRequest, Fenced, ForgetOutcome, HeldLease,
    IdempotencyKey, IdempotencyStore, KeyDigest, PURGE_BATCH_MAX, Policy, PurgeReport, Record, RecordId, RecoveryPoint,
    SavedResponse, SharedClock, StoreError, SystemClock, decode_record, encode_record,
};

/// Index entries one purge transaction handles at most.
pub const PURGE_ENTRIES_PER_TRANSACTION: usize = 64;
/// Record bytes one purge transaction reads at most (it stops after the
/// record that crosses it): with the entry cap, this keeps a purge far below
/// FoundationDB's 10 MB limit even when every record is large.
pub const PURGE_READ_BYTES_PER_TRANSACTION_MAX: usize = 1_000_000;
/// Age at which a purge transaction takes no more entries and commits what it
/// has: FoundationDB refuses a transaction older than 5 s
/// (`TRANSACTION_MS_MAX`), and a slow cluster would otherwise fail the same
/// batch on every retry. The rest of the 5 s is for the last read and the
/// commit; the next transaction carries on.
pub const PURGE_TRANSACTION_MS_MAX: u64 = 2_000;
/// How far behind this process's clock another writer's clock may be (or
/// this clock may step back) without a purge missing an index entry: a
/// shard's next scan starts this long before the time its last drained scan
/// read (see [`PurgeCursors`]).
pub const PURGE_CURSOR_SKEW_MS_MAX: u64 = 60_000;

/// What one purge transaction did.
#[derive(Debug, Default)]
struct PurgeBatch {
    records: u64,
    tombstones: u64,
    /// Records that could not be decoded, set aside: (caller, key digest).
    quarantined: Vec<(CallerId, KeyDigest)>,
    /// Index entries whose key does not parse (no slot to name): cleared.
    unparsable_entries: u64,
    /// Index entries handled (cleared), stale ones included.
    entries: usize,
    /// True when the shard has no more due entries.
    drained: bool,
    /// The clock reading the scan took as now.
    now_ms: u64,
}

/// Where each expiry shard's next purge scan starts, by expiry time.
///
/// A purge clears every index entry it reads, but on an LSM engine (the
/// embedded one) a cleared key stays as a tombstone until compaction
/// reaches it, and a range scan steps over each one: scanning a shard from
/// its start reads every entry purged since the last compaction, again on
/// every purge transaction (BENCHMARKS.md, "A day of keys"). After a scan
/// that drained its shard at time `now`, no entry due by `now` is left, and
/// every entry written later expires after its writer's clock reading (a
/// record at now + retention, a tombstone after the purge that writes it),
/// so the next scan may start at `now` less [`PURGE_CURSOR_SKEW_MS_MAX`].
/// Kept in memory: a restarted process scans each shard once from its
/// start, which also picks up an entry a clock skewed past the margin hid.
struct PurgeCursors {
    scan_start_ms: Vec<AtomicU64>,
}

impl PurgeCursors {
    fn new() -> Self {
        Self {
            scan_start_ms: (0..EXPIRY_SHARDS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn scan_start_ms(&self, shard: u16) -> u64 {
        self.scan_start_ms[usize::from(shard)].load(Ordering::Relaxed)
    }

    /// After a scan of `shard` at `now_ms` left no due entry behind.
    fn drained(&self, shard: u16, now_ms: u64) {
        self.scan_start_ms[usize::from(shard)]
            .fetch_max(now_ms.saturating_sub(PURGE_CURSOR_SKEW_MS_MAX), Ordering::Relaxed);
    }
}

/// What the purge did with the record behind one index entry, and how many
/// record bytes it read.
enum RecordPurge {
    Purged {
        bytes: usize,
    },
    /// Absent, extended, or not yet purgeable: a stale index entry.
    Kept {
        bytes: usize,
    },
    /// Could not be decoded: quarantined.
    Unreadable {
        bytes: usize,
    },
}

pub struct FdbStore<E: Engine> {
    engine: E,
    layout: KeyLayout,
    policy: Policy,
    run_options: RunOptions,
    /// What leases, retention and the purge's transaction age are timed by.
    /// FoundationDB has no server clock, so on both engines it is the
    /// application server's own ([`SystemClock`]); skew between servers
    /// shortens or lengthens a lease, while the lease token keeps every
    /// write fenced regardless. Tests give a `ManualClock` and move it.
    clock: SharedClock,
    /// Claims batched across calls (`claim_batch.rs`), as the engine's
    /// configuration says; `None` when its `batch_items_max` is 1, and
    /// every claim goes alone. Its runner holds a copy of the settings
    /// above, so every builder that changes one builds it again.
    claims: Option<ClaimBatcher<E>>,
    purge_cursors: Arc<PurgeCursors>,
}

/// What a transaction found under a slot.
pub(crate) struct Existing {
    record: Option<Record>,
    /// How many chunks the record is stored in (0 without a record): an
    /// overwrite that needs no more chunks than this replaces every stored
    /// chunk, so it needs no range clear first.
    record_chunks: usize,
    /// Expiry of a live tombstone, when there is no record.
    tombstone_expires_at_ms: Option<u64>,
}

impl Existing {
    pub(crate) fn found(&self) -> Found<'_> {
        match (&self.record, self.tombstone_expires_at_ms) {
            (Some(record), _) => Found::Record(record),
            (None, Some(_)) => Found::Tombstone,
            (None, None) => Found::Nothing,
        }
    }
}

impl<E: Engine> FdbStore<E> {
    /// `prefix` is the bytes every key of this store starts with.
    pub fn new(engine: E, prefix: &[u8], policy: Policy) -> Self {
        let layout = KeyLayout::new(prefix);
        // Other processes' writes reach this process's waiters through the
        // engine's watches, where it has any (docs/design.md#waiting).
        if let Some(watches) = engine.record_watches(&layout) {
            engine.change_hub().set_source(watches);
        }
        Self {
            engine,
            layout,
            policy,
            run_options: RunOptions::default(),
            clock: SystemClock::shared(),
            claims: None,
            purge_cursors: Arc::new(PurgeCursors::new()),
        }
        .with_claim_batcher()
    }

    /// Times leases, retention and purges by `clock` instead of the system's.
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self.with_claim_batcher()
    }

    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    pub fn with_run_options(mut self, run_options: RunOptions) -> Self {
        self.run_options = run_options;
        self.with_claim_batcher()
    }

    /// The store with a claim batcher over its current settings, if the
    /// engine batches claims.
    fn with_claim_batcher(mut self) -> Self {
        self.claims = self
            .engine
            .claim_batch_limits()
            .map(|limits| Batcher::new(ClaimBatchRunner::new(self.without_claim_batcher()), limits));
        self
    }

    /// The same store with no batcher: what a claim batch's transaction
    /// runs on.
    pub(crate) fn without_claim_batcher(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            layout: self.layout.clone(),
            policy: self.policy,
            run_options: self.run_options,
            clock: self.clock.clone(),
            claims: None,
            purge_cursors: self.purge_cursors.clone(),
        }
    }

    pub fn engine(&self) -> &E {
        &self.engine
    }

    pub fn layout(&self) -> &KeyLayout {
        &self.layout
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The retry options of every transaction of this store.
    pub(crate) fn run_options(&self) -> RunOptions {
        self.run_options
    }

    /// Wakes this process's waiters on the record after a write that may
    /// have ended its started state (docs/design.md#waiting). Only a lost
    /// lease certainly wrote nothing; after an error the write may have
    /// happened, and a needless wake-up costs a waiter one read.
    fn announce_end<T>(&self, lease: &HeldLease, result: &Result<Fenced<T>, StoreError>) {
        if !matches!(result, Ok(Fenced::LeaseLost)) {
            self.announce_change(lease);
        }
    }

    /// Wakes this process's waiters on the lease's record.
    pub(crate) fn announce_change(&self, lease: &HeldLease) {
        self.engine
            .change_hub()
            .notify(&RecordId::new(&lease.caller, &lease.key));
    }

    /// The claim's batch, or [`BatchedClaim::Alone`] without batching or
    /// when the batch's lane ended without an answer.
    pub(crate) async fn claim_in_batch(&self, request: &ClaimRequest) -> Result<BatchedClaim, StoreError> {
        let Some(claims) = &self.claims else {
            return Ok(BatchedClaim::Alone);
        };
        match claims.submit(ClaimItem::new(&self.layout, request)).await {
            Ok(batched) => Ok(batched),
            Err(BatchError::Lost) => Ok(BatchedClaim::Alone),
            Err(refused @ BatchError::QueueFull { .. }) => Err(StoreError::unavailable(
                format!("{} claims are queued past their bound", self.engine.name()),
                refused,
            )),
        }
    }

    /// A claim on the path its batch chose.
    pub(crate) async fn finish_claim(
        &self,
        request: &ClaimRequest,
        batched: BatchedClaim,
    ) -> Result<ClaimOutcome, StoreError> {
        match batched {
            BatchedClaim::Decided(outcome) => Ok(outcome),
            BatchedClaim::Failed(error) => Err(error),
            BatchedClaim::Alone => self.claim_alone(request).await,
        }
    }

    /// Transaction 1 of the specification, for one claim alone.
    async fn claim_alone(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.transition(&request.caller, &request.key, |found, now| {
            machine::claim(found, request, now, &self.policy)
        })
        .await
    }

    /// One transition of one key, in one transaction.
    async fn transition<O, S>(&self, caller: &CallerId, key: &IdempotencyKey, transition: S) -> Result<O, StoreError>
    where
        O: Send,
        S: Fn(Found<'_>, u64) -> Step<O> + Send + Sync,
    {
        let slot = &self.layout.slot(caller, key.digest());
        let transition = &transition;
        self.engine
            .run(self.run_options, |tx, _maybe_committed: MaybeCommitted| async move {
                let now = self.clock.now_ms();
                let existing = self.read_existing(&tx, slot, now).await?;
                let step = transition(existing.found(), now);
                self.apply(&tx, slot, &existing, step.write).await?;
                Ok(step.outcome)
            })
            .await
    }

    pub(crate) async fn read_existing(&self, tx: &E::Tx, slot: &Slot, now: u64) -> Result<Existing, TxError> {
        let (record, record_chunks) = match read_record_bytes(tx, slot).await? {
            Some(stored) => (Some(decode_record(&stored.bytes)?), stored.chunks),
            None => (None, 0),
        };
        let tombstone_expires_at_ms = match record {
            Some(_) => None,
            None => read_tombstone(tx, slot).await?.filter(|&expires| expires > now),
        };
        Ok(Existing {
            record,
            record_chunks,
            tombstone_expires_at_ms,
        })
    }

    pub(crate) async fn apply(
        &self,
        tx: &E::Tx,
        slot: &Slot,
        existing: &Existing,
        write: Write,
    ) -> Result<(), TxError> {
        match write {
            Write::Nothing => Ok(()),
            // A tombstone stays while its key is claimed again: if the new
            // claim is abandoned, the key is still known to be late. Purge
            // overwrites it when the new record expires in turn.
            Write::Put(record) => self.write_record(tx, slot, existing, &record).await,
            Write::Delete => self.delete_record(tx, slot, existing).await,
        }
    }

    async fn write_record(&self, tx: &E::Tx, slot: &Slot, existing: &Existing, new: &Record) -> Result<(), TxError> {
        let bytes = encode_record(new);
        let chunks = record_chunks(&bytes).map_err(TxError::Abort)?;
        if existing.record_chunks > chunks.len() {
            // Fewer chunks than stored: the range clear removes the tail.
            self.delete_record(tx, slot, existing).await?;
        } else if let Some(old) = &existing.record {
            // Every stored chunk is overwritten below; only the index moves.
            tx.clear(&self.layout.expiry_key(slot, old.expires_at_ms, KIND_RECORD))?;
        }
        for (index, chunk) in chunks.iter().enumerate() {
            tx.set(&self.layout.record_chunk_key(slot, index), chunk)?;
        }
        tx.set(&self.layout.expiry_key(slot, new.expires_at_ms, KIND_RECORD), &[])?;
        Ok(())
    }

    async fn delete_record(&self, tx: &E::Tx, slot: &Slot, existing: &Existing) -> Result<(), TxError> {
        self.clear_record_chunks(tx, slot, existing.record_chunks).await?;
        if let Some(old) = &existing.record {
            tx.clear(&self.layout.expiry_key(slot, old.expires_at_ms, KIND_RECORD))?;
        }
        Ok(())
    }

    /// Clears the `chunks` chunks a record is stored in. A record's chunks
    /// are always `0..chunks` with nothing after them (`write_record` clears
    /// the tail when a record shrinks), so a one-chunk record needs only a
    /// point clear. That matters on the embedded engine, which clears a range
    /// by reading it: a range read uses no bloom filter, so on a store of
    /// millions of records it reads a block from every table of every level
    /// (BENCHMARKS.md, "A day of keys").
    async fn clear_record_chunks(&self, tx: &E::Tx, slot: &Slot, chunks: usize) -> Result<(), TxError> {
        if chunks == 1 {
            tx.clear(&self.layout.record_chunk_key(slot, 0))?;
        } else {
            let (begin, end) = slot.record.range();
            tx.clear_range(&begin, &end).await?;
        }
        Ok(())
    }

    /// One purge transaction over one shard: up to `limit` due index entries,
    /// no more record bytes than `PURGE_READ_BYTES_PER_TRANSACTION_MAX`, and
    /// no new entry once the transaction is `PURGE_TRANSACTION_MS_MAX` old.
    /// It always handles at least one entry, so purging makes progress.
    async fn purge_shard_batch(&self, shard: u16, limit: usize) -> Result<PurgeBatch, StoreError> {
        self.engine
            .run(self.run_options, |tx, _maybe_committed: MaybeCommitted| async move {
                let started_ms = self.clock.monotonic_ms();
                let now = self.clock.now_ms();
                let from_ms = self.purge_cursors.scan_start_ms(shard);
                let (begin, end) = self.layout.expiry_due_range(shard, from_ms, now);
                let entries = tx.get_range(&begin, &end, limit).await?;
                let mut batch = PurgeBatch {
                    drained: entries.len() < limit,
                    now_ms: now,
                    ..PurgeBatch::default()
                };
                let mut bytes_read = 0;
                for (index_key, _) in &entries {
                    let age_ms = self.clock.monotonic_ms().saturating_sub(started_ms);
                    let full = bytes_read >= PURGE_READ_BYTES_PER_TRANSACTION_MAX || age_ms >= PURGE_TRANSACTION_MS_MAX;
                    if full && batch.entries > 0 {
                        batch.drained = false;
                        break;
                    }
                    tx.clear(index_key)?;
                    batch.entries += 1;
                    let Some((expires_at_ms, kind, slot)) = self.layout.parse_expiry_key(index_key) else {
                        // Only this store writes under its prefix: reported
                        // after the commit, not skipped in silence.
                        batch.unparsable_entries += 1;
                        continue;
                    };
                    if kind == KIND_RECORD {
                        match self.purge_record(&tx, &slot, expires_at_ms, now).await? {
                            RecordPurge::Purged { bytes } => {
                                batch.records += 1;
                                bytes_read += bytes;
                            }
                            RecordPurge::Kept { bytes } => bytes_read += bytes,
                            RecordPurge::Unreadable { bytes } => {
                                batch.quarantined.push((slot.caller.clone(), slot.digest));
                                bytes_read += bytes;
                            }
                        }
                    } else {
                        batch.tombstones += u64::from(self.purge_tombstone(&tx, &slot, expires_at_ms, now).await?);
                    }
                }
                debug_assert!(
                    batch.entries <= limit,
                    "{} entries for a limit of {limit}",
                    batch.entries
                );
                Ok(batch)
            })
            .await
    }

    /// Deletes the record behind an index entry after re-checking that it
    /// is still the record the entry describes and that it has expired, and
    /// leaves a tombstone so a late retry is noticed.
    ///
    /// A record that cannot be decoded is quarantined: left where it is,
    /// its index entry cleared (by the caller) so no later purge meets it
    /// again, and reported. Aborting the transaction instead would stop
    /// every purge run at the same entry for good.
    async fn purge_record(
        &self,
        tx: &E::Tx,
        slot: &Slot,
        expires_at_ms: u64,
        now: u64,
    ) -> Result<RecordPurge, TxError> {
        let StoredRecord { bytes, chunks } = match read_record_bytes(tx, slot).await {
            Ok(Some(stored)) => stored,
            Ok(None) => return Ok(RecordPurge::Kept { bytes: 0 }),
            Err(TxError::Abort(StoreError::Corrupt(_))) => return Ok(RecordPurge::Unreadable { bytes: 0 }),
            Err(error) => return Err(error),
        };
        let Ok(record) = decode_record(&bytes) else {
            return Ok(RecordPurge::Unreadable { bytes: bytes.len() });
        };
        if record.expires_at_ms != expires_at_ms || !machine::is_purgeable(&record, now) {
            return Ok(RecordPurge::Kept { bytes: bytes.len() });
        }
        self.clear_record_chunks(tx, slot, chunks).await?;
        let tombstone_expires = record.expires_at_ms.saturating_add(self.policy.tombstone_ms());
        if tombstone_expires > now {
            tx.set(&slot.tombstone_key, &tombstone_expires.to_be_bytes())?;
            tx.set(&self.layout.expiry_key(slot, tombstone_expires, KIND_TOMBSTONE), &[])?;
        }
        Ok(RecordPurge::Purged { bytes: bytes.len() })
    }

    /// Deletes the record of `slot` in this transaction if, and only if,
    /// its bytes do not decode (with the decoder every transition uses, so
    /// the check and the delete see the same snapshot and commit together).
    ///
    /// Only the record's chunks are cleared. Its expiry index entry, if the
    /// purge has not quarantined it yet, cannot be found without a readable
    /// expiry; it stays, and the purge clears it when it falls due, finding
    /// no record (or a newer one with another expiry) behind it. The
    /// tombstone, if any, stays too.
    async fn forget_if_unreadable(&self, tx: &E::Tx, slot: &Slot) -> Result<ForgetOutcome, TxError> {
        let bytes = match read_record_bytes(tx, slot).await {
            Ok(None) => return Ok(ForgetOutcome::NotFound),
            Ok(Some(stored)) => Some(stored.bytes),
            // More chunks than any record has: unreadable as a whole.
            Err(TxError::Abort(StoreError::Corrupt(_))) => None,
            Err(error) => return Err(error),
        };
        match bytes.map(|bytes| decode_record(&bytes)) {
            Some(Ok(_)) => return Ok(ForgetOutcome::Readable),
            Some(Err(error)) if error.is_newer_format() => return Ok(ForgetOutcome::NewerFormat),
            _ => {}
        }
        let (begin, end) = slot.record.range();
        tx.clear_range(&begin, &end).await?;
        Ok(ForgetOutcome::Deleted)
    }

    async fn purge_tombstone(&self, tx: &E::Tx, slot: &Slot, expires_at_ms: u64, now: u64) -> Result<bool, TxError> {
        let current = read_tombstone(tx, slot).await?;
        if current != Some(expires_at_ms) || expires_at_ms > now {
            return Ok(false);
        }
        tx.clear(&slot.tombstone_key)?;
        Ok(true)
    }
}

/// A record's encoded bytes cut into the chunks it is stored in (keys
/// `record_chunk_key(slot, 0..)`), or `TooLarge` past [`RECORD_CHUNKS_MAX`].
pub(crate) fn record_chunks(bytes: &[u8]) -> Result<Vec<&[u8]>, StoreError> {
    let chunks: Vec<&[u8]> = bytes.chunks(RECORD_CHUNK_BYTES_MAX).collect();
    // A record is at least its version byte, so it has a first chunk,
    // which is what read_record_bytes takes as "the record exists".
    assert!(!chunks.is_empty(), "an encoded record has at least one chunk");
    if chunks.len() > RECORD_CHUNKS_MAX {
        return Err(StoreError::TooLarge(format!(
            "record of {} bytes needs more than {RECORD_CHUNKS_MAX} chunks",
            bytes.len()
        )));
    }
    Ok(chunks)
}

async fn read_record<T: Transaction>(tx: &T, slot: &Slot) -> Result<Option<Record>, TxError> {
    match read_record_bytes(tx, slot).await? {
        Some(stored) => Ok(Some(decode_record(&stored.bytes)?)),
        None => Ok(None),
    }
}

/// A record's encoded bytes as stored, its chunks joined.
struct StoredRecord {
    bytes: Vec<u8>,
    chunks: usize,
}

/// The record's encoded bytes, its chunks joined.
///
/// Chunks are cut at [`RECORD_CHUNK_BYTES_MAX`], so a first chunk shorter
/// than that is the only one: the common case costs one point read, which
/// the embedded engine answers through its tables' Bloom filters, where a
/// range read must merge every table (about a tenth of the service's CPU at
/// 800/s; BENCHMARKS.md, History, "Point reads"). Only a record of a full
/// chunk or more is read as a range.
async fn read_record_bytes<T: Transaction>(tx: &T, slot: &Slot) -> Result<Option<StoredRecord>, TxError> {
    let Some(first) = tx.get(&slot.record.pack(&(0_u64,))).await? else {
        return Ok(None);
    };
    if first.len() < RECORD_CHUNK_BYTES_MAX {
        return Ok(Some(StoredRecord {
            bytes: first,
            chunks: 1,
        }));
    }
    let (begin, end) = slot.record.range();
    let chunks = tx.get_range(&begin, &end, RECORD_CHUNKS_MAX + 1).await?;
    if chunks.len() > RECORD_CHUNKS_MAX {
        let detail = format!("record has more than {RECORD_CHUNKS_MAX} chunks");
        return Err(TxError::Abort(StoreError::Corrupt(store_core::CodecError::Malformed(
            detail,
        ))));
    }
    Ok(Some(StoredRecord {
        chunks: chunks.len(),
        bytes: chunks.into_iter().flat_map(|(_, value)| value).collect(),
    }))
}

async fn read_tombstone<T: Transaction>(tx: &T, slot: &Slot) -> Result<Option<u64>, TxError> {
    let Some(value) = tx.get(&slot.tombstone_key).await? else {
        return Ok(None);
    };
    let bytes: [u8; 8] = value.as_slice().try_into().map_err(|_| {
        TxError::Abort(StoreError::Corrupt(store_core::CodecError::Malformed(
            "tombstone is not 8 bytes".into(),
        )))
    })?;
    Ok(Some(u64::from_be_bytes(bytes)))
}

#[async_trait]
impl<E: Engine> IdempotencyStore for FdbStore<E> {
    fn backend_name(&self) -> &'static str {
        self.engine.name()
    }

    /// In a batch with the claims that arrive while the previous batch is
    /// in flight (`claim_batch.rs`); what the batch does not decide goes
    /// alone.
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let batched = self.claim_in_batch(request).await?;
        self.finish_claim(request, batched).await
    }

    async fn checkpoint(&self, lease: &HeldLease, point: RecoveryPoint) -> Result<Fenced, StoreError> {
        self.transition(&lease.caller, &lease.key, |found, now| {
            machine::checkpoint(found, lease.token, point.clone(), now)
        })
        .await
    }

    async fn complete(&self, lease: &HeldLease, response: SavedResponse) -> Result<Fenced, StoreError> {
        let result = self
            .transition(&lease.caller, &lease.key, |found, now| {
                machine::complete(found, lease.token, response.clone(), now, &self.policy)
            })
            .await;
        self.announce_end(lease, &result);
        result
    }

    async fn release(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        let result = self
            .transition(&lease.caller, &lease.key, |found, now| {
                machine::release(found, lease.token, now)
            })
            .await;
        self.announce_end(lease, &result);
        result
    }

    async fn abandon(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        let result = self
            .transition(&lease.caller, &lease.key, |found, now| {
                machine::abandon(found, lease.token, now)
            })
            .await;
        self.announce_end(lease, &result);
        result
    }

    async fn purge_expired(&self, limit: usize) -> Result<PurgeReport, StoreError> {
        let limit = limit.min(PURGE_BATCH_MAX);
        let mut report = PurgeReport::default();
        let mut handled = 0;
        for shard in 0..EXPIRY_SHARDS {
            while handled < limit {
                let batch = self
                    .purge_shard_batch(shard, PURGE_ENTRIES_PER_TRANSACTION.min(limit - handled))
                    .await?;
                report.records_purged += batch.records;
                report.tombstones_purged += batch.tombstones;
                report.records_quarantined += batch.quarantined.len() as u64;
                // Logged after the commit, so once: the index entry is gone.
                for (caller, digest) in &batch.quarantined {
                    tracing::error!(%caller, key_sha256 = %digest, "quarantined an unreadable record: \
                        it is no longer purged, and its key answers record_unreadable until it is deleted");
                }
                if batch.unparsable_entries > 0 {
                    tracing::error!(
                        shard,
                        entries = batch.unparsable_entries,
                        "cleared expiry index entries \
                        whose keys do not parse: something other than this store wrote under its prefix"
                    );
                }
                handled += batch.entries;
                debug_assert!(handled <= limit, "purged {handled} entries for a limit of {limit}");
                if batch.drained {
                    self.purge_cursors.drained(shard, batch.now_ms);
                    break;
                }
            }
        }
        report.more = handled >= limit;
        Ok(report)
    }

    async fn inspect(&self, caller: &CallerId, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        let slot = &self.layout.slot(caller, key.digest());
        self.engine
            .run(self.run_options, |tx, _maybe_committed: MaybeCommitted| async move {
                read_record(&tx, slot).await
            })
            .await
    }

    fn record_changes(&self) -> Option<&ChangeHub> {
        Some(self.engine.change_hub())
    }

    async fn forget_unreadable_record(&self, caller: &CallerId, key: KeyDigest) -> Result<ForgetOutcome, StoreError> {
        let slot = &self.layout.slot(caller, key);
        let outcome = self
            .engine
            .run(self.run_options, |tx, _maybe_committed: MaybeCommitted| async move {
                self.forget_if_unreadable(&tx, slot).await
            })
            .await?;
        if outcome == ForgetOutcome::Deleted {
            tracing::warn!(%caller, key_sha256 = %key, "deleted an unreadable record: its key may be claimed again");
        }
        Ok(outcome)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let probe = self.layout.effects().pack(&("ping",));
        let probe = &probe;
        self.engine
            .run(self.run_options, |tx, _maybe_committed: MaybeCommitted| async move {
                tx.get(probe).await.map(|_| ()).map_err(TxError::from)
            })
            .await
    }
}

impl From<EngineError> for StoreError {
    fn from(error: EngineError) -> Self {
        error.into_store_error()
    }
}
