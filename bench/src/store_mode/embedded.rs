//! The FDB-style store on the embedded engine (fjall), and its baseline: the
//! engine's raw durable-commit rate, one small set per transaction.

use super::{Baseline, IntentInputs, StoreTarget, TargetError, claim_not_acquired, completion, store_error};
use crate::engine::Workload;
use crate::recorder::Outcome;
use futures::future::BoxFuture;
use std::path::PathBuf;
use std::sync::Arc;
use store_core::{AtomicCompletion, ClaimOutcome, CompleteWithError, Completion, IdempotencyStore, Policy};
use store_fdb::{Durability, EmbeddedConfig, Engine, FdbStore, MaybeCommitted, RunOptions, Transaction};
use store_registry::{OpenedStore, StoreConfig, StoreKind};

/// Bytes of the value each raw baseline transaction sets: a small row.
pub const RAW_VALUE_BYTES: usize = 100;
/// Key prefix of the raw baseline's rows, apart from the store's own keys.
const RAW_PREFIX: &[u8] = b"bench-raw/";

/// Where and how durably the embedded store keeps its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddedOptions {
    pub durability: Durability,
    /// A directory to use (kept afterwards); a temporary one when `None`.
    pub dir: Option<PathBuf>,
    /// Claims per batch at most; the engine's default when `None`.
    pub claim_batch_items_max: Option<usize>,
}

pub fn durability_name(durability: Durability) -> &'static str {
    match durability {
        Durability::SyncData => "sync-data (fdatasync before each commit is acknowledged)",
        Durability::SyncAll => "sync-all (fsync before each commit is acknowledged)",
        Durability::Buffer => "buffer (OS buffers only: survives a process crash, not power loss)",
    }
}

pub async fn open(options: &EmbeddedOptions, policy: Policy) -> Result<StoreTarget, TargetError> {
    let mut config = match &options.dir {
        Some(dir) => EmbeddedConfig::new(dir),
        None => EmbeddedConfig::temporary(),
    };
    config.durability = options.durability;
    if let Some(items_max) = options.claim_batch_items_max {
        config.batch_items_max = items_max;
    }
    let store_config = StoreConfig {
        kind: StoreKind::Embedded,
        embedded: config.clone(),
        ..StoreConfig::default()
    };
    let OpenedStore::Embedded(store) = super::open_store(&store_config, policy).await? else {
        return Err(super::other_kind(StoreKind::Embedded));
    };
    let intents = Arc::new(FdbIntents {
        store: store.clone(),
        inputs: Arc::new(IntentInputs::new("embedded")?),
    });
    let raw = Arc::new(RawCommits {
        engine: store.engine().clone(),
    });
    Ok(StoreTarget {
        backend: "embedded".into(),
        notes: vec![
            format!("durability: {}", durability_name(options.durability)),
            format!("directory: {}", config.path.display()),
            format!("claims per batch at most: {}", config.batch_items_max),
        ],
        intents,
        baseline: Some(Baseline {
            name: "raw engine commits".into(),
            description: format!(
                "two Engine::run transactions per operation, each setting one {RAW_VALUE_BYTES}-byte value, same engine and durability"
            ),
            workload: raw,
        }),
        references: None,
        keep_alive: vec![Box::new(store)],
    })
}

/// One intent: claim the derived key, then `complete_with` writing the
/// label row in the same transaction as the completed record. On either
/// engine of the FDB-style store (embedded, FoundationDB).
pub(crate) struct FdbIntents<E: Engine> {
    pub(crate) store: Arc<FdbStore<E>>,
    pub(crate) inputs: Arc<IntentInputs>,
}

impl<E: Engine> Workload for FdbIntents<E> {
    fn operation(&self, index: u64) -> BoxFuture<'static, Outcome> {
        let store = self.store.clone();
        let inputs = self.inputs.clone();
        Box::pin(async move { run_intent(&store, &inputs, index).await })
    }
}

async fn run_intent<E: Engine>(store: &FdbStore<E>, inputs: &IntentInputs, index: u64) -> Outcome {
    let (intent, request) = match inputs.claim(index) {
        Ok(claim) => claim,
        Err(outcome) => return outcome,
    };
    let lease = match store.claim(&request).await {
        Ok(ClaimOutcome::Acquired(acquired)) => acquired.lease,
        Ok(other) => return claim_not_acquired(&other),
        Err(error) => return store_error(&error),
    };
    let label_key = store
        .layout()
        .effects()
        .pack(&("label", intent.order_id, intent.parcel_no));
    let label_id = intent.label_id();
    let (label_key, label_id, response) = (&label_key, &label_id, &inputs.response);
    let completed = store
        .complete_with(&lease, |tx| {
            Box::pin(async move {
                tx.set(label_key, label_id.as_bytes())?;
                Ok((response.clone(), ()))
            })
        })
        .await
        .map(Completion::into_fenced)
        .map_err(CompleteWithError::into_store_error);
    completion(completed)
}

/// The engine alone: two transactions that each set one small value.
pub(crate) struct RawCommits<E: Engine> {
    pub(crate) engine: E,
}

impl<E: Engine + Clone> Workload for RawCommits<E> {
    fn operation(&self, index: u64) -> BoxFuture<'static, Outcome> {
        let engine = self.engine.clone();
        Box::pin(async move {
            for half in 0..2u64 {
                if let Err(error) = raw_commit(&engine, index * 2 + half).await {
                    return store_error(&error);
                }
            }
            Outcome::success("raw_pair")
        })
    }
}

async fn raw_commit<E: Engine>(engine: &E, number: u64) -> Result<(), store_core::StoreError> {
    let mut key = RAW_PREFIX.to_vec();
    key.extend_from_slice(&number.to_be_bytes());
    let value = [0x5a_u8; RAW_VALUE_BYTES];
    let (key, value) = (&key, &value);
    engine
        .run(
            RunOptions::default(),
            |tx, _maybe_committed: MaybeCommitted| async move {
                tx.set(key, value)?;
                Ok(())
            },
        )
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_intent_claims_completes_and_writes_its_label_row() {
        let options = EmbeddedOptions {
            durability: Durability::Buffer,
            dir: None,
            claim_batch_items_max: None,
        };
        let target = open(&options, Policy::default()).await.unwrap();
        assert_eq!(target.intents.operation(0).await, Outcome::success("first_run"));
        // The same intent again finds its key completed: store mode counts a
        // replay of a fresh key as a failure.
        assert_eq!(target.intents.operation(0).await, Outcome::failure("unexpected_replay"));
        let baseline = target.baseline.unwrap();
        assert_eq!(baseline.workload.operation(0).await, Outcome::success("raw_pair"));
    }
}
