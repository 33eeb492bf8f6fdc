//! store-core's conformance suite against a real PostgreSQL server.

mod common;

use std::sync::Arc;
use store_core::Policy;
use store_core::testkit::SharedStore;

async fn make(policy: Policy) -> SharedStore {
    Arc::new(common::fresh_store(policy).await)
}

store_core::conformance_tests!(make);
