//! The engine interface: FoundationDB's transaction model, reduced to what the
//! store needs.
//!
//! A transaction reads (point and range), writes (set, clear, clear_range)
//! and commits. Commits may fail with a conflict (`not_committed`: nothing
//! happened, run again) or with an unknown result (`commit_unknown_result`:
//! it may have happened). [`Engine::run`] is the retry loop: it runs the body
//! in a fresh transaction until a commit succeeds, passing on whether an
//! earlier attempt may have committed. The store's bodies are idempotent (they
//! read the record and recognise their own earlier write), so retrying after an
//! unknown result is safe; see `store.rs`.
//!
//! Both engines enforce FoundationDB's documented limits with FoundationDB's
//! error kinds, so code that passes on the embedded engine stays within what a
//! cluster accepts.

use crate::keys::KeyLayout;
use std::future::Future;
use std::sync::Arc;
use store_core::{BatchLimits, ChangeHub, ChangeSource, StoreError};

/// FoundationDB: a key may be at most 10,000 bytes.
pub const KEY_BYTES_MAX: usize = 10_000;
/// FoundationDB: a value may be at most 100,000 bytes.
pub const VALUE_BYTES_MAX: usize = 100_000;
/// FoundationDB: a transaction may affect at most 10,000,000 bytes.
pub const TRANSACTION_BYTES_MAX: usize = 10_000_000;
/// FoundationDB: a transaction may live at most 5 s from its first read.
pub const TRANSACTION_MS_MAX: u64 = 5_000;
/// Attempts [`Engine::run`] makes before giving up.
pub const RETRY_LIMIT_DEFAULT: u32 = 30;
/// Whole-call budget of [`Engine::run`], all attempts included.
pub const RUN_TIMEOUT_MS_DEFAULT: u64 = 10_000;

/// The error kinds the store distinguishes, named and numbered after
/// FoundationDB's (`api-error-codes.rst`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineErrorKind {
    /// 1007: the transaction ran longer than 5 s.
    TransactionTooOld,
    /// 1020: conflict with another transaction; nothing was written.
    NotCommitted,
    /// 1021: the commit may or may not have happened.
    CommitUnknownResult,
    /// 1031: the transaction's own timeout passed. Never retried blindly: the
    /// caller's budget is spent, and the commit may have happened.
    TransactionTimedOut,
    /// 2101: more than 10,000,000 bytes affected.
    TransactionTooLarge,
    /// 2102: a key over 10,000 bytes.
    KeyTooLarge,
    /// 2103: a value over 100,000 bytes.
    ValueTooLarge,
    /// The engine could not read or write its storage.
    Io,
}

impl EngineErrorKind {
    /// FoundationDB's numeric code, for logs that match its documentation.
    pub fn code(self) -> u32 {
        match self {
            Self::TransactionTooOld => 1007,
            Self::NotCommitted => 1020,
            Self::CommitUnknownResult => 1021,
            Self::TransactionTimedOut => 1031,
            Self::TransactionTooLarge => 2101,
            Self::KeyTooLarge => 2102,
            Self::ValueTooLarge => 2103,
            Self::Io => 1510,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?} ({code}): {detail}", code = kind.code())]
pub struct EngineError {
    pub kind: EngineErrorKind,
    pub detail: String,
}

impl EngineError {
    pub fn new(kind: EngineErrorKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
        }
    }

    /// Whether the retry loop may run the body again.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            EngineErrorKind::NotCommitted | EngineErrorKind::CommitUnknownResult | EngineErrorKind::TransactionTooOld
        )
    }

    /// Whether the failed attempt may nevertheless have committed.
    pub fn maybe_committed(&self) -> bool {
        matches!(
            self.kind,
            EngineErrorKind::CommitUnknownResult | EngineErrorKind::TransactionTimedOut
        )
    }

    /// What the store reports once the retry loop stops on this error.
    pub fn into_store_error(self) -> StoreError {
        match self.kind {
            EngineErrorKind::TransactionTooLarge | EngineErrorKind::KeyTooLarge | EngineErrorKind::ValueTooLarge => {
                StoreError::TooLarge(self.to_string())
            }
            _ => StoreError::unavailable("transaction failed", self),
        }
    }
}

/// An error inside a transaction body: an engine error (the loop decides
/// whether to retry) or an abort (stop now, commit nothing).
#[derive(Debug, thiserror::Error)]
pub enum TxError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("transaction aborted: {0}")]
    Abort(StoreError),
}

impl From<store_core::CodecError> for TxError {
    fn from(error: store_core::CodecError) -> Self {
        TxError::Abort(StoreError::Corrupt(error))
    }
}

/// Whether an earlier attempt of this run may have committed. Sticky: once an
/// attempt's outcome was unknown, every later attempt is told so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaybeCommitted {
    No,
    Maybe,
}

/// Options of one [`Engine::run`], passed explicitly at every call site.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOptions {
    pub retry_limit: u32,
    pub timeout_ms: u64,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            retry_limit: RETRY_LIMIT_DEFAULT,
            timeout_ms: RUN_TIMEOUT_MS_DEFAULT,
        }
    }
}

pub type KeyValue = (Vec<u8>, Vec<u8>);

/// One transaction: a cheap handle (FoundationDB's `RetryableTransaction` is
/// one too) that a body may clone into the futures it runs. Reads see the
/// transaction's own writes.
pub trait Transaction: Clone + Send + Sync + 'static {
    fn get(&self, key: &[u8]) -> impl Future<Output = Result<Option<Vec<u8>>, EngineError>> + Send;

    /// Up to `limit` pairs with `begin <= key < end`, in key order.
    fn get_range(
        &self,
        begin: &[u8],
        end: &[u8],
        limit: usize,
    ) -> impl Future<Output = Result<Vec<KeyValue>, EngineError>> + Send;

    fn set(&self, key: &[u8], value: &[u8]) -> Result<(), EngineError>;

    fn clear(&self, key: &[u8]) -> Result<(), EngineError>;

    /// Clears every key with `begin <= key < end`.
    fn clear_range(&self, begin: &[u8], end: &[u8]) -> impl Future<Output = Result<(), EngineError>> + Send;
}

/// A transactional key-value engine with FoundationDB's semantics. A cheap
/// handle, as a FoundationDB `Database` is: clones share one engine, so a
/// store can hand one to the batches it runs in tasks of their own.
pub trait Engine: Clone + Send + Sync + 'static {
    type Tx: Transaction;

    /// `embedded` or `foundationdb`, for metrics and logs.
    fn name(&self) -> &'static str;

    /// The waiters of every store over this engine and its clones
    /// (docs/design.md#waiting): one hub, so a store's write wakes the
    /// waiters of every other store over the same engine in this process.
    fn change_hub(&self) -> &ChangeHub;

    /// What turns other processes' writes to records under `layout` into
    /// notifications (FoundationDB: a watch per waited record). `None` where
    /// every writer is in this process (the embedded engine: its database
    /// is locked to one process), so the store's own notifications suffice.
    fn record_watches(&self, layout: &KeyLayout) -> Option<Arc<dyn ChangeSource>> {
        let _ = layout;
        None
    }

    /// How the stores over this engine batch their claims
    /// (`claim_batch.rs`), as its configuration says: `None` (its
    /// `batch_items_max` is 1) when every claim is a transaction of its own.
    /// An engine's setting, not a store's, so that every store opened over
    /// it (one per route policy, say) batches alike.
    fn claim_batch_limits(&self) -> Option<BatchLimits> {
        None
    }

    /// Runs `body` in a fresh transaction per attempt and commits it,
    /// retrying retryable errors up to the options' limits. A
    /// [`TxError::Abort`] ends the loop at once and commits nothing.
    fn run<T, F, Fut>(&self, options: RunOptions, body: F) -> impl Future<Output = Result<T, StoreError>> + Send
    where
        T: Send,
        F: Fn(Self::Tx, MaybeCommitted) -> Fut + Send + Sync,
        Fut: Future<Output = Result<T, TxError>> + Send;
}
