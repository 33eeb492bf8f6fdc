//! store-core's waiting suite on a real FoundationDB cluster: two store
//! instances, each over a `Database` handle of its own, so a waiter on one
//! is woken by the other's write only through a FoundationDB watch
//! (src/foundationdb_watches.rs). Needs a cluster, as
//! `conformance_foundationdb.rs`; `scripts/test-foundationdb` starts one.
#![cfg(feature = "foundationdb")]

store_core::waiting_tests!(store_fdb::testkit::foundationdb_store_pair);
