//! Shutdown in order: readiness fails first (the load balancer stops
//! sending), then the listener closes, and the whole of it, requests and
//! their idempotent work included, stays inside the grace period.

use crate::common::{ALICE, Options, TestServer, client, fresh_key, label_body, order_id};
use server::backend::StoreKind;
use std::time::{Duration, Instant};

const READINESS_DELAY_MS: u64 = 600;
const GRACE_MS: u64 = 1_500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_fails_first_then_the_listener_closes_all_within_the_grace_period() {
    let options = Options {
        shutdown_grace_ms: GRACE_MS,
        shutdown_readiness_delay_ms: READINESS_DELAY_MS,
        ..Options::default()
    };
    let server = TestServer::start_with(StoreKind::Embedded, options).await;
    assert_eq!(server.get("/readyz", None).await.status, 200);
    // A purchase that outlives the grace period holds the shutdown's end.
    server.delay_next_carrier_call(10_000).await;
    let base = server.base.clone();
    let slow = tokio::spawn(async move {
        client()
            .post(format!("{base}/v1/labels"))
            .bearer_auth(ALICE)
            .header("idempotency-key", fresh_key())
            .header("content-type", "application/json")
            .body(label_body(order_id(), 1))
            .send()
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let signalled = Instant::now();
    server.begin_shutdown();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A fresh connection (a new client) is still accepted, and told "not ready".
    let ready = server.get("/readyz", None).await;
    assert_eq!(
        (ready.status, ready.problem_code().as_str()),
        (503, "shutting_down"),
        "{}",
        ready.text()
    );
    assert_eq!(
        server.get("/healthz", None).await.status,
        200,
        "the process is still live"
    );

    tokio::time::sleep(Duration::from_millis(READINESS_DELAY_MS + 200).saturating_sub(signalled.elapsed())).await;
    let refused = client().get(format!("{}/healthz", server.base)).send().await;
    assert!(
        refused.is_err(),
        "the listener is closed after the readiness delay: {refused:?}"
    );

    server.shutdown().await;
    let took = signalled.elapsed();
    assert!(
        took < Duration::from_millis(GRACE_MS + 400),
        "shutdown took {took:?}, more than the {GRACE_MS} ms grace period"
    );
    let _ = slow.await;
}
