//! The limits: in-flight cap (fast 503 overloaded) and the per-request
//! budget (503 request_timeout, while the idempotent work still finishes).

use crate::common::{ALICE, Options, TestServer, fresh_key, label_body, order_id, purchases_for};
use server::backend::StoreKind;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_in_flight_cap_are_refused_at_once() {
    let options = Options {
        in_flight_max: 1,
        ..Options::default()
    };
    let server = TestServer::start_with(StoreKind::Embedded, options).await;
    server.delay_next_carrier_call(1_000).await;
    let body = label_body(order_id(), 1);
    let busy_key = fresh_key();
    let busy = server.post_label(Some(ALICE), Some(&busy_key), &body);
    let shed = async {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let started = Instant::now();
        let reply = server
            .post_label(Some(ALICE), Some(&fresh_key()), &label_body(order_id(), 1))
            .await;
        (reply, started.elapsed())
    };
    let (busy, (shed, waited)) = tokio::join!(busy, shed);
    assert_eq!(busy.status, 201);
    assert_eq!((shed.status, shed.problem_code().as_str()), (503, "overloaded"));
    assert!(
        waited < Duration::from_millis(500),
        "shed at once, not queued: {waited:?}"
    );
    // Probes are not behind the cap.
    assert_eq!(server.get("/healthz", None).await.status, 200);
    server.shutdown().await;
}

/// Work a request leaves running after its client hung up keeps its place
/// under the cap until it is done, so abandoned work cannot pile up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_left_running_by_a_hung_up_client_holds_its_slot_until_done() {
    let options = Options {
        in_flight_max: 1,
        ..Options::default()
    };
    let server = TestServer::start_with(StoreKind::Embedded, options).await;
    server.delay_next_carrier_call(1_000).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let hung_up = impatient
        .post(format!("{}/v1/labels", server.base))
        .bearer_auth(ALICE)
        .header("idempotency-key", fresh_key())
        .header("content-type", "application/json")
        .body(label_body(order_id(), 1))
        .send()
        .await;
    assert!(hung_up.is_err_and(|error| error.is_timeout()));
    let meanwhile = server
        .post_label(Some(ALICE), Some(&fresh_key()), &label_body(order_id(), 1))
        .await;
    assert_eq!(
        (meanwhile.status, meanwhile.problem_code().as_str()),
        (503, "overloaded"),
        "the abandoned attempt still holds the only slot"
    );
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let after = server
        .post_label(Some(ALICE), Some(&fresh_key()), &label_body(order_id(), 1))
        .await;
    assert_eq!(after.status, 201, "freed once its work was done: {}", after.text());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_budget_times_out_but_its_work_completes_and_replays() {
    let options = Options {
        request_timeout_ms: 300,
        ..Options::default()
    };
    let server = TestServer::start_with(StoreKind::Embedded, options).await;
    server.delay_next_carrier_call(800).await;
    let (key, order) = (fresh_key(), order_id());
    let started = Instant::now();
    let timed_out = server.post_label(Some(ALICE), Some(&key), &label_body(order, 1)).await;
    assert_eq!(
        (timed_out.status, timed_out.problem_code().as_str()),
        (503, "request_timeout")
    );
    assert!(timed_out.retry_after_s() >= 1);
    assert!(started.elapsed() < Duration::from_millis(700), "answered at the budget");
    tokio::time::sleep(Duration::from_millis(900)).await;
    let replay = server.post_label(Some(ALICE), Some(&key), &label_body(order, 1)).await;
    assert_eq!(
        (replay.status, replay.header("idempotent-replayed")),
        (201, Some("true")),
        "{}",
        replay.text()
    );
    assert_eq!(purchases_for(&server.carrier_stats().await, order), 1);
    server.shutdown().await;
}

/// Shutdown waits for the work of requests in flight and flushes the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_work_in_flight() {
    let server = TestServer::start(StoreKind::Embedded).await;
    server.delay_next_carrier_call(600).await;
    let (key, body) = (fresh_key(), label_body(order_id(), 1));
    let request = server.post_label(Some(ALICE), Some(&key), &body);
    let stop = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        server.begin_shutdown();
    };
    let (reply, ()) = tokio::join!(request, stop);
    assert_eq!(reply.status, 201, "the request in flight finished: {}", reply.text());
    server.shutdown().await;
}

/// A chunked body (no Content-Length) over the limit is cut off at the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_body_over_the_limit_is_413() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = TestServer::start(StoreKind::Embedded).await;
    let address = server.base.trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let head = format!(
        "POST /v1/labels HTTP/1.1\r\nhost: {address}\r\nauthorization: Bearer {ALICE}\r\n\
         content-type: application/json\r\nidempotency-key: {}\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
        fresh_key()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let chunk = format!("{:x}\r\n{}\r\n", 8_192, "x".repeat(8_192));
    for _ in 0..(server::labels::BODY_BYTES_MAX / 8_192 + 2) {
        if stream.write_all(chunk.as_bytes()).await.is_err() {
            break;
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("\"code\":\"payload_too_large\""), "{answer}");
    server.shutdown().await;
}
