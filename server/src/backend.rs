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

use crate::admission::workers_for_postgres_pool;
use crate::instrumented::InstrumentedStore;
use crate::labels::{FdbLabels, LABELS_MIGRATION, LabelStore, PostgresLabels, SplitLabels};
use crate::setting::{ConfigError, field_error};
use serde::Deserialize;
use std::sync::Arc;
use store_core::{IdempotencyStore, Policy, SharedClock, StoreError, SystemClock};
use store_fdb::EmbeddedStore;
use store_postgres::SslMode;

/// Where records live (`store.kind`): the one list of backends the
/// server, its tests and the bench share (the bench's `--backend` and
/// `--store-kind` parse it too). Opening one is `backend::open`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
#[value(rename_all = "lowercase")]
pub enum StoreKind {
    Embedded,
    Redis,
    Postgres,
    Foundationdb,
    /// The reference store in memory (store-memory): volatile, for tests;
    /// only with the `memory-store` feature, and never a bench backend.
    #[value(skip)]
    Memory,
}

impl StoreKind {
    /// Every kind, whether or not this build has it ([`StoreKind::is_built`]).
    pub const ALL: [StoreKind; 5] = [
        StoreKind::Embedded,
        StoreKind::Redis,
        StoreKind::Postgres,
        StoreKind::Foundationdb,
        StoreKind::Memory,
    ];

    /// The durable kinds a test or the bench runs on this machine alone:
    /// the embedded store, and Redis and PostgreSQL on servers their
    /// testkits start. Not FoundationDB (it needs a cluster nobody here
    /// starts, and the default build leaves it out), not memory (volatile).
    pub const SELF_STARTED: [StoreKind; 3] = [StoreKind::Embedded, StoreKind::Redis, StoreKind::Postgres];

    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Embedded => "embedded",
            StoreKind::Foundationdb => "foundationdb",
            StoreKind::Redis => "redis",
            StoreKind::Postgres => "postgres",
            StoreKind::Memory => "memory",
        }
    }

    /// The server's cargo feature that builds this kind in, for the ones
    /// a default build leaves out.
    pub fn cargo_feature(self) -> Option<&'static str> {
        match self {
            StoreKind::Foundationdb => Some("foundationdb"),
            StoreKind::Memory => Some("memory-store"),
            StoreKind::Embedded | StoreKind::Redis | StoreKind::Postgres => None,
        }
    }

    /// True when this build of the server can open the kind.
    pub fn is_built(self) -> bool {
        match self {
            StoreKind::Foundationdb => cfg!(feature = "foundationdb"),
            StoreKind::Memory => cfg!(feature = "memory-store"),
            StoreKind::Embedded | StoreKind::Redis | StoreKind::Postgres => true,
        }
    }

    /// True when the records' store can commit a label in the record's
    /// own transaction; the others keep labels apart (embedded or
    /// PostgreSQL, `store.labels`).
    pub fn holds_labels(self) -> bool {
        match self {
            StoreKind::Embedded | StoreKind::Foundationdb | StoreKind::Postgres => true,
            StoreKind::Redis | StoreKind::Memory => false,
        }
    }
}

impl std::str::FromStr for StoreKind {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        StoreKind::ALL
            .into_iter()
            .find(|kind| kind.name() == name)
            .ok_or_else(|| format!("unknown store kind {name:?}"))
    }
}

impl std::fmt::Display for StoreKind {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.name())
    }
}

/// Where labels (the business effect) live, beside the records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LabelsKind {
    /// In the records' own store, committed in one transaction with the
    /// record (embedded, FoundationDB, PostgreSQL).
    WithRecords,
    /// In the embedded store beside a Redis record store: two commits, one
    /// instance only (the embedded store is a local directory).
    Embedded,
    /// In PostgreSQL (`[store.postgres]`) beside a Redis record store: two
    /// commits, shared by every instance.
    Postgres,
}

impl LabelsKind {
    pub fn name(self) -> &'static str {
        match self {
            LabelsKind::WithRecords => "with_records",
            LabelsKind::Embedded => "embedded",
            LabelsKind::Postgres => "postgres",
        }
    }
}

/// `[store]`: the kind, where labels go, and each backend's section,
/// deserialised straight into the store crate's own config type (its
/// `Deserialize` keeps this file's field names; the checks that name a
/// field are [`StoreConfig::validate`]'s).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    pub kind: StoreKind,
    /// Where labels live; absent: with the records, or for records that
    /// cannot hold them, in the embedded store (see [`StoreConfig::labels_kind`]).
    pub labels: Option<LabelsKind>,
    /// The embedded store: records with kind = "embedded", labels with kind = "redis" or "memory".
    pub embedded: store_fdb::EmbeddedConfig,
    pub redis: store_redis::RedisConfig,
    pub postgres: store_postgres::PostgresConfig,
    pub foundationdb: store_fdb::FoundationDbConfig,
}

impl StoreConfig {
    /// The store's own default number of admission workers, where it has
    /// one: half the pool in front of PostgreSQL when its writes are not
    /// batched (`admission::workers_for_postgres_pool`); batched, and on the
    /// other stores, `AdmissionConfig::workers`'s default.
    pub fn admission_workers_default(&self) -> Option<usize> {
        match self.kind {
            StoreKind::Postgres if self.postgres.batch_items_max == 1 => {
                Some(workers_for_postgres_pool(self.postgres.pool_size))
            }
            StoreKind::Postgres => None,
            StoreKind::Embedded | StoreKind::Redis | StoreKind::Foundationdb | StoreKind::Memory => None,
        }
    }

    /// Where labels live: as configured, else with the records, or for
    /// records that cannot hold an effect (Redis, memory) in the embedded
    /// store.
    pub fn labels_kind(&self) -> LabelsKind {
        self.labels.unwrap_or(if self.kind.holds_labels() {
            LabelsKind::WithRecords
        } else {
            LabelsKind::Embedded
        })
    }

    /// Checks `[store]`: the kind, where labels go, and the sections the
    /// kind uses.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let store = self;
        let labels = store.labels_kind();
        let uses_embedded = store.kind == StoreKind::Embedded || labels == LabelsKind::Embedded;
        if uses_embedded && store.embedded.path.as_os_str().is_empty() {
            return Err(field_error("store.embedded.path", "must name a directory"));
        }
        if let Some((name, min, max)) = store.embedded.sizes.out_of_range() {
            let field = match name {
                "cache_bytes" => "store.embedded.cache_bytes",
                "memtable_bytes" => "store.embedded.memtable_bytes",
                _ => "store.embedded.journal_bytes_max",
            };
            return Err(field_error(field, format!("must be {min} to {max}")));
        }
        self.validate_labels(labels)?;
        if store.kind == StoreKind::Redis {
            self.validate_redis_tls()?;
        }
        if store.kind == StoreKind::Postgres || labels == LabelsKind::Postgres {
            self.validate_postgres_tls()?;
        }
        match store.kind {
            StoreKind::Redis if store.redis.urls.is_empty() => Err(field_error(
                "store.redis.urls",
                "store.kind = \"redis\" needs at least one redis:// URL",
            )),
            StoreKind::Postgres if store.postgres.url.is_empty() => Err(field_error(
                "store.postgres.url",
                "store.kind = \"postgres\" needs a postgres:// URL",
            )),
            _ => Ok(()),
        }
    }

    /// The TLS files go with `rediss://` URLs, a client certificate with its key.
    fn validate_redis_tls(&self) -> Result<(), ConfigError> {
        let redis = &self.redis;
        let tls_urls = redis
            .urls
            .iter()
            .filter(|url| url.starts_with(store_redis::TLS_SCHEME))
            .count();
        if tls_urls != 0 && tls_urls != redis.urls.len() {
            return Err(field_error(
                "store.redis.urls",
                "mix redis:// and rediss://: every node speaks TLS or none does",
            ));
        }
        let tls = &redis.tls;
        let files = [&tls.ca_file, &tls.client_cert_file, &tls.client_key_file];
        if tls_urls == 0 && files.iter().any(|file| file.is_some()) {
            return Err(field_error(
                "store.redis.ca_file",
                "TLS files are set but store.redis.urls are redis://; use rediss:// for TLS",
            ));
        }
        if tls.client_cert_file.is_none() != tls.client_key_file.is_none() {
            return Err(field_error(
                "store.redis.client_key_file",
                "store.redis.client_cert_file and client_key_file go together: set both or neither",
            ));
        }
        Ok(())
    }

    /// One place says whether PostgreSQL is TLS: `sslmode`, with its CA file.
    fn validate_postgres_tls(&self) -> Result<(), ConfigError> {
        let postgres = &self.postgres;
        if postgres.url.contains("sslmode") {
            return Err(field_error(
                "store.postgres.url",
                "carries sslmode; set store.postgres.sslmode instead (disable, require or verify-full)",
            ));
        }
        match (postgres.ssl_mode, postgres.ca_file.is_none()) {
            (SslMode::Disable, false) => Err(field_error(
                "store.postgres.ca_file",
                "is set but store.postgres.sslmode is disable: set sslmode require or verify-full",
            )),
            (SslMode::Require | SslMode::VerifyFull, true) => Err(field_error(
                "store.postgres.ca_file",
                "store.postgres.sslmode require and verify-full need the CA that signed the server's certificate",
            )),
            _ => Ok(()),
        }
    }

    fn validate_labels(&self, labels: LabelsKind) -> Result<(), ConfigError> {
        let kind = self.kind;
        if !labels_combination_ok(kind, labels) {
            let detail = format!(
                "labels = \"{}\" cannot go with store.kind = \"{}\": with embedded, foundationdb or postgres \
                 records labels go with_records; with redis or memory records, in embedded or postgres",
                labels.name(),
                kind.name()
            );
            return Err(field_error("store.labels", &detail));
        }
        if labels == LabelsKind::Postgres && self.postgres.url.is_empty() {
            return Err(field_error(
                "store.postgres.url",
                "store.labels = \"postgres\" needs a postgres:// URL for the labels",
            ));
        }
        Ok(())
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            kind: StoreKind::Embedded,
            labels: None,
            embedded: store_fdb::EmbeddedConfig::default(),
            redis: store_redis::RedisConfig::default(),
            postgres: store_postgres::PostgresConfig::default(),
            foundationdb: store_fdb::FoundationDbConfig::default(),
        }
    }
}

/// The combinations a team would run: labels with the records wherever the
/// records' store can hold them in one transaction; beside records that
/// cannot (Redis, memory), in the embedded store or in PostgreSQL.
fn labels_combination_ok(kind: StoreKind, labels: LabelsKind) -> bool {
    if kind.holds_labels() {
        labels == LabelsKind::WithRecords
    } else {
        matches!(labels, LabelsKind::Embedded | LabelsKind::Postgres)
    }
}

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

/// Opens the record store of `store_config.kind` and the label store
/// `store.labels` names, running the label migrations where labels live in
/// PostgreSQL.
/// `config_policy` is the config's `[policy]`, which `options` may replace.
pub async fn open(
    store_config: &StoreConfig,
    config_policy: Policy,
    options: &OpenOptions,
) -> Result<Backends, BackendError> {
    let policy = options.policy.unwrap_or(config_policy);
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

/// Opens only the record store of `store_config.kind`, for the operator's
/// commands (`server forget-unreadable-record`): no label store, and no
/// migrations, which are the serving process's to run. On the embedded
/// store this takes the directory's lock, so it fails while a server runs
/// on it ([`store_fdb::EmbeddedEngine::is_directory_locked`]); with Redis
/// records and `store.labels = "embedded"` the label directory is not
/// opened, so it works beside a running server.
pub async fn open_records(
    store_config: &StoreConfig,
    policy: Policy,
) -> Result<Arc<dyn IdempotencyStore>, BackendError> {
    // An operator's command: the system's clock, as a server's.
    let store = open_store(store_config, policy, &SystemClock::shared()).await?;
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
