//! Store mode: drive the `IdempotencyStore` API directly, one intent being
//! a claim and then a completion with an effect, so that store cost and HTTP
//! cost can be told apart.
//!
//! Each backend module builds a [`StoreTarget`]: the intent workload, a raw
//! baseline workload on the same engine or server (what the store would cost
//! if it were free), and whatever keeps a spawned server alive. Backends plug
//! in independently; redis, postgres and foundationdb are cargo features
//! (foundationdb off by default: it links FoundationDB's client library).

pub mod embedded;
#[cfg(feature = "foundationdb")]
pub mod foundationdb;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
pub mod run;

use crate::engine::Workload;
use crate::intent::{CALLER_ID, Intent, RunIds};
use crate::recorder::Outcome;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use store_core::{
    CallerId, ClaimOutcome, ClaimRequest, Fenced, Fingerprint, IdempotencyKey, SavedResponse, StoreError,
};
use store_registry::{OpenedStore, StoreConfig, StoreKind};

/// What every store-mode intent sends besides its own key. The fingerprint
/// and the saved response are made once per run, so that the bench's own
/// JSON and hashing work is not counted as the store's; each intent still
/// claims its own derived key (the key is what the store indexes).
#[derive(Debug, Clone)]
pub struct IntentInputs {
    pub ids: RunIds,
    pub caller: CallerId,
    pub fingerprint: Fingerprint,
    pub response: SavedResponse,
}

impl IntentInputs {
    pub fn new(backend: &'static str) -> Result<Self, TargetError> {
        let ids = RunIds::random();
        let template = ids.intent(0);
        Ok(Self {
            ids,
            caller: CallerId::new(CALLER_ID).map_err(|error| TargetError::unavailable(backend, error))?,
            fingerprint: template.fingerprint(),
            response: template
                .saved_response()
                .map_err(|error| TargetError::unavailable(backend, error))?,
        })
    }

    /// Intent `index` and its claim (a fresh lease token).
    pub fn claim(&self, index: u64) -> Result<(Intent, ClaimRequest), Outcome> {
        let intent = self.ids.intent(index);
        let key = IdempotencyKey::new(&intent.derived_key()).map_err(|_| Outcome::failure("invalid_key"))?;
        Ok((intent, ClaimRequest::new(self.caller.clone(), key, self.fingerprint)))
    }
}

/// A raw baseline: the engine or server doing the same number of round
/// trips or commits as one intent, without the store's logic. Each of its
/// operations is one raw *pair* (two commits, two script calls, two
/// transactions), so its rate compares directly with intents per second.
pub struct Baseline {
    pub name: String,
    pub description: String,
    pub workload: Arc<dyn Workload>,
}

/// A reference rate measured by an outside tool (e.g. `redis-benchmark`),
/// reported beside the baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReferenceRate {
    pub name: String,
    pub command: String,
    /// Calls per second as the tool reported them.
    pub calls_per_s: f64,
    /// The same as pairs of calls per second, comparable with intents/s.
    pub pairs_per_s: f64,
}

/// Something that must stay alive while a target is in use: a spawned
/// server, a temporary directory, the store itself.
pub type KeepAlive = Box<dyn std::any::Any + Send + Sync>;

/// Where a backend's server is, what keeps it running when the bench
/// spawned it, and how it runs (for the report).
pub struct ServerAddress {
    pub url: String,
    pub guard: Option<KeepAlive>,
    pub note: String,
}

/// One backend ready for store mode.
pub struct StoreTarget {
    pub backend: String,
    /// Durability and deployment facts that the numbers depend on.
    pub notes: Vec<String>,
    pub intents: Arc<dyn Workload>,
    pub baseline: Option<Baseline>,
    /// Measures outside references after the in-process runs, if any.
    pub references: Option<Box<dyn References>>,
    /// Keeps spawned servers and temporary directories alive until the
    /// target is dropped.
    pub keep_alive: Vec<KeepAlive>,
}

/// Reference measurements by outside tools, run against the same server.
pub trait References: Send + Sync {
    fn measure(&self, duration_s: u64, concurrency: usize) -> Vec<ReferenceRate>;
}

/// Why a target could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("{backend}: {detail}")]
    Unavailable { backend: &'static str, detail: String },
    #[error("backend {0} is not built into this binary (cargo feature missing)")]
    NotBuilt(String),
}

impl TargetError {
    pub fn unavailable(backend: &'static str, detail: impl std::fmt::Display) -> Self {
        Self::Unavailable {
            backend,
            detail: detail.to_string(),
        }
    }
}

/// The outcome of a claim that did not acquire a fresh key. Store-mode keys
/// are fresh, so each of these means something is wrong and counts as a failure.
pub fn claim_not_acquired(outcome: &ClaimOutcome) -> Outcome {
    match outcome {
        ClaimOutcome::Acquired(_) => Outcome::success("acquired"),
        ClaimOutcome::Replay(_) => Outcome::failure("unexpected_replay"),
        ClaimOutcome::InProgress { .. } => Outcome::failure("unexpected_in_progress"),
        ClaimOutcome::Mismatch => Outcome::failure("unexpected_mismatch"),
    }
}

/// The outcome of a completion.
pub fn completion<T>(completed: Result<Fenced<T>, StoreError>) -> Outcome {
    match completed {
        Ok(Fenced::Applied(_)) => Outcome::success("first_run"),
        Ok(Fenced::LeaseLost) => Outcome::failure("lease_lost"),
        Err(error) => store_error(&error),
    }
}

/// A store error, by kind.
pub fn store_error(error: &StoreError) -> Outcome {
    match error {
        StoreError::Unavailable { .. } => Outcome::failure("store_unavailable"),
        StoreError::RetriesExhausted { .. } => Outcome::failure("store_retries_exhausted"),
        StoreError::TooLarge(_) => Outcome::failure("store_too_large"),
        StoreError::InvalidInput(_) => Outcome::failure("store_invalid_input"),
        StoreError::Corrupt(_) => Outcome::failure("store_corrupt"),
        StoreError::Refused { .. } => Outcome::failure("store_refused"),
    }
}

/// Opens the record store `config` names through the store registry
/// (`store_registry::open_store`), the one place a backend is opened, as
/// the server does; the bench then drives it directly, with its own effect
/// rows.
pub async fn open_store(config: &StoreConfig, policy: store_core::Policy) -> Result<OpenedStore, TargetError> {
    store_registry::open_store(config, policy, &store_core::SystemClock::shared())
        .await
        .map_err(|error| TargetError::unavailable(config.kind.name(), error))
}

/// The refusal of a store the registry opened as another kind (it opens
/// what `store.kind` names, so this is a bench bug).
pub fn other_kind(expected: StoreKind) -> TargetError {
    TargetError::unavailable(expected.name(), "the registry opened another kind of store")
}

/// Prepares `backend` for store mode: opens the embedded store, or connects
/// to (or spawns) the backend's server.
pub async fn prepare(
    backend: StoreKind,
    args: &crate::cli::BackendArgs,
    policy: store_core::Policy,
) -> Result<StoreTarget, TargetError> {
    match backend {
        StoreKind::Embedded => {
            let options = embedded::EmbeddedOptions {
                durability: args.embedded_durability.durability(),
                dir: args.embedded_dir.clone(),
                claim_batch_items_max: args.claim_batch_items_max,
            };
            embedded::open(&options, policy).await
        }
        StoreKind::Redis => prepare_redis(args, policy).await,
        StoreKind::Postgres => prepare_postgres(args, policy).await,
        StoreKind::Foundationdb => prepare_foundationdb(args, policy).await,
        // A backend is benchmarked once it has an arm above (and a raw baseline).
        other => Err(TargetError::unavailable(other.name(), "not a benchmarked backend")),
    }
}

#[cfg(feature = "foundationdb")]
async fn prepare_foundationdb(
    args: &crate::cli::BackendArgs,
    policy: store_core::Policy,
) -> Result<StoreTarget, TargetError> {
    foundationdb::open(args, policy).await
}

#[cfg(not(feature = "foundationdb"))]
async fn prepare_foundationdb(_: &crate::cli::BackendArgs, _: store_core::Policy) -> Result<StoreTarget, TargetError> {
    Err(TargetError::NotBuilt("foundationdb".into()))
}

#[cfg(feature = "redis")]
async fn prepare_redis(args: &crate::cli::BackendArgs, policy: store_core::Policy) -> Result<StoreTarget, TargetError> {
    redis::open(args, policy).await
}

#[cfg(not(feature = "redis"))]
async fn prepare_redis(_: &crate::cli::BackendArgs, _: store_core::Policy) -> Result<StoreTarget, TargetError> {
    Err(TargetError::NotBuilt("redis".into()))
}

#[cfg(feature = "postgres")]
async fn prepare_postgres(
    args: &crate::cli::BackendArgs,
    policy: store_core::Policy,
) -> Result<StoreTarget, TargetError> {
    postgres::open(args, policy).await
}

#[cfg(not(feature = "postgres"))]
async fn prepare_postgres(_: &crate::cli::BackendArgs, _: store_core::Policy) -> Result<StoreTarget, TargetError> {
    Err(TargetError::NotBuilt("postgres".into()))
}
