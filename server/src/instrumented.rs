//! A store wrapper that times every call into
//! `idem_store_operation_duration_seconds{backend, operation, result}`.

use crate::metrics::STORE_OPERATION_DURATION_SECONDS;
use async_trait::async_trait;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;
use store_core::{
    CallerId, ClaimOutcome, ClaimRequest, Fenced, ForgetOutcome, HeldLease, IdempotencyKey, IdempotencyStore,
    KeyDigest, PurgeReport, Record, RecoveryPoint, SavedResponse, StoreError,
};

/// Runs `operation` and records its duration and result.
pub async fn timed<T, E>(
    backend: &'static str,
    operation: &'static str,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let started = Instant::now();
    let result = call.await;
    let outcome = if result.is_ok() {
        STORE_RESULTS[0]
    } else {
        STORE_RESULTS[1]
    };
    metrics::histogram!(
        STORE_OPERATION_DURATION_SECONDS,
        "backend" => backend,
        "operation" => operation,
        "result" => outcome
    )
    .record(started.elapsed().as_secs_f64());
    result
}

/// The `operation` label of every record-store call timed below.
pub const RECORD_OPERATIONS: [&str; 8] = [
    "claim",
    "checkpoint",
    "complete",
    "release",
    "abandon",
    "purge_expired",
    "inspect",
    "ping",
];
/// The `result` label of a timed store call.
pub const STORE_RESULTS: [&str; 2] = ["ok", "error"];

/// Any store, timed.
pub struct InstrumentedStore {
    inner: Arc<dyn IdempotencyStore>,
    backend: &'static str,
}

impl InstrumentedStore {
    pub fn new(inner: Arc<dyn IdempotencyStore>) -> Self {
        let backend = inner.backend_name();
        Self { inner, backend }
    }
}

#[async_trait]
impl IdempotencyStore for InstrumentedStore {
    fn backend_name(&self) -> &'static str {
        self.backend
    }

    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        timed(self.backend, "claim", self.inner.claim(request)).await
    }

    async fn checkpoint(&self, lease: &HeldLease, point: RecoveryPoint) -> Result<Fenced, StoreError> {
        timed(self.backend, "checkpoint", self.inner.checkpoint(lease, point)).await
    }

    async fn complete(&self, lease: &HeldLease, response: SavedResponse) -> Result<Fenced, StoreError> {
        timed(self.backend, "complete", self.inner.complete(lease, response)).await
    }

    async fn release(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        timed(self.backend, "release", self.inner.release(lease)).await
    }

    async fn abandon(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        timed(self.backend, "abandon", self.inner.abandon(lease)).await
    }

    async fn purge_expired(&self, limit: usize) -> Result<PurgeReport, StoreError> {
        timed(self.backend, "purge_expired", self.inner.purge_expired(limit)).await
    }

    async fn inspect(&self, caller: &CallerId, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        timed(self.backend, "inspect", self.inner.inspect(caller, key)).await
    }

    /// Not timed: only the operator command `server
    /// forget-unreadable-record` calls it, once, in a process of its own
    /// that serves no metrics.
    async fn forget_unreadable_record(&self, caller: &CallerId, key: KeyDigest) -> Result<ForgetOutcome, StoreError> {
        self.inner.forget_unreadable_record(caller, key).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        timed(self.backend, "ping", self.inner.ping()).await
    }

    /// The inner store's waiters (docs/design.md#waiting): a wrapper that
    /// kept the default would make every `Prefer: wait` refuse to wait.
    fn record_changes(&self) -> Option<&store_core::ChangeHub> {
        self.inner.record_changes()
    }
}
