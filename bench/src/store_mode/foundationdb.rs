//! The FDB-style store on a FoundationDB cluster, and its baseline: the
//! cluster's raw commit rate, one small set per transaction, as the
//! embedded engine's baseline does it. The same intent as on the embedded
//! engine (claim, then `complete_with` writing the label row in the
//! completing transaction), through FoundationDB's client.
//!
//! The cluster is never spawned: it is the one `--foundationdb-cluster-file`
//! names, else `FDB_CLUSTER_FILE`, else FoundationDB's default cluster file.
//! Each run writes under a key prefix of its own (`--foundationdb-key-prefix`,
//! else `bench-` and random hex) and leaves its rows there.

use super::embedded::{FdbIntents, RAW_VALUE_BYTES, RawCommits};
use super::{Baseline, IntentInputs, StoreTarget, TargetError};
use crate::cli::BackendArgs;
use std::sync::Arc;
use store_core::Policy;
use store_fdb::{FoundationDbConfig, KeyPrefix};
use store_registry::{OpenedStore, StoreConfig, StoreKind};

/// The cluster file the bench uses (`None`: FoundationDB's default, which
/// `FDB_CLUSTER_FILE` overrides) and how the report names it.
pub fn cluster_file(args: &BackendArgs) -> (Option<String>, String) {
    let explicit = args
        .foundationdb_cluster_file
        .as_ref()
        .map(|path| path.display().to_string());
    let shown = explicit
        .clone()
        .or_else(|| {
            std::env::var("FDB_CLUSTER_FILE")
                .ok()
                .map(|file| format!("{file} (FDB_CLUSTER_FILE)"))
        })
        .unwrap_or_else(|| "FoundationDB's default cluster file".to_owned());
    (explicit, shown)
}

/// The run's key prefix: the one asked for, else a fresh one.
pub fn key_prefix(args: &BackendArgs) -> String {
    args.foundationdb_key_prefix
        .clone()
        .unwrap_or_else(|| format!("bench-{:016x}", rand::random::<u64>()))
}

pub async fn open(args: &BackendArgs, policy: Policy) -> Result<StoreTarget, TargetError> {
    let (cluster_file, cluster_shown) = cluster_file(args);
    let prefix = key_prefix(args);
    let defaults = FoundationDbConfig::default();
    let batch_items_max = args.claim_batch_items_max.unwrap_or(defaults.batch_items_max);
    let store_config = StoreConfig {
        kind: StoreKind::Foundationdb,
        foundationdb: FoundationDbConfig {
            cluster_file,
            prefix: KeyPrefix::Bytes(prefix.clone().into_bytes()),
            batch_items_max,
            ..defaults
        },
        ..StoreConfig::default()
    };
    let OpenedStore::Foundationdb(store) = super::open_store(&store_config, policy).await? else {
        return Err(super::other_kind(StoreKind::Foundationdb));
    };
    let intents = Arc::new(FdbIntents {
        store: store.clone(),
        inputs: Arc::new(IntentInputs::new("foundationdb")?),
    });
    let raw = Arc::new(RawCommits {
        engine: store.engine().clone(),
    });
    Ok(StoreTarget {
        backend: "foundationdb".into(),
        notes: vec![
            format!("cluster: {cluster_shown}"),
            format!("key prefix: {prefix:?} (left in place after the run)"),
            format!("claims per batch at most: {batch_items_max}"),
            "durability: the cluster's (its storage engine and replication; the bench does not configure them)".into(),
        ],
        intents,
        baseline: Some(Baseline {
            name: "raw FoundationDB commits".into(),
            description: format!(
                "two Engine::run transactions per operation, each setting one {RAW_VALUE_BYTES}-byte value, same cluster"
            ),
            workload: raw,
        }),
        references: None,
        keep_alive: vec![Box::new(store)],
    })
}
