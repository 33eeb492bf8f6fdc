//! `[store]`: the kind, where labels go, and each backend's section,
//! deserialised straight into the store crate's own config type, with the
//! checks that name a field.

use crate::kind::{LabelsKind, StoreKind};
use serde::Deserialize;
use store_fdb::ClaimBatchingError;
use store_postgres::SslMode;

/// A refusal of one `[store]` field; the server's configuration error
/// carries it as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config field {field}: {message}")]
pub struct FieldError {
    pub field: &'static str,
    pub message: String,
}

/// A refusal of a section's claim batch settings, naming the setting
/// (`[batch_items_max, batches_in_flight_max]`, in full).
fn claim_batching_refusal(
    checked: Result<Option<store_core::BatchLimits>, ClaimBatchingError>,
    [items_field, in_flight_field]: [&'static str; 2],
) -> Result<(), FieldError> {
    match checked {
        Ok(_) => Ok(()),
        Err(error @ ClaimBatchingError::BatchItems(_)) => Err(field_error(items_field, error.to_string())),
        Err(error @ ClaimBatchingError::BatchesInFlight(_)) => Err(field_error(in_flight_field, error.to_string())),
    }
}

fn field_error(field: &'static str, message: impl Into<String>) -> FieldError {
    FieldError {
        field,
        message: message.into(),
    }
}

/// `[store]`: the kind, where labels go, and each backend's section,
/// deserialised straight into the store crate's own config type (its
/// `Deserialize` keeps the file's field names; the checks that name a
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

impl StoreConfig {
    /// Connections in the record store's pool, where every write holds one
    /// of them (PostgreSQL with its writes not batched): the server sizes
    /// its admission workers from it. Batched writes hold none each.
    pub fn unbatched_records_pool_size(&self) -> Option<usize> {
        (self.kind == StoreKind::Postgres && self.postgres.batch_items_max == 1).then_some(self.postgres.pool_size)
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

    /// Checks `[store]`: the engine sections' sizes and batch settings,
    /// where labels go, then the section the records use and the one the
    /// labels use, when apart.
    pub fn validate(&self) -> Result<(), FieldError> {
        if let Some((name, min, max)) = self.embedded.sizes.out_of_range() {
            let field = match name {
                "cache_bytes" => "store.embedded.cache_bytes",
                "memtable_bytes" => "store.embedded.memtable_bytes",
                _ => "store.embedded.journal_bytes_max",
            };
            return Err(field_error(field, format!("must be {min} to {max}")));
        }
        self.validate_claim_batching()?;
        let labels = self.labels_kind();
        self.validate_labels(labels)?;
        match self.kind {
            StoreKind::Embedded => self.validate_embedded()?,
            StoreKind::Redis => self.validate_redis()?,
            StoreKind::Postgres => self.validate_postgres("store.kind = \"postgres\" needs a postgres:// URL")?,
            StoreKind::Foundationdb | StoreKind::Memory => {}
        }
        match labels {
            LabelsKind::WithRecords => Ok(()),
            LabelsKind::Embedded => self.validate_embedded(),
            LabelsKind::Postgres => {
                self.validate_postgres("store.labels = \"postgres\" needs a postgres:// URL for the labels")
            }
        }
    }

    /// The combinations a team would run: labels with the records wherever
    /// the records' store can hold them in one transaction; beside records
    /// that cannot (Redis, memory), in the embedded store or in PostgreSQL.
    fn validate_labels(&self, labels: LabelsKind) -> Result<(), FieldError> {
        let kind = self.kind;
        let fits = if kind.holds_labels() {
            labels == LabelsKind::WithRecords
        } else {
            matches!(labels, LabelsKind::Embedded | LabelsKind::Postgres)
        };
        if fits {
            return Ok(());
        }
        let detail = format!(
            "labels = \"{}\" cannot go with store.kind = \"{}\": with embedded, foundationdb or postgres \
             records labels go with_records; with redis or memory records, in embedded or postgres",
            labels.name(),
            kind.name()
        );
        Err(field_error("store.labels", detail))
    }

    /// The FDB-style engines' claim batch settings, each checked by the
    /// store crate's one check and named by its section.
    fn validate_claim_batching(&self) -> Result<(), FieldError> {
        claim_batching_refusal(
            self.embedded.claim_batch_limits(),
            ["store.embedded.batch_items_max", "store.embedded.batches_in_flight_max"],
        )?;
        claim_batching_refusal(
            self.foundationdb.claim_batch_limits(),
            [
                "store.foundationdb.batch_items_max",
                "store.foundationdb.batches_in_flight_max",
            ],
        )
    }

    fn validate_embedded(&self) -> Result<(), FieldError> {
        if self.embedded.path.as_os_str().is_empty() {
            return Err(field_error("store.embedded.path", "must name a directory"));
        }
        Ok(())
    }

    /// The URLs, and the TLS files with `rediss://` URLs, a client
    /// certificate with its key.
    fn validate_redis(&self) -> Result<(), FieldError> {
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
        if redis.urls.is_empty() {
            return Err(field_error(
                "store.redis.urls",
                "store.kind = \"redis\" needs at least one redis:// URL",
            ));
        }
        Ok(())
    }

    /// The URL (`without_url` says who needs it), and one place that says
    /// whether PostgreSQL is TLS: `sslmode`, with its CA file.
    fn validate_postgres(&self, without_url: &str) -> Result<(), FieldError> {
        let postgres = &self.postgres;
        if postgres.url.is_empty() {
            return Err(field_error("store.postgres.url", without_url));
        }
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
}
