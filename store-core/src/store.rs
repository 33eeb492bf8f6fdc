//! The store API every backend implements, and its one error type.

use crate::codec::CodecError;
use crate::outcome::{ClaimOutcome, ClaimRequest, Fenced, ForgetOutcome, HeldLease, PurgeReport};
use crate::types::{CallerId, IdempotencyKey, InvalidInput, KeyDigest, Record, RecoveryPoint, SavedResponse};
use async_trait::async_trait;

/// Most records one purge call may delete.
pub const PURGE_BATCH_MAX: usize = 10_000;

pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors shared by all backends; backend detail is boxed inside.
///
/// Retryable kinds ([`StoreError::is_retryable`]) mean the call may or may
/// not have taken effect (a timeout can hide a write that happened) and may
/// be made again with the same arguments: every store operation is
/// idempotent for the same lease token. Permanent kinds mean the same call
/// will fail again.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or did not answer in time.
    #[error("store unavailable: {detail}")]
    Unavailable {
        detail: String,
        #[source]
        source: Option<BoxError>,
    },
    /// Transactions kept conflicting, or their outcome stayed unknown, until
    /// the retry limit.
    #[error("store gave up after {attempts} attempts: {detail}")]
    RetriesExhausted { attempts: u32, detail: String },
    /// The request does not fit the store's limits (value or transaction size).
    #[error("request exceeds a store limit: {0}")]
    TooLarge(String),
    /// An argument was refused.
    #[error("invalid input: {0}")]
    InvalidInput(#[from] InvalidInput),
    /// A stored record could not be decoded.
    #[error("stored record is unreadable: {0}")]
    Corrupt(#[from] CodecError),
    /// The store answered with an error that retrying will not fix
    /// (misconfiguration, a script error).
    #[error("store refused the operation: {detail}")]
    Refused {
        detail: String,
        #[source]
        source: Option<BoxError>,
    },
}

impl StoreError {
    pub fn unavailable(detail: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Unavailable {
            detail: detail.into(),
            source: Some(source.into()),
        }
    }

    pub fn refused(detail: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Refused {
            detail: detail.into(),
            source: Some(source.into()),
        }
    }

    /// True when the same call may succeed later; the HTTP layer answers 503
    /// with Retry-After for these.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable { .. } | Self::RetriesExhausted { .. })
    }
}

/// One record per (caller, key): claim it, do the work once, save the answer.
///
/// Every fenced write takes the [`HeldLease`] its claim returned and reports
/// [`Fenced::LeaseLost`], writing nothing, when that token no longer holds the
/// key. Every method is safe to call again with the same arguments after an
/// error whose outcome is unknown.
#[async_trait]
pub trait IdempotencyStore: Send + Sync {
    /// A short name for metrics and logs (`embedded`, `redis`, ...).
    fn backend_name(&self) -> &'static str;

    /// Insert the record, or inspect it: acquire, replay, in progress or mismatch.
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError>;

    /// Save a recovery point for a handler with several phases.
    async fn checkpoint(&self, lease: &HeldLease, point: RecoveryPoint) -> Result<Fenced, StoreError>;

    /// Save the response and end the lease.
    async fn complete(&self, lease: &HeldLease, response: SavedResponse) -> Result<Fenced, StoreError>;

    /// The outcome is unknown: keep the record, end the lease now, so the
    /// next retry takes over at once.
    async fn release(&self, lease: &HeldLease) -> Result<Fenced, StoreError>;

    /// Validation failed before any effect: delete the record.
    async fn abandon(&self, lease: &HeldLease) -> Result<Fenced, StoreError>;

    /// Delete at most `limit` expired records (and expired tombstones);
    /// `limit` 0 does nothing. Backends whose records expire by themselves
    /// (Redis TTLs) report nothing to do.
    async fn purge_expired(&self, limit: usize) -> Result<PurgeReport, StoreError>;

    /// Read one record, for operators and tests. Expired records are
    /// returned as stored; use [`Record::is_expired`].
    async fn inspect(&self, caller: &CallerId, key: &IdempotencyKey) -> Result<Option<Record>, StoreError>;

    /// Deletes the record of (caller, key digest) only if it cannot be
    /// decoded: the operator's way out for a key that answers
    /// [`StoreError::Corrupt`] (HTTP 500 `record_unreadable`), whose record
    /// has no readable expiry and so would never be purged.
    ///
    /// The record is addressed by the key's SHA-256
    /// ([`IdempotencyKey::digest`], printed as `key_sha256` in the logs),
    /// because that is all an operator has. The check that the record is
    /// unreadable is made in the same transaction (script, statement) as the
    /// delete, with the decoder every other call uses: a readable record is
    /// never deleted ([`ForgetOutcome::Readable`]), since a retry would then
    /// run its effect again; nor is one in a format newer than this build
    /// reads ([`ForgetOutcome::NewerFormat`]): a newer build wrote it, in a
    /// rolling upgrade, and reads it. Tombstones are left as they are.
    ///
    /// Safe to call again: after an unknown outcome, a repeat answers
    /// [`ForgetOutcome::NotFound`] if the first call deleted the record.
    /// A backend whose stored form cannot hold an undecodable record
    /// answers only `NotFound` or `Readable`, truthfully.
    async fn forget_unreadable_record(&self, caller: &CallerId, key: KeyDigest) -> Result<ForgetOutcome, StoreError>;

    /// Cheap round trip for readiness probes.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Where waiters for a change of one record register
    /// (docs/design.md#waiting, [`crate::waiting`]). `None`: this store
    /// cannot wake waiters, and [`crate::claim_waiting`] refuses to wait.
    fn record_changes(&self) -> Option<&crate::waiting::ChangeHub> {
        None
    }
}
