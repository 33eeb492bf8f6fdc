//! The smallest store: store-core's state machine over a mutex-guarded map.
//! Volatile (a restart forgets every record), for tests and examples,
//! never for production; the server accepts it only when built with its
//! `memory-store` feature.
//!
//! It is the reference the suites are checked against before any backend
//! adds I/O: every transition is the machine's pure function applied under
//! one lock, so a suite failing here is a suite (or machine) bug. Atomic
//! completion is done optimistically (run the effect on what was read,
//! commit only if the record did not change meanwhile); an effect's
//! transaction is a set of named rows ([`MemoryTransaction`]) committed with
//! the completion. It reads the injected clock, so a test moves its time by
//! hand. Handles made by [`MemoryStore::another_instance`] share one map
//! and one change hub, as two instances share one server.

use async_trait::async_trait;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use store_core::machine::{self, Found, Step, Write};
use store_core::{
    AtomicCompletion, CallerId, ChangeHub, ClaimOutcome, ClaimRequest, CompleteWithError, CompleteWithFuture,
    Completion, EffectFuture, EffectScope, Fenced, ForgetOutcome, HeldLease, IdempotencyKey, IdempotencyStore,
    KeyDigest, Policy, PurgeReport, Record, RecordId, RecoveryPoint, SavedResponse, SharedClock, StoreError,
};

type Slot = (CallerId, KeyDigest);

/// The records and the tombstones, shared by the handles on one map.
type Map = Arc<Mutex<(BTreeMap<Slot, Record>, HashSet<Slot>)>>;

/// The store: see the crate's documentation.
pub struct MemoryStore {
    policy: Policy,
    clock: SharedClock,
    state: Map,
    /// In-process notifications, shared by the handles on one map.
    changes: ChangeHub,
    /// Rows written by committed effects, shared by the handles on one map.
    rows: Arc<Mutex<HashSet<String>>>,
    /// While set, every atomic completion fails after its effect ran.
    fail_completions: Arc<AtomicBool>,
}

/// A lock whose holder panicked still guards a consistent map: every write
/// under it is one insert or remove.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl MemoryStore {
    /// An empty store reading `clock`.
    pub fn new(policy: Policy, clock: SharedClock) -> Self {
        Self {
            policy,
            clock,
            state: Map::default(),
            changes: ChangeHub::new(),
            rows: Arc::default(),
            fail_completions: Arc::default(),
        }
    }

    /// Another handle on the same map, rows and change hub: a second
    /// instance on the same server, for the waiting suite.
    pub fn another_instance(&self) -> Self {
        Self {
            policy: self.policy,
            clock: Arc::clone(&self.clock),
            state: Arc::clone(&self.state),
            changes: self.changes.clone(),
            rows: Arc::clone(&self.rows),
            fail_completions: Arc::clone(&self.fail_completions),
        }
    }

    /// True once an effect that wrote row `name` committed with its completion.
    pub fn has_row(&self, name: &str) -> bool {
        lock(&self.rows).contains(name)
    }

    /// While `fail` holds, every atomic completion fails after its effect
    /// ran and before it commits (a fault switch for tests).
    pub fn fail_completions_after_effect(&self, fail: bool) {
        self.fail_completions.store(fail, Ordering::SeqCst);
    }

    fn apply<O>(
        &self,
        caller: &CallerId,
        key: &IdempotencyKey,
        transition: impl FnOnce(Found<'_>, u64) -> Step<O>,
    ) -> O {
        let slot = (caller.clone(), key.digest());
        let mut guard = lock(&self.state);
        let (records, tombstones) = &mut *guard;
        let found = match records.get(&slot) {
            Some(record) => Found::Record(record),
            None if tombstones.contains(&slot) => Found::Tombstone,
            None => Found::Nothing,
        };
        let step = transition(found, self.clock.now_ms());
        match step.write {
            Write::Nothing => {}
            Write::Put(record) => {
                records.insert(slot, record);
            }
            Write::Delete => {
                records.remove(&slot);
            }
        }
        step.outcome
    }

    fn notify(&self, lease: &HeldLease) {
        self.changes.notify(&RecordId::new(&lease.caller, &lease.key));
    }
}

#[async_trait]
impl IdempotencyStore for MemoryStore {
    fn backend_name(&self) -> &'static str {
        "memory"
    }
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        Ok(self.apply(&request.caller, &request.key, |found, now| {
            machine::claim(found, request, now, &self.policy)
        }))
    }
    async fn checkpoint(&self, lease: &HeldLease, point: RecoveryPoint) -> Result<Fenced, StoreError> {
        Ok(self.apply(&lease.caller, &lease.key, |found, now| {
            machine::checkpoint(found, lease.token, point, now)
        }))
    }
    async fn complete(&self, lease: &HeldLease, response: SavedResponse) -> Result<Fenced, StoreError> {
        let outcome = self.apply(&lease.caller, &lease.key, |found, now| {
            machine::complete(found, lease.token, response, now, &self.policy)
        });
        self.notify(lease);
        Ok(outcome)
    }
    async fn release(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        let outcome = self.apply(&lease.caller, &lease.key, |found, now| {
            machine::release(found, lease.token, now)
        });
        self.notify(lease);
        Ok(outcome)
    }
    async fn abandon(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        let outcome = self.apply(&lease.caller, &lease.key, |found, now| {
            machine::abandon(found, lease.token, now)
        });
        self.notify(lease);
        Ok(outcome)
    }
    async fn purge_expired(&self, limit: usize) -> Result<PurgeReport, StoreError> {
        let mut guard = lock(&self.state);
        let (records, tombstones) = &mut *guard;
        let now = self.clock.now_ms();
        let due: Vec<Slot> = records
            .iter()
            .filter(|(_, record)| machine::is_purgeable(record, now))
            .map(|(slot, _)| slot.clone())
            .take(limit.saturating_add(1))
            .collect();
        let more = due.len() > limit;
        let records_purged = due.len().min(limit) as u64;
        for slot in due.into_iter().take(limit) {
            records.remove(&slot);
            tombstones.insert(slot);
        }
        Ok(PurgeReport {
            records_purged,
            tombstones_purged: 0,
            records_quarantined: 0,
            more,
        })
    }
    async fn inspect(&self, caller: &CallerId, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        Ok(lock(&self.state).0.get(&(caller.clone(), key.digest())).cloned())
    }
    /// The map holds decoded records, never bytes, so no record here is
    /// unreadable: forget answers `Readable` or `NotFound`, and deletes
    /// nothing.
    async fn forget_unreadable_record(&self, caller: &CallerId, key: KeyDigest) -> Result<ForgetOutcome, StoreError> {
        let found = lock(&self.state).0.contains_key(&(caller.clone(), key));
        Ok(if found {
            ForgetOutcome::Readable
        } else {
            ForgetOutcome::NotFound
        })
    }
    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
    fn record_changes(&self) -> Option<&ChangeHub> {
        Some(&self.changes)
    }
}

/// An effect's transaction on the memory store: the rows it writes, staged
/// until the completion commits.
#[derive(Default)]
pub struct MemoryTransaction {
    rows: Mutex<Vec<String>>,
}

impl MemoryTransaction {
    /// Stages row `name`; it exists once the completion commits.
    pub fn write_row(&self, name: &str) {
        lock(&self.rows).push(name.to_owned());
    }
}

/// An effect's own failure on the memory store.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct MemoryEffectError(pub String);

impl MemoryStore {
    fn read(&self, slot: &Slot) -> Option<Record> {
        lock(&self.state).0.get(slot).cloned()
    }

    /// Commits the completion and the staged rows if the record is still
    /// `read`; false when it changed meanwhile (a conflict: run again).
    fn commit(&self, slot: &Slot, read: &Option<Record>, completed: Record, transaction: MemoryTransaction) -> bool {
        let mut guard = lock(&self.state);
        if guard.0.get(slot) != read.as_ref() {
            return false;
        }
        guard.0.insert(slot.clone(), completed);
        let staged = transaction.rows.into_inner().unwrap_or_else(PoisonError::into_inner);
        lock(&self.rows).extend(staged);
        true
    }

    fn injected_completion_failure() -> StoreError {
        StoreError::Unavailable {
            detail: "injected: the completion failed after its effect".into(),
            source: None,
        }
    }
}

impl AtomicCompletion for MemoryStore {
    type EffectContext<'t> = &'t MemoryTransaction;
    type EffectError = MemoryEffectError;

    fn complete_with<'a, T, F>(
        &'a self,
        lease: &'a HeldLease,
        effect: F,
    ) -> CompleteWithFuture<'a, T, MemoryEffectError>
    where
        T: Send + 'a,
        F: for<'t> Fn(EffectScope<'t, 'a, &'t MemoryTransaction>) -> EffectFuture<'t, T, MemoryEffectError>
            + Send
            + Sync
            + 'a,
    {
        Box::pin(async move {
            let slot = (lease.caller.clone(), lease.key.digest());
            loop {
                let (read, now) = (self.read(&slot), self.clock.now_ms());
                let found = Found::from_record(read.as_ref());
                match machine::completion_fence(found, lease.token, now) {
                    machine::CompletionFence::CompletedByThisToken(response) => {
                        return Ok(Completion::AlreadyCompleted {
                            response: response.clone(),
                        });
                    }
                    machine::CompletionFence::Lost => return Ok(Completion::LeaseLost),
                    machine::CompletionFence::Held => {}
                }
                let transaction = MemoryTransaction::default();
                let (response, value) = effect(EffectScope::new(&transaction))
                    .await
                    .map_err(CompleteWithError::Effect)?;
                if self.fail_completions.load(Ordering::SeqCst) {
                    return Err(Self::injected_completion_failure().into());
                }
                let step = machine::complete(found, lease.token, response.clone(), now, &self.policy);
                let Write::Put(completed) = step.write else {
                    panic!("the fence held, so the completion must write");
                };
                if self.commit(&slot, &read, completed, transaction) {
                    return Ok(Completion::Committed { response, value });
                }
            }
        })
    }
}
