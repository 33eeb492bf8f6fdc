//! What the FoundationDB engine is opened with: the cluster file, where
//! the store's keys live and how claims are batched. Outside the
//! `foundationdb` feature, so a server built without FoundationDB still
//! reads (and checks) its config section and refuses the kind only when
//! asked to open it.

use crate::claim_batch::{
    CLAIM_BATCH_ITEMS_MAX_DEFAULT_FOUNDATIONDB, CLAIM_BATCHES_IN_FLIGHT_DEFAULT, ClaimBatchingError, claim_batch_limits,
};
use crate::engine::RunOptions;
use serde::{Deserialize, Deserializer};
use store_core::BatchLimits;
use store_core::config_fields::empty_as_none;

/// Where a store's keys live on the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPrefix {
    /// Fixed bytes, e.g. [`crate::KEY_PREFIX_DEFAULT`].
    Bytes(Vec<u8>),
    /// A directory-layer path, e.g. `["idem", "labels"]`: the directory
    /// layer allocates a short prefix and keeps the name-to-prefix map.
    Directory(Vec<String>),
}

/// How to reach the cluster, where the store's keys live and how claims
/// are batched. The server reads it from its config's `[store.foundationdb]`
/// section: `cluster_file` (empty: FoundationDB's default), `key_prefix`
/// (fixed bytes, written as a string), `batch_items_max` and
/// `batches_in_flight_max`; the run options are for code only.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FoundationDbConfig {
    /// `None`: FoundationDB's default cluster file.
    #[serde(deserialize_with = "empty_as_none")]
    pub cluster_file: Option<String>,
    #[serde(rename = "key_prefix", deserialize_with = "fixed_prefix")]
    pub prefix: KeyPrefix,
    #[serde(skip)]
    pub run_options: RunOptions,
    /// Claims that share one transaction, and so one commit, at most: those
    /// that arrive while a claim batch is in flight go in the next one
    /// (`claim_batch.rs`). 1 turns batching off.
    pub batch_items_max: usize,
    /// Claim batches running at once at most.
    pub batches_in_flight_max: usize,
}

impl Default for FoundationDbConfig {
    fn default() -> Self {
        Self {
            cluster_file: None,
            prefix: KeyPrefix::Bytes(crate::KEY_PREFIX_DEFAULT.to_vec()),
            run_options: RunOptions::default(),
            batch_items_max: CLAIM_BATCH_ITEMS_MAX_DEFAULT_FOUNDATIONDB,
            batches_in_flight_max: CLAIM_BATCHES_IN_FLIGHT_DEFAULT,
        }
    }
}

impl FoundationDbConfig {
    /// How the stores over the engine batch their claims, the settings
    /// checked; `None` when every claim goes alone.
    pub fn claim_batch_limits(&self) -> Result<Option<BatchLimits>, ClaimBatchingError> {
        claim_batch_limits(self.batch_items_max, self.batches_in_flight_max)
    }
}

/// A config file's `key_prefix = "idem"`: fixed bytes (an empty one is
/// refused when the store opens, as any empty prefix).
fn fixed_prefix<'de, D: Deserializer<'de>>(deserializer: D) -> Result<KeyPrefix, D::Error> {
    Ok(KeyPrefix::Bytes(String::deserialize(deserializer)?.into_bytes()))
}
