//! The store-core conformance suites (the store API and atomic completion)
//! on the FDB-style store over a real FoundationDB cluster: the same store
//! and the same behaviours as `conformance_embedded.rs`, with FoundationDB
//! underneath.
//!
//! Compiled only with the `foundationdb` feature, and linking needs
//! FoundationDB's client library. Running needs a cluster: FoundationDB's
//! default cluster file, or the one named by `FDB_CLUSTER_FILE`. Without a
//! reachable cluster every test fails with instructions; none passes
//! silently. `scripts/test-foundationdb` starts one; see
//! store-fdb/FOUNDATIONDB.md.
#![cfg(feature = "foundationdb")]

store_core::conformance_tests!(clocked: store_fdb::testkit::foundationdb_store);
store_core::atomic_completion_tests!(store_fdb::testkit::foundationdb_effects);
