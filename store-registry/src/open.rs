//! Opening the record store `store.kind` names: the one place a backend
//! is opened, for the Label service, its operator's commands and idem-bench.

use crate::config::StoreConfig;
use crate::kind::StoreKind;
use std::sync::Arc;
use store_core::{IdempotencyStore, Policy, SharedClock, StoreError};
use store_fdb::EmbeddedStore;

/// One opened record store, by kind, without a caller's wrappers: what the
/// server times and hands to its idempotency layer, the bench drives and
/// tests audit.
#[derive(Clone)]
pub enum OpenedStore {
    Embedded(Arc<EmbeddedStore>),
    Redis(Arc<store_redis::RedisStore>),
    Postgres(Arc<store_postgres::PostgresStore>),
    #[cfg(feature = "foundationdb")]
    Foundationdb(Arc<store_fdb::FoundationDbStore>),
    #[cfg(feature = "memory-store")]
    Memory(Arc<store_memory::MemoryStore>),
}

impl OpenedStore {
    /// The store as the idempotency layer takes it.
    pub fn records(&self) -> Arc<dyn IdempotencyStore> {
        match self {
            OpenedStore::Embedded(store) => store.clone(),
            OpenedStore::Redis(store) => store.clone(),
            OpenedStore::Postgres(store) => store.clone(),
            #[cfg(feature = "foundationdb")]
            OpenedStore::Foundationdb(store) => store.clone(),
            #[cfg(feature = "memory-store")]
            OpenedStore::Memory(store) => store.clone(),
        }
    }
}

/// Why a store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("store.kind = \"{kind}\": {detail}")]
    Refused { kind: &'static str, detail: String },
    /// A store's TLS (its files, or its handshake at startup) failed:
    /// "PostgreSQL TLS: ..." or "Redis TLS: ...", with the cause.
    #[error("store.kind = \"{kind}\": {detail}")]
    Tls { kind: &'static str, detail: String },
    #[error("store.kind = \"{kind}\": {source}")]
    Store {
        kind: &'static str,
        #[source]
        source: StoreError,
    },
}

/// Opens the record store `config.kind` names, and nothing else: no label
/// store, no migrations (the caller runs its own: the server its labels',
/// the bench its effect rows'). The one place a backend is opened.
/// `clock` is what the embedded, FoundationDB and memory stores read;
/// Redis and PostgreSQL decide expiry by their servers' clocks and take
/// none (ARCHITECTURE.md, "Which clock decides lease expiry").
pub async fn open_store(
    config: &StoreConfig,
    policy: Policy,
    clock: &SharedClock,
) -> Result<OpenedStore, BackendError> {
    let kind = config.kind;
    if !kind.is_built() {
        return Err(not_built(kind));
    }
    match kind {
        StoreKind::Embedded => Ok(OpenedStore::Embedded(open_embedded(config, policy, kind, clock)?)),
        StoreKind::Redis => Ok(OpenedStore::Redis(Arc::new(redis_store(config, policy).await?))),
        StoreKind::Postgres => Ok(OpenedStore::Postgres(Arc::new(open_postgres(config, policy, kind)?))),
        StoreKind::Foundationdb => foundationdb_store(config, policy, clock).await,
        StoreKind::Memory => memory_store(policy, clock),
    }
}

/// The embedded store of `[store.embedded]`: the records' with kind
/// `embedded`, or the labels' beside records of kind `kind`.
pub fn open_embedded(
    config: &StoreConfig,
    policy: Policy,
    kind: StoreKind,
    clock: &SharedClock,
) -> Result<Arc<EmbeddedStore>, BackendError> {
    EmbeddedStore::open_embedded_with_clock(&config.embedded, policy, clock.clone())
        .map(Arc::new)
        .map_err(|source| BackendError::Store {
            kind: kind.name(),
            source,
        })
}

/// The PostgreSQL store of `[store.postgres]`, a pool not yet connected:
/// the records' with kind `postgres`, or the labels' beside records of
/// kind `kind`.
pub fn open_postgres(
    config: &StoreConfig,
    policy: Policy,
    kind: StoreKind,
) -> Result<store_postgres::PostgresStore, BackendError> {
    let kind = kind.name();
    store_postgres::PostgresStore::new(&config.postgres, policy).map_err(|error| match error {
        store_postgres::ConfigError::Tls(tls) => BackendError::Tls {
            kind,
            detail: tls.to_string(),
        },
        other => BackendError::Refused {
            kind,
            detail: other.to_string(),
        },
    })
}

/// Runs the PostgreSQL store's migrations and `extra` (the caller's own
/// tables): the first connection, where a wrong CA shows.
pub async fn migrate_postgres(
    store: &store_postgres::PostgresStore,
    kind: StoreKind,
    extra: &[store_postgres::Migration],
) -> Result<(), BackendError> {
    let kind = kind.name();
    store.migrate(extra).await.map(drop).map_err(|error| match error {
        store_postgres::MigrateError::Store(StoreError::Refused { detail, .. })
            if detail.starts_with(store_postgres::TLS_ERROR_PREFIX) =>
        {
            BackendError::Tls { kind, detail }
        }
        other => BackendError::Refused {
            kind,
            detail: format!("migrations: {other}"),
        },
    })
}

#[cfg(feature = "memory-store")]
fn memory_store(policy: Policy, clock: &SharedClock) -> Result<OpenedStore, BackendError> {
    Ok(OpenedStore::Memory(Arc::new(store_memory::MemoryStore::new(
        policy,
        clock.clone(),
    ))))
}

#[cfg(not(feature = "memory-store"))]
fn memory_store(_policy: Policy, _clock: &SharedClock) -> Result<OpenedStore, BackendError> {
    Err(not_built(StoreKind::Memory))
}

/// The refusal of a kind this binary was built without, naming the
/// feature that builds it in.
fn not_built(kind: StoreKind) -> BackendError {
    let facts = kind.facts();
    let feature = facts.cargo_feature.unwrap_or("default");
    BackendError::Refused {
        kind: facts.name,
        detail: format!(
            "this binary was built without it; rebuild with `cargo build --release -p server --features {feature}`{}",
            facts.left_out_because
        ),
    }
}

/// The Redis record store of `[store.redis]`, connected and checked; its
/// TLS refusals are configuration errors of their own.
async fn redis_store(config: &StoreConfig, policy: Policy) -> Result<store_redis::RedisStore, BackendError> {
    let kind = StoreKind::Redis.name();
    let store = store_redis::RedisStore::connect(config.redis.clone(), policy)
        .await
        .map_err(|source| match &source {
            StoreError::Refused { detail, .. } if detail.starts_with(store_redis::TLS_ERROR_PREFIX) => {
                BackendError::Tls {
                    kind,
                    detail: detail.clone(),
                }
            }
            _ => BackendError::Store { kind, source },
        })?;
    for warning in &store.server_report().warnings {
        tracing::warn!(warning = %warning, "redis");
    }
    Ok(store)
}

/// The FoundationDB store of `[store.foundationdb]`.
#[cfg(feature = "foundationdb")]
async fn foundationdb_store(
    config: &StoreConfig,
    policy: Policy,
    clock: &SharedClock,
) -> Result<OpenedStore, BackendError> {
    use store_fdb::{FoundationDbNetwork, FoundationDbStore};
    let store_error = |source| BackendError::Store {
        kind: StoreKind::Foundationdb.name(),
        source,
    };
    let network = FoundationDbNetwork::start().map_err(store_error)?;
    FoundationDbStore::open_foundationdb(network, &config.foundationdb, policy)
        .await
        .map(|store| OpenedStore::Foundationdb(Arc::new(store.with_clock(clock.clone()))))
        .map_err(store_error)
}

#[cfg(not(feature = "foundationdb"))]
async fn foundationdb_store(
    _config: &StoreConfig,
    _policy: Policy,
    _clock: &SharedClock,
) -> Result<OpenedStore, BackendError> {
    Err(not_built(StoreKind::Foundationdb))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kind this binary was built without is refused naming the cargo
    /// feature that builds it in, whichever features this build has.
    #[test]
    fn a_kind_left_out_is_refused_naming_its_feature() {
        for kind in StoreKind::ALL {
            let Some(feature) = kind.cargo_feature() else {
                continue;
            };
            let refusal = not_built(kind).to_string();
            assert!(refusal.contains(&format!("--features {feature}")), "{kind}: {refusal}");
            assert!(refusal.contains(kind.name()), "{kind}: {refusal}");
        }
    }
}
