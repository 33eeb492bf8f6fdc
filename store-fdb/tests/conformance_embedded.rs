//! The store-core conformance suites on the FDB-style store over the
//! embedded engine, with durable commits as in production: the store API,
//! and atomic completion (an effect committed with the completion).

use std::sync::Arc;
use store_core::Policy;
use store_core::testkit::SharedStore;
use store_fdb::{EmbeddedConfig, EmbeddedStore};

async fn embedded_store(policy: Policy) -> SharedStore {
    Arc::new(EmbeddedStore::open_embedded(&EmbeddedConfig::temporary(), policy).expect("open embedded store"))
}

store_core::conformance_tests!(embedded_store);
store_core::atomic_completion_tests!(store_fdb::testkit::embedded_effects);
