//! The store-core conformance suite on the FDB-style store over the embedded
//! engine, with durable commits as in production, on the suite's manual
//! clock: leases expire when a behaviour moves it.

use std::sync::Arc;
use store_core::testkit::SharedStore;
use store_core::{Policy, SharedClock};
use store_fdb::{EmbeddedConfig, EmbeddedStore};

async fn embedded_store(policy: Policy, clock: SharedClock) -> SharedStore {
    let config = EmbeddedConfig::temporary();
    Arc::new(EmbeddedStore::open_embedded_with_clock(&config, policy, clock).expect("open embedded store"))
}

store_core::conformance_tests!(clocked: embedded_store);
