//! idem's store API: the types, the pure per-key state machine, the record
//! and saved-response codecs, atomic completion ([`AtomicCompletion`]),
//! bulk loading of completed records ([`BulkLoad`]) and
//! (behind the `testkit` feature) the conformance suites that every backend
//! passes.
//!
//! This crate does no I/O and knows no backend: backends bring the
//! transactions and the bytes on disk, and read the time from a [`Clock`]
//! (the machine itself takes it as an argument).

pub mod atomic;
pub mod batch;
pub mod bulk;
pub mod clock;
pub mod codec;
pub mod config_fields;
pub mod fingerprint;
pub mod machine;
pub mod outcome;
pub mod redact;
pub mod store;
pub mod types;
pub mod waiting;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use atomic::{AtomicCompletion, CompleteWithError, CompleteWithFuture, Completion, EffectFuture, EffectScope};
pub use batch::{BatchError, BatchLimits, BatchRunner, Batcher, InvalidBatchLimits};
pub use bulk::{BulkLoad, CompletedRecord, check_bulk_batch};
pub use clock::{Clock, ManualClock, SharedClock, SystemClock};
pub use codec::{
    CodecError, ENCODED_RESPONSE_BYTES_MAX, decode_record, decode_response, decode_response_deflated, encode_record,
    encode_response, encode_response_deflated,
};
pub use outcome::{Acquired, ClaimOutcome, ClaimRequest, Fenced, ForgetOutcome, HeldLease, PurgeReport};
pub use store::{BoxError, IdempotencyStore, PURGE_BATCH_MAX, StoreError};
pub use types::*;
pub use waiting::{
    ChangeHub, ChangeNotifier, ChangeSource, RecordId, RecordWatch, WaitLimits, WaitRefused, WaitedClaim, WatchGuard,
    Woken, claim_waiting, reconnect_delay,
};
