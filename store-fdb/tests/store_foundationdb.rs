//! The FDB-style store's own suite (store-fdb's `testkit`: purge, effects
//! with their completion, FoundationDB's limits, conflicts) on a real
//! FoundationDB cluster: the same functions `store_embedded.rs` runs.
//!
//! Compiled only with the `foundationdb` feature. Running needs a cluster
//! (FoundationDB's default cluster file, or `FDB_CLUSTER_FILE`); without one
//! every test fails with instructions. `scripts/test-foundationdb` starts one.
#![cfg(feature = "foundationdb")]

store_fdb::store_tests!(store_fdb::testkit::foundationdb);
