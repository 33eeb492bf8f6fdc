//! The migration runner: idempotent, safe under concurrent runners,
//! namespaced, atomic, and strict about edited or out-of-order migrations.

mod common;

use common::{LABELS_MIGRATION, count, fresh_database, raw_client};
use store_core::testkit::{claim_request, response, unique_caller};
use store_core::{ClaimOutcome, IdempotencyStore, Policy};
use store_postgres::{MigrateError, Migration, PostgresStore, STORE_MIGRATIONS};

/// Concurrent runners in the concurrency test, each with its own pool.
const CONCURRENT_RUNNERS: usize = 4;

fn store_on(database: &store_postgres::testkit::TestDatabase) -> PostgresStore {
    PostgresStore::new(&database.config(), Policy::default()).expect("valid config")
}

async fn table_exists(client: &tokio_postgres::Client, table: &str) -> bool {
    client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await
        .expect("to_regclass")
        .get(0)
}

#[tokio::test]
async fn migrations_apply_once_and_a_second_run_applies_nothing() {
    let database = fresh_database().await;
    let store = store_on(&database);
    let first = store.migrate(&[LABELS_MIGRATION]).await.expect("first run");
    let mut expected = STORE_MIGRATIONS.to_vec();
    expected.push(LABELS_MIGRATION);
    assert_eq!(first.applied, expected);
    let second = store.migrate(&[LABELS_MIGRATION]).await.expect("second run");
    assert!(second.applied.is_empty(), "{second:?}");
    let client = raw_client(&database.url).await;
    // The store's version 1 and the server's version 1 are two rows.
    assert_eq!(count(&client, "schema_migrations").await, expected.len() as i64);
    for table in ["idempotency_keys", "idempotency_tombstones", "labels"] {
        assert!(table_exists(&client, table).await, "{table} missing");
    }
}

/// The record tables are vacuumed once a hundredth of their rows are dead,
/// not PostgreSQL's fifth: they turn over every day (migration 0004).
#[tokio::test]
async fn the_record_tables_are_vacuumed_after_a_hundredth_of_their_rows_die() {
    let database = fresh_database().await;
    store_on(&database).migrate(&[]).await.expect("migrate");
    let client = raw_client(&database.url).await;
    for table in ["idempotency_keys", "idempotency_tombstones"] {
        let options: Vec<String> = client
            .query_one(
                "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE relname = $1",
                &[&table],
            )
            .await
            .expect("pg_class")
            .get(0);
        assert!(
            options.contains(&"autovacuum_vacuum_scale_factor=0.01".to_owned()),
            "{table}: {options:?}"
        );
        assert!(
            options.contains(&"autovacuum_vacuum_threshold=10000".to_owned()),
            "{table}: {options:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_runners_apply_each_migration_exactly_once() {
    let database = fresh_database().await;
    let stores: Vec<PostgresStore> = (0..CONCURRENT_RUNNERS).map(|_| store_on(&database)).collect();
    let runs = stores.iter().map(|store| store.migrate(&[LABELS_MIGRATION]));
    let reports = futures::future::join_all(runs).await;
    let mut applied = 0;
    for report in reports {
        applied += report.expect("every concurrent run succeeds").applied.len();
    }
    assert_eq!(
        applied,
        STORE_MIGRATIONS.len() + 1,
        "each migration applied by exactly one runner"
    );
    let client = raw_client(&database.url).await;
    assert_eq!(count(&client, "schema_migrations").await, applied as i64);
}

#[tokio::test]
async fn a_failing_migration_leaves_the_schema_as_it_was() {
    let database = fresh_database().await;
    let broken = Migration {
        namespace: "server",
        version: 1,
        name: "broken",
        sql: "CREATE TABLE labels (label_id text PRIMARY KEY); SELECT no_such_column FROM labels",
    };
    let error = store_on(&database).migrate(&[broken]).await.expect_err("broken SQL");
    assert!(
        matches!(error, MigrateError::Failed { name: "broken", .. }),
        "{error:?}"
    );
    let client = raw_client(&database.url).await;
    for table in ["schema_migrations", "idempotency_keys", "labels"] {
        assert!(!table_exists(&client, table).await, "{table} survived a failed run");
    }
}

#[tokio::test]
async fn an_edited_migration_is_refused() {
    let database = fresh_database().await;
    let store = store_on(&database);
    store.migrate(&[LABELS_MIGRATION]).await.expect("first run");
    let edited = Migration {
        sql: "CREATE TABLE labels (label_id text PRIMARY KEY)",
        ..LABELS_MIGRATION
    };
    let error = store.migrate(&[edited]).await.expect_err("edited migration");
    assert!(
        matches!(error, MigrateError::Edited { name: "labels", .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_migration_older_than_an_applied_one_is_refused() {
    let database = fresh_database().await;
    let store = store_on(&database);
    let second = Migration {
        version: 2,
        name: "label_notes",
        sql: "CREATE TABLE label_notes (note text)",
        ..LABELS_MIGRATION
    };
    store.migrate(&[second]).await.expect("version 2 alone");
    let error = store
        .migrate(&[LABELS_MIGRATION, second])
        .await
        .expect_err("version 1 after version 2");
    assert!(
        matches!(
            error,
            MigrateError::OutOfOrder {
                version: 1,
                applied: 2,
                ..
            }
        ),
        "{error:?}"
    );
}

#[tokio::test]
async fn extra_migrations_in_the_store_namespace_are_refused_before_touching_the_database() {
    let database = fresh_database().await;
    let clash = Migration {
        namespace: store_postgres::STORE_MIGRATION_NAMESPACE,
        version: 2,
        ..LABELS_MIGRATION
    };
    let error = store_on(&database).migrate(&[clash]).await.expect_err("clash");
    assert!(matches!(error, MigrateError::Invalid(_)), "{error:?}");
    let client = raw_client(&database.url).await;
    assert!(!table_exists(&client, "schema_migrations").await);
}

#[tokio::test]
async fn the_table_refuses_a_half_written_record() {
    let database = fresh_database().await;
    store_on(&database).migrate(&[]).await.expect("migrate");
    let client = raw_client(&database.url).await;
    let error = client
        .execute(
            "INSERT INTO idempotency_keys (caller_id, idem_key, request_hash, state, created_at, expires_at) \
             VALUES ('c', decode(repeat('00', 32), 'hex'), decode(repeat('00', 32), 'hex'), 'completed', now(), now())",
            &[],
        )
        .await
        .expect_err("a completed row without a response");
    assert_eq!(error.code(), Some(&tokio_postgres::error::SqlState::CHECK_VIOLATION));
}

/// A database a build before migration 0005 left, holding a completed
/// record with its response in the four columns of that time, goes through
/// 0005 with its row unchanged: the record still replays, and a new
/// completion is written in the one column.
#[tokio::test]
async fn a_record_written_before_the_response_went_into_one_column_still_replays() {
    let database = fresh_database().await;
    let client = raw_client(&database.url).await;
    let before_0005 = STORE_MIGRATIONS.iter().filter(|migration| migration.version < 5);
    client
        .batch_execute(
            "CREATE TABLE schema_migrations (namespace text NOT NULL, version integer NOT NULL, \
             name text NOT NULL, checksum bytea NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(), \
             PRIMARY KEY (namespace, version))",
        )
        .await
        .expect("the ledger");
    for migration in before_0005 {
        client.batch_execute(migration.sql).await.expect("an earlier migration");
        client
            .execute(
                "INSERT INTO schema_migrations (namespace, version, name, checksum) \
                 VALUES ($1, $2, $3, sha256(convert_to($4, 'UTF8')))",
                &[
                    &migration.namespace,
                    &(migration.version as i32),
                    &migration.name,
                    &migration.sql,
                ],
            )
            .await
            .expect("its ledger row");
    }
    let caller = unique_caller();
    let earlier = claim_request(&caller, "earlier", "a");
    let saved = response(1);
    let names: Vec<&str> = saved.headers().iter().map(|(name, _)| name.as_str()).collect();
    let values: Vec<&str> = saved.headers().iter().map(|(_, value)| value.as_str()).collect();
    client
        .execute(
            "INSERT INTO idempotency_keys (caller_id, idem_key, request_hash, state, response_status, \
             response_header_names, response_header_values, response_body, completed_by, created_at, expires_at) \
             VALUES ($1, $2, $3, 'completed', $4, $5, $6, $7, gen_random_uuid(), now(), now() + interval '1 hour')",
            &[
                &caller.as_str(),
                &earlier.key.digest().0.as_slice(),
                &earlier.fingerprint.0.as_slice(),
                &i32::from(saved.status()),
                &names,
                &values,
                &saved.body(),
            ],
        )
        .await
        .expect("a row as a build before 0005 wrote it");

    let store = PostgresStore::new(&database.config(), Policy::default()).expect("valid config");
    let report = store.migrate(&[]).await.expect("migrate");
    assert_eq!(
        report
            .applied
            .iter()
            .map(|migration| migration.version)
            .collect::<Vec<_>>(),
        [5]
    );
    assert_eq!(store.claim(&earlier).await.unwrap(), ClaimOutcome::Replay(response(1)));

    let later = claim_request(&caller, "later", "a");
    let ClaimOutcome::Acquired(acquired) = store.claim(&later).await.unwrap() else {
        panic!("later was not acquired");
    };
    assert!(store.complete(&acquired.lease, response(2)).await.unwrap().is_applied());
    let forms = client
        .query(
            "SELECT response IS NOT NULL AS in_one_column, response_status IS NOT NULL AS in_four \
             FROM idempotency_keys WHERE caller_id = $1 ORDER BY created_at",
            &[&caller.as_str()],
        )
        .await
        .expect("the rows' forms");
    let forms: Vec<(bool, bool)> = forms.iter().map(|row| (row.get(0), row.get(1))).collect();
    assert_eq!(forms, [(false, true), (true, false)]);
    assert_eq!(store.claim(&later).await.unwrap(), ClaimOutcome::Replay(response(2)));
}
