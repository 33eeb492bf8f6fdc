//! store-core's suites on the memory store: conformance (on a manual
//! clock), atomic completion, and waiting across two handles on one map.
//! They check the suites and the machine together, before any backend adds
//! I/O.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use store_core::testkit::atomic::EffectHarness;
use store_core::testkit::{SharedStore, TestTime};
use store_core::{Policy, SharedClock, SystemClock};
use store_memory::{MemoryEffectError, MemoryStore, MemoryTransaction};

struct MemoryHarness {
    store: MemoryStore,
}

impl EffectHarness for MemoryHarness {
    type Store = MemoryStore;

    fn store(&self) -> &MemoryStore {
        &self.store
    }

    fn time(&self) -> TestTime {
        TestTime::Wall
    }

    fn write_marker<'c>(
        &'c self,
        context: &'c &MemoryTransaction,
        name: &'c str,
    ) -> Pin<Box<dyn Future<Output = Result<(), MemoryEffectError>> + Send + 'c>> {
        Box::pin(async move {
            context.write_row(name);
            Ok(())
        })
    }

    async fn marker_exists(&self, name: &str) -> bool {
        self.store.has_row(name)
    }

    fn effect_failure(&self, detail: &str) -> MemoryEffectError {
        MemoryEffectError(detail.to_owned())
    }

    async fn fail_completions(&self, fail: bool) {
        self.store.fail_completions_after_effect(fail);
    }
}

async fn memory_store(policy: Policy, clock: SharedClock) -> SharedStore {
    Arc::new(MemoryStore::new(policy, clock))
}

async fn memory_harness(policy: Policy) -> MemoryHarness {
    MemoryHarness {
        store: MemoryStore::new(policy, SystemClock::shared()),
    }
}

/// Two handles on one map, as two instances on one server.
async fn memory_store_pair(policy: Policy) -> (SharedStore, SharedStore) {
    let first = MemoryStore::new(policy, SystemClock::shared());
    let second = first.another_instance();
    (Arc::new(first), Arc::new(second))
}

store_core::conformance_tests!(clocked: memory_store);
store_core::atomic_completion_tests!(memory_harness);

mod waiting {
    store_core::waiting_tests!(super::memory_store_pair);
}
