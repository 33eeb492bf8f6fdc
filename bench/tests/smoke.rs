//! The bench never rots: a short `idem-bench http` run (two seconds at 100
//! intents/s, lost carrier replies and intents sent twice included) against
//! the Label service on every backend, each on a real server the store's
//! testkit starts. It asserts the audit, never a speed.

mod common;

use common::LabelService;
use server::Config;
use store_postgres::testkit::PostgresServer;
use store_redis::testkit::shared_server;
use store_registry::StoreKind;

async fn bench_audit_passes(service: LabelService, backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let output = common::run_bench(&service, &json, &["--duplicate-share", "0.1"]).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{backend}: {stdout}\n{stderr}");
    let report = common::read_report(&json);
    let audit = &report["http"][0]["audit"];
    assert_eq!(audit["passed"], true, "{backend}: {audit}");
    assert_eq!(audit["lost"], 0, "{backend}");
    assert_eq!(audit["duplicate_labels"], 0, "{backend}");
    assert_eq!(audit["parcels_bought_twice"], 0, "{backend}");
    assert!(audit["intents"].as_u64().unwrap() >= 150, "{backend}: {audit}");
    assert_eq!(audit["labelled_exactly_once"], audit["intents"], "{backend}");
    service.running.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bench_audit_passes_on_the_embedded_store() {
    let service = LabelService::start(0.05).await;
    bench_audit_passes(service, "embedded").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bench_audit_passes_on_redis() {
    let redis = shared_server().expect("a redis-server for the test");
    let configure = |config: &mut Config| {
        config.store.kind = StoreKind::Redis;
        config.store.redis.urls = vec![redis.url()];
        config.store.redis.key_prefix = format!("smoke-{:x}", rand::random::<u64>());
    };
    let service = LabelService::start_with(0.05, configure).await;
    bench_audit_passes(service, "redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bench_audit_passes_on_postgresql() {
    let database = PostgresServer::shared()
        .create_database()
        .await
        .expect("a PostgreSQL database for the test");
    let configure = |config: &mut Config| {
        config.store.kind = StoreKind::Postgres;
        config.store.postgres.url = database.url.clone();
    };
    let service = LabelService::start_with(0.05, configure).await;
    bench_audit_passes(service, "postgres").await;
}
