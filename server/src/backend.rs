//! The Label service's stores: the record store `store.kind` names, opened
//! by the store registry (the store-registry crate: the one list of
//! kinds, their `[store]` sections, opening each), wrapped in the server's
//! timing, and the label store `store.labels` names beside it.

use crate::instrumented::InstrumentedStore;
use crate::labels::{FdbLabels, LABELS_MIGRATION, LabelStore, PostgresLabels, SplitLabels};
use std::sync::Arc;
use store_core::{IdempotencyStore, Policy, SharedClock, StoreError, SystemClock};
use store_fdb::EmbeddedStore;
/// The registry's types, which the server's config and its tests name
/// through this module.
pub use store_registry::{BackendError, LabelsKind, OpenedStore, StoreConfig, StoreKind};

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
    let store = store_registry::open_store(store_config, policy, &options.clock).await?;
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
            store_registry::migrate_postgres(postgres, StoreKind::Postgres, &[LABELS_MIGRATION]).await?;
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
    let store = store_registry::open_store(store_config, policy, &SystemClock::shared()).await?;
    Ok(store.records())
}

/// The absolute form of a configured path, for the startup log.
fn shown_path(path: &std::path::Path) -> String {
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_owned())
        .display()
        .to_string()
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
    let records_where = kind.facts().records_where;
    if config.labels_kind() == LabelsKind::Postgres {
        let postgres = store_registry::open_postgres(config, policy, kind)?;
        store_registry::migrate_postgres(&postgres, kind, &[LABELS_MIGRATION]).await?;
        return Ok(Backends {
            kind,
            records: records.clone(),
            labels: Arc::new(SplitLabels::new(records, PostgresLabels::new(postgres))),
            store,
            description: format!(
                "{records_where}, labels in PostgreSQL: NOT atomic, a label and its record commit \
                 separately; the per-parcel uniqueness of labels and the parcel's carrier key are the second \
                 line of defence. Several instances may share these stores."
            ),
            embedded: None,
        });
    }
    let labels_store = store_registry::open_embedded(config, policy, kind, clock)?;
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
