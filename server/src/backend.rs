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
use store_core::{IdempotencyStore, Policy, SharedClock, StoreError, SystemClock};
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
    let policy = policy_of(config)?;
    match config.store.kind {
        StoreKind::Embedded => open_embedded(config, policy, clock),
        StoreKind::Redis => open_redis(config, policy, clock).await,
        StoreKind::Postgres => open_postgres(config, policy).await,
        StoreKind::Foundationdb => open_foundationdb(config, policy, clock).await,
    }
}

fn policy_of(config: &Config) -> Result<Policy, BackendError> {
    config.policy().map_err(|error| BackendError::Refused {
        kind: config.store.kind.name(),
        detail: error.to_string(),
    })
}

/// Opens only the record store of `config.store.kind`, for the operator's
/// commands (`server forget-unreadable-record`): no label store, and no
/// migrations, which are the serving process's to run. On the embedded
/// store this takes the directory's lock, so it fails while a server runs
/// on it ([`EmbeddedEngine::is_directory_locked`]); with Redis records and
/// `store.labels = "embedded"` the label directory is not opened, so it
/// works beside a running server.
pub async fn open_records(config: &Config) -> Result<Arc<dyn IdempotencyStore>, BackendError> {
    let policy = policy_of(config)?;
    Ok(match config.store.kind {
        // An operator's command: the system's clock, as a server's.
        StoreKind::Embedded => embedded_store(config, policy, StoreKind::Embedded, &SystemClock::shared())?,
        StoreKind::Redis => Arc::new(redis_store(config, policy).await?),
        StoreKind::Postgres => Arc::new(postgres_store(config, policy, "postgres")?),
        StoreKind::Foundationdb => foundationdb_records(config, policy, &SystemClock::shared()).await?,
    })
}

#[cfg(feature = "foundationdb")]
async fn foundationdb_records(
    config: &Config,
    policy: Policy,
    clock: &SharedClock,
) -> Result<Arc<dyn IdempotencyStore>, BackendError> {
    Ok(foundationdb_store(config, policy, clock).await?)
}

#[cfg(not(feature = "foundationdb"))]
async fn foundationdb_records(
    _config: &Config,
    _policy: Policy,
    _clock: &SharedClock,
) -> Result<Arc<dyn IdempotencyStore>, BackendError> {
    Err(without_foundationdb())
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

/// A path from the config, where empty means "not set".
fn configured_path(path: &str) -> Option<std::path::PathBuf> {
    (!path.is_empty()).then(|| std::path::PathBuf::from(path))
}

/// A store's error at opening: its TLS refusals (which the stores' messages
/// begin with `tls_prefix`) are configuration errors of their own.
fn store_error(kind: &'static str, tls_prefix: &str, source: StoreError) -> BackendError {
    match &source {
        StoreError::Refused { detail, .. } if detail.starts_with(tls_prefix) => BackendError::Tls {
            kind,
            detail: detail.clone(),
        },
        _ => BackendError::Store { kind, source },
    }
}

/// The absolute form of a configured path, for the startup log.
fn shown_path(path: &std::path::Path) -> String {
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_owned())
        .display()
        .to_string()
}

/// The Redis record store of `[store.redis]`, connected and checked.
async fn redis_store(config: &Config, policy: Policy) -> Result<store_redis::RedisStore, BackendError> {
    let redis = &config.store.redis;
    let redis_config = store_redis::RedisConfig {
        urls: redis.urls.clone(),
        tls: store_redis::RedisTls {
            ca_file: configured_path(&redis.ca_file),
            client_cert_file: configured_path(&redis.client_cert_file),
            client_key_file: configured_path(&redis.client_key_file),
        },
        cluster: redis.cluster,
        key_prefix: redis.key_prefix.clone(),
        response_timeout_ms: redis.response_timeout_ms,
        connection_timeout_ms: redis.connection_timeout_ms,
        wait: None,
        accept_eviction: redis.accept_eviction,
    };
    let store = store_redis::RedisStore::connect(redis_config, policy)
        .await
        .map_err(|source| store_error("redis", store_redis::TLS_ERROR_PREFIX, source))?;
    for warning in &store.server_report().warnings {
        tracing::warn!(warning = %warning, "redis");
    }
    Ok(store)
}

async fn open_redis(config: &Config, policy: Policy, clock: &SharedClock) -> Result<Backends, BackendError> {
    let store = redis_store(config, policy).await?;
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

/// The PostgreSQL store of `[store.postgres]`: a pool, not yet connected.
fn postgres_store(
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
        ssl_mode: postgres.sslmode.store_mode(),
        ca_file: configured_path(&postgres.ca_file),
        ..store_postgres::PostgresConfig::new(postgres.url.clone())
    };
    store_postgres::PostgresStore::new(&postgres_config, policy).map_err(|error| match error {
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

/// The PostgreSQL store of `[store.postgres]`, migrated (records and labels).
async fn migrated_postgres(
    config: &Config,
    policy: Policy,
    kind: &'static str,
) -> Result<store_postgres::PostgresStore, BackendError> {
    let store = postgres_store(config, policy, kind)?;
    // The first connection: where a wrong CA shows, at startup.
    store.migrate(&[LABELS_MIGRATION]).await.map_err(|error| match error {
        store_postgres::MigrateError::Store(StoreError::Refused { detail, .. })
            if detail.starts_with(store_postgres::TLS_ERROR_PREFIX) =>
        {
            BackendError::Tls { kind, detail }
        }
        other => BackendError::Refused {
            kind,
            detail: format!("migrations: {other}"),
        },
    })?;
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

/// The FoundationDB store of `[store.foundationdb]`.
#[cfg(feature = "foundationdb")]
async fn foundationdb_store(
    config: &Config,
    policy: Policy,
    clock: &SharedClock,
) -> Result<Arc<store_fdb::FoundationDbStore>, BackendError> {
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
    FoundationDbStore::open_foundationdb(network, &fdb_config, policy)
        .await
        .map(|store| Arc::new(store.with_clock(clock.clone())))
        .map_err(store_error)
}

#[cfg(feature = "foundationdb")]
async fn open_foundationdb(config: &Config, policy: Policy, clock: &SharedClock) -> Result<Backends, BackendError> {
    let store = foundationdb_store(config, policy, clock).await?;
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
    Err(without_foundationdb())
}

/// The refusal of `store.kind = "foundationdb"` by a binary built without it.
#[cfg(not(feature = "foundationdb"))]
fn without_foundationdb() -> BackendError {
    BackendError::Refused {
        kind: "foundationdb",
        detail: "this binary was built without FoundationDB support; rebuild with \
                 `cargo build --release -p server --features foundationdb` (needs FoundationDB's client \
                 library libfdb_c at link time and run time)"
            .to_owned(),
    }
}
