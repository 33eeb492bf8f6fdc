//! The store-core conformance suites on the FDB-style store over the
//! embedded engine, with durable commits as in production: the store API on
//! the suite's manual clock (leases expire when a behaviour moves it),
//! atomic completion (an effect committed with the completion), and waiting.
//! Claims are batched (`batched_embedded_config`), as on FoundationDB by
//! default: every claim takes the batched path, a batch of one at least.

use std::sync::Arc;
use store_core::testkit::SharedStore;
use store_core::{Policy, SharedClock};
use store_fdb::testkit::batched_embedded_config;
use store_fdb::{EmbeddedEngine, EmbeddedStore, FdbStore, KEY_PREFIX_DEFAULT};

async fn embedded_store(policy: Policy, clock: SharedClock) -> SharedStore {
    let config = batched_embedded_config();
    Arc::new(EmbeddedStore::open_embedded_with_clock(&config, policy, clock).expect("open embedded store"))
}

store_core::conformance_tests!(clocked: embedded_store);
store_core::atomic_completion_tests!(store_fdb::testkit::embedded_effects);

/// Two stores over one engine: two instances on one database. (Two
/// processes cannot open one embedded database, so in-process is all there
/// is to wake.)
async fn embedded_store_pair(policy: Policy) -> (SharedStore, SharedStore) {
    let engine = EmbeddedEngine::open(&batched_embedded_config()).expect("open embedded engine");
    let first = FdbStore::new(engine.clone(), KEY_PREFIX_DEFAULT, policy);
    let second = FdbStore::new(engine, KEY_PREFIX_DEFAULT, policy);
    (Arc::new(first), Arc::new(second))
}

mod waiting {
    store_core::waiting_tests!(super::embedded_store_pair);
}
