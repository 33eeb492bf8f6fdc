//! Runs the conformance suite against the smallest possible store: the pure
//! state machine over a mutex-guarded map. It checks the suite and the
//! machine together, before any backend adds I/O; it is not a backend. It
//! reads the injected clock, so the suite moves its time by hand.

use async_trait::async_trait;
use std::collections::{BTreeMap, HashSet};
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

async fn memory_store(policy: Policy, clock: SharedClock) -> SharedStore {
    Arc::new(MemoryStore {
        policy,
        clock,
        state: Arc::default(),
        changes: ChangeHub::new(),
    })
}

/// Two handles on one map, as two instances on one server.
async fn memory_store_pair(policy: Policy) -> (SharedStore, SharedStore) {
    let first = MemoryStore {
        policy,
        clock: SystemClock::shared(),
        state: Arc::default(),
        changes: ChangeHub::new(),
    };
    let second = MemoryStore {
        policy,
        clock: Arc::clone(&first.clock),
        state: Arc::clone(&first.state),
        changes: first.changes.clone(),
    };
    (Arc::new(first), Arc::new(second))
}

store_core::conformance_tests!(clocked: memory_store);

mod waiting {
    store_core::waiting_tests!(super::memory_store_pair);
}
