//! The store-core conformance suite on the FDB-style store over the embedded
//! engine, with durable commits as in production.

use std::sync::Arc;
use store_core::Policy;
use store_core::testkit::SharedStore;
use store_fdb::{EmbeddedConfig, EmbeddedEngine, EmbeddedStore, FdbStore, KEY_PREFIX_DEFAULT};

async fn embedded_store(policy: Policy) -> SharedStore {
    Arc::new(EmbeddedStore::open_embedded(&EmbeddedConfig::temporary(), policy).expect("open embedded store"))
}

store_core::conformance_tests!(embedded_store);

/// Two stores over one engine: two instances on one database. (Two
/// processes cannot open one embedded database, so in-process is all there
/// is to wake.)
async fn embedded_store_pair(policy: Policy) -> (SharedStore, SharedStore) {
    let engine = EmbeddedEngine::open(&EmbeddedConfig::temporary()).expect("open embedded engine");
    let first = FdbStore::new(engine.clone(), KEY_PREFIX_DEFAULT, policy);
    let second = FdbStore::new(engine, KEY_PREFIX_DEFAULT, policy);
    (Arc::new(first), Arc::new(second))
}

mod waiting {
    store_core::waiting_tests!(super::embedded_store_pair);
}
