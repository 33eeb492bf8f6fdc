//! What the store answers: claim outcomes, fenced-write outcomes, requests.

use crate::types::{CallerId, Fingerprint, IdempotencyKey, LeaseToken, RecoveryPoint, SavedResponse};

/// A request to claim (or inspect) one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    pub caller: CallerId,
    pub key: IdempotencyKey,
    pub fingerprint: Fingerprint,
    /// Made once per attempt, before the first send: a claim re-sent with the
    /// same token is the same attempt and gets its lease back.
    pub token: LeaseToken,
}

impl ClaimRequest {
    /// A claim for a new attempt, with a fresh random lease token.
    pub fn new(caller: CallerId, key: IdempotencyKey, fingerprint: Fingerprint) -> Self {
        Self {
            caller,
            key,
            fingerprint,
            token: LeaseToken::random(),
        }
    }
}

/// Proof that an attempt held the lease on (caller, key) with `token`. Every
/// fenced write takes one; the store checks the token, not the clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLease {
    pub caller: CallerId,
    pub key: IdempotencyKey,
    pub token: LeaseToken,
    pub locked_until_ms: u64,
}

/// The attempt now owns the key and should run the handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquired {
    pub lease: HeldLease,
    /// True when an earlier attempt's lease expired (or was released) and
    /// this attempt took over: the earlier one may have run part of the work.
    pub takeover: bool,
    /// What the earlier attempt saved with `checkpoint`, if it took over.
    pub recovery_point: Option<RecoveryPoint>,
    /// True when the key had been seen before and purged (a tombstone, or an
    /// expired record not yet swept): the request arrived after the retention
    /// window and may duplicate an effect. Operators alert on these.
    pub late_key: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    Acquired(Acquired),
    /// Completed before with the same fingerprint: answer with this.
    Replay(SavedResponse),
    /// Another attempt holds a live lease; retry after this long.
    InProgress {
        retry_after_ms: u64,
    },
    /// The key was used with a different request.
    Mismatch,
}

impl ClaimOutcome {
    /// A short name for the outcome, for logs, metrics and assertions.
    pub fn kind(&self) -> &'static str {
        match self {
            ClaimOutcome::Acquired(_) => "acquired",
            ClaimOutcome::Replay(_) => "replay",
            ClaimOutcome::InProgress { .. } => "in_progress",
            ClaimOutcome::Mismatch => "mismatch",
        }
    }
}

/// Outcome of a fenced write (checkpoint, complete, release, abandon).
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced<T = ()> {
    /// The write happened (or had already happened for this same token).
    Applied(T),
    /// The token no longer holds the key: another attempt took over, or the
    /// record is gone. Nothing was written.
    LeaseLost,
}

impl<T> Fenced<T> {
    pub fn is_applied(&self) -> bool {
        matches!(self, Fenced::Applied(_))
    }
}

/// What one purge batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Records deleted because they had expired.
    pub records_purged: u64,
    /// Tombstones deleted because their own window ended.
    pub tombstones_purged: u64,
    /// Records that could not be decoded: left in place, taken out of the
    /// purge's way (so one bad record does not stop every run) and reported
    /// once. Their keys answer "record unreadable" until an operator deletes
    /// them with [`crate::IdempotencyStore::forget_unreadable_record`].
    pub records_quarantined: u64,
    /// True when the batch limit was reached and more may be due.
    pub more: bool,
}

/// What [`crate::IdempotencyStore::forget_unreadable_record`] found, and did.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForgetOutcome {
    /// The record could not be decoded, and it is deleted: the key may be
    /// claimed again.
    Deleted,
    /// There is no record under that caller and key digest (never written,
    /// purged, or deleted already, for instance by an earlier try of the
    /// same call whose reply was lost).
    NotFound,
    /// The record decodes, so it was left unchanged: deleting a readable
    /// record would let a retry run its effect a second time.
    Readable,
    /// The record is in a format newer than this build reads (a newer
    /// build wrote it, during a rolling upgrade), so it was left unchanged:
    /// it is readable there, and an unknown version is not corruption.
    NewerFormat,
}

impl ForgetOutcome {
    /// A short name for the outcome, for output and assertions.
    pub fn kind(&self) -> &'static str {
        match self {
            ForgetOutcome::Deleted => "deleted",
            ForgetOutcome::NotFound => "not_found",
            ForgetOutcome::Readable => "readable",
            ForgetOutcome::NewerFormat => "newer_format",
        }
    }
}
