//! The backend registry: opens the stores that `store.kind` and
//! `store.labels` name. The server, its tests and the bench all open
//! backends here, from the config's `[store]` section (each backend's
//! section is its store crate's own config type).
//!
//! | kind           | labels         | records          | labels live in                  | label + record   | instances |
//! |----------------|----------------|------------------|---------------------------------|------------------|-----------|
//! | `embedded`     | `with_records` | embedded (fjall) | same store, effects subspace    | one transaction  | one       |
//! | `foundationdb` | `with_records` | FoundationDB     | same store, effects subspace    | one transaction  | many      |
//! | `postgres`     | `with_records` | PostgreSQL       | `labels` table, same database   | one transaction  | many      |
//! | `redis`        | `embedded`     | Redis            | embedded store (a local dir)    | separate commits | one       |
//! | `redis`        | `postgres`     | Redis            | `labels` table in PostgreSQL    | separate commits | many      |
//! | `memory`       | as `redis`     | a map in memory  | as `redis`                      | separate commits | one       |
//!
//! `memory` (store-memory, the reference store) is volatile and only in a
//! server built with the `memory-store` feature, which the server's own
//! tests turn on.
//!
//! Adding a backend: a [`StoreKind`] variant, an [`OpenedStore`] variant and
//! its arm in [`open_store`] (plus where its labels live, in [`open`]).

use crate::config::{Config, LabelsKind, StoreConfig, StoreKind};
use crate::instrumented::InstrumentedStore;
use crate::labels::{FdbLabels, LABELS_MIGRATION, LabelStore, PostgresLabels, SplitLabels};
use std::sync::Arc;
use store_core::{IdempotencyStore, Policy, SharedClock, StoreError, SystemClock};
use store_fdb::EmbeddedStore;

/// What a caller sets beside the config. The server passes its one clock
/// and the config's policy; tests pass a manual clock, or a policy the
/// config would refuse (a lease shorter than the carrier timeout).
#[derive(Clone)]
pub struct OpenOptions {
    /// The clock the embedded, FoundationDB and memory stores read (the
    /// idempotency layer's too); Redis and PostgreSQL decide expiry by
    /// their servers' clocks and take none (ARCHITECTURE.md, "Which clock
    /// decides lease expiry").
    pub clock: SharedClock,
    /// The store policy; `None`: the config's `[policy]`.
    pub policy: Option<Policy>,
}

impl OpenOptions {
    /// The server's options: its clock, the config's policy.
    pub fn with_clock(clock: SharedClock) -> Self {
        Self { clock, policy: None }
    }
}

/// One opened record store, by kind, without the server's timing wrapper:
/// what the bench drives and tests audit.
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

/// The opened stores.
pub struct Backends {
    pub kind: StoreKind,
    /// Every record operation goes through here (timed).
    pub records: Arc<dyn IdempotencyStore>,
    pub labels: Arc<dyn LabelStore>,
    /// The record store itself, untimed.
    pub store: OpenedStore,
    /// One line for the startup log: where records and labels live.
    pub description: String,
    /// The embedded store, if one is open (the records', or the labels'
    /// beside Redis or memory records): flushed at shutdown, observed by
    /// the metrics.
    pub embedded: Option<Arc<EmbeddedStore>>,
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
            Some(store) => store.engine().flush(),
            None => Ok(()),
        }
    }
}

/// Opens the record store of `config.store.kind` and the label store
/// `store.labels` names, running the label migrations where labels live in
/// PostgreSQL.
pub async fn open(config: &Config, options: &OpenOptions) -> Result<Backends, BackendError> {
    let policy = options.policy.unwrap_or(config.policy);
    let store_config = &config.store;
    let store = open_store(store_config, policy, &options.clock).await?;
    let records: Arc<dyn IdempotencyStore> = Arc::new(InstrumentedStore::new(store.records()));
    let (labels, description, embedded): (Arc<dyn LabelStore>, String, _) = match &store {
        OpenedStore::Embedded(embedded) => (
            Arc::new(FdbLabels::new(embedded.clone())),
            format!(
                "records and labels in the embedded store at {} (one transaction per label)",
                shown_path(&store_config.embedded.path)
            ),
            Some(embedded.clone()),
        ),
        OpenedStore::Postgres(postgres) => {
            migrate_labels(postgres, StoreKind::Postgres).await?;
            (
                Arc::new(PostgresLabels::new(postgres.as_ref().clone())),
                "records and labels in PostgreSQL (one transaction per label)".to_owned(),
                None,
            )
        }
        #[cfg(feature = "foundationdb")]
        OpenedStore::Foundationdb(foundationdb) => (
            Arc::new(FdbLabels::new(foundationdb.clone())),
            "records and labels in FoundationDB (one transaction per label)".to_owned(),
            None,
        ),
        _ => return open_labels_apart(store_config, policy, &options.clock, store, records).await,
    };
    Ok(Backends {
        kind: store_config.kind,
        records,
        labels,
        store,
        description,
        embedded,
    })
}

/// Opens only the record store of `config.store.kind`, for the operator's
/// commands (`server forget-unreadable-record`): no label store, and no
/// migrations, which are the serving process's to run. On the embedded
/// store this takes the directory's lock, so it fails while a server runs
/// on it ([`store_fdb::EmbeddedEngine::is_directory_locked`]); with Redis
/// records and `store.labels = "embedded"` the label directory is not
/// opened, so it works beside a running server.
pub async fn open_records(config: &Config) -> Result<Arc<dyn IdempotencyStore>, BackendError> {
    // An operator's command: the system's clock, as a server's.
    let store = open_store(&config.store, config.policy, &SystemClock::shared()).await?;
    Ok(store.records())
}

/// Opens the record store `store.kind` names, and nothing else: no label
/// store, no migrations (the caller runs its own: the server its labels',
/// the bench its effect rows'). The one place a backend is opened.
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
        StoreKind::Embedded => Ok(OpenedStore::Embedded(embedded_store(config, policy, kind, clock)?)),
        StoreKind::Redis => Ok(OpenedStore::Redis(Arc::new(redis_store(config, policy).await?))),
        StoreKind::Postgres => Ok(OpenedStore::Postgres(Arc::new(postgres_store(config, policy, kind)?))),
        StoreKind::Foundationdb => foundationdb_store(config, policy, clock).await,
        StoreKind::Memory => memory_store(policy, clock),
    }
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
    let feature = kind.cargo_feature().unwrap_or("default");
    let why = match kind {
        StoreKind::Foundationdb => {
            " (needs FoundationDB's client library libfdb_c at link time and run time)".to_owned()
        }
        StoreKind::Memory => ": a volatile store for tests and examples, never for production".to_owned(),
        _ => String::new(),
    };
    BackendError::Refused {
        kind: kind.name(),
        detail: format!(
            "this binary was built without it; rebuild with `cargo build --release -p server --features {feature}`{why}"
        ),
    }
}

fn embedded_store(
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
async fn redis_store(config: &StoreConfig, policy: Policy) -> Result<store_redis::RedisStore, BackendError> {
    let store = store_redis::RedisStore::connect(config.redis.clone(), policy)
        .await
        .map_err(|source| store_error("redis", store_redis::TLS_ERROR_PREFIX, source))?;
    for warning in &store.server_report().warnings {
        tracing::warn!(warning = %warning, "redis");
    }
    Ok(store)
}

/// Labels apart from records that cannot hold them (Redis, memory): in
/// PostgreSQL, or in the embedded store; two commits per label.
async fn open_labels_apart(
    config: &StoreConfig,
    policy: Policy,
    clock: &SharedClock,
    store: OpenedStore,
    records: Arc<dyn IdempotencyStore>,
) -> Result<Backends, BackendError> {
    let kind = config.kind;
    let records_where = match kind {
        StoreKind::Memory => "records in memory (volatile: lost at exit; for tests)",
        _ => "records in Redis",
    };
    if config.labels_kind() == LabelsKind::Postgres {
        let labels = PostgresLabels::new(migrated_postgres(config, policy, kind).await?);
        return Ok(Backends {
            kind,
            records: records.clone(),
            labels: Arc::new(SplitLabels::new(records, labels)),
            store,
            description: format!(
                "{records_where}, labels in PostgreSQL: NOT atomic, a label and its record commit \
                 separately; the per-parcel uniqueness of labels and the parcel's carrier key are the second \
                 line of defence. Several instances may share these stores."
            ),
            embedded: None,
        });
    }
    let labels_store = embedded_store(config, policy, kind, clock)?;
    tracing::warn!(
        "store.labels = \"embedded\": labels live in a local directory, so this instance must be the only \
         one on these records; run several with store.labels = \"postgres\""
    );
    Ok(Backends {
        kind,
        records: records.clone(),
        labels: Arc::new(SplitLabels::new(records, FdbLabels::new(labels_store.clone()))),
        store,
        description: format!(
            "{records_where}, labels in the embedded store at {}: NOT atomic, a label and its record \
             commit separately; the per-parcel uniqueness of labels is the second line of defence; \
             one instance only",
            shown_path(&config.embedded.path)
        ),
        embedded: Some(labels_store),
    })
}

/// The PostgreSQL store of `[store.postgres]`: a pool, not yet connected.
fn postgres_store(
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

/// The PostgreSQL store of `[store.postgres]`, migrated (records and labels).
async fn migrated_postgres(
    config: &StoreConfig,
    policy: Policy,
    kind: StoreKind,
) -> Result<store_postgres::PostgresStore, BackendError> {
    let store = postgres_store(config, policy, kind)?;
    migrate_labels(&store, kind).await?;
    Ok(store)
}

/// Runs the store's migrations and the labels table's: the first
/// connection, where a wrong CA shows, at startup.
async fn migrate_labels(store: &store_postgres::PostgresStore, kind: StoreKind) -> Result<(), BackendError> {
    let kind = kind.name();
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
    Ok(())
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
        kind: "foundationdb",
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
