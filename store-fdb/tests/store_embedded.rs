//! The FDB-style store's own suite (store-fdb's `testkit`: purge, effects
//! with their completion, FoundationDB's limits, conflicts) on the embedded
//! engine. `store_foundationdb.rs` runs the same functions on FoundationDB.

store_fdb::store_tests!(store_fdb::testkit::embedded);
