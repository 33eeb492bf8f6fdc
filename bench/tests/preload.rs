//! `idem-bench preload` on every backend this machine starts: 2,000
//! records written through the command line, then checked in the store
//! itself (every record there and no other, each exactly as the service
//! would have saved it, their expiry times one step of the window apart
//! from the first step to its end, a tenth of them in every tenth of it),
//! and replayed by the real Label service started on the filled store: the
//! same key and body answer 201 with `Idempotent-Replayed: true` and the
//! saved body, another body 422, and the loaded label's id 404 (no label
//! row is written).

mod common;

use bench::preload::records::PreloadRecords;
use common::LabelService;
use server::Config;
use store_core::{CallerId, IdempotencyStore, Policy, Record};
use store_fdb::{EmbeddedConfig, EmbeddedStore, Engine, MaybeCommitted, RunOptions, Transaction};
use store_postgres::testkit::PostgresServer;
use store_postgres::{PostgresConfig, PostgresStore};
use store_redis::testkit::RedisServer;
use store_redis::{RedisConfig, RedisStore};
use store_registry::StoreKind;

const RECORDS: u64 = 2_000;
/// A week: the first record expires three and a half minutes after the
/// load (a day would give it 43 s, which a slow test could outlive, and
/// Redis deletes expired keys).
const RETENTION_S: u64 = 7 * 24 * 60 * 60;
const SEED: u64 = 11;
/// Each batch smaller than every backend's maximum, so every run has
/// several batches and a last partial one.
const BATCH_RECORDS: &str = "300";
/// The bearer token of the demo caller, whose id the records are loaded under.
const DEMO_TOKEN: &str = "demo-token";

/// Runs `idem-bench preload` and returns its report's `preload` section.
async fn preload(store_kind: &str, extra: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("preload.json");
    let json_arg = json.display().to_string();
    let (records, retention_s, seed) = (RECORDS.to_string(), RETENTION_S.to_string(), SEED.to_string());
    let mut arguments = vec![
        "preload",
        "--store-kind",
        store_kind,
        "--records",
        &records,
        "--retention-s",
        &retention_s,
        "--batch-records",
        BATCH_RECORDS,
        "--seed",
        &seed,
        "--quiet",
        "--json",
        &json_arg,
    ];
    arguments.extend_from_slice(extra);
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem-bench"))
        .args(&arguments)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{store_kind}: {stdout}\n{stderr}");
    assert!(stdout.contains("2000 of 2000 records written"), "{stdout}");
    let report = common::read_report(&json)["preload"].clone();
    assert_eq!(report["records_written"], RECORDS, "{report}");
    assert_eq!(report["batch_records"], 300, "{report}");
    report
}

/// The records the report's reference time and the test's settings name.
fn loaded_records(report: &serde_json::Value) -> PreloadRecords {
    let reference_ms = report["reference_ms"].as_u64().expect("a reference time");
    let caller = CallerId::new(report["caller"].as_str().unwrap()).unwrap();
    PreloadRecords::new(SEED, caller, RECORDS, RETENTION_S * 1_000, reference_ms)
}

/// Every record is in the store as the service would have saved it, and
/// their expiry times are spread over the window as documented: record i
/// of N at reference + retention * (i + 1) / N.
async fn check_stored_records(store: &dyn IdempotencyStore, records: &PreloadRecords, reference_ms: u64) {
    let mut stored: Vec<Record> = Vec::new();
    for index in 0..RECORDS {
        let expected = records.record(index).unwrap();
        let found = store.inspect(records.caller(), expected.key()).await.unwrap();
        let found = found.unwrap_or_else(|| panic!("record {index} is missing"));
        assert_eq!(found, expected.record(), "record {index}");
        stored.push(found);
    }
    check_expiry_spread(&stored, reference_ms);
}

/// Checked against the window alone, not against the bench's own formula:
/// the first record expires one step after the reference, the last at its
/// end, each a step after the one before, a tenth of them in every tenth.
fn check_expiry_spread(stored: &[Record], reference_ms: u64) {
    let window_ms = RETENTION_S * 1_000;
    let step_ms = window_ms / RECORDS;
    let expiries: Vec<u64> = stored.iter().map(|record| record.expires_at_ms).collect();
    assert_eq!(expiries[0], reference_ms + step_ms);
    assert_eq!(expiries[expiries.len() - 1], reference_ms + window_ms);
    for pair in expiries.windows(2) {
        assert!(pair[1].abs_diff(pair[0] + step_ms) <= 1, "{pair:?}");
    }
    let mut tenths = [0_u64; 10];
    for expiry in &expiries {
        let tenth = (expiry - reference_ms - 1) * 10 / window_ms;
        tenths[usize::try_from(tenth).unwrap()] += 1;
    }
    assert_eq!(tenths, [RECORDS / 10; 10]);
    for record in stored {
        assert_eq!(record.expires_at_ms - record.created_at_ms, window_ms);
    }
}

/// The real service replays loaded records from their saved responses.
async fn check_replays(service: &LabelService, records: &PreloadRecords) {
    let client = reqwest::Client::new();
    let base = service.running.base_url();
    for index in [0, RECORDS / 2, RECORDS - 1] {
        let loaded = records.record(index).unwrap();
        let intent = records.intent(index);
        let post = |body: Vec<u8>| {
            client
                .post(format!("{base}/v1/labels"))
                .bearer_auth(DEMO_TOKEN)
                .header("idempotency-key", loaded.key().as_str())
                .header("content-type", "application/json")
                .body(body)
                .send()
        };
        let replay = post(intent.body()).await.unwrap();
        assert_eq!(replay.status(), 201, "record {index}");
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(replay.headers()["location"], loaded.response().headers()[1].1.as_str());
        assert_eq!(replay.bytes().await.unwrap(), loaded.response().body());
        let mut other_body = intent;
        other_body.weight_g += 1;
        let mismatch = post(other_body.body()).await.unwrap();
        assert_eq!(mismatch.status(), 422, "record {index}");
    }
    let location = records.record(0).unwrap().response().headers()[1].1.clone();
    let label = client
        .get(format!("{base}{location}"))
        .bearer_auth(DEMO_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(label.status(), 404, "no label row backs a loaded record");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preloaded_embedded_records_are_all_there_spread_and_replay() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("records");
    let data_arg = data.display().to_string();
    let report = preload(
        "embedded",
        &["--embedded-dir", &data_arg, "--embedded-durability", "buffer"],
    )
    .await;
    assert!(report["size"]["bytes_per_record"].as_f64().unwrap() > 0.0, "{report}");
    let records = loaded_records(&report);
    {
        let store = EmbeddedStore::open_embedded(&EmbeddedConfig::new(&data), Policy::default()).unwrap();
        assert_eq!(stored_record_count(&store).await, RECORDS);
        check_stored_records(&store, &records, records_reference(&report)).await;
    }
    let service = LabelService::start_with(0.0, |config: &mut Config| {
        config.store.embedded.path = data.clone();
    })
    .await;
    check_replays(&service, &records).await;
    service.running.shutdown().await.unwrap();
}

/// Keys under the records' subspace: one chunk per record of this size.
async fn stored_record_count(store: &EmbeddedStore) -> u64 {
    let (begin, end) = store.layout().records().range();
    let (begin, end) = (&begin, &end);
    let limit = usize::try_from(RECORDS).unwrap() + 10;
    let pairs = store
        .engine()
        .run(RunOptions::default(), |tx, _: MaybeCommitted| async move {
            Ok(tx.get_range(begin, end, limit).await?)
        })
        .await
        .unwrap();
    pairs.len() as u64
}

fn records_reference(report: &serde_json::Value) -> u64 {
    report["reference_ms"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preloaded_redis_records_are_all_there_spread_and_replay() {
    let redis = tokio::task::block_in_place(RedisServer::start).expect("a redis-server for the test");
    let url = redis.url();
    let report = preload("redis", &["--redis-url", &url]).await;
    assert!(report["size"]["bytes_per_record"].as_f64().unwrap() > 0.0, "{report}");
    let records = loaded_records(&report);
    let store = RedisStore::connect(RedisConfig::standalone(url.clone()), Policy::default())
        .await
        .unwrap();
    let mut connection = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: u64 = redis::cmd("DBSIZE").query_async(&mut connection).await.unwrap();
    assert_eq!(keys, 2 * RECORDS, "a record and its tombstone each");
    check_stored_records(&store, &records, records_reference(&report)).await;
    let service = LabelService::start_with(0.0, |config: &mut Config| {
        config.store.kind = StoreKind::Redis;
        config.store.redis.urls = vec![url.clone()];
    })
    .await;
    check_replays(&service, &records).await;
    service.running.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preloaded_postgresql_records_are_all_there_spread_and_replay() {
    let database = PostgresServer::shared()
        .create_database()
        .await
        .expect("a PostgreSQL database for the test");
    let report = preload("postgres", &["--postgres-url", &database.url]).await;
    assert!(report["size"]["bytes_per_record"].as_f64().unwrap() > 0.0, "{report}");
    let records = loaded_records(&report);
    let store = PostgresStore::new(&PostgresConfig::new(database.url.clone()), Policy::default()).unwrap();
    let client = store.pool().get().await.unwrap();
    let count: i64 = client
        .query_one("SELECT count(*) FROM idempotency_keys", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(u64::try_from(count).unwrap(), RECORDS);
    drop(client);
    check_stored_records(&store, &records, records_reference(&report)).await;
    let service = LabelService::start_with(0.0, |config: &mut Config| {
        config.store.kind = StoreKind::Postgres;
        config.store.postgres.url = database.url.clone();
    })
    .await;
    check_replays(&service, &records).await;
    service.running.shutdown().await.unwrap();
}

/// Bad input is refused with its reason, and exit status 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_counts_and_batches_are_refused_with_their_reason() {
    let cases: [(&[&str], &str); 3] = [
        (&["--records", "0"], "--records must be at least 1"),
        (&["--records", "200000001"], "more than 200000000"),
        (
            &[
                "--records",
                "10",
                "--batch-records",
                "10001",
                "--embedded-durability",
                "buffer",
            ],
            "--batch-records 10001 must be between 1 and embedded's 10000",
        ),
    ];
    for (arguments, reason) in cases {
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem-bench"))
            .arg("preload")
            .args(arguments)
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{arguments:?}: {stderr}");
        assert!(stderr.contains(reason), "{arguments:?}: {stderr}");
    }
}
