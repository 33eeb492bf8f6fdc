//! Runs the conformance suites against the smallest possible store: the pure
//! state machine over a mutex-guarded map, with atomic completion done
//! optimistically (run the effect on what was read, commit only if the
//! record did not change meanwhile). It checks the suites and the machine
//! together, before any backend adds I/O; it is not a backend. It reads the
//! injected clock, so the suite moves its time by hand.

use async_trait::async_trait;
use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use store_core::machine::{self, Found, Step, Write};
use store_core::testkit::SharedStore;
use store_core::*;

type Slot = (CallerId, KeyDigest);
/// The records and the tombstones, shared by the handles on one map.
type Map = Arc<Mutex<(BTreeMap<Slot, Record>, HashSet<Slot>)>>;

struct MemoryStore {
    policy: Policy,
    clock: SharedClock,
    state: Map,
    /// In-process notifications, shared by the handles on one map: the
    /// smallest notification source, which checks the waiting suite.
    changes: ChangeHub,
    /// Marker rows written by committed effects.
    markers: Mutex<HashSet<String>>,
    /// While set, every atomic completion fails after its effect ran.
    fail_completions: AtomicBool,
}

impl MemoryStore {
    fn apply<O>(
        &self,
        caller: &CallerId,
        key: &IdempotencyKey,
        transition: impl FnOnce(Found<'_>, u64) -> Step<O>,
    ) -> O {
        let slot = (caller.clone(), key.digest());
        let mut guard = self.state.lock().unwrap();
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
        self.changes.notify(&RecordId::new(&lease.caller, &lease.key));
        Ok(outcome)
    }
    async fn release(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        let outcome = self.apply(&lease.caller, &lease.key, |found, now| {
            machine::release(found, lease.token, now)
        });
        self.changes.notify(&RecordId::new(&lease.caller, &lease.key));
        Ok(outcome)
    }
    async fn abandon(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
        let outcome = self.apply(&lease.caller, &lease.key, |found, now| {
            machine::abandon(found, lease.token, now)
        });
        self.changes.notify(&RecordId::new(&lease.caller, &lease.key));
        Ok(outcome)
    }
    async fn purge_expired(&self, limit: usize) -> Result<PurgeReport, StoreError> {
        let mut guard = self.state.lock().unwrap();
        let (records, tombstones) = &mut *guard;
        let now = self.clock.now_ms();
        let due: Vec<Slot> = records
            .iter()
            .filter(|(_, r)| machine::is_purgeable(r, now))
            .map(|(s, _)| s.clone())
            .take(limit + 1)
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
        Ok(self
            .state
            .lock()
            .unwrap()
            .0
            .get(&(caller.clone(), key.digest()))
            .cloned())
    }
    /// The map holds decoded records, never bytes, so no record here is
    /// unreadable: forget answers `Readable` or `NotFound`, and deletes
    /// nothing.
    async fn forget_unreadable_record(&self, caller: &CallerId, key: KeyDigest) -> Result<ForgetOutcome, StoreError> {
        let found = self.state.lock().unwrap().0.contains_key(&(caller.clone(), key));
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

/// An effect's transaction on the memory store: its marker writes, staged
/// until the commit.
#[derive(Default)]
struct MemoryTransaction {
    markers: Mutex<Vec<String>>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct MemoryEffectError(String);

impl MemoryStore {
    fn read(&self, slot: &Slot) -> Option<Record> {
        self.state.lock().unwrap().0.get(slot).cloned()
    }

    /// Commits the completion and the staged markers if the record is still
    /// `read`; false when it changed meanwhile (a conflict: run again).
    fn commit(&self, slot: &Slot, read: &Option<Record>, completed: Record, transaction: MemoryTransaction) -> bool {
        let mut guard = self.state.lock().unwrap();
        if guard.0.get(slot) != read.as_ref() {
            return false;
        }
        guard.0.insert(slot.clone(), completed);
        let staged = transaction.markers.into_inner().unwrap();
        self.markers.lock().unwrap().extend(staged);
        true
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
                    return Err(StoreError::Unavailable {
                        detail: "injected: the completion failed after its effect".into(),
                        source: None,
                    }
                    .into());
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

struct MemoryHarness {
    store: MemoryStore,
}

impl store_core::testkit::atomic::EffectHarness for MemoryHarness {
    type Store = MemoryStore;

    fn store(&self) -> &MemoryStore {
        &self.store
    }

    fn time(&self) -> store_core::testkit::TestTime {
        store_core::testkit::TestTime::Wall
    }

    fn write_marker<'c>(
        &'c self,
        context: &'c &MemoryTransaction,
        name: &'c str,
    ) -> Pin<Box<dyn Future<Output = Result<(), MemoryEffectError>> + Send + 'c>> {
        Box::pin(async move {
            context.markers.lock().unwrap().push(name.to_owned());
            Ok(())
        })
    }

    async fn marker_exists(&self, name: &str) -> bool {
        self.store.markers.lock().unwrap().contains(name)
    }

    fn effect_failure(&self, detail: &str) -> MemoryEffectError {
        MemoryEffectError(detail.to_owned())
    }

    async fn fail_completions(&self, fail: bool) {
        self.store.fail_completions.store(fail, Ordering::SeqCst);
    }
}

fn memory(policy: Policy, clock: SharedClock) -> MemoryStore {
    MemoryStore {
        policy,
        clock,
        state: Arc::default(),
        changes: ChangeHub::new(),
        markers: Mutex::default(),
        fail_completions: AtomicBool::new(false),
    }
}

async fn memory_store(policy: Policy, clock: SharedClock) -> SharedStore {
    Arc::new(memory(policy, clock))
}

async fn memory_harness(policy: Policy) -> MemoryHarness {
    MemoryHarness {
        store: memory(policy, SystemClock::shared()),
    }
}

/// Two handles on one map, as two instances on one server.
async fn memory_store_pair(policy: Policy) -> (SharedStore, SharedStore) {
    let first = memory(policy, SystemClock::shared());
    let second = MemoryStore {
        clock: Arc::clone(&first.clock),
        state: Arc::clone(&first.state),
        changes: first.changes.clone(),
        ..memory(policy, SystemClock::shared())
    };
    (Arc::new(first), Arc::new(second))
}

store_core::conformance_tests!(clocked: memory_store);
store_core::atomic_completion_tests!(memory_harness);

mod waiting {
    store_core::waiting_tests!(super::memory_store_pair);
}
