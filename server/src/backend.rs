//! Opens the stores that `store.kind` and `store.labels` name.
//!
//! | kind           | labels         | records          | labels live in                  | label + record   | instances |
//! |----------------|----------------|------------------|---------------------------------|------------------|-----------|
//! | `embedded`     | `with_records` | embedded (fjall) | same store, effects subspace    | one transaction  | one       |
//! | `foundationdb` | `with_records` | FoundationDB     | same store, effects subspace    | one transaction  | many      |
//! | `postgres`     | `with_records` | PostgreSQL       | `labels` table, same database   | one transaction  | many      |
//! | `redis`        | `embedded`     | Redis            | embedded store (a local dir)    | separate commits | one       |
//! | `redis`        | `postgres`     | Redis            | `labels` table in PostgreSQL    | separate commits | many      |

use crate::config::{Config, DurabilityConfig, LabelsKind, StoreKind};
use crate::instrumented::InstrumentedStore;
use crate::labels::{FdbLabels, LABELS_MIGRATION, LabelStore, PostgresLabels, SplitLabels};
use std::sync::Arc;
use store_core::{IdempotencyStore, Policy, SharedClock, StoreError};
use store_fdb::{Durability, EmbeddedConfig, EmbeddedEngine, EmbeddedStore};

/// The opened stores.
pub struct Backends {
    pub kind: StoreKind,
    /// Every record operation goes through here (timed).
    pub records: Arc<dyn IdempotencyStore>,
    pub labels: Arc<dyn LabelStore>,
    /// One line for the startup log: where records and labels live.
    pub description: String,
    /// The embedded engine, if one is open: flushed at shutdown, observed
    /// by the metrics.
    pub embedded: Option<EmbeddedEngine>,
}

/// Why the stores could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("store.kind = \"{kind}\": {detail}")]
    Refused { kind: &'static str, detail: String },
    #[error("store.kind = \"{kind}\": {source}")]
    Store {
        kind: &'static str,
        #[source]
        source: StoreError,
    },
}

impl Backends {
    /// Makes everything committed durable; called at shutdown.
    pub fn flush(&self) -> Result<(), StoreError> {
        match &self.embedded {
            Some(engine) => engine.flush(),
            None => Ok(()),
        }
    }
}

/// Opens the stores of `config.store.kind`. The embedded and FoundationDB
/// stores read `clock` (the server's one clock, the idempotency layer's
/// too); Redis and PostgreSQL decide expiry by their servers' clocks and
/// take none (ARCHITECTURE.md, "Which clock decides lease expiry").
pub async fn open(config: &Config, clock: &SharedClock) -> Result<Backends, BackendError> {
    let policy = config.policy().map_err(|error| BackendError::Refused {
        kind: config.store.kind.name(),
        detail: error.to_string(),
    })?;
    match config.store.kind {
        StoreKind::Embedded => open_embedded(config, policy, clock),
        StoreKind::Redis => open_redis(config, policy, clock).await,
        StoreKind::Postgres => open_postgres(config, policy).await,
        StoreKind::Foundationdb => open_foundationdb(config, policy, clock).await,
    }
}

fn embedded_store(
    config: &Config,
    policy: Policy,
    kind: StoreKind,
    clock: &SharedClock,
) -> Result<Arc<EmbeddedStore>, BackendError> {
    let embedded = &config.store.embedded;
    let durability = match embedded.durability {
        DurabilityConfig::SyncData => Durability::SyncData,
        DurabilityConfig::SyncAll => Durability::SyncAll,
        DurabilityConfig::Buffer => Durability::Buffer,
    };
    let store_config = EmbeddedConfig {
        durability,
        sizes: embedded.sizes(),
        ..EmbeddedConfig::new(&embedded.path)
    };
    EmbeddedStore::open_embedded_with_clock(&store_config, policy, clock.clone())
        .map(Arc::new)
        .map_err(|source| BackendError::Store {
            kind: kind.name(),
            source,
        })
}

fn open_embedded(config: &Config, policy: Policy, clock: &SharedClock) -> Result<Backends, BackendError> {
    let store = embedded_store(config, policy, StoreKind::Embedded, clock)?;
    Ok(Backends {
        kind: StoreKind::Embedded,
        records: Arc::new(InstrumentedStore::new(store.clone())),
        labels: Arc::new(FdbLabels::new(store.clone())),
        description: format!(
            "records and labels in the embedded store at {} (one transaction per label)",
            shown_path(&config.store.embedded.path)
        ),
        embedded: Some(store.engine().clone()),
    })
}

/// The absolute form of a configured path, for the startup log.
fn shown_path(path: &std::path::Path) -> String {
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_owned())
        .display()
        .to_string()
}

async fn open_redis(config: &Config, policy: Policy, clock: &SharedClock) -> Result<Backends, BackendError> {
    let redis = &config.store.redis;
    let redis_config = store_redis::RedisConfig {
        urls: redis.urls.clone(),
        cluster: redis.cluster,
        key_prefix: redis.key_prefix.clone(),
        response_timeout_ms: redis.response_timeout_ms,
        connection_timeout_ms: redis.connection_timeout_ms,
        wait: None,
        accept_eviction: redis.accept_eviction,
    };
    let store = store_redis::RedisStore::connect(redis_config, policy)
        .await
        .map_err(|source| BackendError::Store { kind: "redis", source })?;
    for warning in &store.server_report().warnings {
        tracing::warn!(warning = %warning, "redis");
    }
    let records: Arc<dyn IdempotencyStore> = Arc::new(InstrumentedStore::new(Arc::new(store)));
    if config.store.labels_kind() == LabelsKind::Postgres {
        let labels = PostgresLabels::new(migrated_postgres(config, policy, "redis").await?);
        return Ok(Backends {
            kind: StoreKind::Redis,
            records: records.clone(),
            labels: Arc::new(SplitLabels::new(records, labels)),
            description: "records in Redis, labels in PostgreSQL: NOT atomic, a label and its record commit \
                 separately; the per-parcel uniqueness of labels and the parcel's carrier key are the second \
                 line of defence. Several instances may share these stores."
                .to_owned(),
            embedded: None,
        });
    }
    let labels_store = embedded_store(config, policy, StoreKind::Redis, clock)?;
    tracing::warn!(
        "store.labels = \"embedded\": labels live in a local directory, so this instance must be the only \
         one on these Redis records; run several with store.labels = \"postgres\""
    );
    Ok(Backends {
        kind: StoreKind::Redis,
        records: records.clone(),
        labels: Arc::new(SplitLabels::new(records, FdbLabels::new(labels_store.clone()))),
        description: format!(
            "records in Redis, labels in the embedded store at {}: NOT atomic, a label and its record \
             commit separately; the per-parcel uniqueness of labels is the second line of defence; \
             one instance only",
            shown_path(&config.store.embedded.path)
        ),
        embedded: Some(labels_store.engine().clone()),
    })
}

/// The PostgreSQL store of `[store.postgres]`, migrated (records and labels).
async fn migrated_postgres(
    config: &Config,
    policy: Policy,
    kind: &'static str,
) -> Result<store_postgres::PostgresStore, BackendError> {
    let postgres = &config.store.postgres;
    let postgres_config = store_postgres::PostgresConfig {
        url: postgres.url.clone(),
        pool_size: postgres.pool_size,
        connect_timeout_ms: postgres.connect_timeout_ms,
        statement_timeout_ms: postgres.statement_timeout_ms,
        operation_timeout_ms: postgres.operation_timeout_ms,
        ..store_postgres::PostgresConfig::new(postgres.url.clone())
    };
    let refused = |detail: String| BackendError::Refused { kind, detail };
    let store =
        store_postgres::PostgresStore::new(&postgres_config, policy).map_err(|error| refused(error.to_string()))?;
    store
        .migrate(&[LABELS_MIGRATION])
        .await
        .map_err(|error| refused(format!("migrations: {error}")))?;
    Ok(store)
}

async fn open_postgres(config: &Config, policy: Policy) -> Result<Backends, BackendError> {
    let store = migrated_postgres(config, policy, "postgres").await?;
    Ok(Backends {
        kind: StoreKind::Postgres,
        records: Arc::new(InstrumentedStore::new(Arc::new(store.clone()))),
        labels: Arc::new(PostgresLabels::new(store)),
        description: "records and labels in PostgreSQL (one transaction per label)".to_owned(),
        embedded: None,
    })
}

#[cfg(feature = "foundationdb")]
async fn open_foundationdb(config: &Config, policy: Policy, clock: &SharedClock) -> Result<Backends, BackendError> {
    use store_fdb::{FoundationDbConfig, FoundationDbNetwork, FoundationDbStore, KeyPrefix};
    let settings = &config.store.foundationdb;
    let store_error = |source| BackendError::Store {
        kind: "foundationdb",
        source,
    };
    let network = FoundationDbNetwork::start().map_err(store_error)?;
    let fdb_config = FoundationDbConfig {
        cluster_file: (!settings.cluster_file.is_empty()).then(|| settings.cluster_file.clone()),
        prefix: KeyPrefix::Bytes(settings.key_prefix.as_bytes().to_vec()),
        ..FoundationDbConfig::default()
    };
    let store = FoundationDbStore::open_foundationdb(network, &fdb_config, policy)
        .await
        .map(|store| Arc::new(store.with_clock(clock.clone())))
        .map_err(store_error)?;
    Ok(Backends {
        kind: StoreKind::Foundationdb,
        records: Arc::new(InstrumentedStore::new(store.clone())),
        labels: Arc::new(FdbLabels::new(store)),
        description: "records and labels in FoundationDB (one transaction per label)".to_owned(),
        embedded: None,
    })
}

#[cfg(not(feature = "foundationdb"))]
async fn open_foundationdb(_config: &Config, _policy: Policy, _clock: &SharedClock) -> Result<Backends, BackendError> {
    Err(BackendError::Refused {
        kind: "foundationdb",
        detail: "this binary was built without FoundationDB support; rebuild with \
                 `cargo build --release -p server --features foundationdb` (needs FoundationDB's client \
                 library libfdb_c at link time and run time)"
            .to_owned(),
    })
}
