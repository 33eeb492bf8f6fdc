//! Versioned schema migrations: the store's own, plus any the server adds
//! (its `labels` table) through the same runner.
//!
//! Every migration has a namespace, so the store's version 1 and the
//! server's version 1 are different rows of `schema_migrations`. One run
//! applies all pending migrations in one transaction, after taking a
//! transaction-scoped advisory lock, so concurrent runners (several server
//! replicas starting at once) apply each migration exactly once and a failed
//! run leaves the schema as it was.

use crate::error::{pool_error, store_error};
use crate::store::PostgresStore;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use store_core::StoreError;
use tokio_postgres::Transaction;

/// The namespace of the store's own migrations; others may not use it.
pub const STORE_MIGRATION_NAMESPACE: &str = "idem-store";
/// Key of the advisory lock that serialises migration runs ("idem_mig").
pub const MIGRATION_LOCK_KEY: i64 = 0x6964_656d_5f6d_6967;
/// Statement timeout inside a migration run, which may build indexes on
/// large tables and wait for a concurrent runner's lock.
pub const MIGRATION_STATEMENT_TIMEOUT_MS: u64 = 5 * 60 * 1000;
/// Longest namespace accepted, in bytes.
pub const MIGRATION_NAMESPACE_BYTES_MAX: usize = 63;

/// One schema change. Once applied, its SQL must never change: the runner
/// keeps a SHA-256 of it and refuses to run against an edited migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    pub namespace: &'static str,
    /// Starts at 1 and increases within the namespace.
    pub version: u32,
    pub name: &'static str,
    pub sql: &'static str,
}

/// The store's migrations, in order.
pub const STORE_MIGRATIONS: &[Migration] = &[
    Migration {
        namespace: STORE_MIGRATION_NAMESPACE,
        version: 1,
        name: "idempotency_keys",
        sql: include_str!("../migrations/0001_idempotency_keys.sql"),
    },
    Migration {
        namespace: STORE_MIGRATION_NAMESPACE,
        version: 2,
        name: "record_change_notifications",
        sql: include_str!("../migrations/0002_record_change_notifications.sql"),
    },
    Migration {
        namespace: STORE_MIGRATION_NAMESPACE,
        version: 3,
        name: "notify_only_waited_records",
        sql: include_str!("../migrations/0003_notify_only_waited_records.sql"),
    },
    Migration {
        namespace: STORE_MIGRATION_NAMESPACE,
        version: 4,
        name: "autovacuum_for_a_day_of_keys",
        sql: include_str!("../migrations/0004_autovacuum_for_a_day_of_keys.sql"),
    },
    Migration {
        namespace: STORE_MIGRATION_NAMESPACE,
        version: 5,
        name: "saved_response_in_one_column",
        sql: include_str!("../migrations/0005_saved_response_in_one_column.sql"),
    },
];

const CREATE_LEDGER: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (
    namespace  text        NOT NULL,
    version    integer     NOT NULL CHECK (version > 0),
    name       text        NOT NULL,
    checksum   bytea       NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, version)
)";

/// What one run applied; empty when the schema was already current.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigrationReport {
    pub applied: Vec<Migration>,
}

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("migration list refused: {0}")]
    Invalid(String),
    #[error("migration {namespace}/{version} ({name}) was edited after it was applied")]
    Edited {
        namespace: &'static str,
        version: u32,
        name: &'static str,
    },
    #[error("migration {namespace}/{version} ({name}) is older than the applied version {applied}")]
    OutOfOrder {
        namespace: &'static str,
        version: u32,
        name: &'static str,
        applied: i32,
    },
    #[error("migration {namespace}/{version} ({name}) failed; nothing was applied: {source}")]
    Failed {
        namespace: &'static str,
        version: u32,
        name: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The ledger as read under the lock: checksum per (namespace, version),
/// and the highest version per namespace.
#[derive(Default)]
struct Ledger {
    checksums: HashMap<(String, i32), Vec<u8>>,
    highest: HashMap<String, i32>,
}

impl PostgresStore {
    /// Applies the store's pending migrations, then the pending ones of
    /// `extra`, all in one transaction. Safe to run again (it applies
    /// nothing) and to run from several processes at once.
    pub async fn migrate(&self, extra: &[Migration]) -> Result<MigrationReport, MigrateError> {
        validate(extra)?;
        let mut connection = self.pool.get().await.map_err(pool_error)?;
        let transaction = connection.transaction().await.map_err(store_error)?;
        let ledger = lock_and_read_ledger(&transaction).await?;
        let mut report = MigrationReport::default();
        for migration in STORE_MIGRATIONS.iter().chain(extra) {
            if is_applied(migration, &ledger)? {
                continue;
            }
            apply(&transaction, migration).await?;
            report.applied.push(*migration);
        }
        transaction.commit().await.map_err(store_error)?;
        if !report.applied.is_empty() {
            tracing::info!(count = report.applied.len(), "postgresql migrations applied");
        }
        Ok(report)
    }
}

fn validate(extra: &[Migration]) -> Result<(), MigrateError> {
    let mut last_version: HashMap<&str, u32> = HashMap::new();
    for migration in extra {
        let Migration {
            namespace,
            version,
            name,
            ..
        } = *migration;
        if namespace.is_empty() || namespace.len() > MIGRATION_NAMESPACE_BYTES_MAX {
            return Err(MigrateError::Invalid(format!(
                "namespace {namespace:?} must be 1 to {MIGRATION_NAMESPACE_BYTES_MAX} bytes"
            )));
        }
        if namespace == STORE_MIGRATION_NAMESPACE {
            return Err(MigrateError::Invalid(format!(
                "namespace {namespace:?} belongs to the store"
            )));
        }
        if name.is_empty() || version == 0 || i32::try_from(version).is_err() {
            return Err(MigrateError::Invalid(format!(
                "{namespace}/{version}: needs a name and a version from 1 to {}",
                i32::MAX
            )));
        }
        if let Some(previous) = last_version.insert(namespace, version)
            && previous >= version
        {
            return Err(MigrateError::Invalid(format!(
                "{namespace}/{version} follows version {previous}; versions must increase"
            )));
        }
    }
    Ok(())
}

async fn lock_and_read_ledger(transaction: &Transaction<'_>) -> Result<Ledger, MigrateError> {
    let setup = format!(
        "SET LOCAL statement_timeout = {MIGRATION_STATEMENT_TIMEOUT_MS}; \
         SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY}); {CREATE_LEDGER}"
    );
    transaction.batch_execute(&setup).await.map_err(store_error)?;
    let rows = transaction
        .query("SELECT namespace, version, checksum FROM schema_migrations", &[])
        .await
        .map_err(store_error)?;
    let mut ledger = Ledger::default();
    for row in rows {
        let namespace: String = row.try_get("namespace").map_err(store_error)?;
        let version: i32 = row.try_get("version").map_err(store_error)?;
        let highest = ledger.highest.entry(namespace.clone()).or_insert(version);
        *highest = (*highest).max(version);
        ledger
            .checksums
            .insert((namespace, version), row.try_get("checksum").map_err(store_error)?);
    }
    Ok(ledger)
}

fn checksum(migration: &Migration) -> Vec<u8> {
    Sha256::digest(migration.sql.as_bytes()).to_vec()
}

/// True when the ledger has the migration; an error when it has it with
/// other SQL, or has a later version of its namespace without it.
fn is_applied(migration: &Migration, ledger: &Ledger) -> Result<bool, MigrateError> {
    let version = i32::try_from(migration.version).map_err(|_| MigrateError::Invalid("version too large".into()))?;
    let namespace = migration.namespace.to_owned();
    if let Some(stored) = ledger.checksums.get(&(namespace.clone(), version)) {
        if *stored != checksum(migration) {
            return Err(MigrateError::Edited {
                namespace: migration.namespace,
                version: migration.version,
                name: migration.name,
            });
        }
        return Ok(true);
    }
    match ledger.highest.get(&namespace) {
        Some(&applied) if applied > version => Err(MigrateError::OutOfOrder {
            namespace: migration.namespace,
            version: migration.version,
            name: migration.name,
            applied,
        }),
        _ => Ok(false),
    }
}

async fn apply(transaction: &Transaction<'_>, migration: &Migration) -> Result<(), MigrateError> {
    let failed = |source| MigrateError::Failed {
        namespace: migration.namespace,
        version: migration.version,
        name: migration.name,
        source,
    };
    transaction.batch_execute(migration.sql).await.map_err(failed)?;
    let version = i32::try_from(migration.version).map_err(|_| MigrateError::Invalid("version too large".into()))?;
    transaction
        .execute(
            "INSERT INTO schema_migrations (namespace, version, name, checksum) VALUES ($1, $2, $3, $4)",
            &[&migration.namespace, &version, &migration.name, &checksum(migration)],
        )
        .await
        .map_err(failed)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn migration(namespace: &'static str, version: u32) -> Migration {
        Migration {
            namespace,
            version,
            name: "labels",
            sql: "SELECT 1",
        }
    }

    #[test]
    fn extra_migrations_may_not_clash_with_the_store_or_go_backwards() {
        assert!(validate(&[migration("server", 1), migration("server", 2), migration("other", 1)]).is_ok());
        for bad in [
            vec![migration(STORE_MIGRATION_NAMESPACE, 2)],
            vec![migration("server", 2), migration("server", 1)],
            vec![migration("server", 1), migration("server", 1)],
            vec![migration("server", 0)],
            vec![migration("", 1)],
            vec![migration("server", u32::MAX)],
        ] {
            assert!(matches!(validate(&bad), Err(MigrateError::Invalid(_))), "{bad:?}");
        }
    }

    #[test]
    fn the_store_migrations_are_in_order_in_their_own_namespace() {
        for (index, migration) in STORE_MIGRATIONS.iter().enumerate() {
            assert_eq!(migration.namespace, STORE_MIGRATION_NAMESPACE);
            assert_eq!(migration.version as usize, index + 1);
        }
    }
}
