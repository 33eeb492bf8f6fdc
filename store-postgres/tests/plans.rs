//! The batched claim reads each item's record and tombstone through the
//! primary key, whatever the tables hold and whatever their statistics say.
//!
//! A prepared statement runs on a generic plan once PostgreSQL judges it no
//! worse than a custom one, and the generic plan of a join against an array
//! of unknown length was a hash join over a sequential scan of the whole
//! table: a cost per batch that grew with every record kept. This test asks
//! PostgreSQL for the generic plan (`plan_cache_mode = force_generic_plan`)
//! on empty tables and on tables of many analysed rows, and refuses any
//! sequential scan of the two tables.

mod common;

use common::{fresh_database, raw_client};
use store_core::Policy;
use store_postgres::testkit::CLAIM_BATCH_STATEMENT;
use tokio_postgres::Client;

/// Rows put in each table before the second look: enough that a
/// sequential scan costs more than a few index probes by the planner's own
/// arithmetic.
const ROWS: i64 = 20_000;

/// The batched claim's plan, generic, as `EXPLAIN` prints it (the
/// statement is not run).
async fn generic_plan(client: &Client) -> String {
    client
        .batch_execute("SET plan_cache_mode = force_generic_plan; DEALLOCATE ALL")
        .await
        .expect("force generic plans");
    client
        .batch_execute(&format!("PREPARE claim_batch AS {CLAIM_BATCH_STATEMENT}"))
        .await
        .expect("prepare the batched claim");
    let rows = client
        .query(
            "EXPLAIN EXECUTE claim_batch(ARRAY['caller'], ARRAY[sha256('key')], ARRAY[sha256('body')], \
             ARRAY[gen_random_uuid()], ARRAY[30000::bigint], ARRAY[86400000::bigint])",
            &[],
        )
        .await
        .expect("explain the batched claim");
    rows.iter()
        .map(|row| row.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n")
}

fn assert_no_sequential_scan(plan: &str, tables: &str) {
    for table in ["idempotency_keys", "idempotency_tombstones"] {
        assert!(
            !plan.contains(&format!("Seq Scan on {table}")),
            "the batched claim scans {table} ({tables}):\n{plan}"
        );
    }
}

async fn fill_and_analyse(client: &Client) {
    client
        .batch_execute(&format!(
            "INSERT INTO idempotency_keys (caller_id, idem_key, request_hash, state, response_status, \
                 response_header_names, response_header_values, response_body, completed_by, created_at, expires_at) \
             SELECT 'caller', sha256(int8send(n)), sha256('body'), 'completed', 201, '{{}}', '{{}}', '', \
                 gen_random_uuid(), now(), now() + interval '1 day' FROM generate_series(1, {ROWS}) AS n; \
             INSERT INTO idempotency_tombstones (caller_id, idem_key, expires_at) \
             SELECT 'caller', sha256(int8send(-n)), now() + interval '1 day' FROM generate_series(1, {ROWS}) AS n; \
             ANALYZE idempotency_keys; ANALYZE idempotency_tombstones"
        ))
        .await
        .expect("fill the tables");
}

#[tokio::test]
async fn the_batched_claim_probes_the_primary_keys_on_empty_and_on_full_tables() {
    let database = fresh_database().await;
    let _store = database
        .migrated_store(Policy::default(), &[])
        .await
        .expect("migrated store");
    let client = raw_client(&database.url).await;

    assert_no_sequential_scan(&generic_plan(&client).await, "empty tables");
    fill_and_analyse(&client).await;
    assert_no_sequential_scan(&generic_plan(&client).await, &format!("{ROWS} rows each"));
}
