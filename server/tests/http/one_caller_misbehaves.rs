//! One client misbehaves, on purpose or by accident, against the `server`
//! binary, while another caller's requests must keep succeeding: a body
//! sent a byte at a time, a flood of probes and scrapes, every retry sent
//! with `Prefer: wait`, and connections opened and left idle.

use crate::common::{
    ALICE, BOB, callers_env, client, fresh_key, fresh_postgres_url, label_body, metric_value, order_id,
};
use crate::process::{delay_next_carrier_call, post, start, start_carrier};
use std::time::Duration;
use test_support::process::ServerProcess;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Requests the well-behaved caller sends while the other misbehaves.
const POLITE_REQUESTS: usize = 3;

/// The well-behaved caller's labels, each of which must be created.
async fn polite_caller_is_served(server: &ServerProcess) {
    for _ in 0..POLITE_REQUESTS {
        let reply = post(&server.url, BOB, &fresh_key(), &label_body(order_id(), 1)).await;
        assert_eq!(reply.status, 201, "the other caller is served: {}", reply.text());
    }
}

/// The binary on a loopback port, with the test callers, an instant
/// in-process carrier simulator (unless `settings` name a carrier), and
/// `settings`.
async fn server_with(dir: &std::path::Path, settings: &[(&'static str, String)]) -> ServerProcess {
    let mut env = vec![
        ("IDEM__SERVER__LISTEN", "127.0.0.1:0".to_owned()),
        ("IDEM__CALLERS", callers_env()),
        ("IDEM__CARRIER__SIMULATOR__LATENCY_MS_MIN", "0".to_owned()),
        ("IDEM__CARRIER__SIMULATOR__LATENCY_MS_MAX", "0".to_owned()),
    ];
    env.extend(settings.iter().cloned());
    start(&[], &env, dir).await
}

fn address_of(server: &ServerProcess) -> String {
    server.url.trim_start_matches("http://").to_owned()
}

async fn metrics_of(server: &ServerProcess) -> String {
    let response = client().get(format!("{}/metrics", server.url)).send().await.unwrap();
    response.text().await.unwrap()
}

/// Everything the server sends on `stream` until it closes it, or what it
/// sent within `limit` if it does not.
async fn answer_within(stream: &mut TcpStream, limit: Duration) -> String {
    let mut received = Vec::new();
    let _ = tokio::time::timeout(limit, stream.read_to_end(&mut received)).await;
    String::from_utf8_lossy(&received).into_owned()
}

/// The body is read before admission, under its own deadline: four
/// requests whose bodies never finish take no admission worker (there are
/// two), so the other caller is served, and each gets 408 `body_timeout`
/// at its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_sent_slowly_holds_no_admission_worker() {
    const BODY_READ_TIMEOUT_MS: u64 = 3_000;
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("IDEM__SERVER__ADMISSION__WORKERS", "2".to_owned()),
        ("IDEM__SERVER__BODY_READ_TIMEOUT_MS", BODY_READ_TIMEOUT_MS.to_string()),
    ];
    let server = server_with(dir.path(), &env).await;
    let mut slow = Vec::new();
    for _ in 0..4 {
        let mut stream = TcpStream::connect(address_of(&server)).await.unwrap();
        let head = format!(
            "POST /v1/labels HTTP/1.1\r\nhost: idem\r\nauthorization: Bearer {ALICE}\r\n\
             idempotency-key: {}\r\ncontent-type: application/json\r\ncontent-length: 60000\r\n\r\n{{",
            fresh_key()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        slow.push(stream);
    }
    // Long enough for the slow requests to reach admission, were they let in.
    tokio::time::sleep(Duration::from_millis(500)).await;
    polite_caller_is_served(&server).await;
    let limit = Duration::from_millis(BODY_READ_TIMEOUT_MS + 5_000);
    for stream in &mut slow {
        let answer = answer_within(stream, limit).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("body_timeout"), "{answer}");
    }
    let metrics = metrics_of(&server).await;
    let timed_out = metric_value(&metrics, "idem_http_requests_total", &["outcome=\"body_timeout\""]);
    assert_eq!(timed_out, 4.0, "{metrics}");
}

/// `/readyz` answers from the background check and `/metrics` from the
/// recorder: a flood of both reaches no store (here PostgreSQL, where a
/// ping takes a pool connection), while the other caller is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_probes_and_scrapes_reaches_no_store() {
    const FLOODERS: usize = 8;
    const PROBES_EACH: usize = 25;
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("IDEM__STORE__KIND", "postgres".to_owned()),
        ("IDEM__STORE__POSTGRES__URL", fresh_postgres_url().await),
        ("IDEM__STORE__POSTGRES__POOL_SIZE", "2".to_owned()),
        // No background check within the test: every ping it sees is a probe's.
        ("IDEM__SERVER__READINESS_REFRESH_MS", "60000".to_owned()),
    ];
    let server = server_with(dir.path(), &env).await;
    let pings = |metrics: &str| {
        metric_value(
            metrics,
            "idem_store_operation_duration_seconds_count",
            &["operation=\"ping\""],
        )
    };
    let before = pings(&metrics_of(&server).await);
    let flood = (0..FLOODERS).map(|flooder| {
        let url = server.url.clone();
        tokio::spawn(async move {
            let path = if flooder % 2 == 0 { "/readyz" } else { "/metrics" };
            for _ in 0..PROBES_EACH {
                let response = client().get(format!("{url}{path}")).send().await.unwrap();
                assert_eq!(response.status(), 200, "{path}");
            }
        })
    });
    let flood: Vec<_> = flood.collect();
    polite_caller_is_served(&server).await;
    for flooder in flood {
        flooder.await.unwrap();
    }
    let after = pings(&metrics_of(&server).await);
    assert_eq!(after - before, 0.0, "probes pinged the store");
}

/// Waiters are capped per caller and below the in-flight cap (here 8 in
/// flight, so 4 waiters, 1 per caller): one caller sending ten retries of a
/// key in progress with `Prefer: wait` gets one wait and nine 409s at once,
/// instead of holding every place in flight, and the other caller is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_callers_waiters_cannot_hold_every_place_in_flight() {
    const WAITERS: usize = 10;
    let dir = tempfile::tempdir().unwrap();
    let carrier = start_carrier(dir.path()).await;
    let env = [
        ("IDEM__SERVER__IN_FLIGHT_MAX", "8".to_owned()),
        ("IDEM__CARRIER__URL", carrier.url.clone()),
    ];
    let server = server_with(dir.path(), &env).await;
    delay_next_carrier_call(&carrier.url, 4_000).await;
    let (key, body) = (fresh_key(), label_body(order_id(), 1));
    let holder = {
        let (url, key, body) = (server.url.clone(), key.clone(), body.clone());
        tokio::spawn(async move { post(&url, ALICE, &key, &body).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (url, key, body) = (server.url.clone(), key.clone(), body.clone());
            tokio::spawn(async move {
                let response = client()
                    .post(format!("{url}/v1/labels"))
                    .bearer_auth(ALICE)
                    .header("idempotency-key", key)
                    .header("content-type", "application/json")
                    .header("prefer", "wait=8")
                    .body(body)
                    .send()
                    .await
                    .expect("server answers");
                response.status().as_u16()
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    polite_caller_is_served(&server).await;
    assert_eq!(holder.await.unwrap().status, 201);
    let mut statuses = Vec::new();
    for waiter in waiters {
        statuses.push(waiter.await.unwrap());
    }
    statuses.sort_unstable();
    // One waits and gets the label; the others are answered at once: 409
    // past the caller's waiter cap (or 503 if they came while the places
    // in flight were taken).
    let waited = statuses.iter().filter(|status| **status == 201).count();
    assert_eq!(waited, 1, "one waiter per caller: {statuses:?}");
    assert!(statuses.contains(&409), "{statuses:?}");
    assert!(
        statuses.iter().all(|status| [201, 409, 503].contains(status)),
        "{statuses:?}"
    );
}

/// One address opening connections and sending nothing holds at most its
/// share of the connection cap (here 4 of 8): the rest of its connections
/// are closed at once, and a client from another address is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_hold_every_connection() {
    const CONNECTIONS_MAX: usize = 8;
    const PER_PEER_MAX: usize = 4;
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("IDEM__SERVER__CONNECTIONS_MAX", CONNECTIONS_MAX.to_string()),
        ("IDEM__SERVER__CONNECTIONS_PER_PEER_MAX", PER_PEER_MAX.to_string()),
        ("IDEM__SERVER__HEADER_READ_TIMEOUT_MS", "60000".to_owned()),
    ];
    let server = server_with(dir.path(), &env).await;
    let address = address_of(&server).parse().unwrap();
    // The flood comes from 127.0.0.2 (loopback too), the polite caller
    // from 127.0.0.1.
    let mut flood = Vec::new();
    for _ in 0..CONNECTIONS_MAX {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        flood.push(socket.connect(address).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    polite_caller_is_served(&server).await;
    let mut closed = 0;
    for stream in &mut flood {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_millis(300), stream.read(&mut byte)).await;
        closed += usize::from(matches!(read, Ok(Ok(0) | Err(_))));
    }
    assert_eq!(
        closed,
        CONNECTIONS_MAX - PER_PEER_MAX,
        "past its share, closed on accept"
    );
    let metrics = metrics_of(&server).await;
    let refused = metric_value(&metrics, "idem_connections_peer_cap_refused_total", &[]);
    assert_eq!(refused, (CONNECTIONS_MAX - PER_PEER_MAX) as f64, "{metrics}");
}
