//! The store-core conformance suite on the FDB-style store over a real
//! FoundationDB cluster: the same store and the same behaviours as
//! `conformance_embedded.rs`, with FoundationDB underneath.
//!
//! Compiled only with the `foundationdb` feature, and linking needs
//! FoundationDB's client library. Running needs a cluster: FoundationDB's
//! default cluster file, or the one named by `FDB_CLUSTER_FILE`. Without a
//! reachable cluster every test fails with instructions; none passes
//! silently. See store-fdb/FOUNDATIONDB.md.
#![cfg(feature = "foundationdb")]

use std::sync::Arc;
use std::time::Duration;
use store_core::testkit::SharedStore;
use store_core::{IdempotencyStore, Policy};
use store_fdb::{FoundationDbConfig, FoundationDbNetwork, FoundationDbStore, KeyPrefix};

/// How long the first ping of a store may take before the cluster counts as
/// unreachable.
const CLUSTER_REACHABLE_MS_MAX: u64 = 5_000;
/// Start of every key prefix the suite writes under, so leftovers can be
/// cleared with one `clearrange` (see FOUNDATIONDB.md).
const TEST_PREFIX_START: &str = "idem-test-";

const HOW_TO_RUN: &str = "\
this test needs a running FoundationDB cluster and its client library:
  1. install foundationdb-clients and foundationdb-server 7.3.x (.deb from FoundationDB's GitHub releases);
  2. fdbcli --exec \"configure new single ssd\"   (once, on a new cluster);
  3. fdbcli --exec status                          (must say the database is available);
  4. FDB_CLUSTER_FILE=/etc/foundationdb/fdb.cluster cargo test -p store-fdb --features foundationdb
see store-fdb/FOUNDATIONDB.md";

fn cluster_unavailable(what: &str, error: impl std::fmt::Display) -> ! {
    panic!("FoundationDB {what}: {error}\n{HOW_TO_RUN}");
}

/// A store under a fresh prefix, so that one test's purge sees only its own
/// records and leftovers of earlier runs never interfere.
async fn foundationdb_store(policy: Policy) -> SharedStore {
    let network = FoundationDbNetwork::start().unwrap_or_else(|error| cluster_unavailable("network", error));
    let prefix = format!("{TEST_PREFIX_START}{:016x}", rand::random::<u64>());
    let config = FoundationDbConfig {
        prefix: KeyPrefix::Bytes(prefix.into_bytes()),
        ..FoundationDbConfig::default()
    };
    let store = FoundationDbStore::open_foundationdb(network, &config, policy)
        .await
        .unwrap_or_else(|error| cluster_unavailable("open", error));
    let reachable = tokio::time::timeout(Duration::from_millis(CLUSTER_REACHABLE_MS_MAX), store.ping()).await;
    match reachable {
        Ok(Ok(())) => Arc::new(store),
        Ok(Err(error)) => cluster_unavailable("ping", error),
        Err(_) => cluster_unavailable("ping", format!("no answer within {CLUSTER_REACHABLE_MS_MAX} ms")),
    }
}

store_core::conformance_tests!(foundationdb_store);
